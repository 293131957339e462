// The issuance decision of one domain: pure rules over one snapshot, no I/O, time passed in.
//
// CertLoop (cert-loop.ts) reads the store, keeps the best certificate it has seen, and gathers what it
// knows into an IssuanceSnapshot; decideIssuance() runs the rules below in order and the first that
// decides wins, in the style of cert-manager's trigger policies and our ca-rotation.ts. A decision says
// what to do (an action), why (a stable snake_case reason: the `reason` label of
// certshare_issuance_attempts_total and the bracketed code of /healthz) and when (`at`, epoch ms). The
// steps on the way to a CertPair call each await something (the budget, a slot, the intent write): the
// loop takes the step, records it in `turn`, and decides again on a fresh snapshot (clock and role),
// so a role lost while waiting is seen before the call.
import { retryDelay, type BackoffPolicy } from './backoff.ts';
import type { BudgetVerdict } from './issuance-budget.ts';
import { isRenewalDue, nextCheckTime, tooShortReason, type HeldValidity, type RenewalPolicy } from '../renewal/renewal.ts';
import { ariVerdict, type AriReason, type AriState, type AriVerdict } from '../renewal/renewal-info.ts';
import type { Coordination, RecordedCert } from '../ports/store.ts';

/**
 * The rules in order; the first that decides wins, and when none does: issue (issueReason() says why).
 * What each decides, and with which reason, is at its function below.
 */
const ISSUANCE_RULES: readonly IssuanceRule[] = [
  storeUnreadableRule, // not knowing what is stored is never a reason to issue: decided before anything is weighed
  restoreRule, // a store that lost our certificate is repaired before any due date counts (a restore never issues)
  notYetValidRule, // a pair held for later: asking again would only make tailscaled order another
  renewRequestRule, // an operator's renew request (certshare renew): the writer's own path through the rules below, or a refusal
  notDueRule, // a valid certificate, not due by expiry nor by the CA's word (ARI): use it; nothing below matters until then
  readerRule, // due, but only the writer issues: everything below is the writer's
  storedRateLimitRule, // the CA refused for every replica: before our own schedule
  backoffRule, // our own backoff after a failed call or a certificate too short
  minIntervalRule, // the storm bound: no second call within the minimum interval, whatever passed above
  otherWriterRule, // another writer's call under way: its result may make ours unneeded
  budgetRule, // from here on each rule is a step that awaits; the budget first (a slot in it may take days)
  slotRule, // then one of the process's issuance slots, so the intent lives for the call, not the wait
  intentRule, // then the intent, written last before the call
];

/** The next thing to do for one domain. */
export function decideIssuance(s: IssuanceSnapshot, p: IssuanceSettings): IssuanceDecision {
  for (const rule of ISSUANCE_RULES) {
    const decision = rule(s, p);
    if (decision) return decision;
  }
  return { action: 'issue', reason: issueReason(s), at: s.now };
}

/** Why a CertPair call is made: the `reason` label of certshare_issuance_attempts_total (few values, stable). */
export const ISSUE_REASONS = [
  'no_certificate', // nothing stored and nothing held: a first issuance (or one after an expiry)
  'stored_unusable', // the store holds garbage, a mismatched pair or an expired one, and nothing valid is held
  'expiry', // the held certificate reached its renewal point (renewal.ts)
  'ca_requested', // ACME Renewal Information: the time chosen inside the CA's suggested window has come (renewal-info.ts)
  'ca_requested_now', // ARI: the CA's window was already over when it arrived (a revocation, an incident)
  'operator_requested', // an operator's renew request (certshare renew, or the annotation) for a certificate not due
] as const;
export type IssueReason = (typeof ISSUE_REASONS)[number];

/** Why this loop's own backoff holds: what set it. */
type BackoffReason =
  | 'rate_limited' // the CA refused with a rate limit (ours, or one a replica recorded in the store)
  | 'retry_backoff' // the last CertPair call failed (no answer, an error, a pair refused)
  | 'too_short'; // the issuer gave a certificate due again (almost) at once

export type IssuanceReason =
  | IssueReason
  | BackoffReason
  | 'store_unavailable' // the store could not be read (or the intent not written): never a reason to issue
  | 'stored_mismatch' // the store does not hold the certificate this loop holds: put it back
  | 'not_yet_valid' // a pair obtained whose notBefore is ahead of our clock
  | 'not_due' // the certificate held is valid and not due for renewal
  | 'not_writer' // this replica only reads (or lost the writer role while this turn waited)
  | 'min_interval' // the minimum interval since the last new certificate has not passed
  | 'other_writer_issuing' // another writer announced a CertPair call that has not lapsed
  | 'budget_exhausted' // a first issuance waits for a slot of the issuance budget
  | 'name_limited' // a new certificate of a name waits: the CA's limit for that exact name is reached in the window
  | 'name_reserve' // a renew request refused: it would take an issuance of the name kept for ordinary renewals
  | 'ledger_unavailable' // the budget's ledger could not be read or written: no first issuance
  | 'store_changed'; // the intent write lost a race: the next turn reads what changed

/** Why a renew request is refused (recorded on the Secret, in /healthz?verbose, an Event and the metrics). */
export type RenewRefusal =
  | 'min_interval' // a new certificate was obtained less than the minimum interval (--first-retry) ago
  | 'budget_exhausted' // the issuance budget has no slot free now (a renew request never queues)
  | 'name_reserve'; // it would leave fewer than RENEW_RESERVE of the name's limit for ordinary renewals

export type IssuanceDecision =
  /** use: keep serving the certificate held; wait: nothing to do; restore: write the held certificate back. */
  | { action: 'use' | 'wait' | 'restore'; reason: IssuanceReason; at: number }
  /**
   * A step towards a CertPair call, each awaited by the loop before it decides again: ask_budget (wait
   * until tailscaled lists the domain; a first issuance under a budget asks it for a slot), take_slot (one
   * of the process's issuance slots), announce (the intent, in the store), issue (the call itself).
   */
  | { action: 'ask_budget' | 'take_slot' | 'announce' | 'issue'; reason: IssueReason; at: number }
  /** A renew request: ask the budget for a slot (never a queue); or refuse it, recording why on the store. */
  | { action: 'ask_renew_budget'; reason: 'operator_requested'; at: number }
  | { action: 'refuse_renew'; reason: RenewRefusal; at: number };

/** What the store read returned, reduced to what the rules read. */
export type StoreView =
  | { state: 'unreadable'; failures: number } // `failures`: consecutive failed calls to the store, this one included
  | { state: 'absent' }
  | (({ state: 'unusable' } | { state: 'valid'; notAfter: number }) & { record?: RecordedCert | undefined }); // record: StoreRead's

/** The answer to ask_budget. */
export type BudgetAnswer = BudgetVerdict | { kind: 'not_needed' } | { kind: 'unusable'; failures: number };

/** The answer to ask_renew_budget: a slot taken (or no budget), none free now, or a ledger we cannot use. */
export type RenewBudgetAnswer =
  | { kind: 'granted' }
  | { kind: 'not_needed' }
  | { kind: 'refused'; reason: 'budget_exhausted' | 'name_reserve'; registeredDomain: string; nextSlotAt: number }
  | { kind: 'unusable'; failures: number };

/** What this turn has done on its way to a CertPair call (empty at the start of a turn). */
export interface TurnProgress {
  budget?: BudgetAnswer;
  slot?: true;
  intent?: { kind: 'recorded' } | { kind: 'conflict' } | { kind: 'failed'; failures: number };
  renewBudget?: RenewBudgetAnswer;
}

export interface IssuanceSnapshot {
  /** The clock when the snapshot was gathered (epoch ms). */
  now: number;
  store: StoreView;
  /** The best certificate valid now that the loop knows (from the store or its own call); its serial when known. */
  held: (HeldValidity & { serial?: string }) | undefined;
  /**
   * The writer's ACME Renewal Information for `held` (renewal-info.ts): its AriState and the least time a
   * certificate is held before the CA's answer may order (the minimum interval between two issuances).
   * notDueRule then looks again at the earlier of the expiry rule's time and the one chosen inside the CA's
   * window, and a certificate not due by expiry is due once ariVerdict says order (issueReason says why).
   * Undefined: ARI off, a reader, or nothing known for this certificate yet (its ARI ID not computed).
   */
  ari?: { state: AriState; minHoldMs: number } | undefined;
  /** A pair obtained whose validity starts later (the issuer's clock is ahead): taken into use at its notBefore. */
  pending: { notBefore: number } | undefined;
  /** The role as it is now: issue (CertPair calls) and write (restores; also a writer that stopped issuing). */
  role: { identity: string; issue: boolean; write: boolean };
  /** What the writers told each other through the store (an intent, a recorded rate limit). */
  coordination: Coordination;
  /** This loop's own backoff: no CertPair call before `until`. */
  backoff: { until: number; reason: BackoffReason } | undefined;
  /** No CertPair call before this: the minimum interval after the last new certificate, or its notBefore if later. */
  callFloor: number;
  turn: TurnProgress;
}

/** The fixed settings the rules read (CertLoopDeps provides them). @forTests */
export interface IssuanceSettings {
  renewal: RenewalPolicy;
  backoff: BackoffPolicy;
  /** How long another writer's announced CertPair call blocks ours. */
  intentTtlMs: number;
}

/**
 * How long a writer's announced CertPair call (its intent) blocks the others: the call's timeout plus a margin for its
 * store round trips, capped at 30 s.
 */
export function intentTtl(certTimeoutMs: number): number {
  return certTimeoutMs + Math.min(30_000, certTimeoutMs);
}

/** @forTests */
export type IssuanceRule = (s: IssuanceSnapshot, p: IssuanceSettings) => IssuanceDecision | undefined;

const wait = (reason: IssuanceReason, at: number): IssuanceDecision => ({ action: 'wait', reason, at });

/** The backoff step of a failed store or ledger call (`failures` of them in a row). */
const storeRetryAt = (s: IssuanceSnapshot, p: IssuanceSettings, failures: number): number =>
  s.now + retryDelay({ kind: 'transient', message: '' }, failures, p.backoff);

/** Whether the store holds `held` or a certificate that expires later. */
export function storeHolds(store: StoreView, held: Pick<HeldValidity, 'notAfter'>): boolean {
  return store.state === 'valid' && store.notAfter >= held.notAfter;
}

/** What ARI says about the held certificate now (silent without ARI state). */
export function ariVerdictOf(s: Pick<IssuanceSnapshot, 'now' | 'ari'>): AriVerdict {
  return s.ari ? ariVerdict(s.ari.state, s.now, s.ari.minHoldMs) : { kind: 'silent', why: 'no_answer' };
}

/**
 * Why a CertPair call would be made now. The CA's word comes first, even for a certificate also due by
 * expiry: the call then asks for the min_validity that replaces a revoked certificate (renewal-info.ts
 * ariMinValidityMs), and the at-most-one-order guard records it.
 * @forTests
 */
export function issueReason(s: Pick<IssuanceSnapshot, 'held' | 'store' | 'now' | 'ari'>): IssueReason {
  if (s.held) {
    const ari = ariVerdictOf(s);
    return ari.kind === 'order' ? ari.reason : 'expiry';
  }
  return s.store.state === 'unusable' ? 'stored_unusable' : 'no_certificate';
}

/** Whether a call for `reason` is one the CA asked for through ARI. */
export function isAriReason(reason: IssueReason): reason is AriReason {
  return reason === 'ca_requested' || reason === 'ca_requested_now';
}

/**
 * A failed store read retries at the transient pace, but at least every half of what the held certificate
 * has left (never sooner than the first retry): a renewal the store holds is read before the expiry even
 * behind a long streak of failed reads, not a backoff step after it.
 * @forTests
 */
export function storeUnreadableRule(s: IssuanceSnapshot, p: IssuanceSettings): IssuanceDecision | undefined {
  if (s.store.state !== 'unreadable') return undefined;
  let at = storeRetryAt(s, p, s.store.failures);
  if (s.held) at = Math.min(at, s.now + Math.max(p.backoff.firstRetryMs, Math.floor((s.held.notAfter - s.now) / 2)));
  return wait('store_unavailable', at);
}

/** Deleted, emptied, garbage or older in the store: put back what we hold (a restore needs the role to write, not to issue). @forTests */
export function restoreRule(s: IssuanceSnapshot): IssuanceDecision | undefined {
  if (!s.role.write || !s.held || storeHolds(s.store, s.held) || !mayRestore(s.store, s.held, s.role.issue)) return undefined;
  return { action: 'restore', reason: 'stored_mismatch', at: s.now };
}

/**
 * Whether a replica may put `held` back into a store that does not hold it. The writer may (it issues if what
 * it holds is due). A replica that may not issue (a candidate of a Lease: LeaseElector.canWrite) puts back only
 * the certificate of record (StoreRead.record) or a pair that expires later than it: a pair it held from before
 * a renewal it never saw (its reads failed meanwhile) is older than the record, and putting it back would undo
 * that renewal; it leaves the repair to the writer, or to a replica that holds the record's pair. A record that
 * names no pair (a deleted Secret) leaves the store's own compare-and-swap and the later-expiry rule to decide.
 */
export function mayRestore(store: StoreView, held: Pick<HeldValidity, 'notAfter'> & { serial?: string }, issue: boolean): boolean {
  const record = store.state === 'valid' || store.state === 'unusable' ? store.record : undefined;
  if (issue || record === undefined || record.serial === held.serial) return true;
  return record.notAfter !== undefined && held.notAfter > record.notAfter;
}

/** Obtained, not valid yet: asking again would only make tailscaled order another one. @forTests */
export function notYetValidRule(s: IssuanceSnapshot): IssuanceDecision | undefined {
  return s.pending ? wait('not_yet_valid', s.pending.notBefore) : undefined;
}

/**
 * Valid and not due: keep it, look again at its renewal point (or the check interval, if sooner), or at
 * the time the CA's ARI answer makes it due if that is sooner. Once ARI says order, it is due now.
 * @forTests
 */
export function notDueRule(s: IssuanceSnapshot, p: IssuanceSettings): IssuanceDecision | undefined {
  if (!s.held || isRenewalDue(s.held, s.now, p.renewal)) return undefined;
  const ari = ariVerdictOf(s);
  if (ari.kind === 'order') return undefined;
  const next = nextCheckTime(s.held, s.now, p.renewal);
  return { action: 'use', reason: 'not_due', at: ari.kind === 'wait' ? Math.min(next, ari.at) : next };
}

/**
 * Readers wait for the writer's update (the store's watch wakes them); as a safety net against a watch
 * that stalled silently they look again at the first-retry pace. A writer that lost the role while this
 * turn waited (for the budget, a slot, the intent write) looks again at once, as the reader it now is.
 * @forTests
 */
export function readerRule(s: IssuanceSnapshot, p: IssuanceSettings): IssuanceDecision | undefined {
  if (s.role.issue) return undefined;
  return wait('not_writer', s.turn.budget ? s.now : s.now + Math.min(p.renewal.checkIntervalMs, p.backoff.firstRetryMs));
}

/** A rate limit recorded by any replica (or by this one before a restart) holds for everyone. @forTests */
export function storedRateLimitRule(s: IssuanceSnapshot): IssuanceDecision | undefined {
  const until = s.coordination.retryNotBefore;
  if (until === undefined || until <= s.now || until <= (s.backoff?.until ?? -Infinity)) return undefined;
  return wait('rate_limited', until);
}

/** This loop's own backoff after a failed call, a rate limit or a certificate too short. @forTests */
export function backoffRule(s: IssuanceSnapshot): IssuanceDecision | undefined {
  return s.backoff && s.now < s.backoff.until ? wait(s.backoff.reason, s.backoff.until) : undefined;
}

/** Whatever the certificates look like, never two issuances of a domain closer than the minimum interval. @forTests */
export function minIntervalRule(s: IssuanceSnapshot): IssuanceDecision | undefined {
  return s.now < s.callFloor ? wait('min_interval', s.callFloor) : undefined;
}

/** Another writer is mid-issuance: its result lands in the store (the watch wakes us) or its intent lapses. @forTests */
export function otherWriterRule(s: IssuanceSnapshot, p: IssuanceSettings): IssuanceDecision | undefined {
  const intent = s.coordination.intent;
  if (!intent || intent.holder === s.role.identity || s.now >= intent.at + p.intentTtlMs) return undefined;
  return wait('other_writer_issuing', intent.at + p.intentTtlMs);
}

/** A first issuance waits for a slot of the budget; a ledger we cannot use is never an empty budget. @forTests */
export function budgetRule(s: IssuanceSnapshot, p: IssuanceSettings): IssuanceDecision | undefined {
  const answer = s.turn.budget;
  if (!answer) return { action: 'ask_budget', reason: issueReason(s), at: s.now };
  if (answer.kind === 'unusable') return wait('ledger_unavailable', storeRetryAt(s, p, answer.failures));
  if (answer.kind === 'queued') return wait('budget_exhausted', answer.turnAt);
  if (answer.kind === 'name_limited') return wait('name_limited', answer.turnAt);
  return undefined;
}

/** At most issuanceSlots.limit domains of the process issue at once; the intent is written once the slot is ours. @forTests */
export function slotRule(s: IssuanceSnapshot): IssuanceDecision | undefined {
  return s.turn.slot ? undefined : { action: 'take_slot', reason: issueReason(s), at: s.now };
}

/**
 * An operator's renew request (Coordination.renewRequest: asked and not yet answered) for a certificate
 * that is valid and not due. Only the writer acts on it; a reader, a domain without a certificate, or a
 * certificate due anyway (by expiry or the CA's word) follow the ordinary rules, and the certificate they
 * obtain answers the request too. A rate limit or a backoff makes it wait (the CA said when); the minimum
 * interval since the last new certificate refuses it, and so does a budget without a free slot (it never
 * queues: a request the operator made today is not served next week). The steps to the call are the
 * ordinary ones (slot, intent), taken for this reason.
 * @forTests
 */
export function renewRequestRule(s: IssuanceSnapshot, p: IssuanceSettings): IssuanceDecision | undefined {
  if (s.coordination.renewRequest === undefined || !s.held || !s.role.issue) return undefined;
  if (isRenewalDue(s.held, s.now, p.renewal) || ariVerdictOf(s).kind === 'order') return undefined;
  const held = storedRateLimitRule(s) ?? backoffRule(s);
  if (held) return held;
  if (s.now < s.callFloor) return { action: 'refuse_renew', reason: 'min_interval', at: s.now };
  const other = otherWriterRule(s, p);
  if (other) return other;
  const budget = s.turn.renewBudget;
  if (!budget) return { action: 'ask_renew_budget', reason: 'operator_requested', at: s.now };
  if (budget.kind === 'unusable') return wait('ledger_unavailable', storeRetryAt(s, p, budget.failures));
  if (budget.kind === 'refused') return { action: 'refuse_renew', reason: budget.reason, at: s.now };
  const step = slotRule(s) ?? intentRule(s, p);
  if (step?.action === 'take_slot' || step?.action === 'announce') return { ...step, reason: 'operator_requested' };
  return step ?? { action: 'issue', reason: 'operator_requested', at: s.now };
}

/** Whether a call for `reason` must make tailscaled order anew even for a certificate with most of its life left. */
export function forcesNewOrder(reason: IssueReason): boolean {
  return isAriReason(reason) || reason === 'operator_requested';
}

/** Announce the call before making it; a write that lost a race or failed issues nothing. @forTests */
export function intentRule(s: IssuanceSnapshot, p: IssuanceSettings): IssuanceDecision | undefined {
  const intent = s.turn.intent;
  if (!intent) return { action: 'announce', reason: issueReason(s), at: s.now };
  if (intent.kind === 'conflict') return wait('store_changed', s.now);
  if (intent.kind === 'failed') return wait('store_unavailable', storeRetryAt(s, p, intent.failures));
  return undefined;
}

/**
 * When to look again after a CertPair call that gave a certificate: a pending one's notBefore; else the
 * held certificate's next check, but not before a backoff (a certificate too short) ends.
 */
export function planAfterCall(s: Pick<IssuanceSnapshot, 'now' | 'held' | 'pending' | 'backoff'>, p: Pick<IssuanceSettings, 'renewal'>): IssuanceDecision {
  if (s.pending) return wait('not_yet_valid', s.pending.notBefore);
  const next = s.held ? nextCheckTime(s.held, s.now, p.renewal) : s.now;
  if (s.backoff && s.backoff.until > next) return wait(s.backoff.reason, s.backoff.until);
  // Without a certificate (not reached: a call that gave one holds it, or a newer one): look again now.
  return s.held ? { action: 'use', reason: 'not_due', at: next } : wait('no_certificate', next);
}

/** What a CertPair answer that passed validation is worth. */
type AnswerVerdict =
  | { kind: 'unchanged' } // the certificate held, not due: tailscaled answered from its cache
  | { kind: 'due_again' } // the certificate held, due: refused (CERTSHARE_CERT_STALE)
  /** A new pair that expires no later than the one held: the held one stays; refused unless it is too short (then a backoff). */
  | { kind: 'older'; tooShort: string | undefined }
  /** A new pair: used now, or from its notBefore (the issuer's clock is ahead); `tooShort` says why it is due again too soon. */
  | { kind: 'new'; usableAt: 'now' | 'not_before'; tooShort: string | undefined };

/**
 * Judges the answer of a CertPair call against the certificate held (with its serial) at `now`, for the
 * min_validity asked for and the minimum interval between two issuances (renewal.ts tooShortReason).
 */
export function judgeAnswer(
  answer: Pick<HeldValidity, 'notBefore' | 'notAfter'> & { serial: string },
  held: (HeldValidity & { serial: string }) | undefined,
  now: number,
  renewal: Pick<RenewalPolicy, 'renewFraction'>,
  asked: { minValidityMs: number; minIssueIntervalMs: number },
): AnswerVerdict {
  if (held && answer.serial === held.serial) return isRenewalDue(held, now, renewal) ? { kind: 'due_again' } : { kind: 'unchanged' };
  const tooShort = tooShortReason(answer, now, renewal, asked);
  if (held && answer.notAfter <= held.notAfter) return { kind: 'older', tooShort };
  return { kind: 'new', usableAt: now < answer.notBefore ? 'not_before' : 'now', tooShort };
}

/**
 * Whether a copy that reached the store while a CertPair call was under way makes the call pointless: valid now,
 * not due, and expiring after the certificate the call replaces (none: a first issuance, or one that ran out).
 * A member's break-glass certificate pushed to the home, another writer's renewal: the call was decided for the
 * renewal this copy already is, so it is cancelled (a call may hang for its whole timeout) and the copy used.
 */
export function copySupersedesCall(
  copy: HeldValidity,
  replaced: Pick<HeldValidity, 'notAfter'> | undefined,
  now: number,
  renewal: Pick<RenewalPolicy, 'renewFraction'>,
): boolean {
  return copy.notBefore <= now && !isRenewalDue(copy, now, renewal) && (replaced === undefined || copy.notAfter > replaced.notAfter);
}
