// Baseline for the injector's RSS (bench/injector.ts): what the packages of the design the injector needs
// cost a process, bundled as dist/ is (bench/lib/baseline.ts) and loaded the way certshare loads them:
// @kubernetes/client-node through its fence (a CoreV1Api client built; nothing asked of any server),
// @peculiar/x509 through src/pki/ca.ts (a CA and one leaf issued, as the injector's webhook has),
// prom-client (a registry with the default metrics, as src/http/daemon-metrics.ts collects them), serving HTTPS
// with that leaf, and answering one request of its own over it (verified against the CA) before it says it
// listens: the injector answers the apiserver over TLS and calls it over TLS, and the first TLS handshake of
// a process pages in the TLS library's code (about 1.6 MB, docs/performance.md) whoever the peer is.
// V8 without its optimizing compilers, as the injector runs. Nothing of the injector itself. Prints
// {"listening":"https://127.0.0.1:PORT"}; runs until SIGTERM.
import './lib/as-the-injector-runs.ts';
import { createServer, request } from 'node:https';
import { Registry } from 'prom-client';
import { createCertificateAuthority } from '../src/pki/ca.ts';
import { CoreV1Api, KubeConfig } from '../src/kube/transport/client-node.ts';
import { collectNodeMetrics } from '../src/http/daemon-metrics.ts';

// A CA and a serving leaf from it, as the injector makes its webhook's (src/pki/ca.ts, @peculiar/x509).
const now = Date.now();
const ca = await createCertificateAuthority({ name: 'certshare bench baseline', now });
const leaf = await ca.sign({ dnsName: 'localhost', ipAddresses: ['127.0.0.1'], notBefore: Math.floor(now / 1000) * 1000, notAfter: now + 86_400_000 });
const kubeconfig = new KubeConfig();
kubeconfig.loadFromClusterAndUser({ name: 'bench', server: 'https://127.0.0.1:1', skipTLSVerify: false }, { name: 'bench', token: 'unused' });
// Held for the process's life, as the injector holds its client and registry: what it holds is what is measured.
const held = { api: kubeconfig.makeApiClient(CoreV1Api), registry: new Registry() };
collectNodeMetrics(held.registry);
await held.registry.metrics();
const server = createServer({ cert: leaf.chainPem, key: leaf.keyPem }, (_request, response) => response.end('ok'));
server.listen(Number(process.argv[2] ?? 0), '127.0.0.1', () => {
  const address = server.address();
  const port = typeof address === 'object' && address ? address.port : 0;
  // Bounded and loud: a floor that never answered must not leave the bench waiting on it.
  request({ host: '127.0.0.1', port, ca: ca.certPem, agent: false, timeout: 10_000 }, (response) => {
    response.once('end', () => process.stdout.write(`${JSON.stringify({ listening: `https://127.0.0.1:${port}` })}\n`));
    response.resume();
  })
    .once('timeout', function (this: { destroy(err: Error): void }) {
      this.destroy(new Error('no answer within 10 s'));
    })
    .once('error', (err) => {
      process.stderr.write(`injector packages floor: its own HTTPS request failed: ${err.message}\n`);
      process.exit(1);
    })
    .end();
});
const stop = (): void => {
  server.close(() => process.exit(0));
};
process.once('SIGTERM', stop);
process.once('SIGINT', stop);
