// ACME Renewal Information end to end with the Secret: the writer is certshare as a process in kube mode
// (--store kube against the real kube-apiserver, the example's least-privilege RBAC) beside a real
// tailscaled and pebble, trusting the ACME front through NODE_EXTRA_CA_CERTS; two readers run in-process
// (they never ask the CA nor tailscaled for a certificate). A window moved into the past and a revocation
// each give one order, and the new certificate reaches the writer's files, the Secret and both readers.
// CERTSHARE_TS_TIMINGS=1 prints the measured figures to stderr.
import assert from 'node:assert/strict';
import { X509Certificate } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { CertshareProcess } from '../harness/certshare-process.ts';
import { BUILD_AND_START_TIMEOUT_MS, useRealTailscaled, type RealTailscaled } from '../harness/tailscale.ts';
import { useControlPlane } from '../harness/use-control-plane.ts';
import {
  answerToStoredMs,
  ariAnswers,
  ariFlags,
  assertOneIssuance,
  NOTHING,
  issuanceCount,
  isStored,
  nextStored,
  pebbleChallengeRaces,
  RENEWAL_BOUND_MS,
  report,
} from '../support/ari-process.ts';
import {
  exampleNamespace,
  filesHold,
  filesWritten,
  heldSerial,
  KUBE_DOMAIN,
  KUBE_DOMAIN_TAILSCALED,
  replicaArgs,
  replicaKubeconfig,
  secretSatisfies,
  startReplicas,
  type Replica,
  type SecretObject,
} from '../support/kube.ts';
import { useTempDir } from '../support/standalone.ts';
import { until } from '../support/wait.ts';

const H = 3_600_000;

const serialOf = (pem: string): string => new X509Certificate(pem).serialNumber;

/** The serial of the certificate in the Secret, undefined when absent, empty or garbage. */
function secretSerial(secret: SecretObject | undefined): string | undefined {
  try {
    return serialOf(Buffer.from(secret?.data?.['tls.crt'] ?? '', 'base64').toString());
  } catch {
    return undefined;
  }
}

describe('ARI against a real tailscaled and pebble: the writer in kube mode, readers included', { timeout: BUILD_AND_START_TIMEOUT_MS }, () => {
  const cp = useControlPlane();
  const dir = useTempDir();
  // The example's RBAC names the domain's Secret.
  const realTailscaled = useRealTailscaled(KUBE_DOMAIN_TAILSCALED);
  let writer: CertshareProcess | undefined;
  let readers: Replica[] = [];
  let ns = '';
  const writerOut = (): string => join(dir(), 'proxy-0', 'certs');
  after(async () => {
    await Promise.all([writer?.stop(), ...readers.map((r) => r.stop())]);
  });

  const writerPair = async (): Promise<{ keyPem: string; certPem: string; serial: string }> => {
    const certPem = await readFile(join(writerOut(), KUBE_DOMAIN, 'tls.crt'), 'utf8');
    return { certPem, keyPem: await readFile(join(writerOut(), KUBE_DOMAIN, 'tls.key'), 'utf8'), serial: serialOf(certPem) };
  };
  /**
   * The writer's files once it projected the one new certificate of this step (it logs the files after the
   * Secret write): the first files written from log line `from` on.
   */
  const writerFiles = async (w: CertshareProcess, from: number): Promise<{ keyPem: string; certPem: string; serial: string; at: number }> => {
    await w.logged('certificate files written', (l) => l.msg === 'certificate files written', RENEWAL_BOUND_MS, from);
    return { ...(await writerPair()), at: performance.now() };
  };

  /** Resolves with how long after `since` (performance.now()) every reader held `serial` and had its files. */
  const readersHold = (serial: string, since: number): Promise<number> =>
    Promise.all(
      readers.map(async (r) => {
        await Promise.all([
          until(`${r.name} holds ${serial}`, () => heldSerial(r) === serial, [filesWritten(r)], RENEWAL_BOUND_MS),
          filesHold(r, serial, RENEWAL_BOUND_MS),
        ]);
        return performance.now() - since;
      }),
    ).then((delays) => Math.round(Math.max(...delays)));

  async function withDiagnostics<T>(ts: RealTailscaled, body: () => Promise<T>): Promise<T> {
    try {
      return await body();
    } catch (err) {
      process.stderr.write(`tailscaled (last lines):\n${ts.logs().tailscaled.slice(-30).join('\n')}\n`);
      process.stderr.write(`certshare writer (last lines):\n${writer?.tail(40) ?? '(not started)'}\n`);
      throw err;
    }
  }

  it('the writer issues once through the real tailscaled and shares the certificate through the Secret', async () => {
    const ts = realTailscaled();
    assert.equal(ts.domain, KUBE_DOMAIN);
    await withDiagnostics(ts, async () => {
      ns = await exampleNamespace(cp());
      const env = {
        KUBECONFIG: await replicaKubeconfig(cp(), ns, 'proxy-0'),
        POD_NAME: 'proxy-0',
        POD_NAMESPACE: ns,
        POD_IPS: '10.0.0.10',
        NODE_EXTRA_CA_CERTS: ts.acmeCaBundle,
      };
      writer = await CertshareProcess.start('proxy-0', [...replicaArgs(ts.socket, writerOut(), 'rw'), ...ariFlags(await ts.acmeDirectoryUrl())], env);
      readers = await startReplicas(cp(), ns, dir(), ['proxy-1', 'proxy-2'], { mode: 'ro' });
      const stored = await nextStored(writer, 0, 60_000);
      const serial = String(stored.line.serial);
      await secretSatisfies(cp(), ns, KUBE_DOMAIN, (s) => secretSerial(s) === serial);
      await readersHold(serial, performance.now());
      assert.equal((await writerFiles(writer, 0)).serial, serial);
      assertOneIssuance(NOTHING, await issuanceCount(ts, writer));
      for (const r of readers) assert.deepEqual(r.emulator.stats().certRequests, {}, 'readers never call CertPair');
    });
  });

  /**
   * The CA asks, through `ask`, for the writer's certificate to be replaced: one order, the new certificate in
   * the writer's files, the Secret and both readers' files within RENEWAL_BOUND_MS, and no second order while
   * the CA answers about the new certificate three times. Reported as `what`.
   */
  async function renewalAskedBy(what: string, ask: (ts: RealTailscaled, old: { keyPem: string; certPem: string }) => Promise<void>): Promise<void> {
    const ts = realTailscaled();
    const w = writer;
    assert.ok(w, 'the writer runs (the first case started it)');
    await withDiagnostics(ts, async () => {
      const old = await writerPair();
      const before = await issuanceCount(ts, w);
      const from = w.logs.length;
      const askedAt = performance.now();
      await ask(ts, old);
      const stored = await nextStored(w, from, RENEWAL_BOUND_MS);
      const serial = String(stored.line.serial);
      assert.notEqual(serial, old.serial);
      const [secretMs, readersMs] = await Promise.all([
        secretSatisfies(cp(), ns, KUBE_DOMAIN, (s) => secretSerial(s) === serial, RENEWAL_BOUND_MS).then(() => Math.round(performance.now() - askedAt)),
        readersHold(serial, askedAt),
      ]);
      const files = await writerFiles(w, from);
      assert.equal(files.serial, serial, "the writer's files");
      const writerMs = Math.round(files.at - askedAt);
      const certshareMs = await answerToStoredMs(w, from, old.certPem, stored.line);
      await ariAnswers(w, files.certPem, 3);
      const after = await issuanceCount(ts, w);
      assertOneIssuance(before, after, pebbleChallengeRaces(w.logs.slice(from)));
      assert.equal(w.logs.slice(from).filter(isStored).length, 1, 'one new certificate');
      report(
        `kube, ${what}: the new certificate in the writer's files ${writerMs} ms ` +
          `(certshare's share, from the CA's answer to the Secret written: ${certshareMs} ms), ` +
          `in the Secret ${secretMs} ms, at both readers ${readersMs} ms; ACME orders ${before.orders} -> ${after.orders}`,
      );
    });
  }

  it("a window moved into the past (pebble's /set-renewal-info/): one order, the new certificate in the Secret and at every reader", async () => {
    const now = Date.now();
    const answer = { suggestedWindow: { start: new Date(now - 2 * H).toISOString(), end: new Date(now - H).toISOString() } };
    await renewalAskedBy('window moved into the past', (ts, old) => ts.setRenewalInfo(old.certPem, JSON.stringify(answer)));
  });

  it('a revocation (ACME revokeCert signed with the certificate key): one order, the new certificate in the Secret and at every reader', async () => {
    await renewalAskedBy('revocation', (ts, old) => ts.revoke(old.keyPem + old.certPem));
  });
});
