import type { BackoffPolicy } from '../issuance/backoff.ts';
import { FailureStreak, storeRetryDelay } from '../issuance/backoff.ts';
import { BudgetQueueLog } from '../issuance/budget-queue-log.ts';
import type { Clock } from '../ports/clock.ts';
import { errorMessage } from '../errors.ts';
import { HeldCertificate, held } from './held-certificate.ts';
import { IssueFailures } from '../issuance/issue-failures.ts';
import type { BudgetVerdict, IssuanceBudget } from '../issuance/issuance-budget.ts';
import type { IssuanceSlots } from '../issuance/issuance-slots.ts';
import type { LocalApi } from '../ports/localapi.ts';
import type { Logger } from '../ports/logger.ts';
import type { LoopObserver } from '../ports/observer.ts';
import {
  decideIssuance,
  type BudgetAnswer,
  type IssuanceDecision,
  type IssuanceSnapshot,
  type RenewRefusal,
  type TurnProgress,
} from '../issuance/issuance-policy.ts';
import type { RenewalPolicy } from '../renewal/renewal.ts';
import { askRenewBudget, refusalText, refuseRenewRequest } from '../renewal/renew-request.ts';
import { ARI_MIN_HOLD_MS, type AriStateSource } from '../renewal/renewal-info.ts';
import type { StartupCondition, StartupGrace } from './startup-grace.ts';
import type { CertStore, IssuanceRole, StoreRead, StoredCert } from '../ports/store.ts';
import { UnusableRecordLog } from './unusable-record-log.ts';
import { latestPendingStart, unstoredPending } from './pending-pair.ts';
import { IssueCall } from './issue-call.ts';
import { watchForSupersedingCopy } from './superseding-copy.ts';
import { OutOfBoundsLog } from '../values/untrusted-values.ts';
import { breakGlassPoint } from '../federation/home-verdicts.ts';
import { isConflict, restoreToStore, storeView, verifyStored as verifyStoredIn, type LoadResult, type StoreRestoreDeps } from './store-restore.ts';

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
  /**
   * --readiness-lead: where the safety point of a certificate falls (home-verdicts.ts breakGlassPoint), past which
   * a renewal no longer waits for the name's limit. Undefined: the longest lead the gate allows (the earliest point).
   */
  readinessLeadMs?: number | undefined;
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
  readonly #held: HeldCertificate;
  readonly #failures: IssueFailures;
  #storeFailures = new FailureStreak();
  /** No certificate held yet: an empty store record is the first issuance running, not damage (startup-grace.ts). */
  readonly #firstCertificate: StartupCondition | undefined;
  readonly #budgetQueue: BudgetQueueLog;
  readonly #restoreDeps: StoreRestoreDeps;
  readonly #unusable: UnusableRecordLog;
  #wake: AbortController = new AbortController();
  /** Since when a reader has seen its certificate due (or the stored one unusable) without the writer's renewal arriving. */
  #dueSince: number | undefined;
  readonly #outOfBounds: OutOfBoundsLog;
  /** The CertPair call (and the save after it) under way. */
  #issuing: Promise<void> | undefined;
  /** Its CertPair calls and what follows each (issue-call.ts). */
  readonly #calls: IssueCall;

  constructor(domain: string, deps: CertLoopDeps) {
    this.domain = domain;
    this.#deps = deps;
    this.#log = deps.logger.child({ domain });
    this.#firstCertificate = deps.startup?.condition();
    const minIssueIntervalMs = deps.minIssueIntervalMs ?? deps.backoff.firstRetryMs;
    const { clock, observer } = deps;
    this.#held = new HeldCertificate({ domain, clock, observer, log: this.#log, minIssueIntervalMs, firstCertificate: this.#firstCertificate });
    this.#budgetQueue = new BudgetQueueLog(domain, deps.budget, observer, this.#log);
    const issues = () => deps.role.canIssue(domain);
    this.#restoreDeps = { domain, store: deps.store, issuanceSlots: deps.issuanceSlots, clock, log: this.#log, issues };
    this.#unusable = new UnusableRecordLog(this.#log, this.#firstCertificate);
    this.#outOfBounds = new OutOfBoundsLog(this.#log, observer.outOfBounds);
    this.#failures = new IssueFailures({ domain, store: deps.store, clock, backoff: deps.backoff, observer, log: this.#log });
    const watching = { domain, store: deps.store, clock, renewal: deps.renewal, log: this.#log, read: (s: AbortSignal) => this.#read(s) };
    const watchCall = (replaced: StoredCert | undefined, call: AbortController) => watchForSupersedingCopy(watching, replaced?.info, call);
    const storePending = async (cert: StoredCert, signal: AbortSignal) =>
      deps.store.savePending ? await restoreToStore(this.#restoreDeps, cert, 'obtained', signal, { pending: true, slotHeld: true }) : ('stored' as const);
    const callParts = {
      domain,
      log: this.#log,
      held: this.#held,
      failures: this.#failures,
      minIssueIntervalMs,
      ari: () => this.#ari(),
      watchCall,
      storePending,
    };
    this.#calls = new IssueCall({ ...deps, ...callParts });
  }

  /** A stopping writer's last look before it hands the role over (store-restore.ts verifyStored). */
  async verifyStored(signal: AbortSignal): Promise<void> {
    await verifyStoredIn(this.#restoreDeps, () => (this.#mayWrite() ? this.#held.best : undefined), signal);
  }

  /** Holds the role that writes the store (restores); issuing may have stopped (IssuanceRole.canWrite). */
  #mayWrite(): boolean {
    const { role } = this.#deps;
    return role.canWrite ? role.canWrite(this.domain) : role.canIssue(this.domain);
  }

  /** The best valid certificate this loop knows, if any. */
  get current(): StoredCert | undefined {
    return this.#held.best;
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
    if (read.state === 'unreadable') this.#held.dropIfExpired();
    else this.#remember(read);
    const unstored = await this.#storePending(read, signal);
    if (unstored !== undefined) return unstored;
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
            const restored = await restoreToStore(this.#restoreDeps, this.#held.best!, read.state, signal);
            return restored === 'stored' || restored === 'conflict' ? 0 : storeRetryDelay(this.#storeFailures, this.#deps.backoff);
          }
          case 'issue':
            return await this.#trackIssuing(this.#calls.issue(signal, decision.reason, turn.budget?.kind === 'granted', snapshot.coordination.renewRequest));
          default:
            return this.#wait(decision, snapshot);
        }
      }
    } finally {
      release?.();
    }
  }

  /**
   * Reads the store, its times bounded (untrusted-values.ts). A renewal the writer stores reaches a reader by
   * the store's watch within moments; one missing a first-retry interval after it came due means the watched
   * copy may be stale (a stream stalled): read the store itself. A failed read is 'unreadable' (never a reason to issue).
   */
  async #load(signal: AbortSignal): Promise<LoadResult> {
    const { store, clock, observer } = this.#deps;
    const fresh = this.#dueSince !== undefined && clock.now() - this.#dueSince >= this.#deps.backoff.firstRetryMs;
    try {
      const read = await this.#read(signal, fresh);
      this.#storeFailures.reset();
      return read;
    } catch (err) {
      if (signal.aborted) throw err;
      this.#log.warn({ code: 'CERTSHARE_STORE_UNAVAILABLE', err: errorMessage(err) }, 'certificate store unreadable');
      observer.problem(this.domain, `store ${store.kind} unreadable: ${errorMessage(err)}`);
      return { state: 'unreadable', failures: this.#storeFailures.record('transient') };
    }
  }

  /** The store's record, its times bounded where read (untrusted-values.ts). */
  async #read(signal: AbortSignal, fresh = false): Promise<StoreRead> {
    const { store, clock } = this.#deps;
    const read = await store.load(this.domain, signal, fresh ? { fresh } : undefined);
    const [now, retryCapMs] = [clock.now(), this.#deps.backoff.retryCapMs];
    const pendingLatest = latestPendingStart(read, this.#held, now, { ...this.#deps, retryCapMs });
    const bounded = this.#outOfBounds.bounded(read, `the ${store.kind} record of ${this.domain}`, now, { retryCapMs, pendingLatest });
    if (bounded.replacedNow) this.#deps.observer.replacedNow(this.domain, bounded.replacedNow.split(','));
    return bounded;
  }

  /** Stores the pair valid only later it holds and the store lacks (a successor waits for it); a wait if not stored. */
  async #storePending(read: LoadResult, signal: AbortSignal): Promise<number | undefined> {
    const pending = read.state === 'unreadable' || !this.#mayWrite() ? undefined : unstoredPending(this.#held.pending, read, this.#deps.store);
    if (!pending) return undefined;
    const stored = await restoreToStore(this.#restoreDeps, pending, read.state, signal, { pending: true });
    if (stored !== 'stored') return stored === 'conflict' ? 0 : storeRetryDelay(this.#storeFailures, this.#deps.backoff);
    return undefined;
  }

  /** Keeps the best valid certificate of what the store returned, our pending pair and what we held. */
  #remember(read: StoreRead): void {
    if (read.state === 'valid') this.#held.considerStored(read.cert, true);
    else if (read.state === 'unusable' && read.expired) this.#held.heldBefore();
    // A newer pair the store saw before what it holds now (a hand edit, a deletion): restored rather than
    // our own older one, which may already be due.
    if (read.lastValid) this.#held.considerStored(read.lastValid);
    // A pair another writer stored for later (its CA's clock ahead): waited for, not ordered again.
    if (read.pending) this.#held.considerPending(read.pending);
    this.#held.adoptPending();
    this.#unusable.report(read);
    this.#held.dropIfExpired();
    const writer = this.#deps.role.canIssue(this.domain);
    if (writer) this.#dueSince = undefined;
    // Only a writer of a name never held waits for a first issuance; renewals (after an expiry too) are exempt.
    if (this.#held.wasHeld || !writer) this.#budgetQueue.leave();
  }

  /** What the rules read, as it is now: the clock and the role are read again for every decision of a turn. */
  #snapshot(read: LoadResult, turn: TurnProgress): IssuanceSnapshot {
    const { role, clock } = this.#deps;
    const issue = role.canIssue(this.domain);
    return {
      now: clock.now(),
      store: storeView(read),
      held: this.#held.best && held(this.#held.best),
      // A reader never acts on ARI: the writer's renewal reaches it through the store.
      ari: issue ? this.#ari() : undefined,
      pending: this.#held.pending && { notBefore: this.#held.pending.info.notBefore },
      role: { identity: role.identity, issue, write: this.#mayWrite() },
      coordination: (read.state === 'unreadable' ? undefined : read.coordination) ?? {},
      backoff: this.#failures.backoff,
      callFloor: this.#held.callFloor,
      turn,
    };
  }

  /** The ARI state of the certificate held, if the daemon's checker knows one for it. */
  #ari(): IssuanceSnapshot['ari'] {
    const state = this.#held.best && this.#deps.renewalInfo?.stateFor(this.domain, this.#held.best.info.serial);
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
        this.#failures.rateLimitedUntil(at, s.now);
        break;
      case 'other_writer_issuing':
        this.#log.info({ holder: s.coordination.intent?.holder }, 'another writer is issuing; waiting');
        break;
      case 'budget_exhausted':
        if (s.turn.budget?.kind === 'queued') this.#budgetQueue.queued(s.turn.budget);
        break;
    }
    return at - s.now;
  }

  /** Waits until tailscaled lists the domain; a first issuance under a budget then asks it for a slot. */
  async #askBudget(signal: AbortSignal): Promise<BudgetAnswer> {
    const { budget, availability, observer } = this.#deps;
    budget?.settled(this.domain);
    await availability.waitFor(this.domain, signal);
    if (!budget) return { kind: 'not_needed' };
    // A name held before is renewed, expired or not: the first-issuance slots (perhaps at an unreachable home)
    // are for new names; a renewal only counts against the name's CA limit.
    const renewal = this.#held.best !== undefined || this.#held.wasHeld;
    let verdict: BudgetVerdict;
    try {
      verdict = await (renewal ? budget.requestReissue(this.domain, signal, this.#renewalDeadline()) : budget.request(this.domain, {}, signal));
    } catch (err) {
      if (signal.aborted) throw err;
      this.#log.warn({ code: 'CERTSHARE_STORE_UNAVAILABLE', err: errorMessage(err) }, 'issuance ledger unusable; not issuing');
      observer.problem(this.domain, `issuance ledger unusable: ${errorMessage(err)}`);
      return { kind: 'unusable', failures: this.#storeFailures.record('transient') };
    }
    if (verdict.kind !== 'queued') this.#budgetQueue.leave(verdict.kind === 'granted' ? 'slot granted' : 'renewal, exempt');
    return verdict;
  }

  /**
   * The latest a renewal waits for the name's limit (IssuanceBudget.requestReissue): the safety point of the
   * certificate held, as a federation member cut off from its home breaks glass at, so the renewal still lands
   * before the gate takes the Pods out; at once when none is held (it ran out).
   */
  #renewalDeadline(): number {
    const best = this.#held.best;
    if (!best) return this.#deps.clock.now();
    return breakGlassPoint(held(best), this.#deps.renewal, this.#deps.readinessLeadMs ?? Number.POSITIVE_INFINITY);
  }

  /** Answers the pending renew request with a refusal (renew-request.ts); 0: decide again on a fresh read. */
  async #refuseRenew(s: IssuanceSnapshot, reason: RenewRefusal, signal: AbortSignal): Promise<number> {
    const id = s.coordination.renewRequest!;
    const budget = s.turn.renewBudget;
    const detail = budget?.kind === 'refused' ? { until: budget.nextSlotAt, registeredDomain: budget.registeredDomain } : { until: s.callFloor };
    const refused = await refuseRenewRequest(this.#deps, this.domain, { id, reason, message: refusalText(this.domain, id, reason, detail) }, signal);
    return refused === 'recorded' || refused === 'conflict' ? 0 : storeRetryDelay(this.#storeFailures, this.#deps.backoff);
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

  get #minIssueIntervalMs(): number {
    return this.#deps.minIssueIntervalMs ?? this.#deps.backoff.firstRetryMs;
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
