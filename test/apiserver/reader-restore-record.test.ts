// A reader that never saw a renewal must not put its older pair back over a hand edit. Found by the
// three-cluster chaos run (seed 42, invariant 3): every candidate of the Lease may restore what the Secret
// lost, and one whose reads failed across its API server's restart (its watch relisted after 410 Gone, so the
// renewal's event never reached it) restored the pair the renewal had replaced, compare-and-swap on the
// hand-edited object. The Secret's serial annotation outlives the edit and names the certificate of record: a
// replica that may not issue restores only that pair (issuance-policy.ts mayRestore).
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { ANNOTATION_SERIAL } from '../../src/kube/secret-codec.ts';
import { useControlPlane } from '../harness/use-control-plane.ts';
import {
  KUBE_DOMAIN,
  exampleNamespace,
  filesWritten,
  heldSerial,
  isWriter,
  kubeconfigVia,
  roleChange,
  secretSatisfies,
  startReplica,
  type Replica,
  type SecretObject,
} from '../support/kube.ts';
import { recordingLogger } from '../support/recording-logger.ts';
import { useTempDir } from '../support/standalone.ts';
import { startTcpProxy } from '../support/tcp-proxy.ts';
import { until } from '../support/wait.ts';

const cp = useControlPlane();

describe('a hand edit seen by a reader that missed the renewal', () => {
  const dir = useTempDir();

  it('the reader leaves its older pair out of the Secret; the writer puts the renewal back', { timeout: 180_000 }, async () => {
    const ns = await exampleNamespace(cp());
    const apiPort = Number(new URL(cp().server).port);
    const [writerPath, readerPath] = await Promise.all([startTcpProxy(apiPort), startTcpProxy(apiPort)]);
    // 40 s certificates, renewed 20 s after issuance: A stays valid for 20 s after the renewal B. A Lease of
    // 60 s: the reader stays a reader while the writer's path is cut.
    const options = (port: number, name: string) =>
      kubeconfigVia(cp(), ns, join(dir(), `${name}.kubeconfig`), { url: `https://127.0.0.1:${port}` }).then((KUBECONFIG) => ({
        mode: 'auto' as const,
        flags: ['--lease-duration', '60s', '--shutdown-timeout', '3s', '--drain-delay', '500ms'],
        env: { KUBECONFIG },
        emulator: { certLifetimeMs: 40_000 },
      }));
    const writer = await startReplica(cp(), ns, dir(), 'proxy-0', await options(writerPath.port, 'proxy-0'));
    let reader: Replica | undefined;
    const readerLog = recordingLogger();
    try {
      await until('proxy-0 writes', () => isWriter(writer) && heldSerial(writer) !== undefined, [roleChange(writer), filesWritten(writer)], 20_000);
      const a = heldSerial(writer)!;
      // The writer's issuances after A, with their validity: B, and at a loaded machine's pace its renewals when due.
      const issued: Array<{ serial: string; notBefore: number }> = [];
      writer.emulator.events.on('issued', (e: { serial: string; notBefore: string }) => issued.push({ serial: e.serial, notBefore: Date.parse(e.notBefore) }));
      reader = await startReplica(cp(), ns, dir(), 'proxy-1', { ...(await options(readerPath.port, 'proxy-1')), logger: readerLog.logger });
      const r = reader;
      await until('proxy-1 reads A', () => heldSerial(r) === a, [filesWritten(r)], 10_000);
      const path = `/api/v1/namespaces/${ns}/secrets/${KUBE_DOMAIN}`;
      const aData = (JSON.parse((await cp().adminRequest('GET', path)).body) as SecretObject).data!;

      // The reader is cut off while the writer renews; then the writer is cut off, and B's data is edited by hand.
      readerPath.cut();
      await until('proxy-0 renews', () => heldSerial(writer) !== a, [filesWritten(writer)], 40_000);
      const b = heldSerial(writer)!;
      await secretSatisfies(cp(), ns, KUBE_DOMAIN, (s) => s?.metadata.annotations?.[ANNOTATION_SERIAL] === b);
      writerPath.cut();
      const edit = await cp().adminRequest('PATCH', path, {
        headers: { 'content-type': 'application/merge-patch+json' },
        body: { data: { 'tls.crt': Buffer.from('garbage, not a PEM\n').toString('base64') } },
      });
      assert.equal(edit.status, 200, edit.body);
      // The API server restarts: the reader's watch, resumed from before B, ends in 410 Gone and relists.
      await cp().stopApiServer();
      await cp().startApiServer();
      readerPath.restore();
      await until(
        'proxy-1 reads the edit',
        () => readerLog.entries.some((e) => e.msg === 'stored certificate unusable'),
        [
          (l) => {
            readerLog.events.on('entry', l);
            return () => readerLog.events.off('entry', l);
          },
        ],
        30_000,
      );
      assert.equal(heldSerial(r), a, 'the reader never saw B');
      assert.equal(isWriter(r), false);
      // One more whole turn of the reader's loop on what it reads now: its decision is made.
      await r.daemon.manager.loop(KUBE_DOMAIN)!.turn(new AbortController().signal);
      const after = JSON.parse((await cp().adminRequest('GET', path)).body) as SecretObject;
      assert.ok(after.data?.['tls.crt'] !== aData['tls.crt'], 'A, older than the record B, was put back by the reader');
      assert.equal(after.metadata.annotations?.[ANNOTATION_SERIAL], b);

      // The writer, back, restores B; the reader takes it.
      writerPath.restore();
      await secretSatisfies(
        cp(),
        ns,
        KUBE_DOMAIN,
        (s) => s?.metadata.annotations?.[ANNOTATION_SERIAL] === b && s?.data?.['tls.crt'] !== after.data?.['tls.crt'],
        30_000,
      );
      await until('proxy-1 holds B', () => heldSerial(r) === b, [filesWritten(r)], 30_000);
      assert.equal(r.emulator.stats().issuancesTotal, 0, 'the reader issued nothing');
      assert.equal(issued[0]?.serial, b, 'B, the first issuance after A');
      // A, B, and nothing before it was due: each later one at its predecessor's renewal point (half of 40 s), the
      // edit and the restores never an issuance.
      for (const [i, next] of issued.entries()) {
        if (i === 0) continue;
        assert.ok(next.notBefore >= issued[i - 1]!.notBefore + 20_000 - 1000, `issuance ${i + 1} after A came before it was due`);
      }
    } finally {
      writerPath.restore();
      readerPath.restore();
      await Promise.all([writer.stop(), reader?.stop()]);
      await Promise.all([writerPath.close(), readerPath.close()]);
    }
  });
});
