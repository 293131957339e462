import type { BackoffPolicy } from './backoff.ts';
import { doubling, FailureStreak, retryDelay } from './backoff.ts';
import { checkValidAt, inspectCertPair, isCurrentlyValid, type CertInfo } from './certificate.ts';
import type { Clock } from './clock.ts';
import { CertshareError, errorMessage, isRefusal } from './errors.ts';
import { classifyIssuanceFailure } from './failure.ts';
import { formatBudget, type BudgetVerdict, type IssuanceBudget } from './issuance-budget.ts';
import type { IssuanceSlots } from './issuance-slots.ts';
import { LocalApiError, type LocalApi } from './localapi.ts';
import type { Logger } from './logger.ts';
import type { LoopObserver } from './observer.ts';
import type { RenewalPolicy } from './renewal.ts';
import { isRenewalDue, minValidityFor, nextCheckTime, tooShortReason, type HeldValidity } from './renewal.ts';
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
  /**
   * The hard floor between two CertPair calls that may issue for one domain, counted from the moment the
   * last new certificate was obtained. Default: backoff.firstRetryMs (1m).
   */
  minIssueIntervalMs?: number;
  /** Let's Encrypt's new-certificates-per-registered-domain limit, kept on our side (first issuances only). */
  budget?: IssuanceBudget | undefined;
  /**
   * Shared by every loop of the process: how many issue at once (the CertPair call and the store writes
   * around it, or a restore's write). Undefined: no bound (a loop on its own).
   */
  issuanceSlots?: IssuanceSlots | undefined;
}

function isConflict(err: unknown): boolean {
  return err instanceof CertshareError && err.code === 'CERTSHARE_STORE_CONFLICT';
}

/**
 * One domain's issuance state machine. Each turn reads the store, keeps the best valid certificate it
 * has seen, and calls CertPair only when this replica is the writer, renewal is due and no backoff or
 * rate limit is pending. Turns are sequential, so there is never more than one CertPair in flight per
 * domain; the loops of a process share issuanceSlots, which bounds how many domains issue at once.
 */
export class CertLoop {
  readonly domain: string;
  readonly #deps: CertLoopDeps;
  readonly #log: Logger;
  #best: StoredCert | undefined;
  #failures = new FailureStreak();
  #storeFailures = new FailureStreak();
  #retryAt = 0;
  /**
   * No CertPair call before this: the minimum interval after the last new certificate, or that
   * certificate's notBefore if later (until then tailscaled sees its cached pair as invalid and orders anew).
   */
  #callFloor = -Infinity;
  /** The shortest validity a certificate had when a renewal call returned it: what this issuer really gives. */
  #freshValidityMs: number | undefined;
  /** A pair whose validity starts later (the issuer's clock is ahead): adopted at its notBefore, no call before. */
  #pending: StoredCert | undefined;
  #lastUnusable: string | undefined;
  /** 'queued' while the issuance budget keeps this domain waiting: logged once per change, not per turn. */
  #budgetState: 'queued' | undefined;
  #wake: AbortController = new AbortController();
  /** Since when a reader has seen its certificate due (or the stored one unusable) without the writer's renewal arriving. */
  #dueSince: number | undefined;
  /** The CertPair call (and the save after it) under way. */
  #issuing: Promise<void> | undefined;

  constructor(domain: string, deps: CertLoopDeps) {
    this.domain = domain;
    this.#deps = deps;
    this.#log = deps.logger.child({ domain });
  }

  /**
   * A stopping writer's last look before it hands the role over: reads the store itself (not the watched
   * copy, which may lag) and puts back the certificate this loop holds if the store does not hold it (a
   * hand edit, a deletion, or our own save that failed). The successor may never have seen that
   * certificate and would issue the domain again. Failed reads and writes are tried again (100 ms doubling
   * to 2 s) until `signal` ends it: the shutdown budget, not one answer of a flaky API server, decides. A
   * refusal (401, 403) ends it at once: no answer within the budget would differ, and the Pod's stop
   * should not wait the whole grace period on a Role that lacks a verb.
   */
  async verifyStored(signal: AbortSignal): Promise<void> {
    let lastError: unknown;
    for (let attempt = 1; !signal.aborted; attempt++) {
      const best = this.#best;
      if (!best || !this.#mayWrite()) return;
      try {
        const read = await this.#deps.store.load(this.domain, signal, { fresh: true });
        if (storeHolds(read, best)) return;
        const restored = await this.#restore(best, read, signal);
        if (restored === 'stored') return;
        // A conflict: the Secret changed since our read; a failure: logged by #restore. Read again.
        if (restored !== 'conflict') lastError = restored.failed;
      } catch (err) {
        lastError = err;
      }
      if (isRefusal(lastError)) break;
      await this.#deps.clock.sleep(doubling(100, attempt, 2000), signal).catch(() => {});
    }
    this.#log.warn({ err: lastError === undefined ? undefined : errorMessage(lastError) }, 'could not verify the stored certificate before handing over');
  }

  /** Puts `cert` back into the store: stored, a conflict (the Secret changed since it was read), or the failure (logged). */
  async #restore(cert: StoredCert, read: StoreRead, signal: AbortSignal): Promise<'stored' | 'conflict' | { failed: unknown }> {
    // A write like an issuance's: it takes one of the process's issuance slots (issuance-slots.ts).
    const release = await this.#deps.issuanceSlots?.acquire(signal);
    try {
      await this.#deps.store.save(this.domain, cert, signal);
      this.#log.info({ serial: cert.info.serial, was: read.state }, 'restored certificate to the store');
      return 'stored';
    } catch (err) {
      if (signal.aborted) throw err;
      if (isConflict(err)) return 'conflict';
      this.#log.warn({ err: errorMessage(err) }, 'could not restore certificate to the store');
      return { failed: err };
    } finally {
      release?.();
    }
  }

  /** Holds the role that writes the store (restores); issuing may have stopped (IssuanceRole.canWrite). */
  #mayWrite(): boolean {
    const { role } = this.#deps;
    return role.canWrite ? role.canWrite(this.domain) : role.canIssue(this.domain);
  }

  #storeRetryDelay(): number {
    return retryDelay({ kind: 'transient', message: '' }, this.#storeFailures.record('transient'), this.#deps.backoff);
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
        // Whatever the turn decided, this domain is no longer one the budget has not heard from.
        const waitMs = await this.turn(signal).finally(() => this.#deps.budget?.settled(this.domain));
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
    // A renewal the writer stores reaches a reader through the store's watch within moments; one still
    // missing a first-retry interval after the certificate came due means the watched copy may be stale
    // (a stream stalled without failing): read the store itself, before the certificate expires.
    const fresh = this.#dueSince !== undefined && clock.now() - this.#dueSince >= this.#deps.backoff.firstRetryMs;
    try {
      read = await store.load(this.domain, signal, fresh ? { fresh } : undefined);
      this.#storeFailures.reset();
    } catch (err) {
      if (signal.aborted) throw err;
      // Not knowing what is stored is never a reason to issue: keep serving what we have and retry.
      const message = `store ${store.kind} unreadable: ${errorMessage(err)}`;
      this.#log.warn({ code: 'CERTSHARE_STORE_UNAVAILABLE', err: errorMessage(err) }, 'certificate store unreadable');
      observer.problem(this.domain, message);
      this.#dropIfExpired();
      return this.#beforeExpiry(retryDelay({ kind: 'transient', message }, this.#storeFailures.record('transient'), this.#deps.backoff));
    }

    if (read.state === 'valid') this.#considerStored(read.cert);
    // A newer pair the store saw before what it holds now (a hand edit, a deletion): restored below
    // rather than our own older one, which may already be due.
    if (read.lastValid) this.#considerStored(read.lastValid);
    this.#adoptPending();
    const unusable = read.state === 'unusable' ? read.reason : undefined;
    if (unusable && unusable !== this.#lastUnusable) this.#log.warn({ reason: unusable }, 'stored certificate unusable');
    this.#lastUnusable = unusable;
    this.#dropIfExpired();
    const now = clock.now();
    const writer = role.canIssue(this.domain);
    if (writer) this.#dueSince = undefined;
    // Only a writer without a certificate waits for a first issuance; renewals are exempt.
    if (this.#best || !writer) this.#leaveBudgetQueue();

    // Deleted, emptied, garbage or older in the store: put back the certificate we hold; no issuance.
    // Restores need the role, not the right to issue: a stopping writer still puts back what the store lost.
    if (this.#mayWrite() && this.#best && !storeHolds(read, this.#best)) {
      // A conflict is no failure: the next turn reads what changed.
      const restored = await this.#restore(this.#best, read, signal);
      return restored === 'stored' || restored === 'conflict' ? 0 : this.#storeRetryDelay();
    }

    if (this.#pending) {
      // Obtained, not valid yet: asking again would only make tailscaled order another one.
      const at = this.#pending.info.notBefore;
      observer.planned(this.domain, at, 0);
      return at - now;
    }
    if (this.#best && !isRenewalDue(held(this.#best), now, renewal)) {
      this.#dueSince = undefined;
      observer.problem(this.domain, undefined);
      const at = nextCheckTime(held(this.#best), now, renewal);
      observer.planned(this.domain, at, 0);
      return at - now;
    }
    if (!writer) {
      // Due, or a Secret whose certificate expired or broke (not one never issued: a first issuance may
      // wait in the budget's queue for days): the writer's fix should arrive soon; see `fresh` above.
      if (this.#best || read.state === 'unusable') this.#dueSince ??= now;
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
    if (now < this.#callFloor) {
      // Whatever the certificates look like, never two issuances of a domain closer than this.
      observer.planned(this.domain, this.#callFloor, 0);
      return this.#callFloor - now;
    }
    const intent = coordination.intent;
    if (intent && intent.holder !== role.identity && now < intent.at + this.#deps.intentTtlMs) {
      // Another writer is mid-issuance: its result lands in the store (the watch wakes us) or its intent lapses.
      this.#log.info({ holder: intent.holder }, 'another writer is issuing; waiting');
      return intent.at + this.#deps.intentTtlMs - now;
    }
    this.#deps.budget?.settled(this.domain);
    await this.#deps.availability.waitFor(this.domain, signal);
    let reserved = false;
    if (this.#deps.budget && !this.#best) {
      let verdict: BudgetVerdict;
      try {
        verdict = await this.#deps.budget.request(this.domain, {}, signal);
      } catch (err) {
        if (signal.aborted) throw err;
        // A ledger we cannot read or write is never an empty budget: no issuance until it is back.
        const message = `issuance ledger unusable: ${errorMessage(err)}`;
        this.#log.warn({ code: 'CERTSHARE_STORE_UNAVAILABLE', err: errorMessage(err) }, 'issuance ledger unusable; not issuing');
        observer.problem(this.domain, message);
        return retryDelay({ kind: 'transient', message }, this.#storeFailures.record('transient'), this.#deps.backoff);
      }
      if (verdict.kind === 'queued') return this.#queuedForBudget(verdict);
      reserved = verdict.kind === 'granted';
      this.#leaveBudgetQueue(reserved ? 'slot granted' : 'renewal, exempt');
    }
    // At most issuanceSlots.limit domains of this process issue at once (see issuance-slots.ts); the
    // intent is recorded once this one's turn has come, so its lifetime covers the call, not the wait.
    const release = await this.#deps.issuanceSlots?.acquire(signal);
    try {
      // The wait may have been long: the daemon may be stopping, or the role gone.
      if (!role.canIssue(this.domain)) return 0;
      return await this.#announceAndIssue(signal, reserved);
    } finally {
      release?.();
    }
  }

  /** Records the intent, then issues (while this replica still holds the role). */
  async #announceAndIssue(signal: AbortSignal, reserved: boolean): Promise<number> {
    const { store, role, clock, observer } = this.#deps;
    if (store.recordIntent) {
      try {
        await store.recordIntent(this.domain, role.identity, clock.now(), signal);
      } catch (err) {
        if (signal.aborted) throw err;
        if (isConflict(err)) return 0;
        this.#log.warn({ err: errorMessage(err) }, 'could not record the issuance intent; not issuing');
        observer.problem(this.domain, `cannot record the issuance intent: ${errorMessage(err)}`);
        return this.#storeRetryDelay();
      }
    }
    // Leadership may have moved while we wrote (or waited for the domain), or the daemon is stopping:
    // never call CertPair without the role.
    if (!role.canIssue(this.domain)) return 0;
    const issuing = this.#issue(signal, reserved);
    this.#issuing = issuing.then(
      () => {},
      () => {},
    );
    try {
      return await issuing;
    } finally {
      this.#issuing = undefined;
    }
  }

  /** Settles when the CertPair call under way (if any) has ended and its certificate is stored or given up. */
  get issuing(): Promise<void> {
    return this.#issuing ?? Promise.resolve();
  }

  #queuedForBudget(verdict: Extract<BudgetVerdict, { kind: 'queued' }>): number {
    const { observer, clock, budget } = this.#deps;
    const now = clock.now();
    const next = Math.min(
      verdict.turnAt,
      ...(budget
        ?.queues()
        .filter((q) => q.registeredDomain === verdict.registeredDomain)
        .map((q) => q.nextSlotAt ?? Infinity) ?? []),
    );
    const limit = budget ? formatBudget(budget.limit) : '';
    const message =
      `waiting for the issuance budget (${limit} first issuances for ${verdict.registeredDomain}): ` +
      `${verdict.position} of ${verdict.queued} in the queue, next slot frees at ${iso(next)}, this domain's turn at ${iso(verdict.turnAt)}`;
    if (this.#budgetState !== 'queued') {
      this.#log.info(
        { registeredDomain: verdict.registeredDomain, position: verdict.position, queued: verdict.queued, turnAt: iso(verdict.turnAt) },
        'issuance budget exhausted; domain queued',
      );
    }
    this.#budgetState = 'queued';
    observer.problem(this.domain, message);
    observer.planned(this.domain, verdict.turnAt, 0);
    return verdict.turnAt - now;
  }

  #leaveBudgetQueue(why = 'no longer waiting'): void {
    this.#deps.budget?.withdraw(this.domain);
    if (this.#budgetState === 'queued') this.#log.info({ why }, 'issuance budget: domain left the queue');
    this.#budgetState = undefined;
  }

  get #minIssueIntervalMs(): number {
    return this.#deps.minIssueIntervalMs ?? this.#deps.backoff.firstRetryMs;
  }

  async #issue(signal: AbortSignal, reserved: boolean): Promise<number> {
    const { localApi, store, clock, renewal, backoff, observer } = this.#deps;
    const previous = this.#best;
    const minValidityMs = minValidityFor(previous && held(previous), clock.now(), renewal, this.#freshValidityMs);
    try {
      const pair = await localApi.certPair(this.domain, { minValidityMs, signal });
      if (reserved) {
        // The CA issued (whatever our validation says next): later issuances of this domain are renewals.
        await this.#deps.budget?.issued(this.domain, signal).catch((err: unknown) => {
          if (signal.aborted) throw err;
          this.#log.warn({ err: errorMessage(err) }, 'could not mark the first issuance done in the ledger; its slot stays taken');
        });
      }
      const now = clock.now();
      const info = inspectCertPair(pair, this.domain);
      if (previous && info.serial === previous.info.serial) {
        checkValidAt(info, now);
        if (isRenewalDue(held(previous), now, renewal)) {
          throw new CertshareError('CERTSHARE_CERT_STALE', `tailscaled returned the certificate due for renewal (serial ${info.serial})`);
        }
        observer.attempt(this.domain, 'unchanged');
      } else {
        if (now >= info.notBefore || info.notBefore >= info.notAfter) checkValidAt(info, now);
        // A new pair was issued (or tailscaled had a newer one): the minimum interval starts now, and its
        // validity is what this issuer gives. Used or not, it is what tailscaled has cached.
        this.#callFloor = Math.max(now + this.#minIssueIntervalMs, info.notBefore);
        const validity = info.notAfter - Math.max(info.notBefore, now);
        if (minValidityMs > 0) this.#freshValidityMs = Math.min(this.#freshValidityMs ?? Infinity, validity);
        const tooShort = tooShortReason(info, now, renewal, { minValidityMs, minIssueIntervalMs: this.#minIssueIntervalMs });
        if (previous && info.notAfter <= previous.info.notAfter) {
          if (tooShort) return this.#tooShort(info, now, minValidityMs, tooShort);
          throw new CertshareError('CERTSHARE_CERT_STALE', `new certificate expires before the current one (${new Date(info.notAfter).toISOString()})`);
        }
        const cert: StoredCert = { pair, info, obtainedAt: Math.max(info.notBefore, now) };
        if (now < info.notBefore) {
          // The issuer's clock is ahead of ours: tailscaled would see this pair as invalid too and order
          // another on every call. Keep it and use it from its notBefore, without asking again.
          this.#pending = cert;
          this.#log.warn(
            { code: 'CERTSHARE_CERT_INVALID', serial: info.serial, notBefore: iso(info.notBefore) },
            'certificate not valid yet (issuer clock ahead?); using it from its notBefore',
          );
        } else {
          try {
            await store.save(this.domain, cert, signal);
          } finally {
            // Held even when the save failed: the next turn restores it to the store instead of issuing again.
            this.#consider(cert);
          }
          this.#log.info({ serial: info.serial, notAfter: iso(info.notAfter) }, 'certificate issued and stored');
        }
        if (tooShort) return this.#tooShort(info, now, minValidityMs, tooShort);
        observer.attempt(this.domain, 'success');
      }
      this.#failures.reset();
      this.#retryAt = 0;
      observer.problem(this.domain, undefined);
      return this.#planAfterSuccess();
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
        failure.kind === 'rate_limited'
          ? store.recordRateLimit?.(this.domain, this.#retryAt, signal)
          : answered
            ? store.clearIntent?.(this.domain, signal)
            : undefined;
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

  /**
   * A renewal answered with a certificate that is due again (almost) at once. It is used (it is valid and
   * newer), but asking again on its schedule would be an issuance storm: back off as after a failure.
   */
  #tooShort(info: CertInfo, now: number, minValidityMs: number, reason: string): number {
    const { backoff, observer } = this.#deps;
    const failure = { kind: 'too_short' as const, message: `certificate from the issuer too short: ${reason}` };
    const delay = retryDelay(failure, this.#failures.record(failure.kind), backoff);
    this.#retryAt = Math.max(now + delay, this.#retryAt);
    this.#log.warn(
      {
        code: 'CERTSHARE_CERT_TOO_SHORT',
        serial: info.serial,
        notBefore: iso(info.notBefore),
        notAfter: iso(info.notAfter),
        lifetimeMs: info.notAfter - info.notBefore,
        validFromNowMs: info.notAfter - Math.max(info.notBefore, now),
        minValidityMs,
        minIssueIntervalMs: this.#minIssueIntervalMs,
        retryInMs: this.#retryAt - now,
      },
      `the issuer gave a certificate too short for the renewal rule (${reason}); backing off`,
    );
    observer.attempt(this.domain, 'too_short', failure);
    // Shown by /healthz once the short certificate has expired during the backoff.
    observer.problem(this.domain, failure.message);
    return this.#planAfterSuccess();
  }

  /** The wait after a certificate was obtained: a pending one's notBefore, else its renewal point but not before a backoff ends. */
  #planAfterSuccess(): number {
    const { clock, renewal, observer } = this.#deps;
    const now = clock.now();
    const cert = this.#best;
    const at = this.#pending ? this.#pending.info.notBefore : Math.max(cert ? nextCheckTime(held(cert), now, renewal) : now, this.#retryAt);
    observer.planned(this.domain, at, Math.max(0, this.#retryAt - now));
    return Math.max(0, at - now);
  }

  /** Takes a pending pair into use once its validity has started. */
  #adoptPending(): void {
    const pending = this.#pending;
    if (!pending || this.#deps.clock.now() < pending.info.notBefore) return;
    this.#pending = undefined;
    this.#consider(pending);
  }

  /** A pair that was in the store: a candidate, and the start of the minimum interval. */
  #considerStored(cert: StoredCert): void {
    this.#consider(cert);
    // A stored certificate also starts the minimum interval (a restart right after an issuance): from
    // when the writer obtained it, or else from its notBefore, clipped to now.
    const start = cert.obtainedAt ?? Math.min(cert.info.notBefore, this.#deps.clock.now());
    this.#callFloor = Math.max(this.#callFloor, start + this.#minIssueIntervalMs);
  }

  /** Keeps the candidate if it is valid now and expires later than what we hold. */
  #consider(candidate: StoredCert): void {
    const now = this.#deps.clock.now();
    if (!isCurrentlyValid(candidate.info, now)) return;
    if (this.#best && this.#best.info.notAfter >= candidate.info.notAfter) return;
    this.#best = candidate;
    this.#deps.observer.certificate(this.domain, candidate);
  }

  /**
   * A retry of a failed store read, brought forward while the certificate held is about to expire: at
   * least every half of what it has left (never sooner than the first retry), so a renewal the store holds
   * is read before the expiry even behind a long streak of failed reads, not a backoff step after it.
   */
  #beforeExpiry(delayMs: number): number {
    if (!this.#best) return delayMs;
    const left = this.#best.info.notAfter - this.#deps.clock.now();
    return Math.min(delayMs, Math.max(this.#deps.backoff.firstRetryMs, Math.floor(left / 2)));
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

/** What the renewal rule reads of a held certificate. */
function held(cert: StoredCert): HeldValidity {
  return { notBefore: cert.info.notBefore, notAfter: cert.info.notAfter, obtainedAt: cert.obtainedAt };
}

function iso(ms: number): string {
  return new Date(ms).toISOString();
}

function storeHolds(read: StoreRead, cert: StoredCert): boolean {
  return read.state === 'valid' && read.cert.info.notAfter >= cert.info.notAfter;
}
