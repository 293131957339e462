// The injector's webhook on a test control plane: manifests/injector applied in the namespace `certshare`, the
// apiserver calling the webhook by URL (the manifests call the Service; without kube-proxy the tests serve it on
// loopback), a namespace opted in to injection, and the Pod the tests create there.
import { fileURLToPath } from 'node:url';
import type { V1Pod } from '../../src/kube/transport/client-node.ts';
import { ANNOTATION } from '../../src/injector/mutate.ts';
import type { ControlPlane } from '../harness/control-plane.ts';
import { must } from './kube.ts';

const MANIFESTS = fileURLToPath(new URL('../../manifests/injector', import.meta.url));

/** The annotations of a Pod that asks for certshare. */
export const ASKED = { [ANNOTATION.inject]: 'true', [ANNOTATION.domains]: 'proxy.tailnet-0000.ts.net' };

/** A proxy and tailscaled's socket volume: with `annotations` ASKED, a Pod the webhook injects. */
export function proxyPod(name: string, annotations?: Record<string, string>): V1Pod {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name, ...(annotations ? { annotations } : {}) },
    spec: {
      containers: [{ name: 'proxy', image: 'nginx', volumeMounts: [{ name: 'tailscale-socket', mountPath: '/var/run/tailscale' }] }],
      volumes: [{ name: 'tailscale-socket', emptyDir: {} }],
    },
  };
}

/** Applies manifests/injector, points its webhook at `url`, opts `ns` in; the kubeconfig of the injector's own account. */
export async function installInjector(cp: ControlPlane, url: string, ns: string): Promise<string> {
  await must(cp.kubectl(['create', 'namespace', 'certshare']));
  await must(cp.kubectl(['apply', '-k', MANIFESTS]));
  const clientConfig = [{ op: 'replace', path: '/webhooks/0/clientConfig', value: { url } }];
  await must(cp.kubectl(['patch', 'mutatingwebhookconfiguration', 'certshare-injector', '--type=json', '-p', JSON.stringify(clientConfig)]));
  await must(cp.kubectl(['create', 'namespace', ns]));
  await must(cp.kubectl(['label', 'namespace', ns, 'certshare.io/injection=enabled']));
  // Under the manifests' ServiceAccount: their least-privilege RBAC is what the injector gets.
  return cp.kubeconfigFor('certshare', 'certshare-injector');
}
