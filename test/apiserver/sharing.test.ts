import assert from 'node:assert/strict';
import { X509Certificate } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { systemClock } from '../../src/core/ports/clock.ts';
import { validateCertPair } from '../../src/core/certificates/certificate.ts';
import { CertshareError } from '../../src/core/errors.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import { connectKube } from '../../src/kube/connection.ts';
import { KubeSecretStore } from '../../src/kube/secret-store.ts';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { DAY, makePair } from '../support/certs.ts';
import {
  KUBE_DOMAIN,
  GROUP,
  exampleNamespace,
  filesWritten,
  heldSerial,
  must,
  secretSatisfies,
  startReplica,
  startReplicas,
  type Replica,
  type SecretObject,
} from '../support/kube.ts';
import { recordingLogger } from '../support/recording-logger.ts';
import { useTempDir } from '../support/standalone.ts';
import { nextEvent, until } from '../support/wait.ts';

const cp = useControlPlane();

async function secretOf(
  ns: string,
): Promise<
  | { type: string; metadata: { labels: Record<string, string>; annotations: Record<string, string>; resourceVersion: string }; data: Record<string, string> }
  | undefined
> {
  const res = await cp().adminRequest('GET', `/api/v1/namespaces/${ns}/secrets/${KUBE_DOMAIN}`);
  if (res.status === 404) return undefined;
  assert.equal(res.status, 200, res.body);
  return JSON.parse(res.body);
}

const serialOf = (pem: string): string => new X509Certificate(pem).serialNumber;
const filesSerial = async (r: Replica): Promise<string | undefined> => readFile(join(r.outDir, KUBE_DOMAIN, 'tls.crt'), 'utf8').then(serialOf, () => undefined);

describe('kube mode: one writer shares through a Secret, readers pick renewals up at once', () => {
  const dir = useTempDir();

  it('issues once, shares to readers, and propagates each renewal to their files within a second', async () => {
    const ns = await exampleNamespace(cp());
    // 8 s certificates: renewal due at half, so a renewal every 4 s.
    const writer = await startReplica(cp(), ns, dir(), 'proxy-0', { mode: 'rw', emulator: { certLifetimeMs: 8000 } });
    const readers = await startReplicas(cp(), ns, dir(), ['proxy-1', 'proxy-2'], { mode: 'ro' });
    const all = [writer, ...readers];
    try {
      await until('every replica has the certificate on disk', () => all.every((r) => heldSerial(r) !== undefined), all.map(filesWritten), 20_000);
      const secret = await secretOf(ns);
      assert.equal(secret?.type, 'kubernetes.io/tls');
      assert.equal(secret?.metadata.labels['app.kubernetes.io/managed-by'], 'certshare');
      assert.equal(secret?.metadata.labels['certshare.io/group'], GROUP);
      const first = heldSerial(writer);
      for (const r of readers) {
        assert.equal(heldSerial(r), first);
        assert.deepEqual(r.emulator.stats().certRequests, {}, 'readers never call CertPair');
      }

      const delays: number[] = [];
      for (let i = 0; i < 3; i++) {
        const issued = await nextEvent<{ serial: string }>(writer.emulator.events, 'issued', () => true, 15_000);
        const issuedAt = performance.now();
        await Promise.all(readers.map((r) => until(`${r.name} has renewal ${i + 1}`, () => heldSerial(r) === issued.serial, [filesWritten(r)], 5000)));
        delays.push(performance.now() - issuedAt);
      }
      for (const r of readers) assert.equal(await filesSerial(r), heldSerial(writer));
      assert.ok(Math.max(...delays) < 1500, `propagation delays ${delays.map(Math.round).join(', ')} ms`);
      assert.equal(writer.emulator.stats().issuances[KUBE_DOMAIN], 4, 'the first issuance and three renewals, nothing more');
    } finally {
      await Promise.all(all.map((r) => r.stop()));
    }
  });

  it('a reader that finds the Secret empty while the first issuance runs says so at info, without a warning', async () => {
    const ns = await exampleNamespace(cp());
    // The first issuance takes 3 s: the writer's intent (a Secret without tls.crt / tls.key) stands meanwhile.
    const writer = await startReplica(cp(), ns, dir(), 'proxy-0', { mode: 'rw', emulator: { faults: ['cert:slow:delay=3s:count=1'] } });
    const { logger, entries } = recordingLogger();
    let reader: Replica | undefined;
    try {
      await secretSatisfies(cp(), ns, KUBE_DOMAIN, (s) => s !== undefined && !s.data?.['tls.crt']);
      reader = await startReplica(cp(), ns, dir(), 'proxy-1', { mode: 'ro', logger });
      const r = reader;
      await until('shared', () => heldSerial(r) !== undefined, [filesWritten(r)], 20_000);
      const about = entries.filter((e) => /stored certificate unusable|no certificate stored yet/.test(e.msg ?? '')).map((e) => [e.level, e.msg, e.reason]);
      assert.deepEqual(about, [['info', 'no certificate stored yet; waiting for the first issuance', 'Secret holds no tls.crt / tls.key']]);
      assert.deepEqual(
        entries.filter((e) => e.level === 'warn' || e.level === 'error').map((e) => e.msg),
        [],
        'nothing warned during a normal start',
      );
    } finally {
      await Promise.all([writer.stop(), reader?.stop()]);
    }
  });

  it('writes compare-and-swap: a concurrent change surfaces as a conflict, never a blind overwrite', async () => {
    const ns = await exampleNamespace(cp());
    const kubeconfig = await cp().kubeconfigFor(ns, 'certshare');
    const store = new KubeSecretStore({
      connection: await connectKube({ KUBECONFIG: kubeconfig, POD_NAMESPACE: ns }),
      clock: systemClock,
      logger: silentLogger,
      group: GROUP,
    });
    const signal = new AbortController().signal;
    const pair = await makePair(KUBE_DOMAIN, Date.now() - DAY, 90 * DAY);
    const cert = { pair, info: validateCertPair(pair, KUBE_DOMAIN, Date.now()) };
    assert.equal((await store.load(KUBE_DOMAIN, signal)).state, 'absent');
    await must(cp().kubectl(['-n', ns, 'create', 'secret', 'generic', KUBE_DOMAIN, '--from-literal=note=someone else']));
    await assert.rejects(store.save(KUBE_DOMAIN, cert, signal), (err: unknown) => err instanceof CertshareError && err.code === 'CERTSHARE_STORE_CONFLICT');
    assert.equal((await store.load(KUBE_DOMAIN, signal)).state, 'unusable');
    await must(cp().kubectl(['-n', ns, 'annotate', 'secret', KUBE_DOMAIN, 'touched=yes']));
    await assert.rejects(store.save(KUBE_DOMAIN, cert, signal), (err: unknown) => err instanceof CertshareError && err.code === 'CERTSHARE_STORE_CONFLICT');
    assert.equal((await store.load(KUBE_DOMAIN, signal)).state, 'unusable');
    await store.save(KUBE_DOMAIN, cert, signal);
    const secret = await secretOf(ns);
    assert.equal(secret?.metadata.annotations.touched, 'yes', "other people's annotations are kept");
    assert.equal((await store.load(KUBE_DOMAIN, signal)).state, 'valid');
  });

  it('restores a Secret deleted, emptied or filled with garbage, without issuing; readers keep serving', async () => {
    const ns = await exampleNamespace(cp());
    const writer = await startReplica(cp(), ns, dir(), 'proxy-0', { mode: 'rw' });
    const reader = await startReplica(cp(), ns, dir(), 'proxy-1', { mode: 'ro' });
    try {
      await until('shared', () => heldSerial(reader) !== undefined && heldSerial(writer) !== undefined, [filesWritten(reader), filesWritten(writer)], 20_000);
      const serial = heldSerial(writer)!;
      const holdsSerial = (secret: SecretObject | undefined): boolean => {
        try {
          return serialOf(Buffer.from(secret?.data?.['tls.crt'] ?? '', 'base64').toString()) === serial;
        } catch {
          return false; // empty or garbage
        }
      };
      const restored = (what: string) =>
        secretSatisfies(cp(), ns, KUBE_DOMAIN, holdsSerial).catch((err: Error) => {
          throw new Error(`after ${what}: ${err.message}`);
        });
      await must(cp().kubectl(['-n', ns, 'delete', 'secret', KUBE_DOMAIN]));
      await restored('delete');
      await must(cp().kubectl(['-n', ns, 'patch', 'secret', KUBE_DOMAIN, '--type=merge', '-p', '{"data":{"tls.crt":"","tls.key":""}}']));
      await restored('emptying');
      await must(
        cp().kubectl(['-n', ns, 'patch', 'secret', KUBE_DOMAIN, '--type=merge', '-p', `{"data":{"tls.crt":"${Buffer.from('garbage').toString('base64')}"}}`]),
      );
      await restored('garbage');
      assert.equal(writer.emulator.stats().issuances[KUBE_DOMAIN], 1, 'no new issuance');
      assert.equal(heldSerial(reader), serial);
      assert.equal(await filesSerial(reader), serial);
      assert.equal((await fetch(`${reader.daemon.address}/healthz`)).status, 200);
    } finally {
      await Promise.all([writer.stop(), reader.stop()]);
    }
  });
});
