import type { BackoffPolicy } from './backoff.ts';
import { FailureStreak, retryDelay } from './backoff.ts';
import { isCurrentlyValid, validateCertPair } from './certificate.ts';
import type { Clock } from './clock.ts';
import { CertshareError, errorMessage } from './errors.ts';
import { classifyIssuanceFailure } from './failure.ts';
import { LocalApiError, type LocalApi } from './localapi.ts';
import type { Logger } from './logger.ts';
import type { LoopObserver } from './observer.ts';
import type { RenewalPolicy } from './renewal.ts';
import { isRenewalDue, minValidityFor, nextCheckTime } from './renewal.ts';
import type { CertStore, IssuanceRole, StoreRead, StoredCert } from './store.ts';

export interface DomainAvailability {
  /** Resolves once tailscaled lists the domain among its cert domains. */
  waitFor(domain: string, signal: AbortSignal): Promise<void>;
}

export interface CertLoopDeps {
  localApi: Pick<LocalApi, 'certPair'>;
  store: CertStore;
  role: IssuanceRole;
  availability: DomainAvailability;
  clock: Clock;
  renewal: RenewalPolicy;
  backoff: BackoffPolicy;
  observer: Required<LoopObserver>;
  logger: Logger;
  /** How long another writer's announced CertPair call blocks ours (its timeout plus a margin). */
  intentTtlMs: number;
}

function isConflict(err: unknown): boolean {
  return err instanceof CertshareError && err.code === 'CERTSHARE_STORE_CONFLICT';
}

/**
 * One domain's issuance state machine. Each turn reads the store, keeps the best valid certificate it
 * has seen, and calls CertPair only when this replica is the writer, renewal is due and no backoff or
 * rate limit is pending. Turns are sequential, so there is never more than one CertPair in flight.
 */
export class CertLoop {
  readonly domain: string;
  readonly #deps: CertLoopDeps;
  readonly #log: Logger;
  #best: StoredCert | undefined;
  #failures = new FailureStreak();
  #storeFailures = new FailureStreak();
  #retryAt = 0;
  #lastUnusable: string | undefined;
  #wake: AbortController = new AbortController();

  constructor(domain: string, deps: CertLoopDeps) {
    this.domain = domain;
    this.#deps = deps;
    this.#log = deps.logger.child({ domain });
  }

  /** The best valid certificate this loop knows, if any. */
  get current(): StoredCert | undefined {
    return this.#best;
  }

  /** Cuts the current wait short: the store changed, the role changed, or a test wants a turn. */
  wake(): void {
    this.#wake.abort();
  }

  async run(signal: AbortSignal): Promise<void> {
    const { store, role, observer } = this.#deps;
    const unsubscribe = [store.watch?.(this.domain, () => this.wake()), role.onChange?.(() => this.wake())];
    try {
      while (!signal.aborted) {
        const waitMs = await this.turn(signal);
        await this.#pause(waitMs, signal);
      }
    } catch (err) {
      if (!signal.aborted) throw err;
    } finally {
      for (const off of unsubscribe) off?.();
      observer.stopped(this.domain);
    }
  }

  /** One decision; returns how long to wait before the next. Exposed for step-by-step tests. */
  async turn(signal: AbortSignal): Promise<number> {
    const { store, role, clock, renewal, observer } = this.#deps;
    let read: StoreRead;
    try {
      read = await store.load(this.domain, signal);
      this.#storeFailures.reset();
    } catch (err) {
      if (signal.aborted) throw err;
      // Not knowing what is stored is never a reason to issue: keep serving what we have and retry.
      const message = `store ${store.kind} unreadable: ${errorMessage(err)}`;
      this.#log.warn({ code: 'CERTSHARE_STORE_UNAVAILABLE', err: errorMessage(err) }, 'certificate store unreadable');
      observer.problem(this.domain, message);
      this.#dropIfExpired();
      return retryDelay({ kind: 'transient', message }, this.#storeFailures.record('transient'), this.#deps.backoff);
    }

    if (read.state === 'valid') this.#consider(read.cert);
    const unusable = read.state === 'unusable' ? read.reason : undefined;
    if (unusable && unusable !== this.#lastUnusable) this.#log.warn({ reason: unusable }, 'stored certificate unusable');
    this.#lastUnusable = unusable;
    this.#dropIfExpired();
    const now = clock.now();
    const writer = role.canIssue(this.domain);

    if (writer && this.#best && !storeHolds(read, this.#best)) {
      // Deleted, emptied, garbage or older in the store: put back the certificate we hold; no issuance.
      try {
        await store.save(this.domain, this.#best, signal);
        this.#log.info({ serial: this.#best.info.serial, was: read.state }, 'restored certificate to the store');
        return 0;
      } catch (err) {
        if (signal.aborted) throw err;
        if (isConflict(err)) return 0;
        this.#log.warn({ err: errorMessage(err) }, 'could not restore certificate to the store');
        return retryDelay({ kind: 'transient', message: '' }, this.#storeFailures.record('transient'), this.#deps.backoff);
      }
    }

    if (this.#best && !isRenewalDue(this.#best.info, now, renewal)) {
      observer.problem(this.domain, undefined);
      const at = nextCheckTime(this.#best.info, now, renewal);
      observer.planned(this.domain, at, 0);
      return at - now;
    }
    if (!writer) {
      // Readers wait for the writer's update: the store's watch wakes them. As a safety net against a
      // watch that stalled or died silently, a reader without a certificate that is valid and not due
      // looks again every first-retry interval.
      if (!this.#best) observer.problem(this.domain, 'waiting for the writer to store a certificate');
      return Math.min(renewal.checkIntervalMs, this.#deps.backoff.firstRetryMs);
    }
    const coordination = read.coordination ?? {};
    if (coordination.retryNotBefore !== undefined && coordination.retryNotBefore > this.#retryAt) {
      // A rate limit recorded by any replica, or by this one before a restart, holds for everyone.
      this.#retryAt = coordination.retryNotBefore;
      observer.planned(this.domain, this.#retryAt, this.#retryAt - now);
      observer.problem(this.domain, `rate limited until ${new Date(this.#retryAt).toISOString()}`);
    }
    if (now < this.#retryAt) return this.#retryAt - now;
    const intent = coordination.intent;
    if (intent && intent.holder !== role.identity && now < intent.at + this.#deps.intentTtlMs) {
      // Another writer is mid-issuance: its result lands in the store (the watch wakes us) or its intent lapses.
      this.#log.info({ holder: intent.holder }, 'another writer is issuing; waiting');
      return intent.at + this.#deps.intentTtlMs - now;
    }
    await this.#deps.availability.waitFor(this.domain, signal);
    if (store.recordIntent) {
      try {
        await store.recordIntent(this.domain, role.identity, clock.now(), signal);
      } catch (err) {
        if (signal.aborted) throw err;
        if (isConflict(err)) return 0;
        this.#log.warn({ err: errorMessage(err) }, 'could not record the issuance intent; not issuing');
        observer.problem(this.domain, `cannot record the issuance intent: ${errorMessage(err)}`);
        return retryDelay({ kind: 'transient', message: '' }, this.#storeFailures.record('transient'), this.#deps.backoff);
      }
      // Leadership may have moved while we wrote: never call CertPair without it.
      if (!role.canIssue(this.domain)) return 0;
    }
    return this.#issue(signal);
  }

  async #issue(signal: AbortSignal): Promise<number> {
    const { localApi, store, clock, renewal, backoff, observer } = this.#deps;
    const previous = this.#best;
    try {
      const pair = await localApi.certPair(this.domain, {
        minValidityMs: minValidityFor(previous?.info, renewal),
        signal,
      });
      const info = validateCertPair(pair, this.domain, clock.now());
      if (previous && info.serial === previous.info.serial) {
        if (isRenewalDue(info, clock.now(), renewal)) {
          throw new CertshareError('CERTSHARE_CERT_STALE', `tailscaled returned the certificate due for renewal (serial ${info.serial})`);
        }
        observer.attempt(this.domain, 'unchanged');
      } else {
        if (previous && info.notAfter < previous.info.notAfter) {
          throw new CertshareError('CERTSHARE_CERT_STALE', `new certificate expires before the current one (${new Date(info.notAfter).toISOString()})`);
        }
        const cert = { pair, info };
        try {
          await store.save(this.domain, cert, signal);
        } finally {
          // Held even when the save failed: the next turn restores it to the store instead of issuing again.
          this.#consider(cert);
        }
        this.#log.info({ serial: info.serial, notAfter: new Date(info.notAfter).toISOString() }, 'certificate issued and stored');
        observer.attempt(this.domain, 'success');
      }
      this.#failures.reset();
      this.#retryAt = 0;
      observer.problem(this.domain, undefined);
      const now = clock.now();
      const at = nextCheckTime(this.#best!.info, now, renewal);
      observer.planned(this.domain, at, 0);
      return Math.max(0, at - now);
    } catch (err) {
      if (signal.aborted) throw err;
      if (isConflict(err)) return 0;
      const failure = classifyIssuanceFailure(err);
      const delay = retryDelay(failure, this.#failures.record(failure.kind), backoff);
      const now = clock.now();
      this.#retryAt = now + delay;
      const result = failure.kind === 'rate_limited' ? 'rate_limited' : failure.kind === 'rejected' ? 'rejected' : 'error';
      // A timeout or a dropped connection leaves the intent standing: tailscaled may still be issuing.
      const answered = !(err instanceof LocalApiError) || (err.status !== undefined && !err.timedOut);
      const update =
        failure.kind === 'rate_limited' ? store.recordRateLimit?.(this.domain, this.#retryAt, signal) : answered ? store.clearIntent?.(this.domain, signal) : undefined;
      await update?.catch((updateErr: unknown) => {
        this.#log.warn({ err: errorMessage(updateErr) }, 'could not update the coordination record in the store');
      });
      observer.attempt(this.domain, result, failure);
      observer.planned(this.domain, this.#retryAt, delay);
      observer.problem(this.domain, failure.message);
      this.#log.warn({ kind: failure.kind, err: failure.message, retryInMs: delay }, 'certificate issuance failed');
      return delay;
    }
  }

  /** Keeps the candidate if it is valid now and expires later than what we hold. */
  #consider(candidate: StoredCert): void {
    const now = this.#deps.clock.now();
    if (!isCurrentlyValid(candidate.info, now)) return;
    if (this.#best && this.#best.info.notAfter >= candidate.info.notAfter) return;
    this.#best = candidate;
    this.#deps.observer.certificate(this.domain, candidate);
  }

  #dropIfExpired(): void {
    if (this.#best && !isCurrentlyValid(this.#best.info, this.#deps.clock.now())) {
      this.#log.warn({ serial: this.#best.info.serial }, 'certificate expired');
      this.#best = undefined;
      this.#deps.observer.certificate(this.domain, undefined);
    }
  }

  async #pause(ms: number, signal: AbortSignal): Promise<void> {
    if (ms <= 0 || this.#wake.signal.aborted) {
      this.#wake = new AbortController();
      return;
    }
    try {
      await this.#deps.clock.sleep(ms, AbortSignal.any([signal, this.#wake.signal]));
    } catch (err) {
      if (signal.aborted) throw err;
    }
    if (this.#wake.signal.aborted) this.#wake = new AbortController();
  }
}

function storeHolds(read: StoreRead, cert: StoredCert): boolean {
  return read.state === 'valid' && read.cert.info.notAfter >= cert.info.notAfter;
}
