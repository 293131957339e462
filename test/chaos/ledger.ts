// Pure analysis of the emulators' ledger: renewal windows and extra issuances (invariant 1), and
// CertPair calls made before a rate-limit retry time (invariant 6).
//
// Renewal windows (the definition the report uses). Issuances are taken in ledger time order, all
// emulators together. A certificate "covers" from its issuance until its renewal point: notAfter minus
// half its lifetime when the lifetime is under 10 days (a third otherwise), certshare's rule. The first
// issuance opens window 0. An issuance made while a certificate that opened a window is still covering
// is EXTRA (it counts in the current window); any other issuance opens the next window. So `windows`
// (windows passed after the first issuance) = non-extra issuances - 1, issuances = windows + 1 + extras,
// and the promise "one issuance per renewal window" is: no extra issuance (max 1 per window).
// A certificate that never reached the Secret (its writer died right after CertPair) still opens its
// window: issuing again inside it costs a real Let's Encrypt issuance all the same.

import { renewalTime } from '../../src/core/renewal/renewal.ts';
import type { LedgerIssuance, LedgerRequest } from '../../src/emulator/ledger.ts';

/** A ledger line as the emulator writes it (src/emulator/ledger.ts), its timestamps parsed to epoch ms. */
type Parsed<Line, Times extends keyof Line> = Omit<Line, 'kind' | Times> & Record<Times, number>;
export type Issuance = Parsed<LedgerIssuance, 'time' | 'notBefore' | 'notAfter'>;
export type CertRequest = Parsed<LedgerRequest, 'time' | 'end'>;

/** certshare's own rule (src/core/renewal/renewal.ts): the window is defined by when certshare renews. */
export function renewalPoint(c: { notBefore: number; notAfter: number }, renewFraction = 1 / 3): number {
  return renewalTime(c, { renewFraction });
}

export function parseLedgerLine(line: Record<string, unknown>): { issuance?: Issuance; request?: CertRequest } {
  const t = (v: unknown): number => (typeof v === 'string' ? Date.parse(v) : NaN);
  if (line.kind === 'request') {
    const r: CertRequest = {
      time: t(line.time),
      end: t(line.end),
      emulator: String(line.emulator),
      domain: String(line.domain),
      minValidity: String(line.minValidity ?? ''),
      outcome: String(line.outcome),
    };
    if (typeof line.retryAfterSeconds === 'number') r.retryAfterSeconds = line.retryAfterSeconds;
    if (typeof line.serial === 'string') r.serial = line.serial;
    return { request: r };
  }
  // Lines without `kind` predate it: they are issuances.
  if (line.kind === undefined || line.kind === 'issuance') {
    return {
      issuance: {
        time: t(line.time),
        emulator: String(line.emulator),
        domain: String(line.domain),
        serial: String(line.serial),
        notBefore: t(line.notBefore),
        notAfter: t(line.notAfter),
        trigger: line.trigger === 'background' ? 'background' : 'request',
      },
    };
  }
  return {};
}

export interface WindowAnalysis {
  issuances: number;
  /** Windows passed after the first issuance (summed over domains). */
  windows: number;
  maxIssuancesPerWindow: number;
  extras: Array<{ issuance: Issuance; coveredBy: Issuance; window: number }>;
  /** Issuances per window, per domain. */
  perWindow: Record<string, number[]>;
}

export function analyseWindows(all: Issuance[], renewFraction = 1 / 3): WindowAnalysis {
  const byDomain = groupBy(all, (i) => i.domain);
  const result: WindowAnalysis = { issuances: all.length, windows: 0, maxIssuancesPerWindow: 0, extras: [], perWindow: {} };
  for (const [domain, list] of byDomain) {
    const sorted = list.sort((a, b) => a.time - b.time);
    const counts: number[] = [];
    // Openers whose cover has not ended before the issuance being looked at: the rest can never cover a
    // later one (issuances come in time order), so the search stays short whatever the run's length.
    let openers: Issuance[] = [];
    for (const i of sorted) {
      openers = openers.filter((e) => i.time < Math.min(e.notAfter, renewalPoint(e, renewFraction)));
      const covering = openers.find((e) => i.time >= e.notBefore);
      if (covering) {
        counts[counts.length - 1]!++;
        result.extras.push({ issuance: i, coveredBy: covering, window: counts.length - 1 });
      } else {
        counts.push(1);
        openers.push(i);
      }
    }
    result.perWindow[domain] = counts;
    result.windows += Math.max(0, counts.length - 1);
    result.maxIssuancesPerWindow = Math.max(result.maxIssuancesPerWindow, ...counts);
  }
  return result;
}

/** A retry-not-before value seen in the Secret, and when the checker first saw it there. */
export interface RetryRecord {
  domain: string;
  observedAt: number;
  until: number;
}

export interface RateLimitFindings {
  /** Calls before a retry time that the caller knew or could read: violations. */
  violations: string[];
  /**
   * Calls before an injected 429's Retry-After by another certshare process, when that rate limit never
   * reached the Secret (its recipient died or could not write before the call): reported, not counted.
   */
  unshared: string[];
  rateLimitedAnswers: number;
}

/** A time of day to the millisecond, as the run's log writes it. */
export const iso = (t: number): string => new Date(t).toISOString().slice(11, 23);

/**
 * `instanceOf(emulator, t)` names the certshare process (replica + pid) behind an emulator at time t:
 * each replica has its own emulator. `recordsBind(call)`: whether the recorded retry times bind that call
 * (default: every call).
 */
export function checkRateLimits(
  requests: CertRequest[],
  records: RetryRecord[],
  instanceOf: (emulator: string, t: number) => string | undefined,
  toleranceMs = 20,
  recordsBind: (request: CertRequest) => boolean = () => true,
): RateLimitFindings {
  const findings: RateLimitFindings = { violations: [], unshared: [], rateLimitedAnswers: 0 };
  // Indexed by domain: a run with many domains compares each call only with its own domain's limits.
  const recordsOf = groupBy(records, (rec) => rec.domain);
  const limitsOf = groupBy(
    requests.filter((r) => r.outcome === '429' && r.retryAfterSeconds !== undefined),
    (r) => r.domain,
  );
  for (const list of limitsOf.values()) findings.rateLimitedAnswers += list.length;
  for (const r of requests) {
    const recorded = recordsBind(r) ? recordsOf.get(r.domain)?.find((rec) => rec.observedAt < r.time && r.time < rec.until - toleranceMs) : undefined;
    if (recorded) {
      findings.violations.push(
        `inv6 ${iso(r.time)} ${r.emulator} called CertPair for ${r.domain} before the Secret's retry-not-before ${iso(recorded.until)} ` +
          `(in the Secret since ${iso(recorded.observedAt)}; outcome ${r.outcome})`,
      );
      continue;
    }
    for (const q of limitsOf.get(r.domain) ?? []) {
      if (q === r) continue;
      const deadline = q.end + q.retryAfterSeconds! * 1000;
      if (!(q.end <= r.time && r.time < deadline - toleranceMs)) continue;
      const caller = instanceOf(r.emulator, r.time);
      const recipient = instanceOf(q.emulator, q.end);
      const text =
        `${iso(r.time)} ${r.emulator} (${caller ?? '?'}) called CertPair for ${r.domain} before the Retry-After of the 429 ` +
        `that ${q.emulator} (${recipient ?? '?'}) answered at ${iso(q.end)} (until ${iso(deadline)}; outcome ${r.outcome})`;
      if (caller !== undefined && caller === recipient) findings.violations.push(`inv6 ${text}`);
      else findings.unshared.push(text);
      break;
    }
  }
  return findings;
}

function groupBy<T>(items: T[], key: (item: T) => string): Map<string, T[]> {
  const groups = new Map<string, T[]>();
  for (const item of items) {
    const k = key(item);
    const list = groups.get(k);
    if (list) list.push(item);
    else groups.set(k, [item]);
  }
  return groups;
}
