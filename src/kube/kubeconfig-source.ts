import { existsSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { CertshareError } from '../core/errors.ts';

type KubeconfigSource = { kind: 'file'; path: string } | { kind: 'in-cluster' };

/**
 * Where the Kubernetes credentials come from: KUBECONFIG (its first file), the Pod's service account, or
 * ~/.kube/config. Cheap (no client loaded), so that kube mode without a cluster fails at once at start.
 * Not client-node's loadFromDefault(): without any kubeconfig it falls back to http://localhost:8080, and
 * the daemon would run for ever against nothing.
 */
export function kubeconfigSource(env: NodeJS.ProcessEnv): KubeconfigSource {
  const fail = (why: string): never => {
    throw new CertshareError('CERTSHARE_BAD_CONFIG', { source: 'Kubernetes credentials', reason: `cannot be loaded: ${why}` });
  };
  if (env.KUBECONFIG) {
    const path = env.KUBECONFIG.split(':')[0]!;
    if (!existsSync(path)) fail(`KUBECONFIG names ${path}, which does not exist`);
    return { kind: 'file', path };
  }
  if (env.KUBERNETES_SERVICE_HOST) return { kind: 'in-cluster' };
  const path = join(env.HOME || homedir(), '.kube', 'config');
  if (!existsSync(path)) fail(`no Kubernetes cluster configured: set KUBECONFIG, provide ${path}, or run in a Pod`);
  return { kind: 'file', path };
}
