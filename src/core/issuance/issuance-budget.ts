// The issuance budget: Let's Encrypt's "new certificates per registered domain" limit (50 per 7 days), kept
// on our side so that a group with many domains is never refused for a week in an order nobody chose.
// Only first issuances count (a domain that never had a certificate in this group): renewals of a name
// set issued before are exempt, as at Let's Encrypt. The ledger of first issuances is written before the
// CertPair call, on a group object every writer shares, so no restart or failover forgets a slot taken.
import { iso, type Clock } from '../ports/clock.ts';
import { CertshareError, errorMessage, errorText } from '../errors.ts';
import type { Logger } from '../ports/logger.ts';
import { normalizeDomain } from '../certificates/domain.ts';
import { parseDuration } from '../values/duration.ts';
import { loadRegisteredDomainRule, tailnetDomain, type RegisteredDomainRule } from './registered-domain.ts';
import { CLOCK_SKEW_MS, isRenewId, OutOfBoundsLog, type UntrustedValue } from '../values/untrusted-values.ts';

export interface BudgetLimit {
  /** First issuances allowed per registered domain in any window of windowMs. */
  count: number;
  windowMs: number;
}

/** One first issuance, reserved before its CertPair call. */
export interface LedgerEntry {
  domain: string;
  registeredDomain: string;
  /**
   * When the slot was taken (epoch ms): the reservation instant, moved to the end of the CertPair call once
   * it returned a certificate. A CA stamps its issuance in between, so the slot never frees before the
   * CA's own window has passed.
   */
  at: number;
  /** A certificate was obtained: later issuances of this domain are renewals (exempt). */
  issued: boolean;
  /**
   * A slot an operator's renew request took (certshare renew): an issuance outside the renewal schedule,
   * counted like a first one for its window and then dropped (it makes nothing exempt). The request's id:
   * a retry of the same request (its call failed) finds its slot instead of taking another, in the process
   * that took it and until a call returns a certificate (RenewRequests).
   */
  renew?: string;
  /**
   * A new certificate for a name that had one (a renewal by expiry or the CA's word, a re-issuance): it
   * counts only towards the name's own limit (NameLimit), taken before the call and confirmed (`issued`)
   * once the call returned a certificate; a retry after a failed call reuses the unconfirmed one.
   */
  renewal?: true;
}

/**
 * The CA's limit on certificates for one exact name set (Let's Encrypt: 5 per 168 h), which renewals do
 * not escape: every issuance of a name counts, whatever asked for it. A renew request is refused once it
 * would leave fewer than RENEW_RESERVE issuances of the window for the ordinary renewals.
 */
type NameLimit = BudgetLimit;

/** What the name limit leaves for more renew requests: `left` now, and when the next is possible if none is. */
export interface RenewLeft {
  left: number;
  of: NameLimit;
  until: number;
}

/** Issuances of a name a renew request never takes: left for renewals by expiry or the CA's word. */
export const RENEW_RESERVE = 2;

/**
 * The ledger as read; `version` is what a compare-and-swap write must still find (undefined: no ledger yet).
 * `entries`: this writer's own part, the one it writes. `others`: in a ledger shared by a cluster's groups,
 * the parts other accounts write (one per namespace, and the unattributed one of 0.1.0), read only: their
 * first issuances and renew slots count for the registered domain's budget (the CA counts them all), and
 * nothing else of them is believed (a name's limit and a name's record of its first certificate are the
 * group's own part's: another group's token must not hold this group's renewals or exempt its first issuances).
 */
export interface LedgerSnapshot {
  entries: LedgerEntry[];
  version: string | undefined;
  others?: readonly LedgerPart[] | undefined;
}

/**
 * One part of a shared ledger another account writes: named for the logs (its key), its entries as read;
 * `fault`: why it could not be read (then it counts for nothing: its writer could as well have emptied it,
 * and a part one tenant garbles must not stop every group's first issuances).
 */
export interface LedgerPart {
  name: string;
  entries: LedgerEntry[];
  fault?: string;
}

/**
 * Where the ledger lives (a group object in the cluster, `.state/` standalone). A failed read throws
 * (CERTSHARE_STORE_UNAVAILABLE or CERTSHARE_STORE_CORRUPT): it is never an empty ledger.
 */
export interface LedgerStore {
  readonly kind: string;
  /**
   * `registeredDomain`: the one the caller decides for. A store that keeps one ledger per registered domain
   * (shared by every group of a cluster) reads and writes that one; a group's ledger holds them all.
   */
  read(signal: AbortSignal, registeredDomain: string): Promise<LedgerSnapshot>;
  /** Replaces the ledger if it is still at `previous.version`; CERTSHARE_STORE_CONFLICT otherwise. */
  write(entries: LedgerEntry[], previous: LedgerSnapshot, signal: AbortSignal, registeredDomain: string): Promise<void>;
}

/** A domain waiting for a first issuance; expiresAt is the notAfter of a certificate it still holds, if any. */
interface Contender {
  domain: string;
  expiresAt?: number | undefined;
}

/**
 * `COUNT/WINDOW` (e.g. `50/168h`), or `0` for no budget. COUNT is a positive integer, WINDOW a Go-style
 * duration longer than 0. Throws CERTSHARE_BAD_FLAG with the reason.
 */
export function parseBudget(text: string, flag = '--issuance-budget'): BudgetLimit | undefined {
  const input = text.trim();
  if (input === '0') return undefined;
  const match = /^(\d+)\/(.+)$/.exec(input);
  const bad = (why: string): CertshareError =>
    new CertshareError('CERTSHARE_BAD_FLAG', { flag, rule: `"${text}" ${why} (want COUNT/WINDOW, e.g. 50/168h, or 0 to disable)` });
  if (!match) throw bad('is not COUNT/WINDOW');
  const count = Number(match[1]);
  if (!Number.isSafeInteger(count) || count < 1) throw bad('needs a COUNT of at least 1');
  let windowMs: number;
  try {
    windowMs = parseDuration(match[2]!);
  } catch {
    throw bad('has an invalid WINDOW duration');
  }
  if (!(windowMs > 0)) throw bad('needs a WINDOW longer than 0');
  return { count, windowMs };
}

export function formatBudget(limit: BudgetLimit): string {
  return `${limit.count} per ${limit.windowMs / 1000}s`;
}

/** Contenders in the order they get slots: without a certificate first, then the soonest to expire, then by name. */
function byPriority(a: Contender, b: Contender): number {
  const ea = a.expiresAt ?? -Infinity;
  const eb = b.expiresAt ?? -Infinity;
  if (ea !== eb) return ea < eb ? -1 : 1;
  return a.domain < b.domain ? -1 : a.domain > b.domain ? 1 : 0;
}

/**
 * Whether a later issuance of `domain` is a renewal: the ledger saw it obtain a first certificate (a renew
 * request's slot, `issued` as well, makes nothing exempt).
 */
function everIssued(entries: readonly LedgerEntry[], domain: string): boolean {
  return entries.some((e) => e.domain === domain && e.issued && isFirst(e));
}

/** An entry of a first issuance (not a renew request's slot, not a renewal). */
const isFirst = (e: LedgerEntry): boolean => e.renew === undefined && e.renewal === undefined;

/** The instants of `domain`'s issuances inside the name limit's window at `now`, oldest first. */
function nameIssuances(entries: readonly LedgerEntry[], domain: string, now: number, limit: NameLimit): number[] {
  return entries
    .filter((e) => e.domain === domain && e.at > now - limit.windowMs)
    .map((e) => e.at)
    .sort((a, b) => a - b);
}

/**
 * When the name's next issuance may be made, keeping `reserve` of the window's issuances for others: now
 * while fewer than count - reserve are in the window, else when enough of the oldest have left it.
 */
function nextNameSlot(taken: readonly number[], now: number, limit: NameLimit, reserve = 0): number {
  const room = limit.count - reserve;
  if (taken.length < room) return now;
  if (room <= 0) return Number.POSITIVE_INFINITY;
  return Math.max(now, taken[taken.length - room]! + limit.windowMs);
}

/**
 * Until when a renewal waits that the name's limit holds until `turnAt`; undefined: it goes ahead now.
 * `deadline` (IssuanceBudget.requestReissue): the safety point of the certificate held (core/federation/
 * home-verdicts.ts breakGlassPoint), now for one that ran out. Whoever may write the ledger (a group's token; in
 * a ledger shared by a cluster's groups, any group's) can fill a name's window with entries dated now, again and
 * again: the ledger cannot tell them from issuances. Issuances hold a renewal that long only for certificates
 * living less than the window, and a certificate running out is worse than the CA's refusal (a rate limit,
 * backed off from): from the deadline the renewal goes ahead, counted (CERTSHARE_NAME_LIMIT_PASSED). Entries
 * delay it to the safety point, never past it. Without a deadline: the window.
 */
function nameLimitWait(at: { domain: string; turnAt: number; now: number; deadline: number | undefined }, log: Logger): number | undefined {
  const { domain, turnAt, now, deadline } = at;
  if (turnAt <= now) return undefined;
  if (deadline === undefined) return turnAt;
  if (now < deadline) return Math.min(turnAt, deadline);
  const until = iso(turnAt);
  log.warn(
    { domain, code: 'CERTSHARE_NAME_LIMIT_PASSED', until },
    `CERTSHARE_NAME_LIMIT_PASSED ${errorText('CERTSHARE_NAME_LIMIT_PASSED', { domain, until })}`,
  );
  return undefined;
}

/**
 * The instant each contender of one registered domain gets a slot, in priority order: at once while the
 * window has room, else when the oldest slot in the window frees, then the next, and so on (a slot taken
 * at T frees at T + window). Pure: the ledger entries, the contenders and now in, the plan out.
 * @forTests
 */
export function planTurns(
  limit: BudgetLimit,
  entries: readonly LedgerEntry[],
  contenders: readonly Contender[],
  now: number,
): Array<{ domain: string; turnAt: number; expiresAt?: number | undefined }> {
  const taken = entries
    .filter((e) => e.at > now - limit.windowMs)
    .map((e) => e.at)
    .sort((a, b) => a - b);
  const free = Math.max(0, limit.count - taken.length);
  const turns: number[] = [];
  return [...contenders].sort(byPriority).map((c, rank) => {
    let turnAt: number;
    if (rank < free) turnAt = now;
    else if (rank - free < taken.length) turnAt = Math.max(now, taken[rank - free]! + limit.windowMs);
    else turnAt = turns[rank - limit.count]! + limit.windowMs; // a slot taken by a contender ahead, freed a window later
    turns.push(turnAt);
    return { domain: c.domain, turnAt, expiresAt: c.expiresAt };
  });
}

export type BudgetVerdict =
  /** A renewal (the ledger saw this domain obtain a certificate): not counted. */
  | { kind: 'exempt' }
  /** A slot is reserved in the ledger for this call. */
  | { kind: 'granted' }
  | {
      kind: 'queued';
      registeredDomain: string;
      position: number;
      queued: number;
      turnAt: number;
      /** In a shared ledger: the window's slots each part holds, most first (`own`: this writer's part). */
      holders?: string | undefined;
    }
  /** A new certificate of a name that had one waits for the name's own limit (NameLimit). */
  | { kind: 'name_limited'; turnAt: number };

/** What the queue of one registered domain looks like, for metrics, health and alerts. */
export interface QueueReport {
  registeredDomain: string;
  queued: number;
  /** Queued domains whose certificate expires before their turn. */
  expiringBeforeTurn: number;
  /** When the next slot frees (epoch ms), if anyone waits. */
  nextSlotAt: number | undefined;
}

/** How many times one request re-reads the ledger after losing a compare-and-swap to another writer. */
const MAX_CONFLICTS = 5;

/**
 * The budget of one writer process: every CertLoop asks it before a first issuance. Requests are handled
 * one at a time, against a ledger read fresh each time (another writer may have taken slots). The first
 * decisions wait until every domain of the registered domain has had its first look at the store, so that
 * at start-up the priority order holds whichever loop happens to ask first.
 */
export class IssuanceBudget {
  readonly limit: BudgetLimit;
  readonly nameLimit: NameLimit | undefined;
  readonly #store: LedgerStore;
  readonly #clock: Clock;
  readonly #log: Logger;
  /** Managed domains, and whether each has ended a first turn (or is waiting for tailscaled to list it). */
  readonly #settled = new Map<string, boolean>();
  /** Domains that asked and wait for a slot (or are being decided). */
  readonly #waiting = new Map<string, Contender>();
  /** The last plan per registered domain (from the last decision): what metrics and health report. */
  readonly #plans = new Map<string, Array<{ domain: string; turnAt: number; expiresAt?: number | undefined }>>();
  #queue: Promise<unknown> = Promise.resolve();
  #settledChange = new AbortController();
  readonly #shiftListeners = new Set<(domains: string[]) => void>();
  /**
   * The public suffix list, loaded at the first decision that involves a name outside `<tailnet>.ts.net`
   * (see registered-domain.ts: it costs RSS that a Tailscale sidecar need not pay).
   */
  #list: RegisteredDomainRule | undefined;
  readonly #rule: RegisteredDomainRule;

  readonly #outOfBounds: OutOfBoundsLog;
  readonly #renewRequests = new RenewRequests();

  constructor(options: {
    limit: BudgetLimit;
    store: LedgerStore;
    clock: Clock;
    logger: Logger;
    registeredDomain?: RegisteredDomainRule;
    /** The CA's limit per exact name set; undefined: none kept (first issuances only, by `limit`). */
    nameLimit?: NameLimit | undefined;
    /** An entry of the ledger not believed (believedEntries): counted and recorded as an Event. */
    onOutOfBounds?: (where: string, value: UntrustedValue) => void;
  }) {
    this.limit = options.limit;
    this.nameLimit = options.nameLimit;
    this.#store = options.store;
    this.#clock = options.clock;
    this.#log = options.logger;
    this.#outOfBounds = new OutOfBoundsLog(this.#log, (where, value) => options.onOutOfBounds?.(where, value));
    const injected = options.registeredDomain;
    this.#rule = injected ?? ((d) => tailnetDomain(d) ?? this.#list?.(d) ?? d);
  }

  get storeKind(): string {
    return this.#store.kind;
  }

  track(domain: string): void {
    if (!this.#settled.has(domain)) this.#settled.set(domain, false);
  }

  untrack(domain: string): void {
    this.#settled.delete(domain);
    this.withdraw(domain);
    this.#signalSettled();
  }

  /** The domain's loop ended a turn or waits for something else: it cannot be a contender that has not asked yet. */
  settled(domain: string): void {
    if (this.#settled.get(domain) === false) {
      this.#settled.set(domain, true);
      this.#signalSettled();
    }
  }

  /**
   * The domain no longer waits (it holds a certificate, or this replica stopped being the writer): the
   * domains behind it may now have an earlier turn, and their loops are told (onQueueShift).
   */
  withdraw(domain: string): void {
    const behind = this.#remove(domain);
    if (behind.length > 0) for (const listener of this.#shiftListeners) listener(behind);
  }

  /** Calls `listener` with the queued domains whose turn may have come earlier. */
  onQueueShift(listener: (domains: string[]) => void): () => void {
    this.#shiftListeners.add(listener);
    return () => this.#shiftListeners.delete(listener);
  }

  /** Takes the domain out of the queue; returns the queued domains planned after it. */
  #remove(domain: string): string[] {
    if (!this.#waiting.delete(domain)) return [];
    const rd = this.#rule(domain);
    const old = this.#plans.get(rd) ?? [];
    const plan = old.filter((t) => t.domain !== domain);
    if (plan.length) this.#plans.set(rd, plan);
    else this.#plans.delete(rd);
    const index = old.findIndex((t) => t.domain === domain);
    return index < 0
      ? []
      : old
          .slice(index + 1)
          .map((t) => t.domain)
          .filter((d) => this.#waiting.has(d));
  }

  /**
   * Asks for a first issuance of `domain`. Granted means the slot is in the ledger already (written
   * before this returns); a failed ledger read or write throws, and the caller must not issue.
   */
  async request(domain: string, contender: Omit<Contender, 'domain'>, signal: AbortSignal): Promise<BudgetVerdict> {
    this.#waiting.set(domain, { domain, expiresAt: contender.expiresAt });
    this.#signalSettled(); // an asker is no longer one the others wait for
    try {
      await this.#loadListIfNeeded(domain);
      await this.#untilPeersSettled(domain, signal);
      return await this.#serially(() => this.#decide(domain, signal));
    } catch (err) {
      // Not knowing the ledger keeps the domain in the queue (it still waits), but never issues.
      throw err instanceof CertshareError
        ? err
        : new CertshareError(
            'CERTSHARE_STORE_UNAVAILABLE',
            { action: 'use', object: `the issuance ledger (${this.#store.kind})`, cause: errorMessage(err) },
            { cause: err },
          );
    }
  }

  /**
   * Takes a slot for an operator's renew request of `domain` if one is free now: it never queues (the
   * request is refused instead, with when the next slot frees). The slot is in the ledger before this
   * returns; a failed ledger read or write throws, and the caller must not issue.
   */
  async requestRenewal(
    domain: string,
    request: string,
    signal: AbortSignal,
  ): Promise<{ kind: 'granted' } | { kind: 'refused'; reason: 'budget_exhausted' | 'name_reserve'; registeredDomain: string; nextSlotAt: number }> {
    await this.#loadListIfNeeded(domain);
    const rd = this.#rule(domain);
    return await this.#serially(async () => {
      for (let attempt = 0; ; attempt++) {
        const snapshot = await this.#read(signal, rd);
        const now = this.#clock.now();
        const live = liveEntries(snapshot.entries, now, this.limit, this.nameLimit);
        if (this.#renewRequests.isRetry(domain, request, live)) return { kind: 'granted' };
        this.#renewRequests.noteLeft(domain, request, live, now, this.nameLimit);
        // The name's own limit first: a renew request never takes the issuances kept for ordinary renewals.
        const nameSlotAt = this.nameLimit && nextNameSlot(nameIssuances(live, domain, now, this.nameLimit), now, this.nameLimit, RENEW_RESERVE);
        if (nameSlotAt !== undefined && nameSlotAt > now) return { kind: 'refused', reason: 'name_reserve', registeredDomain: rd, nextSlotAt: nameSlotAt };
        const taken = slotEntries([...live, ...othersOf(snapshot)], rd)
          .filter((e) => e.at > now - this.limit.windowMs)
          .map((e) => e.at)
          .sort((a, b) => a - b);
        // Domains waiting for a first issuance come first: a free slot is theirs unless more are free.
        const waiting = [...this.#waiting.keys()].filter((d) => this.#rule(d) === rd).length;
        if (taken.length + waiting >= this.limit.count) {
          const nextSlotAt = taken.length > 0 ? taken[Math.max(0, taken.length + waiting - this.limit.count)]! + this.limit.windowMs : now;
          return { kind: 'refused', reason: 'budget_exhausted', registeredDomain: rd, nextSlotAt: Math.max(now, nextSlotAt) };
        }
        try {
          await this.#store.write([...live, { domain, registeredDomain: rd, at: now, issued: true, renew: request }], snapshot, signal, rd);
          this.#renewRequests.took(domain, request, now);
          return { kind: 'granted' };
        } catch (err) {
          if (!isConflict(err) || attempt >= MAX_CONFLICTS) throw err;
        }
      }
    });
  }

  /** A call for `domain` returned a certificate: the renew request whose slot it took is served, its slot no retry's. */
  certificateReturned(domain: string): void {
    this.#renewRequests.returned(domain);
  }

  /** What the name limit leaves for more renew requests of `domain` once `request` is served (none: no name limit). */
  renewLeft(domain: string, request: string): RenewLeft | undefined {
    return this.#renewRequests.left(domain, request);
  }

  /**
   * Asks for a new certificate of a name that had one (a renewal: by expiry, by the CA's word, or a name
   * the ledger saw issued whose certificate is gone): granted while the name's limit has room, with the
   * issuance in the ledger before this returns (confirmed by issued() once the call returns a
   * certificate); else queued until the oldest issuance of the window leaves it. Without a name limit:
   * exempt, nothing written. A ledger that cannot be read or written (a home outage: break-glass) lets the
   * renewal go ahead uncounted, logged: a certificate running out is worse than a count missed; the name's limit holds it until `deadline` (nameLimitWait).
   */
  async requestReissue(domain: string, signal: AbortSignal, deadline?: number): Promise<BudgetVerdict> {
    try {
      await this.#loadListIfNeeded(domain);
      return await this.#serially(() => this.#reissue(domain, signal, deadline));
    } catch (err) {
      if (signal.aborted) throw err;
      this.#log.warn({ domain, code: 'CERTSHARE_STORE_UNAVAILABLE', err: errorMessage(err) }, 'issuance ledger unusable; the renewal goes ahead uncounted');
      return { kind: 'exempt' };
    }
  }

  async #reissue(domain: string, signal: AbortSignal, deadline?: number): Promise<BudgetVerdict> {
    const limit = this.nameLimit;
    if (!limit) return { kind: 'exempt' };
    const rd = this.#rule(domain);
    for (let attempt = 0; ; attempt++) {
      const snapshot = await this.#read(signal, rd);
      const now = this.#clock.now();
      const live = liveEntries(snapshot.entries, now, this.limit, limit);
      // A renewal whose call failed or never ended: the retry is the same issuance, not another.
      const pending = live.find((e) => e.domain === domain && e.renewal && !e.issued);
      if (!pending) {
        const turnAt = nextNameSlot(nameIssuances(live, domain, now, limit), now, limit);
        const wait = nameLimitWait({ domain, turnAt, now, deadline }, this.#log);
        if (wait !== undefined) return { kind: 'name_limited', turnAt: wait };
      }
      const entries = pending
        ? live.map((e) => (e === pending ? { ...e, at: Math.max(e.at, now) } : e))
        : [...live, { domain, registeredDomain: rd, at: now, issued: false, renewal: true as const }];
      try {
        await this.#store.write(entries, snapshot, signal, rd);
        return { kind: 'granted' };
      } catch (err) {
        if (!isConflict(err) || attempt >= MAX_CONFLICTS) throw err;
      }
    }
  }

  /**
   * The reserved call returned a certificate: the domain's next issuances are renewals; its slot counts from
   * now. A lost compare-and-swap is tried again for as long as `signal` allows, not MAX_CONFLICTS times: each
   * conflict is another writer's progress (a ledger shared by every group of a cluster sees many), and a
   * mark given up would count the domain's next renewal as a first issuance.
   */
  async issued(domain: string, signal: AbortSignal): Promise<void> {
    await this.#loadListIfNeeded(domain);
    const rule = this.#rule;
    const rd = rule(domain);
    await this.#serially(async () => {
      for (;;) {
        const snapshot = await this.#read(signal, rd);
        const now = this.#clock.now();
        const pending = snapshot.entries.find((e) => e.domain === domain && e.renewal && !e.issued);
        const mark = (e: LedgerEntry): boolean => (pending ? e === pending : e.domain === domain && isFirst(e));
        const entries = snapshot.entries.map((e) => (mark(e) ? { ...e, at: Math.max(e.at, now), issued: true } : e));
        if (!snapshot.entries.some(mark)) entries.push({ domain, registeredDomain: rd, at: now, issued: true });
        try {
          await this.#store.write(entries, snapshot, signal, rd);
          return;
        } catch (err) {
          if (!isConflict(err) || signal.aborted) throw err;
        }
      }
    });
  }

  /** One report per registered domain of the managed domains (zeros when nobody waits: the series always exist). */
  queues(): QueueReport[] {
    const managed = new Set([...this.#settled.keys()].map(this.#rule));
    return [...managed].sort().map((rd) =>
      queueReport(
        rd,
        (this.#plans.get(rd) ?? []).filter((t) => this.#waiting.has(t.domain)),
      ),
    );
  }

  async #decide(domain: string, signal: AbortSignal): Promise<BudgetVerdict> {
    const rule = this.#rule;
    const rd = rule(domain);
    for (let attempt = 0; ; attempt++) {
      const snapshot = await this.#read(signal, rd);
      const now = this.#clock.now();
      if (everIssued(snapshot.entries, domain)) {
        this.withdraw(domain);
        return await this.#reissue(domain, signal);
      }
      // Entries of other registered domains, and reservations that left the window without a certificate,
      // are kept and dropped respectively: the ledger stays about one entry per domain.
      const live = liveEntries(snapshot.entries, now, this.limit, this.nameLimit);
      const mine = live.find((e) => e.domain === domain && isFirst(e));
      let entries: LedgerEntry[];
      if (mine) {
        // A reservation whose call failed or never ended: the retry is the same first issuance, no new slot.
        entries = live.map((e) => (e === mine ? { ...e, at: Math.max(e.at, now) } : e));
      } else {
        const contenders = [...this.#waiting.values()].filter((c) => rule(c.domain) === rd);
        const plan = planTurns(this.limit, slotEntries([...live, ...othersOf(snapshot)], rd), contenders, now);
        this.#plans.set(rd, plan);
        const position = plan.findIndex((t) => t.domain === domain);
        const turn = plan[position]!;
        if (turn.turnAt > now) {
          // Contenders of this process ahead of it whose turn is now take their slots next: theirs, too.
          const promised = plan.slice(0, position).filter((t) => t.turnAt <= now).length;
          const holders = snapshot.others && slotHolders(live, promised, snapshot.others, rd, now - this.limit.windowMs);
          return { kind: 'queued', registeredDomain: rd, position: position + 1, queued: plan.length, turnAt: turn.turnAt, holders };
        }
        entries = [...live, { domain, registeredDomain: rd, at: now, issued: false }];
      }
      try {
        await this.#store.write(entries, snapshot, signal, rd);
      } catch (err) {
        if (!isConflict(err) || attempt >= MAX_CONFLICTS) throw err;
        this.#log.info({ domain, err: errorMessage(err) }, 'issuance ledger changed meanwhile; deciding again');
        continue;
      }
      // Its turn had come: the domains behind it keep theirs, nobody need look again.
      this.#remove(domain);
      return { kind: 'granted' };
    }
  }

  /**
   * The ledger as read, without the entries of `rd` it does not believe (believedEntries): they count for
   * nothing, and the next write leaves them out. Each is reported (log line once, metric and Event).
   */
  async #read(signal: AbortSignal, rd: string): Promise<LedgerSnapshot> {
    const snapshot = await this.#store.read(signal, rd);
    const report = (where: string, refused: UntrustedValue[]): void =>
      this.#outOfBounds.read(`the issuance ledger (${this.#store.kind}) of ${rd}${where}`, refused);
    return believedSnapshot(snapshot, rd, this.#clock.now(), this.#rule, report);
  }

  async #untilPeersSettled(domain: string, signal: AbortSignal): Promise<void> {
    const rule = this.#rule;
    const rd = rule(domain);
    for (;;) {
      const pending = [...this.#settled].some(([d, settled]) => !settled && d !== domain && !this.#waiting.has(d) && rule(d) === rd);
      if (!pending) return;
      signal.throwIfAborted();
      await eitherAborted(this.#settledChange.signal, signal);
    }
  }

  async #loadListIfNeeded(domain: string): Promise<void> {
    if (this.#list || ![domain, ...this.#settled.keys()].some((d) => tailnetDomain(d) === undefined)) return;
    this.#list = await loadRegisteredDomainRule();
  }

  #signalSettled(): void {
    this.#settledChange.abort();
    this.#settledChange = new AbortController();
  }

  /** Runs decisions one at a time: two loops of this process never race each other for the last slot. */
  #serially<T>(task: () => Promise<T>): Promise<T> {
    const run = this.#queue.then(task, task);
    this.#queue = run.catch(() => {});
    return run;
  }
}

/** The queue of registered domain `rd` from the turns planned for the domains `waiting` in it. */
function queueReport(rd: string, waiting: ReadonlyArray<{ turnAt: number; expiresAt?: number | undefined }>): QueueReport {
  if (waiting.length === 0) return { registeredDomain: rd, queued: 0, expiringBeforeTurn: 0, nextSlotAt: undefined };
  return {
    registeredDomain: rd,
    queued: waiting.length,
    expiringBeforeTurn: waiting.filter((t) => t.expiresAt !== undefined && t.expiresAt < t.turnAt).length,
    nextSlotAt: Math.min(...waiting.map((t) => t.turnAt)),
  };
}

/** Resolves when either signal aborts, then listens to neither. */
function eitherAborted(a: AbortSignal, b: AbortSignal): Promise<void> {
  return new Promise<void>((resolve) => {
    const done = (): void => {
      a.removeEventListener('abort', done);
      b.removeEventListener('abort', done);
      resolve();
    };
    a.addEventListener('abort', done, { once: true });
    b.addEventListener('abort', done, { once: true });
  });
}

/**
 * The entries of registered domain `rd` the ledger's own rules could have written, and the others refused
 * with why (entries of other registered domains pass untouched: they are judged when theirs is decided).
 * An entry is believed when its domain is a canonical DNS name whose registered domain is the one it names,
 * its time is not in the future (beyond the clock skew between writers), a renew slot carries a request id
 * as certshare renew writes one and `issued: true`, and it is the domain's only first-issuance entry. A
 * refused entry counts for nothing: neither a slot taken (a date in 9999 would hold a slot for ever) nor a
 * name issued (an `issued: true` the rules would not write would exempt a first issuance). Refusing one
 * gives nobody more than deleting it would, which whoever can write the ledger can do anyway.
 * @forTests
 */
export function believedEntries(
  entries: readonly LedgerEntry[],
  rd: string,
  now: number,
  rule: RegisteredDomainRule,
): { entries: LedgerEntry[]; refused: UntrustedValue[] } {
  const believed: LedgerEntry[] = [];
  const refused: UntrustedValue[] = [];
  const firsts = new Set<string>();
  for (const entry of entries) {
    const why = entryFault(entry, rd, now, rule, firsts);
    if (why === undefined) {
      believed.push(entry);
      if (isFirst(entry) && entry.registeredDomain === rd) firsts.add(entry.domain);
      continue;
    }
    if (why === 'other') believed.push(entry);
    else refused.push({ field: 'ledger-entry', value: describeEntry(entry), why });
  }
  return { entries: believed, refused };
}

/** Why the rules would not have written `entry` (undefined: they could have; 'other': not of `rd`). */
function entryFault(entry: LedgerEntry, rd: string, now: number, rule: RegisteredDomainRule, firsts: ReadonlySet<string>): string | undefined {
  let canonical: string | undefined;
  try {
    canonical = normalizeDomain(entry.domain);
  } catch {
    canonical = undefined;
  }
  const own = canonical === entry.domain ? rule(entry.domain) : undefined;
  if (entry.registeredDomain !== rd && own !== rd) return 'other';
  if (own === undefined) return 'its domain is not a canonical DNS name';
  if (own !== entry.registeredDomain) return `its registered domain is ${own}, not ${entry.registeredDomain}`;
  if (entry.at > now + CLOCK_SKEW_MS) return `its time is in the future (later than ${iso(now + CLOCK_SKEW_MS)})`;
  if (entry.renew !== undefined) {
    if (!entry.issued || !isRenewId(entry.renew) || entry.renewal) return 'a renew slot is written with a request id and issued: true';
    return undefined;
  }
  if (entry.renewal) return undefined;
  if (firsts.has(entry.domain)) return 'a second first-issuance entry for the domain';
  return undefined;
}

/** An entry as the log line and the Event name it, each string cut short (a hostile one can be long). */
function describeEntry(e: LedgerEntry): string {
  const text = (value: string): string => JSON.stringify(value.slice(0, 256));
  const renew = e.renew !== undefined ? `, renew ${text(e.renew)}` : '';
  return `{domain ${text(e.domain)}, registeredDomain ${text(e.registeredDomain)}, at ${iso(e.at)}, issued ${e.issued}${renew}}`;
}

/** What the budget of one process remembers of renew requests (IssuanceBudget.requestRenewal). */
class RenewRequests {
  /** What the name limit left for more renew requests when each request was granted (by request id). */
  readonly #left = new Map<string, RenewLeft>();
  /**
   * Per domain, the renew request whose slot this process took (and when) and whose call has returned no
   * certificate yet: only its retry finds that slot again. An id is the requester's to write, an old one too
   * once another request was answered: a slot found in the ledger alone may have been served already, and
   * asked for again, would be an issuance no slot counts (name limit and budget both passed by). After a
   * restart, or once the ledger holds a later entry of the name (another writer's slot or renewal: a
   * failover), the request takes a new slot: counted twice, never not at all.
   */
  readonly #calls = new Map<string, { request: string; at: number }>();

  /** Whether `request` of `domain` is the retry of this process's call for it, its slot the name's last entry. */
  isRetry(domain: string, request: string, live: readonly LedgerEntry[]): boolean {
    const call = this.#calls.get(domain);
    if (call?.request !== request) return false;
    const ofName = live.filter((e) => e.domain === domain);
    return ofName.some((e) => e.renew === request) && !ofName.some((e) => e.at > call.at);
  }

  took(domain: string, request: string, at: number): void {
    this.#calls.set(domain, { request, at });
  }

  returned(domain: string): void {
    this.#calls.delete(domain);
  }

  left(domain: string, request: string): RenewLeft | undefined {
    return this.#left.get(`${domain}\u0000${request}`);
  }

  /** Notes what one more renew request of `domain` would leave (left), before it is decided. */
  noteLeft(domain: string, request: string, live: readonly LedgerEntry[], now: number, limit: NameLimit | undefined): void {
    if (!limit) return;
    const taken = [...nameIssuances(live, domain, now, limit), now];
    const left = Math.max(0, limit.count - RENEW_RESERVE - taken.length);
    if (this.#left.size > 256) this.#left.clear(); // one per request served; a bound, not a cache to keep
    this.#left.set(`${domain}\u0000${request}`, { left, of: limit, until: nextNameSlot(taken, now, limit, RENEW_RESERVE) });
  }
}

/**
 * The entries worth keeping: a domain's record of its first certificate (it makes its renewals exempt), and
 * any slot still inside the window (a reservation whose call has not returned, a renew request's slot).
 */
function liveEntries(entries: readonly LedgerEntry[], now: number, limit: BudgetLimit, nameLimit: NameLimit | undefined): LedgerEntry[] {
  const kept = Math.max(limit.windowMs, nameLimit?.windowMs ?? 0);
  return entries.filter((e) => (e.issued && isFirst(e)) || e.at > now - kept);
}

/**
 * `snapshot` without the entries of `rd` its parts' rules would not write (believedEntries), each part judged
 * on its own, and a part that could not be read (`fault`) emptied: each refusal is `report`ed, with where.
 */
function believedSnapshot(
  snapshot: LedgerSnapshot,
  rd: string,
  now: number,
  rule: RegisteredDomainRule,
  report: (where: string, refused: UntrustedValue[]) => void,
): LedgerSnapshot {
  const believe = (part: readonly LedgerEntry[], where: string): LedgerEntry[] => {
    const { entries, refused } = believedEntries(part, rd, now, rule);
    report(where, refused);
    return entries;
  };
  const others = snapshot.others?.map((p) => {
    if (p.fault !== undefined) report('', [{ field: 'ledger-part', value: p.name, why: p.fault }]);
    return { name: p.name, entries: believe(p.entries, `, part ${p.name}`) };
  });
  return { entries: believe(snapshot.entries, ''), version: snapshot.version, ...(others ? { others } : {}) };
}

/** Every entry of the other parts of a shared ledger (none for a group's own ledger). */
function othersOf(snapshot: LedgerSnapshot): LedgerEntry[] {
  return snapshot.others?.flatMap((p) => p.entries) ?? [];
}

/**
 * Who holds the window's slots of `rd` since `from`, most first: `own 3, ledger.team-a.json 47` (a shared
 * ledger's parts are named by the namespace that writes them: one filling the window is seen, not guessed).
 * `promised`: own slots about to be written (a queued name's reason is not computed again before its turn).
 */
function slotHolders(own: readonly LedgerEntry[], promised: number, others: readonly LedgerPart[], rd: string, from: number): string {
  const count = (entries: readonly LedgerEntry[]): number => slotEntries(entries, rd).filter((e) => e.at > from).length;
  return [{ name: 'own', slots: count(own) + promised }, ...others.map((p) => ({ name: p.name, slots: count(p.entries) }))]
    .filter((h) => h.slots > 0)
    .sort((a, b) => b.slots - a.slots || (a.name < b.name ? -1 : 1))
    .map((h) => `${h.name} ${h.slots}`)
    .join(', ');
}

/** The entries of `rd` that take one of its budget's slots: first issuances and renew requests, not renewals. */
function slotEntries(entries: readonly LedgerEntry[], rd: string): LedgerEntry[] {
  return entries.filter((e) => e.registeredDomain === rd && e.renewal === undefined);
}

function isConflict(err: unknown): boolean {
  return err instanceof CertshareError && err.code === 'CERTSHARE_STORE_CONFLICT';
}

/** The ledger's JSON form, the same in `.state/ledger.json` and in the group's ConfigMap. */
export function encodeLedger(entries: readonly LedgerEntry[]): string {
  const sorted = [...entries].sort((a, b) => a.at - b.at || (a.domain < b.domain ? -1 : 1));
  return `${JSON.stringify({
    entries: sorted.map((e) => ({
      domain: e.domain,
      registeredDomain: e.registeredDomain,
      at: iso(e.at),
      issued: e.issued,
      ...(e.renew !== undefined ? { renew: e.renew } : {}),
      ...(e.renewal ? { renewal: true } : {}),
    })),
  })}\n`;
}

/**
 * Parses what encodeLedger wrote. Anything else is CERTSHARE_STORE_CORRUPT naming `where`: a damaged ledger
 * is never read as an empty one (that would hand out the whole budget again).
 */
export function decodeLedger(text: string, where: string): LedgerEntry[] {
  const corrupt = (why: string): CertshareError =>
    new CertshareError('CERTSHARE_STORE_CORRUPT', {
      object: `issuance ledger ${where}`,
      damage: why,
      consequence: 'no first issuance until it is repaired or removed by hand (removing it forgets the slots taken)',
    });
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (err) {
    throw corrupt(`not JSON: ${errorMessage(err)}`);
  }
  const list = (raw as { entries?: unknown } | null)?.entries;
  if (!Array.isArray(list)) throw corrupt('no "entries" array');
  return list.map((item: unknown, i) => {
    const e = (item ?? {}) as Record<string, unknown>;
    const at = typeof e.at === 'string' ? Date.parse(e.at) : Number.NaN;
    const valid = typeof e.domain === 'string' && typeof e.registeredDomain === 'string' && Number.isFinite(at) && typeof e.issued === 'boolean';
    const optional = (e.renew === undefined || typeof e.renew === 'string') && (e.renewal === undefined || e.renewal === true);
    if (!valid || !optional) throw corrupt(`entry ${i} is not {domain, registeredDomain, at, issued[, renew][, renewal]}`);
    const entry: LedgerEntry = { domain: e.domain as string, registeredDomain: e.registeredDomain as string, at, issued: e.issued as boolean };
    if (typeof e.renew === 'string') entry.renew = e.renew;
    if (e.renewal === true) entry.renewal = true;
    return entry;
  });
}
