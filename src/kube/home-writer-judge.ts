// The federation home's writer judged by its results (docs/federation.md, "A home writer judged by its results"): per
// domain, whether the home Lease's holder let the group's newest copy pass its safety point unrenewed while the home
// answers (then this member takes the Lease over, whatever it says: lease-elector.ts failedHolder), and the home's
// records as believed in such a window (home-verdicts.ts boundFailedWindow). Whoever holds the home credential (every
// member's sidecars, and each member namespace's `edit` tenants) can write the Lease and those records as a writer would.
import { boundFailedWindow, homeWriterVerdict } from '../core/federation/home-verdicts.ts';
import { iso, type Clock } from '../core/ports/clock.ts';
import type { Logger } from '../core/ports/logger.ts';
import type { StoreRead, StoredCert } from '../core/ports/store.ts';
import type { RenewalPolicy } from '../core/renewal/renewal.ts';
import { LEASE_DURATION_FACTOR, OutOfBoundsLog, type OutOfBoundsReport } from '../core/values/untrusted-values.ts';

interface JudgeOptions {
  clock: Clock;
  logger: Logger;
  renewal: Pick<RenewalPolicy, 'renewFraction'>;
  readinessLeadMs: number;
  /** The home Lease's duration (--federation-lease-duration). */
  leaseDurationMs: number;
  /** How long an announced CertPair call blocks the others (issuance-policy.ts intentTtl). */
  intentTtlMs: number;
  /** The home's records ignored in a failed window: counted and told. */
  onOutOfBounds?: OutOfBoundsReport | undefined;
}

/** The member's side of the home Lease: a look at it now. */
interface HomeLease {
  look(): void;
}

export class HomeWriterJudge {
  readonly #o: JudgeOptions;
  /**
   * Domains whose newest copy (`serial`) passed its safety point unrenewed while the home answers: `reason`, for the
   * takeover's log line; `judgedAt`, when this member first judged so; `busyUntil`, the end of the call under way that
   * the home's last read announced, as believed (boundFailedWindow): no takeover before it; `since` and `exit`, the
   * copy's safety point and readiness exit.
   */
  readonly #failed = new Map<string, { reason: string; serial: string; judgedAt: number; busyUntil: number | undefined; since: number; exit: number }>();
  readonly #outOfBounds: OutOfBoundsLog;

  constructor(options: JudgeOptions) {
    this.#o = options;
    this.#outOfBounds = new OutOfBoundsLog(options.logger, (where, value) => options.onOutOfBounds?.(where, value));
  }

  /**
   * Why the holder has failed the group (the first such domain's reason), or undefined: the elector's failedHolder. A
   * domain whose believed call under way has not ended is not one: taking the Lease from a member whose call runs, the
   * taker (and the next, each taking it from the last) would call again.
   */
  failedHolder(): string | undefined {
    const now = this.#o.clock.now();
    for (const failed of this.#failed.values()) if (failed.busyUntil === undefined || now >= failed.busyUntil) return failed.reason;
    return undefined;
  }

  /** The safety point and readiness exit of `domain`'s copy its holder let pass unrenewed, if it did (homeWritesRefused). */
  failedWindow(domain: string): { since: number; exit: number } | undefined {
    return this.#failed.get(domain);
  }

  /** The home cannot be reached for `domain`: the outage rules answer (break-glass), not a takeover. */
  forget(domain: string): void {
    this.#failed.delete(domain);
  }

  /**
   * The home answered `homeRead` (the member's own Secret `localRead`, and its last copy, valid or expired): whether the
   * holder renewed the newest copy by its safety point. Newly failed, the Lease is looked at at once (`lease.look`).
   */
  judge(domain: string, reads: { home: StoreRead; local: StoreRead; localCopy: StoredCert | undefined }, lease: HomeLease | undefined): void {
    const { clock, renewal, readinessLeadMs } = this.#o;
    const now = clock.now();
    const validity = (cert: StoredCert | undefined) => cert && { ...cert.info, obtainedAt: cert.obtainedAt };
    const expired = (read: StoreRead) => (read.state === 'unusable' ? read.expired : undefined);
    const copies = [bestValid(reads.home, now), bestValid(reads.local, now), expired(reads.home), reads.localCopy].map(validity);
    const [a, b] = [reads.home.pending, reads.local.pending];
    const pending = a && b ? (a.info.notAfter >= b.info.notAfter ? a : b) : (a ?? b);
    const verdict = homeWriterVerdict({ copies, pending: validity(pending), now, policy: renewal, readinessLeadMs });
    if (!verdict.failed) {
      this.#failed.delete(domain);
      return;
    }
    const known = this.#failed.get(domain);
    const reason = `${domain}: its newest copy ${verdict.serial} passed its safety point ${iso(verdict.since)} with no renewal at the home`;
    const { since, exit } = verdict;
    const failed = known?.serial === verdict.serial ? known : { reason, serial: verdict.serial, judgedAt: now, busyUntil: undefined, since, exit };
    // Before the look: the elector may read failedHolder before this read's records are bounded for the loop.
    failed.busyUntil = this.#window(failed, reads.home).busyUntil;
    this.#failed.set(domain, failed);
    if (!known) lease?.look();
  }

  #window(failed: { judgedAt: number }, read: StoreRead): ReturnType<typeof boundFailedWindow> {
    const leaseBoundMs = LEASE_DURATION_FACTOR * this.#o.leaseDurationMs;
    return boundFailedWindow(read.coordination ?? {}, { since: failed.judgedAt, leaseBoundMs, intentTtlMs: this.#o.intentTtlMs });
  }

  /** The home's read with its records bounded in a failed window (boundFailedWindow); what it ignored, counted and told. */
  bounded(domain: string, read: StoreRead): StoreRead {
    const failed = this.#failed.get(domain);
    if (!failed) return read;
    const { coordination, refused, busyUntil } = this.#window(failed, read);
    failed.busyUntil = busyUntil;
    this.#outOfBounds.read(`the federation home's record of ${domain}`, refused);
    return refused.length ? { ...read, coordination } : read;
  }
}

/** The newest valid pair a read offers (its own, or the last valid one its store saw). */
export function bestValid(read: StoreRead, now: number): StoredCert | undefined {
  const own = read.state === 'valid' ? read.cert : undefined;
  const last = read.lastValid && now < read.lastValid.info.notAfter ? read.lastValid : undefined;
  if (!own) return last;
  return last && last.info.notAfter > own.info.notAfter ? last : own;
}
