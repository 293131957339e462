// What each end-to-end test file sets up on its cluster before applying an example, as the README's steps
// say, with the test's own values: the injector (Helm, the chart), and a namespace opted in to injection
// holding what the examples need besides their manifests (tailscaled's auth key, and here the test control
// server's and pebble's addresses, read by the overlays' components in test/cluster/e2e/components).
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { helm, readmeHelmInstallArgs } from '../../support/helm.ts';
import type { E2eCluster } from '../e2e-cluster.ts';

const REPO = fileURLToPath(new URL('../../../', import.meta.url));
/** The auth key tailscaled logs in with: the test control server takes any. */
export const E2E_AUTH_KEY = 'tskey-auth-e2e';

/** `helm install` of the injector with these values files (paths from the repository's root), rolled out, its caBundle written. */
export async function installInjector(env: E2eCluster, valuesFiles: string[]): Promise<void> {
  const k = (args: string[]) => env.cluster.kubectlOk(args, { timeoutMs: 120_000 });
  const values = valuesFiles.flatMap((f) => ['--values', join(REPO, f)]);
  const installed = await helm([...readmeHelmInstallArgs(), '--kubeconfig', env.cluster.adminKubeconfigPath, ...values], {
    run: (command, options) => env.cluster.exec(command, options),
  });
  assert.equal(installed.code, 0, `helm install: ${installed.stderr}`);
  await k(['rollout', 'status', 'deployment/certshare-injector', '-n', 'certshare', '--timeout=180s']);
  const deadline = Date.now() + 60_000;
  for (;;) {
    const caBundle = await k(['get', 'mutatingwebhookconfiguration', 'certshare-injector', '-o', 'jsonpath={.webhooks[0].clientConfig.caBundle}']).catch(
      () => '',
    );
    if (caBundle.trim().length > 0) return;
    if (Date.now() > deadline) throw new Error('the injector wrote no caBundle within 60 s');
    await sleep(500);
  }
}

/**
 * README: opt the namespace in. Then what the examples need besides their manifests: tailscaled's auth key,
 * and here the test control server's and pebble's addresses (ConfigMap tailscale-test, with tailscaled's
 * hostname: the domain is <hostname>.<MagicDNS suffix>) and the CA bundle tailscaled trusts pebble by.
 */
export async function prepareExampleNamespace(env: E2eCluster, ns: string, hostname: string, caFile: string): Promise<void> {
  const k = (args: string[]) => env.cluster.kubectlOk(args, { timeoutMs: 120_000 });
  await k(['create', 'namespace', ns]);
  await k(['label', 'namespace', ns, 'certshare.io/injection=enabled']);
  await k(['create', 'secret', 'generic', 'tailscale-auth', '-n', ns, `--from-literal=TS_AUTHKEY=${E2E_AUTH_KEY}`]);
  await k(['create', 'configmap', 'tailscale-test-ca', '-n', ns, `--from-file=ca-bundle.pem=${caFile}`]);
  await k([
    'create',
    'configmap',
    'tailscale-test',
    '-n',
    ns,
    `--from-literal=TS_EXTRA_ARGS=--login-server=${env.tsenv.control}`,
    `--from-literal=TS_HOSTNAME=${hostname}`,
    `--from-literal=TS_DEBUG_ACME_DIRECTORY_URL=${env.tsenv.acme}`,
    '--from-literal=SSL_CERT_FILE=/etc/tailscale-test/ca-bundle.pem',
  ]);
}

/**
 * What a user would look at when Pods do not come up, written to stderr: the Pods, their events and the last
 * lines of the named containers of each Pod. Every call has its own timeout and none may throw: it runs on a
 * failure path, beside the error it explains.
 */
export async function explainPods(env: E2eCluster, ns: string, containers: string[], label = 'e2e'): Promise<void> {
  const k = (args: string[]) =>
    env.cluster.kubectl(args, { timeoutMs: 30_000 }).then(
      (r) => r.stdout + r.stderr,
      (err: unknown) => String(err),
    );
  const names = (await k(['get', 'pods', '-n', ns, '-o', 'jsonpath={.items[*].metadata.name}'])).trim().split(/\s+/).filter(Boolean);
  const parts = [await k(['get', 'pods', '-n', ns, '-o', 'wide']), (await k(['describe', 'pods', '-n', ns])).slice(-8000)];
  for (const pod of names) {
    for (const c of containers) parts.push(`--- ${pod} ${c}:\n${await k(['logs', pod, '-n', ns, '-c', c, '--tail=30'])}`);
  }
  process.stderr.write(`${label}: ${ns}:\n${parts.join('\n')}\n`);
}
