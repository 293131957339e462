// Kubernetes mode as the daemon loads it: on demand, since its client costs tens of MB that directory mode does
// not pay, and only once credentials exist (no kubeconfig and no service account: fail before loading the client).
import type { StoreBackend } from '../store/store-backend.ts';
import type { KubeBackendContext, KubeSettings } from './kube-backend.ts';
import { kubeconfigSource } from './kubeconfig-source.ts';

/** The Kubernetes backend (kube-backend.ts), loaded now. */
export async function loadKubeBackend(ctx: KubeBackendContext, settings: KubeSettings): Promise<StoreBackend> {
  const source = kubeconfigSource(ctx.env);
  // A refused kubeconfig (the cluster's or the federation home's) fails the start before the client and the
  // federation's code load, as fast as a bad flag; connectKube checks the file it loads again.
  const files = [...(source.kind === 'file' ? [source.path] : []), ...(settings.federation ? [settings.federation.kubeconfig] : [])];
  if (files.length > 0) {
    const { readInlineKubeconfig } = await import('./kubeconfig-file.ts');
    for (const path of files) await readInlineKubeconfig(path);
  }
  return (await import('./kube-backend.ts')).createKubeBackend(ctx, settings);
}
