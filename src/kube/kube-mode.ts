// Kubernetes mode as the daemon loads it: on demand, since its client costs tens of MB that directory mode does
// not pay, and only once credentials exist (no kubeconfig and no service account: fail before loading the client).
import type { StoreBackend } from '../store/store-backend.ts';
import type { KubeBackendContext, KubeSettings } from './kube-backend.ts';
import { kubeconfigSource } from './kubeconfig-source.ts';

/** The Kubernetes backend (kube-backend.ts), loaded now. */
export async function loadKubeBackend(ctx: KubeBackendContext, settings: KubeSettings): Promise<StoreBackend> {
  kubeconfigSource(ctx.env);
  return (await import('./kube-backend.ts')).createKubeBackend(ctx, settings);
}
