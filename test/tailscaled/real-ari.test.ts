// ACME Renewal Information end to end on the real tier: certshare as a process of its own (the CA's TLS
// trusted through NODE_EXTRA_CA_CERTS, as a private ACME CA is), a real tailscaled, pebble 2.10 behind
// tsenv's ACME front (test/harness/tailscale.ts). The CA's word comes from pebble itself: its default
// window, a window set through its management endpoint (/set-renewal-info/), and its answer for a
// certificate revoked with an ACME revokeCert signed with the certificate's own key.
// CERTSHARE_TS_TIMINGS=1 prints the measured figures to stderr.
import assert from 'node:assert/strict';
import { X509Certificate } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { ariCertificateId } from '../../src/core/renewal/certificate-id.ts';
import type { AttemptResult } from '../../src/core/ports/observer.ts';
import { CertshareProcess } from '../harness/certshare-process.ts';
import { BUILD_AND_START_TIMEOUT_MS, useRealTailscaled, type RealTailscaled } from '../harness/tailscale.ts';
import {
  answerToStoredMs,
  ariAnswers,
  ariFlags,
  assertOneIssuance,
  NOTHING,
  isAriAnswer,
  issuanceCount,
  isStored,
  loggedWindow,
  nextStored,
  pebbleChallengeRaces,
  RENEWAL_BOUND_MS,
  report,
  type IssuanceCount,
} from '../support/ari-process.ts';
import { FAST_FLAGS, useTempDir } from '../support/standalone.ts';

const H = 3_600_000;
/** The `result` label of certshare_issuance_attempts_total (core/ports/observer.ts AttemptResult). */
const ATTEMPT_RESULTS: readonly AttemptResult[] = ['success', 'unchanged', 'rate_limited', 'error', 'rejected', 'too_short'];

async function pairOnDisk(certDir: string, domain: string): Promise<{ keyPem: string; certPem: string; serial: string }> {
  const certPem = await readFile(join(certDir, domain, 'tls.crt'), 'utf8');
  const keyPem = await readFile(join(certDir, domain, 'tls.key'), 'utf8');
  return { keyPem, certPem, serial: new X509Certificate(certPem).serialNumber };
}

/** certshare standalone for `ts`'s domain, a directory store, ARI at tsenv's ACME front; `trusted`: NODE_EXTRA_CA_CERTS names its CA. */
async function startStandalone(ts: RealTailscaled, name: string, certDir: string, trusted: boolean): Promise<CertshareProcess> {
  const args = ['--localapi', ts.socket, '--domain', ts.domain, '--store', `dir:${certDir}`, ...FAST_FLAGS, ...ariFlags(await ts.acmeDirectoryUrl())];
  return CertshareProcess.start(name, args, trusted ? { NODE_EXTRA_CA_CERTS: ts.acmeCaBundle } : {});
}

async function withDiagnostics<T>(ts: RealTailscaled, certshare: () => CertshareProcess | undefined, body: () => Promise<T>): Promise<T> {
  try {
    return await body();
  } catch (err) {
    process.stderr.write(`tailscaled (last lines):\n${ts.logs().tailscaled.slice(-30).join('\n')}\n`);
    process.stderr.write(`certshare (last lines):\n${certshare()?.tail(40) ?? '(not started)'}\n`);
    throw err;
  }
}

describe('ARI against a real tailscaled and pebble: certshare standalone, as a process', { timeout: BUILD_AND_START_TIMEOUT_MS }, () => {
  const dir = useTempDir();
  const realTailscaled = useRealTailscaled({ certDomainsAtStart: true });
  let certshare: CertshareProcess | undefined;
  const certDir = (): string => join(dir(), 'certs');
  after(() => certshare?.stop());

  /**
   * After the CA asked (at `askedAt`) for `old` to be replaced: the new certificate stored and on disk (what
   * tailscaled holds), one order, and no second one while the CA answers about the new certificate three
   * times. Returns the milliseconds from the CA's change to the new certificate on disk.
   */
  async function exactlyOneRenewal(
    ts: RealTailscaled,
    cs: CertshareProcess,
    oldPair: { serial: string; certPem: string },
    from: number,
    askedAt: number,
    before: IssuanceCount,
  ): Promise<string> {
    const old = oldPair.serial;
    const stored = await nextStored(cs, from, RENEWAL_BOUND_MS);
    const tookMs = Math.round(stored.at - askedAt);
    const disk = await pairOnDisk(certDir(), ts.domain);
    assert.equal(disk.serial, stored.line.serial, 'the stored certificate is the one on disk');
    assert.notEqual(disk.serial, old);
    const certshareMs = await answerToStoredMs(cs, from, oldPair.certPem, stored.line);
    const asked = cs.logs.slice(from).filter((l) => l.msg.startsWith('the CA asked for this certificate to be replaced'));
    // One attempt, plus one after each call pebble itself failed (pebbleChallengeRaces), all of the old certificate.
    const races = pebbleChallengeRaces(cs.logs.slice(from));
    assert.deepEqual(
      asked.map((l) => [l.reason, l.serial]),
      Array.from({ length: 1 + races }, () => ['ca_requested_now', old]),
      'one renewal, the CA asked for it, of the old certificate',
    );
    const real = await ts.localApi(`/localapi/v0/cert/${ts.domain}?type=pair&min_validity=0s`);
    assert.ok(real.body.includes(disk.certPem.trim()), "the certificate on disk is tailscaled's");
    // The new certificate's own window (pebble's default: 2/3 of 90 days) asked three times: no second order.
    await ariAnswers(cs, disk.certPem, 3);
    const after = await issuanceCount(ts, cs);
    assertOneIssuance(before, after, races);
    assert.equal(cs.logs.slice(from).filter(isStored).length, 1, 'one new certificate');
    return `${tookMs} ms (certshare's share, from the CA's answer: ${certshareMs} ms), ACME orders ${before.orders} -> ${after.orders}`;
  }

  it("reads pebble's default window through NODE_EXTRA_CA_CERTS (the 2/3 point +/- 24 h) and orders nothing more", async () => {
    const ts = realTailscaled();
    await withDiagnostics(
      ts,
      () => certshare,
      async () => {
        certshare = await startStandalone(ts, 'standalone', certDir(), true);
        await nextStored(certshare, 0, 60_000);
        const { certPem } = await pairOnDisk(certDir(), ts.domain);
        const answers = await ariAnswers(certshare, certPem, 3);
        const cert = new X509Certificate(certPem);
        const notBefore = Date.parse(cert.validFrom);
        const notAfter = Date.parse(cert.validTo);
        // pebble: validity = notAfter + 1 s - notBefore; ideal = notAfter - validity/3; the window +/- 24 h.
        const ideal = notAfter - (notAfter + 1000 - notBefore) / 3;
        const window = loggedWindow(answers[0]!);
        assert.ok(Math.abs(window.start - (ideal - 24 * H)) < 2000, `window start ${new Date(window.start).toISOString()}`);
        assert.ok(Math.abs(window.end - (ideal + 24 * H)) < 2000, `window end ${new Date(window.end).toISOString()}`);
        assert.ok(
          answers.every((l) => l.msg === answers[0]!.msg),
          'the same window, the same time chosen in it',
        );
        const metric = await certshare.metrics();
        assert.ok(metric('certshare_ari_checks_total', { outcome: 'ok' }) >= answers.length);
        assert.equal(metric('certshare_ari_checks_total'), metric('certshare_ari_checks_total', { outcome: 'ok' }), 'no failed check');
        assertOneIssuance(NOTHING, await issuanceCount(ts, certshare)); // the first issuance only
      },
    );
  });

  /**
   * The CA asks, through `ask`, for the certificate on disk to be replaced: exactly one renewal follows
   * (exactlyOneRenewal), reported as `what`. Returns the old pair and the first log line after the ask.
   */
  async function renewalAskedBy(what: string, ask: (ts: RealTailscaled, old: { keyPem: string; certPem: string }) => Promise<void>) {
    const ts = realTailscaled();
    const cs = certshare;
    assert.ok(cs, 'certshare runs (the first case started it)');
    return withDiagnostics(
      ts,
      () => cs,
      async () => {
        const old = await pairOnDisk(certDir(), ts.domain);
        const before = await issuanceCount(ts, cs);
        const from = cs.logs.length;
        const askedAt = performance.now();
        await ask(ts, old);
        report(`${what} to the new certificate on disk: ${await exactlyOneRenewal(ts, cs, old, from, askedAt, before)}`);
        return { cs, old, from };
      },
    );
  }

  it("a window moved into the past (pebble's /set-renewal-info/) gives exactly one order, the new certificate on disk", async () => {
    const now = Date.now();
    const answer = {
      suggestedWindow: { start: new Date(now - 2 * H).toISOString(), end: new Date(now - H).toISOString() },
      explanationURL: 'https://ca.example/incident-2026-11',
    };
    const { cs, from } = await renewalAskedBy('window moved into the past', (ts, old) => ts.setRenewalInfo(old.certPem, JSON.stringify(answer)));
    assert.ok(
      cs.logs.slice(from).some((l) => isAriAnswer(l) && l.msg.includes(answer.explanationURL)),
      "the CA's explanation logged",
    );
    assert.equal((await cs.metrics())('certshare_issuance_attempts_total', { reason: 'ca_requested_now', result: 'success' }), 1);
  });

  it('a revocation (ACME revokeCert signed with the certificate key) gives exactly one order, the new certificate on disk', async () => {
    const { cs, old, from } = await renewalAskedBy('revocation', (ts, pair) => ts.revoke(pair.keyPem + pair.certPem));
    // pebble's answer for a revoked certificate: a one-second window an hour ago.
    const oldId = await ariCertificateId(old.certPem);
    const revokedAnswer = cs.logs.slice(from).find((l) => isAriAnswer(l) && l.certId === oldId);
    assert.ok(revokedAnswer);
    const window = loggedWindow(revokedAnswer);
    assert.equal(window.end - window.start, 1000);
    assert.ok(window.end < Date.now() - H + 60_000);
    assert.equal((await cs.metrics())('certshare_issuance_attempts_total', { reason: 'ca_requested_now', result: 'success' }), 2);
  });

  it('does not trust the private CA without NODE_EXTRA_CA_CERTS: the check fails, counted, and orders nothing', async () => {
    const ts = realTailscaled();
    let untrusting: CertshareProcess | undefined;
    await withDiagnostics(
      ts,
      () => untrusting,
      async () => {
        const ordersBefore = (await ts.acmeStats()).orders;
        untrusting = await startStandalone(ts, 'untrusting', join(dir(), 'untrusting'), false);
        try {
          const failed = await untrusting.logged('a failed ARI check', (l) => l.code === 'CERTSHARE_ARI_UNAVAILABLE');
          assert.match(String(failed.err), /certificate/);
          const metric = await untrusting.metrics();
          assert.ok(metric('certshare_ari_checks_total', { outcome: 'unavailable' }) >= 1);
          assert.equal(metric('certshare_ari_checks_total', { outcome: 'ok' }), 0);
          // It took tailscaled's cached certificate (valid, not due): no order.
          assert.equal((await ts.acmeStats()).orders, ordersBefore);
        } finally {
          await untrusting.stop();
        }
      },
    );
  });
});

describe("ARI against a real tailscaled and pebble: pebble's default window of short certificates", { timeout: BUILD_AND_START_TIMEOUT_MS }, () => {
  const dir = useTempDir();
  // 30 s certificates: pebble's window (the 2/3 point +/- 24 h) is clamped to the whole lifetime, so the
  // time chosen in it often comes before the expiry rule's (half the lifetime, 15 s).
  const VALIDITY_S = 30;
  const realTailscaled = useRealTailscaled({ certDomainsAtStart: true, certValidity: `${VALIDITY_S}s` });

  it('renews each certificate at most once: one order per certificate, whoever asked', async () => {
    const ts = realTailscaled();
    let cs: CertshareProcess | undefined;
    await withDiagnostics(
      ts,
      () => cs,
      async () => {
        const certDir = join(dir(), 'certs');
        cs = await startStandalone(ts, 'short', certDir, true);
        const c = cs;
        // The first certificate and three renewals.
        await c.logged('four certificates stored', () => c.logs.filter(isStored).length >= 4, 4 * VALIDITY_S * 1000);
        const metric = await c.metrics();
        const attempts = (labels: Record<string, string>): number => metric('certshare_issuance_attempts_total', labels);
        const renewals = (reason: string): number => attempts({ reason, result: 'success' });
        const reasons = { ca: renewals('ca_requested') + renewals('ca_requested_now'), expiry: renewals('expiry') };
        const succeeded = attempts({ result: 'success' });
        const results = Object.fromEntries(ATTEMPT_RESULTS.map((result) => [result, attempts({ result })]));
        // The next renewal is at least the 5 s hold away: stopping now leaves no order under way.
        await c.stop();
        const stored = c.logs.filter(isStored);
        // A call pebble failed itself (pebbleChallengeRaces) is retried after the backoff: one attempt more.
        const races = pebbleChallengeRaces(c.logs);
        const serials = stored.map((l) => String(l.serial));
        assert.equal(new Set(serials).size, serials.length, 'each certificate stored is a new one');
        const stats = await ts.acmeStats();
        const renewalsBy = `renewals asked by the CA ${reasons.ca}, by expiry ${reasons.expiry}`;
        report(`${VALIDITY_S}s certificates, pebble's default window: ${stored.length} certificates, ${stats.orders} orders; ${renewalsBy}`);
        const counts = `${JSON.stringify({ reasons, results, races })}`;
        assert.equal(reasons.ca + reasons.expiry, stored.length - 1, `one successful attempt per renewal: ${counts}`);
        const failed = ATTEMPT_RESULTS.filter((r) => r !== 'success').reduce((sum, r) => sum + results[r]!, 0);
        assert.ok(failed <= races, `every attempt that gave no certificate was one pebble failed itself: ${counts}`);
        assert.equal(succeeded, stored.length, 'every attempt gave a new certificate');
        assert.equal(stats.finalizes, stored.length, 'one finalized order per certificate: no certificate replaced twice');
        // pebble now and then fails an order itself (see real-tailscaled.test.ts): tailscaled's retry is a second order.
        assert.ok(stats.orders <= stored.length + 1 + races, `${stats.orders} orders for ${stored.length} certificates, ${races} failed by pebble`);
        const answered = c.logs.filter(isAriAnswer);
        assert.ok(answered.length >= stored.length, `the CA was asked about each certificate (${answered.length} answers)`);
        for (const line of answered) {
          const w = loggedWindow(line);
          // Clamped to the lifetime: a window as long as the certificate (pebble adds a second).
          assert.ok(w.end - w.start <= VALIDITY_S * 1000 + 1000, line.msg);
        }
      },
    );
  });
});
