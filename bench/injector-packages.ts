// Baseline for the injector's RSS (bench/injector.ts): what the packages of the design the injector needs
// cost a process, bundled as dist/ is (bench/lib/baseline.ts) and loaded the way certshare loads them:
// @kubernetes/client-node through its fence (a CoreV1Api client built; nothing asked of any server),
// @peculiar/x509 through src/core/x509.ts (one self-signed certificate issued), prom-client (a registry
// with the default metrics, as src/server/metrics.ts collects them), serving HTTPS with that certificate.
// Nothing of the injector itself. Prints {"listening":"https://127.0.0.1:PORT"}; runs until SIGTERM.
import { webcrypto } from 'node:crypto';
import { createServer } from 'node:https';
import { Registry } from 'prom-client';
import { loadX509 } from '../src/core/x509.ts';
import { CoreV1Api, KubeConfig } from '../src/kube/transport/client-node.ts';
import { collectNodeMetrics } from '../src/server/metrics.ts';

const algorithm = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' } as const;
const x509 = await loadX509();
const keys = (await webcrypto.subtle.generateKey(algorithm, true, ['sign', 'verify'])) as webcrypto.CryptoKeyPair;
const cert = await x509.X509CertificateGenerator.createSelfSigned({
  serialNumber: '01',
  name: 'CN=certshare bench baseline',
  notBefore: new Date(),
  notAfter: new Date(Date.now() + 86_400_000),
  signingAlgorithm: algorithm,
  keys,
});
const kubeconfig = new KubeConfig();
kubeconfig.loadFromClusterAndUser({ name: 'bench', server: 'https://127.0.0.1:1', skipTLSVerify: false }, { name: 'bench', token: 'unused' });
// Held for the process's life, as the injector holds its client and registry: what it holds is what is measured.
const held = { api: kubeconfig.makeApiClient(CoreV1Api), registry: new Registry() };
collectNodeMetrics(held.registry);
await held.registry.metrics();
const pkcs8 = Buffer.from(await webcrypto.subtle.exportKey('pkcs8', keys.privateKey)).toString('base64');
const key = `-----BEGIN PRIVATE KEY-----\n${pkcs8.replace(/.{64}/g, '$&\n')}\n-----END PRIVATE KEY-----\n`;
const server = createServer({ cert: cert.toString('pem'), key }, (_request, response) => response.end('ok'));
server.listen(Number(process.argv[2] ?? 0), '127.0.0.1', () => {
  const address = server.address();
  const port = typeof address === 'object' && address ? address.port : 0;
  process.stdout.write(`${JSON.stringify({ listening: `https://127.0.0.1:${port}` })}\n`);
});
const stop = (): void => {
  server.close(() => process.exit(0));
};
process.once('SIGTERM', stop);
process.once('SIGINT', stop);
