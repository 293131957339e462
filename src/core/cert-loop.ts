import type { BackoffPolicy } from './backoff.ts';
import { doubling, FailureStreak, retryDelay } from './backoff.ts';
import { checkValidAt, inspectCertPair, isCurrentlyValid, type CertInfo } from './certificate.ts';
import type { Clock } from './clock.ts';
import { CertshareError, errorMessage, errorText, isRefusal } from './errors.ts';
import { classifyIssuanceFailure } from './failure.ts';
import { formatBudget, type BudgetVerdict, type IssuanceBudget } from './issuance-budget.ts';
import type { IssuanceSlots } from './issuance-slots.ts';
import { LocalApiError, type LocalApi } from './localapi.ts';
import type { Logger } from './logger.ts';
import type { LoopObserver } from './observer.ts';
import {
  ariVerdictOf,
  decideIssuance,
  forcesNewOrder,
  isAriReason,
  judgeAnswer,
  planAfterCall,
  storeHolds,
  type BudgetAnswer,
  type IssuanceDecision,
  type IssuanceSnapshot,
  type IssueReason,
  type RenewRefusal,
  type StoreView,
  type TurnProgress,
} from './issuance-policy.ts';
import type { RenewalPolicy } from './renewal.ts';
import { askRenewBudget, issuedAnswer, refusalText, refuseRenewRequest } from './renew-request.ts';
import { minValidityFor, usableLifetime, type HeldValidity } from './renewal.ts';
import { ARI_MIN_HOLD_MS, ariMinValidityMs, describeAriAnswer, type AriStateSource } from './renewal-info.ts';
import type { StartupCondition, StartupGrace } from './startup-grace.ts';
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
  /**
   * An empty store record (the writer's first issuance still running) logs at info within this grace, until
   * this loop has held a certificate once. Undefined: it warns at once.
   */
  startup?: StartupGrace | undefined;
  /**
   * The CA's word on the certificates this writer holds (ACME Renewal Information): a window that makes a
   * certificate due earlier than the expiry rule. Undefined: ARI off (--acme-directory none).
   */
  renewalInfo?: AriStateSource | undefined;
}

function isConflict(err: unknown): boolean {
  return err instanceof CertshareError && err.code === 'CERTSHARE_STORE_CONFLICT';
}

/**
 * One domain's issuance loop: the I/O and the scheduling around issuance-policy.ts. Each turn reads the
 * store, keeps the best valid certificate it has seen, gathers an IssuanceSnapshot and does what
 * decideIssuance() says (the rules, and why they are in that order, are listed there). Turns are
 * sequential, so there is never more than one CertPair in flight per domain; the loops of a process share
 * issuanceSlots, which bounds how many domains issue at once.
 */
export class CertLoop {
  readonly domain: string;
  readonly #deps: CertLoopDeps;
  readonly #log: Logger;
  #best: StoredCert | undefined;
  #failures = new FailureStreak();
  #storeFailures = new FailureStreak();
  /** This loop's own backoff (after a failed call, a rate limit, a certificate too short): no call before `until`. */
  #backoff: IssuanceSnapshot['backoff'];
  /**
   * No CertPair call before this: the minimum interval after the last new certificate, or that
   * certificate's notBefore if later (until then tailscaled sees its cached pair as invalid and orders anew).
   */
  #callFloor = -Infinity;
  /** The shortest validity a certificate had when a renewal call returned it: what this issuer really gives. */
  #freshValidityMs: number | undefined;
  /** A pair whose validity starts later (the issuer's clock is ahead): adopted at its notBefore, no call before. */
  #pending: StoredCert | undefined;
  /** The unusable store record last logged, and at which level: each change is logged once, not every turn. */
  #lastUnusable: string | undefined;
  /** No certificate held yet: an empty store record is the first issuance running, not damage (startup-grace.ts). */
  readonly #firstCertificate: StartupCondition | undefined;
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
    this.#firstCertificate = deps.startup?.condition();
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
        if (storeHolds(storeView(read), best.info)) return;
        const restored = await this.#restore(best, read.state, signal);
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
  async #restore(cert: StoredCert, was: StoreView['state'], signal: AbortSignal): Promise<'stored' | 'conflict' | { failed: unknown }> {
    // A write like an issuance's: it takes one of the process's issuance slots (issuance-slots.ts).
    const release = await this.#deps.issuanceSlots?.acquire(signal);
    try {
      await this.#deps.store.save(this.domain, cert, signal);
      this.#log.info({ serial: cert.info.serial, was }, 'restored certificate to the store');
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
    const read = await this.#load(signal);
    if (read.state === 'unreadable') this.#dropIfExpired();
    else this.#remember(read);
    const turn: TurnProgress = {};
    let release: (() => void) | undefined;
    try {
      // Gather, decide, act; a step on the way to a CertPair call awaits, so decide again afterwards.
      for (;;) {
        const snapshot = this.#snapshot(read, turn);
        const decision = decideIssuance(snapshot, this.#deps);
        this.#deps.observer.decided(this.domain, decision);
        switch (decision.action) {
          case 'ask_budget':
            turn.budget = await this.#askBudget(signal);
            break;
          case 'take_slot':
            // At most issuanceSlots.limit domains of this process issue at once (see issuance-slots.ts).
            release = await this.#deps.issuanceSlots?.acquire(signal);
            turn.slot = true;
            break;
          case 'announce':
            turn.intent = await this.#announce(signal);
            break;
          case 'ask_renew_budget':
            turn.renewBudget = await askRenewBudget(this.#deps.budget, this.domain, snapshot.coordination.renewRequest!, signal, (err) => {
              this.#log.warn({ code: 'CERTSHARE_STORE_UNAVAILABLE', err: errorMessage(err) }, 'issuance ledger unusable; not serving the renew request');
              return this.#storeFailures.record('transient');
            });
            break;
          case 'refuse_renew':
            return await this.#refuseRenew(snapshot, decision.reason, signal);
          case 'restore': {
            // A conflict is no failure: the next turn reads what changed.
            const restored = await this.#restore(this.#best!, read.state, signal);
            return restored === 'stored' || restored === 'conflict' ? 0 : this.#storeRetryDelay();
          }
          case 'issue':
            return await this.#trackIssuing(this.#issue(signal, decision.reason, turn.budget?.kind === 'granted', snapshot.coordination.renewRequest));
          default:
            return this.#wait(decision, snapshot);
        }
      }
    } finally {
      release?.();
    }
  }

  /**
   * Reads the store. A renewal the writer stores reaches a reader through the store's watch within
   * moments; one still missing a first-retry interval after the certificate came due means the watched
   * copy may be stale (a stream stalled without failing): read the store itself, before the certificate
   * expires. A failed read is reported here and returned as 'unreadable' (never a reason to issue).
   */
  async #load(signal: AbortSignal): Promise<LoadResult> {
    const { store, clock, observer } = this.#deps;
    const fresh = this.#dueSince !== undefined && clock.now() - this.#dueSince >= this.#deps.backoff.firstRetryMs;
    try {
      const read = await store.load(this.domain, signal, fresh ? { fresh } : undefined);
      this.#storeFailures.reset();
      return read;
    } catch (err) {
      if (signal.aborted) throw err;
      this.#log.warn({ code: 'CERTSHARE_STORE_UNAVAILABLE', err: errorMessage(err) }, 'certificate store unreadable');
      observer.problem(this.domain, `store ${store.kind} unreadable: ${errorMessage(err)}`);
      return { state: 'unreadable', failures: this.#storeFailures.record('transient') };
    }
  }

  /** Keeps the best valid certificate of what the store returned, our pending pair and what we held. */
  #remember(read: StoreRead): void {
    if (read.state === 'valid') this.#considerStored(read.cert);
    // A newer pair the store saw before what it holds now (a hand edit, a deletion): restored rather than
    // our own older one, which may already be due.
    if (read.lastValid) this.#considerStored(read.lastValid);
    this.#adoptPending();
    this.#logUnusable(read);
    this.#dropIfExpired();
    const writer = this.#deps.role.canIssue(this.domain);
    if (writer) this.#dueSince = undefined;
    // Only a writer without a certificate waits for a first issuance; renewals are exempt.
    if (this.#best || !writer) this.#leaveBudgetQueue();
  }

  /**
   * An unusable record warns, except an empty one while the first issuance may still be running (the
   * start-up grace, and no certificate held yet): that one is said plainly at info, and warns once the
   * grace has passed. Garbage or a mismatched pair warns at once: bad input is never hidden.
   */
  #logUnusable(read: StoreRead): void {
    if (read.state !== 'unusable') {
      this.#lastUnusable = undefined;
      return;
    }
    const level = read.empty && this.#firstCertificate ? this.#firstCertificate.level() : 'warn';
    const logged = `${level} ${read.reason}`;
    if (logged === this.#lastUnusable) return;
    this.#lastUnusable = logged;
    if (level === 'info') this.#log.info({ reason: read.reason }, 'no certificate stored yet; waiting for the first issuance');
    else this.#log.warn({ reason: read.reason }, 'stored certificate unusable');
  }

  /** What the rules read, as it is now: the clock and the role are read again for every decision of a turn. */
  #snapshot(read: LoadResult, turn: TurnProgress): IssuanceSnapshot {
    const { role, clock } = this.#deps;
    const issue = role.canIssue(this.domain);
    return {
      now: clock.now(),
      store: storeView(read),
      held: this.#best && held(this.#best),
      // A reader never acts on ARI: the writer's renewal reaches it through the store.
      ari: issue ? this.#ari() : undefined,
      pending: this.#pending && { notBefore: this.#pending.info.notBefore },
      role: { identity: role.identity, issue, write: this.#mayWrite() },
      coordination: (read.state === 'unreadable' ? undefined : read.coordination) ?? {},
      backoff: this.#backoff,
      callFloor: this.#callFloor,
      turn,
    };
  }

  /** The ARI state of the certificate held, if the daemon's checker knows one for it. */
  #ari(): IssuanceSnapshot['ari'] {
    const state = this.#best && this.#deps.renewalInfo?.stateFor(this.domain, this.#best.info.serial);
    return state && { state, minHoldMs: Math.max(this.#minIssueIntervalMs, ARI_MIN_HOLD_MS) };
  }

  /** Reports a decision to wait (or to use what is held) and returns the wait. */
  #wait(decision: IssuanceDecision, s: IssuanceSnapshot): number {
    const { observer } = this.#deps;
    const { at, reason } = decision;
    switch (reason) {
      case 'not_yet_valid':
      case 'min_interval':
        observer.planned(this.domain, at, 0);
        break;
      case 'not_due':
        this.#dueSince = undefined;
        observer.problem(this.domain, undefined);
        observer.planned(this.domain, at, 0);
        break;
      case 'not_writer':
        // Due, or a Secret whose certificate expired or broke (not one never issued: a first issuance may
        // wait in the budget's queue for days): the writer's fix should arrive soon; see #load.
        if (s.held || s.store.state === 'unusable') this.#dueSince ??= s.now;
        if (!s.held) observer.problem(this.domain, 'waiting for the writer to store a certificate');
        break;
      case 'rate_limited':
        if (at > (this.#backoff?.until ?? -Infinity)) {
          // Recorded in the store by a replica (or by this one before a restart): ours from now on.
          this.#backoff = { until: at, reason };
          observer.planned(this.domain, at, at - s.now);
          observer.problem(this.domain, `rate limited until ${iso(at)}`);
        }
        break;
      case 'other_writer_issuing':
        this.#log.info({ holder: s.coordination.intent?.holder }, 'another writer is issuing; waiting');
        break;
      case 'budget_exhausted':
        if (s.turn.budget?.kind === 'queued') this.#queuedForBudget(s.turn.budget);
        break;
    }
    return at - s.now;
  }

  /** Waits until tailscaled lists the domain; a first issuance under a budget then asks it for a slot. */
  async #askBudget(signal: AbortSignal): Promise<BudgetAnswer> {
    const { budget, availability, observer } = this.#deps;
    budget?.settled(this.domain);
    await availability.waitFor(this.domain, signal);
    if (!budget || this.#best) return { kind: 'not_needed' };
    let verdict: BudgetVerdict;
    try {
      verdict = await budget.request(this.domain, {}, signal);
    } catch (err) {
      if (signal.aborted) throw err;
      this.#log.warn({ code: 'CERTSHARE_STORE_UNAVAILABLE', err: errorMessage(err) }, 'issuance ledger unusable; not issuing');
      observer.problem(this.domain, `issuance ledger unusable: ${errorMessage(err)}`);
      return { kind: 'unusable', failures: this.#storeFailures.record('transient') };
    }
    if (verdict.kind !== 'queued') this.#leaveBudgetQueue(verdict.kind === 'granted' ? 'slot granted' : 'renewal, exempt');
    return verdict;
  }

  /** Answers the pending renew request with a refusal (renew-request.ts); 0: decide again on a fresh read. */
  async #refuseRenew(s: IssuanceSnapshot, reason: RenewRefusal, signal: AbortSignal): Promise<number> {
    const id = s.coordination.renewRequest!;
    const budget = s.turn.renewBudget;
    const detail = budget?.kind === 'refused' ? { until: budget.nextSlotAt, registeredDomain: budget.registeredDomain } : { until: s.callFloor };
    const refused = await refuseRenewRequest(this.#deps, this.domain, { id, reason, message: refusalText(this.domain, id, reason, detail) }, signal);
    return refused === 'recorded' || refused === 'conflict' ? 0 : this.#storeRetryDelay();
  }

  /** Records the intent (when the store coordinates writers); a failure is reported here. */
  async #announce(signal: AbortSignal): Promise<NonNullable<TurnProgress['intent']>> {
    const { store, role, clock, observer } = this.#deps;
    if (!store.recordIntent) return { kind: 'recorded' };
    try {
      await store.recordIntent(this.domain, role.identity, clock.now(), signal);
      return { kind: 'recorded' };
    } catch (err) {
      if (signal.aborted) throw err;
      if (isConflict(err)) return { kind: 'conflict' };
      this.#log.warn({ err: errorMessage(err) }, 'could not record the issuance intent; not issuing');
      observer.problem(this.domain, `cannot record the issuance intent: ${errorMessage(err)}`);
      return { kind: 'failed', failures: this.#storeFailures.record('transient') };
    }
  }

  /** Keeps the CertPair call (and the save after it) visible to `issuing` while it runs. */
  async #trackIssuing(issuing: Promise<number>): Promise<number> {
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

  #queuedForBudget(verdict: Extract<BudgetVerdict, { kind: 'queued' }>): void {
    const { observer, budget } = this.#deps;
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
  }

  #leaveBudgetQueue(why = 'no longer waiting'): void {
    this.#deps.budget?.withdraw(this.domain);
    if (this.#budgetState === 'queued') this.#log.info({ why }, 'issuance budget: domain left the queue');
    this.#budgetState = undefined;
  }

  get #minIssueIntervalMs(): number {
    return this.#deps.minIssueIntervalMs ?? this.#deps.backoff.firstRetryMs;
  }

  /**
   * The CertPair call, for `reason` (the attempt's label); `reserved`: a slot of the budget was taken for it;
   * `serving`: the renew request pending when it was decided (a new certificate answers it, in the same write).
   */
  async #issue(signal: AbortSignal, reason: IssueReason, reserved: boolean, serving: string | undefined): Promise<number> {
    const { localApi, store, clock, renewal, backoff, observer } = this.#deps;
    const previous = this.#best;
    const minValidityMs = this.#minValidity(previous, reason);
    try {
      const pair = await localApi.certPair(this.domain, { minValidityMs, signal });
      // Whatever the pair is worth: the CA's request for this certificate has been acted on (at most one order each).
      if (previous && isAriReason(reason)) this.#deps.renewalInfo?.renewalDone(this.domain, previous.info.serial);
      if (reserved) {
        // The CA issued (whatever our validation says next): later issuances of this domain are renewals.
        await this.#deps.budget?.issued(this.domain, signal).catch((err: unknown) => {
          if (signal.aborted) throw err;
          this.#log.warn({ err: errorMessage(err) }, 'could not mark the first issuance done in the ledger; its slot stays taken');
        });
      }
      const now = clock.now();
      const info = inspectCertPair(pair, this.domain);
      // Valid now, except a new pair whose validity merely starts later (the issuer's clock is ahead).
      if (info.serial === previous?.info.serial || now >= info.notBefore || info.notBefore >= info.notAfter) checkValidAt(info, now);
      const asked = { minValidityMs, minIssueIntervalMs: this.#minIssueIntervalMs };
      const verdict = judgeAnswer(info, previous && { ...held(previous), serial: previous.info.serial }, now, renewal, asked);
      if (verdict.kind === 'due_again') {
        throw new CertshareError('CERTSHARE_CERT_STALE', `tailscaled returned the certificate due for renewal (serial ${info.serial})`);
      }
      if (verdict.kind === 'unchanged') {
        observer.attempt(this.domain, 'unchanged', reason);
      } else {
        // A new pair was issued (or tailscaled had a newer one): the minimum interval starts now, and its
        // validity is what this issuer gives. Used or not, it is what tailscaled has cached.
        this.#callFloor = Math.max(now + this.#minIssueIntervalMs, info.notBefore);
        const validity = info.notAfter - Math.max(info.notBefore, now);
        if (minValidityMs > 0) this.#freshValidityMs = Math.min(this.#freshValidityMs ?? Infinity, validity);
        const { tooShort } = verdict;
        if (verdict.kind === 'older') {
          if (tooShort) return this.#tooShort(info, now, { minValidityMs, reason }, tooShort);
          throw new CertshareError('CERTSHARE_CERT_STALE', `new certificate expires before the current one (${new Date(info.notAfter).toISOString()})`);
        }
        const cert: StoredCert = { pair, info, obtainedAt: Math.max(info.notBefore, now) };
        if (verdict.usableAt === 'not_before') {
          // The issuer's clock is ahead of ours: tailscaled would see this pair as invalid too and order
          // another on every call. Keep it and use it from its notBefore, without asking again.
          this.#pending = cert;
          this.#log.warn(
            { code: 'CERTSHARE_CERT_INVALID', serial: info.serial, notBefore: iso(info.notBefore) },
            'certificate not valid yet (issuer clock ahead?); using it from its notBefore',
          );
        } else {
          try {
            await store.save(this.domain, cert, signal, serving === undefined ? undefined : { renewAnswer: issuedAnswer(serving, info.serial) });
          } finally {
            // Held even when the save failed: the next turn restores it to the store instead of issuing again.
            this.#consider(cert);
          }
          this.#log.info({ serial: info.serial, notAfter: iso(info.notAfter), ...(serving ? { renewRequest: serving } : {}) }, 'certificate issued and stored');
          if (serving !== undefined) observer.renewRequest(this.domain, { id: serving, result: 'issued', serial: info.serial });
        }
        if (tooShort) return this.#tooShort(info, now, { minValidityMs, reason }, tooShort);
        observer.attempt(this.domain, 'success', reason);
      }
      this.#failures.reset();
      this.#backoff = undefined;
      observer.problem(this.domain, undefined);
      return this.#planAfterCall();
    } catch (err) {
      if (signal.aborted) throw err;
      if (isConflict(err)) return 0;
      const failure = classifyIssuanceFailure(err);
      const delay = retryDelay(failure, this.#failures.record(failure.kind), backoff);
      const retryAt = clock.now() + delay;
      this.#backoff = { until: retryAt, reason: failure.kind === 'rate_limited' ? 'rate_limited' : 'retry_backoff' };
      const result = failure.kind === 'rate_limited' ? 'rate_limited' : failure.kind === 'rejected' ? 'rejected' : 'error';
      // A timeout or a dropped connection leaves the intent standing: tailscaled may still be issuing.
      const answered = !(err instanceof LocalApiError) || (err.status !== undefined && !err.timedOut);
      const update =
        failure.kind === 'rate_limited'
          ? store.recordRateLimit?.(this.domain, retryAt, signal)
          : answered
            ? store.clearIntent?.(this.domain, signal)
            : undefined;
      await update?.catch((updateErr: unknown) => {
        this.#log.warn({ err: errorMessage(updateErr) }, 'could not update the coordination record in the store');
      });
      observer.attempt(this.domain, result, reason, failure);
      observer.decided(this.domain, { action: 'wait', reason: this.#backoff.reason, at: retryAt });
      observer.planned(this.domain, retryAt, delay);
      observer.problem(this.domain, failure.message);
      this.#log.warn({ kind: failure.kind, err: failure.message, retryInMs: delay }, 'certificate issuance failed');
      return delay;
    }
  }

  /**
   * The min_validity of a CertPair call: the expiry rule's (renewal.ts minValidityFor), or for a renewal the
   * CA asked for, one that makes tailscaled order anew even for a certificate with most of its life left
   * (renewal-info.ts ariMinValidityMs), capped by what a fresh certificate from this issuer has.
   */
  #minValidity(previous: StoredCert | undefined, reason: IssueReason): number {
    const { clock, renewal } = this.#deps;
    const now = clock.now();
    if (!previous || !forcesNewOrder(reason)) return minValidityFor(previous && held(previous), now, renewal, this.#freshValidityMs);
    if (reason === 'operator_requested') {
      this.#log.info({ serial: previous.info.serial }, 'an operator asked for this certificate to be replaced (renew request); renewing');
      return ariMinValidityMs(previous.info, now, this.#freshValidityMs ?? usableLifetime(held(previous)));
    }
    const ari = ariVerdictOf({ now, ari: this.#ari() });
    this.#log.info(
      { reason, serial: previous.info.serial, ...(ari.kind === 'silent' ? {} : { ari: describeAriAnswer(ari.answer) }) },
      'the CA asked for this certificate to be replaced (ACME Renewal Information); renewing',
    );
    return ariMinValidityMs(previous.info, now, this.#freshValidityMs ?? usableLifetime(held(previous)));
  }

  /**
   * A renewal answered with a certificate that is due again (almost) at once. It is used (it is valid and
   * newer), but asking again on its schedule would be an issuance storm: back off as after a failure.
   */
  #tooShort(info: CertInfo, now: number, asked: { minValidityMs: number; reason: IssueReason }, why: string): number {
    const { backoff, observer } = this.#deps;
    const { minValidityMs } = asked;
    const failure = { kind: 'too_short' as const, message: errorText('CERTSHARE_CERT_TOO_SHORT', { why }) };
    const delay = retryDelay(failure, this.#failures.record(failure.kind), backoff);
    // A longer backoff under way (a rate limit) keeps its end and its reason.
    if (now + delay >= (this.#backoff?.until ?? -Infinity)) this.#backoff = { until: now + delay, reason: 'too_short' };
    const retryAt = this.#backoff!.until;
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
        retryInMs: retryAt - now,
      },
      `the issuer gave a certificate too short for the renewal rule (${why}); backing off`,
    );
    observer.attempt(this.domain, 'too_short', asked.reason, failure);
    // Shown by /healthz once the short certificate has expired during the backoff.
    observer.problem(this.domain, failure.message);
    return this.#planAfterCall();
  }

  /** The wait after a call that gave a certificate (issuance-policy.ts planAfterCall), reported. */
  #planAfterCall(): number {
    const { observer, clock } = this.#deps;
    const now = clock.now();
    const pending = this.#pending && { notBefore: this.#pending.info.notBefore };
    const decision = planAfterCall({ now, held: this.#best && held(this.#best), pending, backoff: this.#backoff }, this.#deps);
    observer.decided(this.domain, decision);
    observer.planned(this.domain, decision.at, Math.max(0, (this.#backoff?.until ?? 0) - now));
    return Math.max(0, decision.at - now);
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
    this.#firstCertificate?.cleared();
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

/** What the renewal rule reads of a held certificate. */
function held(cert: StoredCert): HeldValidity {
  return { notBefore: cert.info.notBefore, notAfter: cert.info.notAfter, obtainedAt: cert.obtainedAt };
}

function iso(ms: number): string {
  return new Date(ms).toISOString();
}

/** A store read, or the failure streak of a read that failed. */
type LoadResult = StoreRead | { state: 'unreadable'; failures: number };

/** What the rules read of a store read. */
function storeView(read: LoadResult): StoreView {
  if (read.state === 'valid') return { state: 'valid', notAfter: read.cert.info.notAfter };
  return read.state === 'unreadable' ? read : { state: read.state };
}
