// The federation home's writes as one member sees them (docs/federation-chaos.md, "A home that refuses writes"): a home
// that answers reads but fails this member's writes (its etcd out of space, an admission policy or webhook refusing,
// writes timing out) lets no takeover stand, no intent nor certificate be stored, so no one renews; and it answers, so
// the outage rules would never start. Past the safety point of a copy its holder did not renew, and a bound of failed
// writes, the member counts the home as cut off for that name (core/federation/home-verdicts.ts homeWritesRefused).
import { homeWritesRefused } from '../core/federation/home-verdicts.ts';
import type { Clock } from '../core/ports/clock.ts';

/** The Lease's key: group-wide (a domain is a DNS name, never empty). */
const LEASE = '';

export class HomeWrites {
  /** Per domain's Secret of record, and for the Lease: since when every write failed, none going through. */
  readonly #failingSince = new Map<string, number>();
  readonly #clock: Clock;
  readonly #leaseDurationMs: number;

  constructor(clock: Clock, leaseDurationMs: number) {
    this.#clock = clock;
    this.#leaseDurationMs = leaseDurationMs;
  }

  /** A write of the home Lease (`domain` undefined) or of `domain`'s Secret of record: stored (or lost to a newer version), or `failed`. */
  wrote(domain: string | undefined, failed: boolean): void {
    const key = domain ?? LEASE;
    if (!failed) this.#failingSince.delete(key);
    else if (!this.#failingSince.has(key)) this.#failingSince.set(key, this.#clock.now());
  }

  /**
   * Whether the home counts as cut off for `domain`, whose copy's holder failed it over `window` (home-writer-judge.ts
   * failedWindow; undefined: it did not): its Secret's writes, or the Lease's, failed long enough (homeWritesRefused).
   */
  refused(domain: string, window: { since: number; exit: number } | undefined): boolean {
    if (!window) return false;
    const failing = [this.#failingSince.get(domain), this.#failingSince.get(LEASE)].filter((at) => at !== undefined);
    const failingSince = failing.length ? Math.min(...failing) : undefined;
    return homeWritesRefused({ failingSince, ...window, now: this.#clock.now(), leaseDurationMs: this.#leaseDurationMs });
  }
}
