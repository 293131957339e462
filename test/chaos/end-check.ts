// The end-of-run comparison (invariant 4 at the end) without racing a renewal: the writers keep renewing
// until the processes stop, so a certificate can be stored in the Secret a few milliseconds before the
// comparison. Such a certificate gets the time to converge that this run measured itself (its convergence
// p99 in quiet periods, with a margin, bounded by the quiet-period grace), and only then is it judged.
import type { Checker, CheckerResult } from './checker.ts';

/**
 * The p99 leaves one certificate in a hundred slower than it; twice the p99 covers that tail on a loaded
 * machine, and a renewal stored at the very end is no different from one stored in a quiet period.
 */
export const END_SETTLE_FACTOR = 2;

/** The allowance of a certificate stored at the end: measured (factor x quiet p99), never above the bound. */
export function endSettleAllowanceMs(quiet: { samples: number; p99Ms: number }, boundMs: number): number {
  if (quiet.samples === 0) return boundMs;
  return Math.min(boundMs, Math.max(1, Math.ceil(quiet.p99Ms * END_SETTLE_FACTOR)));
}

export interface EndCheckOptions {
  /** The most a certificate stored at the end is given (the quiet-period grace). */
  boundMs: number;
  now: () => number;
  sleep: (ms: number) => Promise<void>;
  /** How often the convergence is looked at while waiting. */
  pollMs?: number;
}

export interface EndCheck {
  result: CheckerResult;
  allowanceMs: number;
  /** How long the comparison waited for certificates stored in the last moments. */
  waitedMs: number;
}

/**
 * Waits until every replica holds every Secret's certificate, or until each certificate a replica lacks
 * has had its allowance, then judges. The wait is bounded: by the allowance past the latest store, and
 * (should renewals keep landing) by the bound plus the allowance in all; a certificate stored during the
 * last allowance is then judged against what the Secret held before it (see Checker.finish).
 */
export async function judgeAtEnd(checker: Checker, options: EndCheckOptions): Promise<EndCheck> {
  const allowanceMs = endSettleAllowanceMs(checker.quietConvergence(), options.boundMs);
  const started = options.now();
  const capAt = started + options.boundMs + allowanceMs;
  for (;;) {
    const by = checker.settledBy(allowanceMs);
    const t = options.now();
    if (by === undefined || t >= by || t >= capAt) break;
    await options.sleep(Math.min(options.pollMs ?? 20, by - t, capAt - t));
  }
  const at = options.now();
  return { result: checker.finish(at, { mustHold: true, settleMs: allowanceMs }), allowanceMs, waitedMs: at - started };
}
