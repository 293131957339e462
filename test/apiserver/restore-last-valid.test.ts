// A Secret overwritten by hand right after a renewal, its writer gone before restoring it: the replica
// that takes over restores the renewal it saw on its watch, not its own older certificate (which is due:
// restoring it meant renewing it, a second issuance in the window the renewal already covered). Found by
// the 50-domain chaos run; each replica has its own tailscaled, so the new writer's holds no renewal.
// And a restart: the pair only the Pod's files still hold (the Secret edited while its writer was down) is
// restored from them. Found by the three-cluster chaos run (a break-glass certificate lost that way).
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import type { LedgerLine } from '../../src/emulator/ledger.ts';
import { ANNOTATION_SERIAL } from '../../src/kube/secret-codec.ts';
import { useControlPlane } from '../harness/use-control-plane.ts';
import {
  KUBE_DOMAIN,
  exampleNamespace,
  filesWritten,
  heldSerial,
  kubeconfigVia,
  secretSatisfies,
  startReplica,
  type Replica,
  type SecretObject,
  roleChange,
  isWriter,
} from '../support/kube.ts';
import { useTempDir } from '../support/standalone.ts';
import { startTcpProxy } from '../support/tcp-proxy.ts';
import { until } from '../support/wait.ts';

const cp = useControlPlane();

describe('a hand edit over a renewal, its writer gone', () => {
  const dir = useTempDir();

  it('the new writer restores the renewal its watch delivered with the edit, and issues nothing', { timeout: 120_000 }, async () => {
    const ns = await exampleNamespace(cp());
    const apiPort = Number(new URL(cp().server).port);
    const [writerPath, readerPath] = await Promise.all([startTcpProxy(apiPort), startTcpProxy(apiPort)]);
    const ledgerPath = join(dir(), 'ledger.jsonl');
    // 24 s certificates: renewed 12 s after issuance, so the renewal stays far from due while the test runs.
    const options = (port: number, name: string) =>
      kubeconfigVia(cp(), ns, join(dir(), `${name}.kubeconfig`), { url: `https://127.0.0.1:${port}` }).then((KUBECONFIG) => ({
        mode: 'auto' as const,
        // A writer stopping through a cut path tries to verify its Secrets until its shutdown budget ends:
        // a short one, so the reader's certificate does not run out meanwhile.
        flags: ['--lease-duration', '2s', '--shutdown-timeout', '3s', '--drain-delay', '500ms'],
        env: { KUBECONFIG },
        emulator: { certLifetimeMs: 24_000, ledgerPath },
      }));
    const writer = await startReplica(cp(), ns, dir(), 'proxy-0', await options(writerPath.port, 'proxy-0'));
    let reader: Replica | undefined;
    try {
      await until('proxy-0 writes', () => isWriter(writer) && heldSerial(writer) !== undefined, [roleChange(writer), filesWritten(writer)], 20_000);
      reader = await startReplica(cp(), ns, dir(), 'proxy-1', await options(readerPath.port, 'proxy-1'));
      const r = reader;
      await until('proxy-1 reads the certificate', () => heldSerial(r) !== undefined, [filesWritten(r)], 10_000);
      const old = heldSerial(writer)!;
      assert.equal(heldSerial(r), old);

      // The reader's path to the API server stalls as the writer starts renewing, which takes its
      // tailscaled 1.5 s: meanwhile the reader's certificate stays due without the renewal arriving, so its
      // loop reads the Secret itself (LoadOptions.fresh), and that read is held too. The renewal N reaches
      // it only with the hand edit after it, and its read answers with the edit: its loop never sees N.
      writer.emulator.injectFault({ target: 'cert', kind: 'slow', delayMs: 1500 });
      writer.emulator.events.once('certRequest', () => readerPath.hold());
      await until('proxy-0 renewed', () => heldSerial(writer) !== old, [filesWritten(writer)], 30_000);
      const renewal = heldSerial(writer)!;
      await secretSatisfies(cp(), ns, KUBE_DOMAIN, (s) => s?.metadata.annotations?.[ANNOTATION_SERIAL] === renewal);
      // The writer's watch fails (it would restore N at once), then it is gone.
      writerPath.cut();
      const stored = await cp().adminRequest('GET', `/api/v1/namespaces/${ns}/secrets/${KUBE_DOMAIN}`);
      assert.equal(stored.status, 200);
      const n = (JSON.parse(stored.body) as SecretObject).data!;
      const edit = await cp().adminRequest('PATCH', `/api/v1/namespaces/${ns}/secrets/${KUBE_DOMAIN}`, {
        headers: { 'content-type': 'application/merge-patch+json' },
        body: { data: { 'tls.crt': Buffer.from('-----BEGIN CERTIFICATE-----\nedited by hand\n-----END CERTIFICATE-----\n').toString('base64') } },
      });
      assert.equal(edit.status, 200, edit.body);
      await writer.stop();
      assert.equal(heldSerial(r), old, 'the reader never read N');
      readerPath.restore();

      await until('proxy-1 takes over', () => isWriter(r), [roleChange(r)], 15_000);
      const issuances = async (): Promise<string[]> =>
        (await readFile(ledgerPath, 'utf8'))
          .split('\n')
          .filter(Boolean)
          .map((line) => JSON.parse(line) as LedgerLine)
          .filter((line) => line.domain === KUBE_DOMAIN)
          .map((line) => `${line.emulator} ${'serial' in line ? line.serial : ''}`);
      await secretSatisfies(cp(), ns, KUBE_DOMAIN, (s) => s?.data?.['tls.crt'] === n['tls.crt'] && s?.data?.['tls.key'] === n['tls.key'], 15_000).catch(
        async (err: Error) => {
          throw new Error(`${err.message}: N not restored; issuances: ${(await issuances()).join(', ')}`);
        },
      );
      assert.equal(heldSerial(r), renewal);
      const issued = await issuances();
      assert.equal(issued.length, 2, `the first issuance and the renewal, both by proxy-0: ${issued.join(', ')}`);
      assert.ok(
        issued.every((line) => line.startsWith('proxy-0 ')),
        issued.join(', '),
      );
    } finally {
      readerPath.restore();
      await Promise.all([writer.stop(), reader?.stop()]);
      await Promise.all([writerPath.close(), readerPath.close()]);
    }
  });

  /** A namespace where proxy-0 stored a certificate (in the Secret and its files), then stopped. */
  async function storedThenStopped(): Promise<{ ns: string; serial: string }> {
    const ns = await exampleNamespace(cp());
    const first = await startReplica(cp(), ns, dir(), 'proxy-0');
    try {
      await until('proxy-0 writes', () => heldSerial(first) !== undefined, [filesWritten(first)], 20_000);
      const serial = heldSerial(first)!;
      await secretSatisfies(cp(), ns, KUBE_DOMAIN, (s) => s?.metadata.annotations?.[ANNOTATION_SERIAL] === serial);
      return { ns, serial };
    } finally {
      await first.stop();
    }
  }

  it('a writer restarted after its Secret was edited by hand restores the pair its files hold, and issues nothing', { timeout: 60_000 }, async () => {
    const { ns, serial } = await storedThenStopped();
    const path = `/api/v1/namespaces/${ns}/secrets/${KUBE_DOMAIN}`;
    const stored = (JSON.parse((await cp().adminRequest('GET', path)).body) as SecretObject).data!;
    const edit = await cp().adminRequest('PATCH', path, {
      headers: { 'content-type': 'application/merge-patch+json' },
      body: { data: { 'tls.crt': Buffer.from('garbage, not a PEM\n').toString('base64') } },
    });
    assert.equal(edit.status, 200, edit.body);

    // The same Pod again (its files kept, as an emptyDir keeps them across a container restart), with a
    // tailscaled that holds no certificate: asked, it would issue one.
    const again = await startReplica(cp(), ns, dir(), 'proxy-0', { keepFiles: true });
    try {
      await secretSatisfies(cp(), ns, KUBE_DOMAIN, (s) => s?.data?.['tls.crt'] === stored['tls.crt'] && s?.data?.['tls.key'] === stored['tls.key'], 15_000);
      assert.equal(heldSerial(again), serial);
      assert.equal(again.emulator.stats().issuancesTotal, 0, 'restored from the files, not issued again');
    } finally {
      await again.stop();
    }
  });

  it('but not over a Secret whose record names a pair stored since: a renewal the restarted Pod never saw', { timeout: 60_000 }, async () => {
    const { ns, serial } = await storedThenStopped();
    // While proxy-0 was down another replica stored a renewal (the record names it), then a hand edit took
    // its data: what proxy-0's files hold is what that renewal replaced (maybe revoked, or a key renewed away).
    const edit = await cp().adminRequest('PATCH', `/api/v1/namespaces/${ns}/secrets/${KUBE_DOMAIN}`, {
      headers: { 'content-type': 'application/merge-patch+json' },
      body: {
        metadata: { annotations: { [ANNOTATION_SERIAL]: 'A-RENEWAL-PROXY-0-NEVER-SAW' } },
        data: { 'tls.crt': Buffer.from('garbage, not a PEM\n').toString('base64') },
      },
    });
    assert.equal(edit.status, 200, edit.body);
    const again = await startReplica(cp(), ns, dir(), 'proxy-0', { keepFiles: true });
    try {
      await secretSatisfies(cp(), ns, KUBE_DOMAIN, (s) => {
        const named = s?.metadata.annotations?.[ANNOTATION_SERIAL];
        return named !== undefined && named !== 'A-RENEWAL-PROXY-0-NEVER-SAW';
      });
      const stored = JSON.parse((await cp().adminRequest('GET', `/api/v1/namespaces/${ns}/secrets/${KUBE_DOMAIN}`)).body) as SecretObject;
      assert.notEqual(stored.metadata.annotations?.[ANNOTATION_SERIAL], serial, 'the older files were not put back');
      assert.equal(again.emulator.stats().issuancesTotal, 1, 'a new certificate instead');
    } finally {
      await again.stop();
    }
  });
});
