// What the real-tier ACME Renewal Information tests read of a certshare process (harness/certshare-process.ts):
// its timing flags, the log lines of the CA's answers and of new certificates, the figures they report.
import assert from 'node:assert/strict';
import { ariCertificateId } from '../../src/core/renewal/certificate-id.ts';
import type { CertshareProcess, LogLine } from '../harness/certshare-process.ts';
import type { RealTailscaled } from '../harness/tailscale.ts';

/** What the issue asks: the CA's request acted on, the new certificate in place, within this. */
export const RENEWAL_BOUND_MS = 60_000;

/**
 * ARI at `directoryUrl` every 5 s at most (pebble's Retry-After is 6 h), debug logs (every answer of the CA);
 * after the fast tier's timing (FAST_FLAGS), which the caller puts first (the last of a flag wins). A
 * certificate is held at least 5 s before the CA's answer may order (the guard's floor).
 */
export const ariFlags = (directoryUrl: string): string[] => ['--acme-directory', directoryUrl, '--ari-interval', '5s', '--log-level', 'debug'];

/** CERTSHARE_TS_TIMINGS=1 prints the measured figures to stderr. */
export function report(figure: string): void {
  if (process.env.CERTSHARE_TS_TIMINGS === '1') process.stderr.write(`real tailscaled, ARI: ${figure}\n`);
}

/** A renewalInfo answer certshare logged (at info when the window changed, at debug when the same). */
export const isAriAnswer = (l: LogLine): boolean => typeof l.certId === 'string' && l.msg.startsWith('CA suggests renewal');
/** A new certificate stored by the writer. */
export const isStored = (l: LogLine): boolean => l.msg === 'certificate issued and stored';

/** Resolves once the writer logged `count` answers of the CA for the certificate `certPem`. */
export async function ariAnswers(certshare: CertshareProcess, certPem: string, count: number, timeoutMs = 30_000): Promise<LogLine[]> {
  const certId = await ariCertificateId(certPem);
  const answers = (): LogLine[] => certshare.logs.filter((l) => isAriAnswer(l) && l.certId === certId);
  await certshare.logged(`${count} ARI answers for ${certId}`, () => answers().length >= count, timeoutMs);
  return answers();
}

/** The window a logged answer describes (describeAriAnswer's line). */
export function loggedWindow(line: LogLine): { start: number; end: number } {
  const m = /^CA suggests renewal (\S+)\.\.(\S+),/.exec(line.msg);
  assert.ok(m, line.msg);
  return { start: Date.parse(m[1]!), end: Date.parse(m[2]!) };
}

/** The first certificate stored from log line `afterIndex` on, once there: its log line and when it arrived. */
export async function nextStored(certshare: CertshareProcess, afterIndex: number, timeoutMs: number): Promise<{ line: LogLine; at: number }> {
  const line = await certshare.logged('a new certificate stored', isStored, timeoutMs, afterIndex);
  return { line, at: performance.now() };
}

/**
 * Milliseconds from the CA's changed answer about `oldCertPem` (the first answer logged from line `from` on
 * at info: a new window) to `stored`, both by certshare's own clock: its share of a renewal the CA asked for.
 */
export async function answerToStoredMs(certshare: CertshareProcess, from: number, oldCertPem: string, stored: LogLine): Promise<number> {
  const oldId = await ariCertificateId(oldCertPem);
  const changed = certshare.logs.slice(from).find((l) => isAriAnswer(l) && l.certId === oldId && l.level === 'info');
  assert.ok(changed, `a new answer about ${oldId} logged`);
  return Date.parse(stored.time) - Date.parse(changed.time);
}

/** ACME new orders and finalized ones (tsenv's front), and certshare's CertPair calls (its attempts). */
export interface IssuanceCount {
  orders: number;
  finalizes: number;
  calls: number;
}

/** The counts before anything happened. */
export const NOTHING: IssuanceCount = { orders: 0, finalizes: 0, calls: 0 };

export async function issuanceCount(ts: RealTailscaled, certshare: CertshareProcess): Promise<IssuanceCount> {
  const [stats, metric] = await Promise.all([ts.acmeStats(), certshare.metrics()]);
  return { orders: stats.orders, finalizes: stats.finalizes, calls: metric('certshare_issuance_attempts_total') };
}

/**
 * Pebble failing an order itself, a race inside pebble seen in CI: "Cannot update challenge with status
 * valid, only status pending". tailscaled sometimes orders again inside the same call, sometimes returns it
 * to certshare as HTTP 500, and certshare calls again after its backoff: a failed attempt, not a second
 * certificate. Only this failure is excused; any other extra call still fails the tests.
 */
export function pebbleChallengeRaces(lines: ReadonlyArray<{ msg?: string | undefined; err?: unknown }>): number {
  return lines.filter((l) => l.msg === 'certificate issuance failed' && /Cannot update challenge with status valid/.test(String(l.err))).length;
}

/**
 * Exactly one issuance from `before` to `after` (both read once everything settled): one CertPair call and
 * one order finalized; one new order, or two when pebble failed the first itself and tailscaled ordered
 * again inside that one call. `pebbleRaces` (pebbleChallengeRaces) calls that pebble failed are allowed on
 * top: each is one more call and at most one more order, never one more finalized.
 */
export function assertOneIssuance(before: IssuanceCount, after: IssuanceCount, pebbleRaces = 0): void {
  const counts = `before ${JSON.stringify(before)}, after ${JSON.stringify(after)}, calls pebble failed ${pebbleRaces}`;
  assert.equal(after.calls - before.calls, 1 + pebbleRaces, `one CertPair call (and one per call pebble failed): ${counts}`);
  assert.equal(after.finalizes - before.finalizes, 1, `one order finalized: ${counts}`);
  const orders = after.orders - before.orders;
  assert.ok(orders >= 1 && orders <= 2 + pebbleRaces, `one new order (one more per pebble failure at most): ${counts}`);
}
