// A leaf the CA asked to replace now (an ARI revocation) leaves every replica's proxy, not only the writer's: the
// writer renews and names the replaced serial in the domain Secret (certshare.io/replaced-now); a reader whose
// proxy still serves that leaf past --served-stale-after (its reload failed) turns its readiness gate False on
// the real apiserver, and True again once its proxy serves the renewal. The reader's proxy is a TLS listener of
// the test's (test/support/tls-proxy.ts): this tier runs no real proxy, and a proxy whose reload failed is one
// that goes on serving the leaf it was given (test/proxies proves that of nginx and HAProxy).
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { DAY, makePair } from '../support/certs.ts';
import { control } from '../support/emulator.ts';
import { GATE, KUBE_DOMAIN, createGatedPod, exampleNamespace, filesHold, heldSerial, secretSatisfies, startReplica } from '../support/kube.ts';
import { freePort } from '../support/processes.ts';
import { useTempDir } from '../support/standalone.ts';
import { startTlsProxy } from '../support/tls-proxy.ts';

const cp = useControlPlane();
const STALE_AFTER_MS = 3000;

interface Condition {
  type: string;
  status: string;
  reason?: string;
  message?: string;
}

/** Resolves with the Pod's readiness gate once `predicate` holds, driven by a watch of the Pod (no polling). */
async function gateWhen(ns: string, name: string, predicate: (gate: Condition | undefined) => boolean, timeoutMs: number): Promise<Condition | undefined> {
  const { KubeConfig, Watch } = await import('@kubernetes/client-node');
  const kc = new KubeConfig();
  kc.loadFromFile(cp().adminKubeconfigPath);
  type Pod = { status?: { conditions?: Condition[] }; metadata: { resourceVersion: string } };
  const gateOf = (pod: Pod): Condition | undefined => pod.status?.conditions?.find((c) => c.type === GATE);
  const res = await cp().adminRequest('GET', `/api/v1/namespaces/${ns}/pods/${name}`);
  const pod = JSON.parse(res.body) as Pod;
  if (predicate(gateOf(pod))) return gateOf(pod);
  let last = gateOf(pod);
  return new Promise((resolve, reject) => {
    let controller: AbortController | undefined;
    const timer = setTimeout(() => finish(new Error(`Pod ${name}'s gate not as expected within ${timeoutMs} ms: ${JSON.stringify(last)}`)), timeoutMs);
    function finish(err?: Error): void {
      clearTimeout(timer);
      controller?.abort();
      if (err) reject(err);
      else resolve(last);
    }
    void new Watch(kc)
      .watch(
        `/api/v1/namespaces/${ns}/pods`,
        { fieldSelector: `metadata.name=${name}`, resourceVersion: pod.metadata.resourceVersion },
        (_type, obj: Pod) => {
          last = gateOf(obj);
          if (predicate(last)) finish();
        },
        (err: unknown) => err && finish(err as Error),
      )
      .then((c) => (controller = c));
  });
}

describe('a leaf the CA asked to replace now, at a reader (real apiserver)', () => {
  const dir = useTempDir();

  it('takes a reader out of rotation while its proxy (its reload failed) serves the revoked leaf, and back once it serves the renewal', async (t) => {
    const ns = await exampleNamespace(cp());
    for (const name of ['proxy-0', 'proxy-1']) await createGatedPod(cp(), ns, name);
    // The writer asks its emulator's ACME server for the renewal window (ARI) every second; an hour-long certificate.
    const acmePort = await freePort();
    const writer = await startReplica(cp(), ns, dir(), 'proxy-0', {
      mode: 'rw',
      emulator: { acmeListen: `127.0.0.1:${acmePort}`, certLifetimeMs: 3_600_000 },
      flags: ['--readiness-gate', GATE, '--acme-directory', `http://127.0.0.1:${acmePort}/acme/directory`, '--ari-interval', '1s'],
    });
    // The reader's proxy serves an expired pair of the test's until it is given the reader's files.
    const proxy = await startTlsProxy(await makePair(KUBE_DOMAIN, Date.now() - 2 * DAY, DAY));
    const reader = await startReplica(cp(), ns, dir(), 'proxy-1', {
      mode: 'ro',
      flags: [
        ...['--readiness-gate', GATE, '--served-check', `127.0.0.1:${proxy.port}`],
        ...['--served-check-interval', '1s', '--served-stale-after', `${STALE_AFTER_MS}ms`],
      ],
    });
    const serveReaderFiles = async (): Promise<void> => {
      const [certPem, keyPem] = await Promise.all(['tls.crt', 'tls.key'].map((f) => readFile(join(reader.outDir, KUBE_DOMAIN, f), 'utf8')));
      proxy.serve({ certPem: certPem!, keyPem: keyPem! });
    };
    try {
      await gateWhen(ns, 'proxy-0', (g) => g?.status === 'True', 60_000);
      const revoked = heldSerial(writer)!;
      await filesHold(reader, revoked, 30_000);
      await serveReaderFiles();
      await gateWhen(ns, 'proxy-1', (g) => g?.status === 'True', 30_000);

      const res = await control(writer.emulator.address, 'ari/revoke', { serial: revoked });
      assert.equal(res.status, 200, res.body);
      let renewal = '';
      await secretSatisfies(
        cp(),
        ns,
        KUBE_DOMAIN,
        (s) => {
          renewal = s?.metadata.annotations?.['certshare.io/serial'] ?? '';
          return s?.metadata.annotations?.['certshare.io/replaced-now']?.split(',')[0] === revoked.toUpperCase();
        },
        30_000,
      );
      assert.notEqual(renewal, revoked, 'the writer renewed');
      await filesHold(reader, renewal, 15_000);
      const heldAt = Date.now();
      // The reader's proxy did not take the renewal: it goes on serving the revoked leaf.
      const out = await gateWhen(ns, 'proxy-1', (g) => g?.status === 'False', 30_000);
      const outMs = Date.now() - heldAt;
      t.diagnostic(`reader out ${outMs} ms after its files held the renewal (--served-stale-after ${STALE_AFTER_MS} ms): ${out?.reason}: ${out?.message}`);
      assert.equal(out?.reason, 'CertificateNotValid');
      assert.match(out?.message ?? '', /CA asked to replace now/);
      assert.ok(outMs >= STALE_AFTER_MS - 1000, `not before the reload window has passed (${outMs} ms)`);
      assert.ok(outMs <= STALE_AFTER_MS + 10_000, `within the window and a check or two (${outMs} ms)`);

      await serveReaderFiles();
      const servedAt = Date.now();
      await gateWhen(ns, 'proxy-1', (g) => g?.status === 'True', 15_000);
      t.diagnostic(`reader back in rotation ${Date.now() - servedAt} ms after its proxy served the renewal`);
    } finally {
      await reader.stop();
      await writer.stop();
      await proxy.close();
    }
  });
});
