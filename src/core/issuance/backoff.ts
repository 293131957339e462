import type { ClassifiedFailure, FailureKind } from './failure.ts';

export interface BackoffPolicy {
  /** First retry after an error answer (default 1m), doubling up to retryCapMs (default 24h). */
  firstRetryMs: number;
  retryCapMs: number;
  /** First wait after a rate limit that carried no Retry-After (default 1h), doubling up to retryCapMs. */
  rateLimitFirstRetryMs: number;
}

/**
 * Consecutive failures per kind. Kinds escalate independently so that a flaky socket does not push
 * the rate-limit backoff up, and a rate limit is not forgotten because a timeout came in between.
 */
export class FailureStreak {
  #counts = new Map<FailureKind, number>();

  record(kind: FailureKind): number {
    const next = (this.#counts.get(kind) ?? 0) + 1;
    this.#counts.set(kind, next);
    return next;
  }

  reset(): void {
    this.#counts.clear();
  }

  get total(): number {
    let sum = 0;
    for (const n of this.#counts.values()) sum += n;
    return sum;
  }
}

/** The wait after the `attempt`-th (1-based) consecutive failure: `first`, doubling up to `cap`. */
export function doubling(first: number, attempt: number, cap: number): number {
  return Math.min(cap, first * 2 ** Math.min(attempt - 1, 40));
}

/**
 * `ms` spread uniformly over ±`spread` (a fraction), so that replicas that failed together do not retry
 * together. `random` returns [0, 1) (injectable for tests).
 */
export function jitter(ms: number, spread = 0.25, random: () => number = Math.random): number {
  return ms * (1 - spread + 2 * spread * random());
}

/** The wait after a failed store call (read, restore, a recorded answer): the transient pace, escalating. */
export function storeRetryDelay(streak: FailureStreak, policy: BackoffPolicy): number {
  return retryDelay({ kind: 'transient', message: '' }, streak.record('transient'), policy);
}

/** How long to wait before the next CertPair call after the `attempt`-th consecutive failure of this kind. */
export function retryDelay(failure: ClassifiedFailure, attempt: number, policy: BackoffPolicy): number {
  switch (failure.kind) {
    case 'rate_limited':
      // An explicit Retry-After is exact: earlier is refused again, later wastes the refill.
      if (failure.retryAfterMs !== undefined) return Math.max(failure.retryAfterMs, 0);
      return doubling(policy.rateLimitFirstRetryMs, attempt, policy.retryCapMs);
    case 'transient':
      // Nothing reached the CA: retry at the first-retry pace, escalating a little, never for long.
      return doubling(policy.firstRetryMs, attempt, Math.min(policy.retryCapMs, policy.firstRetryMs * 8));
    case 'invalid_domain':
    case 'rejected':
    case 'too_short':
    case 'error':
      return doubling(policy.firstRetryMs, attempt, policy.retryCapMs);
  }
}
