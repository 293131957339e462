import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { believedEntries, IssuanceBudget, RENEW_RESERVE, type BudgetLimit, type LedgerEntry } from '../../src/core/issuance/issuance-budget.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import { tailnetDomain } from '../../src/core/issuance/registered-domain.ts';
import { CLOCK_SKEW_MS, boundCoordination, boundLeaseDuration, nextLeaseTransitions } from '../../src/core/values/untrusted-values.ts';
import { MemoryLedger } from '../support/memory-ledger.ts';

const RUNS = Number(process.env.CERTSHARE_PROPERTY_RUNS ?? 100);
const HOUR = 3_600_000;
const NOW = Date.UTC(2026, 10, 28, 12);
const RD = 'tailnet-7.ts.net';
const rule = (d: string): string => tailnetDomain(d) ?? d;
const never = new AbortController().signal;
const LE: BudgetLimit = { count: 5, windowMs: 168 * HOUR };

describe("a Lease's duration read back: bounded", () => {
  it("believes a holder's duration up to twice the reader's own, and says why past it", () => {
    assert.deepEqual(boundLeaseDuration(undefined, 15_000), { ms: 15_000 });
    assert.deepEqual(boundLeaseDuration(30, 15_000), { ms: 30_000 });
    const { ms, refused } = boundLeaseDuration(2_147_483_647, 15_000);
    assert.equal(ms, 30_000);
    assert.deepEqual(refused, { field: 'lease-duration', value: '2147483647s', why: "longer than 2 times this replica's own duration: taken as 30s" });
  });
  it('counts a takeover up to the int32 the field is, never past it', () => {
    assert.deepEqual(nextLeaseTransitions(undefined), { count: 1 });
    assert.deepEqual(nextLeaseTransitions(2_147_483_646), { count: 2_147_483_647 });
    const { count, refused } = nextLeaseTransitions(2_147_483_647);
    assert.equal(count, 2_147_483_647);
    assert.equal(refused?.field, 'lease-transitions');
  });
});

describe('coordination read back from a Secret: bounded', () => {
  const bounds = { retryCapMs: 24 * HOUR };
  it('keeps a retry date up to the retry cap from now, and an intent up to the clock skew ahead', () => {
    const ok = { retryNotBefore: NOW + 24 * HOUR, intent: { holder: 'w', at: NOW + CLOCK_SKEW_MS } };
    assert.deepEqual(boundCoordination(ok, NOW, bounds), { coordination: ok, refused: [] });
  });
  it('drops a later retry date and an intent stamped further ahead, saying why', () => {
    const { coordination, refused } = boundCoordination(
      { retryNotBefore: Date.parse('9999-12-31T00:00:00Z'), intent: { holder: 'w', at: NOW + CLOCK_SKEW_MS + 1 }, renewRequest: 'r' },
      NOW,
      bounds,
    );
    assert.deepEqual(coordination, { renewRequest: 'r' });
    assert.deepEqual(
      refused.map((r) => [r.field, r.value]),
      [
        ['retry-not-before', '9999-12-31T00:00:00.000Z'],
        ['issuing', `w at ${new Date(NOW + CLOCK_SKEW_MS + 1).toISOString()}`],
      ],
    );
  });
});

const entry = (domain: string, at: number, issued: boolean, extra: Partial<LedgerEntry> = {}): LedgerEntry => ({
  domain,
  registeredDomain: rule(domain),
  at,
  issued,
  ...extra,
});

describe('the issuance ledger: entries the rules would not write are not believed', () => {
  it('refuses an entry in the future, a registered domain not its own, a name not canonical, a bad renew slot, a second first issuance', () => {
    const good = [entry(`a.${RD}`, NOW - HOUR, true), entry(`b.${RD}`, NOW + CLOCK_SKEW_MS, false), entry(`a.${RD}`, NOW, true, { renew: 'r-1' })];
    const hostile = [
      entry(`c.${RD}`, Date.parse('9999-12-31T00:00:00Z'), false),
      entry(`d.${RD}`, NOW - HOUR, true, { registeredDomain: 'other.ts.net' }),
      { ...entry(`e.${RD}`, NOW - HOUR, true), domain: `E.${RD}` },
      entry(`f.${RD}`, NOW - HOUR, false, { renew: 'r-2' }),
      entry(`g.${RD}`, NOW - HOUR, true, { renew: 'has space' }),
      entry(`a.${RD}`, NOW - 2 * HOUR, true),
    ];
    const other = entry('x.tailnet-8.ts.net', Date.parse('9999-12-31T00:00:00Z'), true);
    const { entries, refused } = believedEntries([...good, ...hostile, other], RD, NOW, rule);
    assert.deepEqual(entries, [...good, other], 'entries of another registered domain are judged when theirs is decided');
    assert.equal(refused.length, hostile.length);
    assert.ok(refused.every((r) => r.field === 'ledger-entry' && r.why.length > 0));
  });
});

/** Any entry a credential could write to the ledger of RD: names of RD and beside it, any time, any flag. */
const hostileEntry = fc.record({
  domain: fc.oneof(fc.constantFrom(`a.${RD}`, `b.${RD}`, `c.${RD}`, `A.${RD}`, 'x.other.ts.net', `${RD}`), fc.string({ maxLength: 8 })),
  registeredDomain: fc.oneof(fc.constant(RD), fc.constant('other.ts.net'), fc.string({ maxLength: 8 })),
  at: fc.oneof(fc.integer({ min: NOW - 400 * HOUR, max: NOW + 400 * HOUR }), fc.constant(Date.parse('9999-12-31T00:00:00Z'))),
  issued: fc.boolean(),
  renew: fc.option(fc.oneof(fc.constant('r-1'), fc.string({ maxLength: 4 })), { nil: undefined }),
  renewal: fc.option(fc.constant(true as const), { nil: undefined }),
});
const withoutUndefined = (e: LedgerEntry): LedgerEntry => {
  const { renew, renewal, ...rest } = e;
  return { ...rest, ...(renew !== undefined ? { renew } : {}), ...(renewal ? { renewal } : {}) };
};

describe('the issuance ledger under hostile entries (properties)', () => {
  it('never holds a new name longer than one window, and exempts it only for an entry the rules could write', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(hostileEntry, { maxLength: 20 }), fc.constantFrom(`a.${RD}`, `b.${RD}`, `n.${RD}`), async (raw, domain) => {
        const ledger = new MemoryLedger();
        ledger.entries = raw.map(withoutUndefined);
        const reports: string[] = [];
        const budget = new IssuanceBudget({
          limit: LE,
          store: ledger,
          clock: { now: () => NOW, sleep: async () => {} },
          logger: silentLogger,
          registeredDomain: rule,
          onOutOfBounds: (_w, v) => reports.push(v.why),
        });
        budget.track(domain);
        const verdict = await budget.request(domain, {}, never);
        if (verdict.kind === 'queued') assert.ok(verdict.turnAt <= NOW + LE.windowMs, `held until ${new Date(verdict.turnAt).toISOString()}`);
        const believable = raw.some(
          (e) => e.domain === domain && e.registeredDomain === RD && e.issued && e.renew === undefined && !e.renewal && e.at <= NOW + CLOCK_SKEW_MS,
        );
        if (verdict.kind === 'exempt') assert.ok(believable, 'exempt only by an entry the rules could have written');
        // Nothing written back is in the future, or refused: the ledger heals at its next write.
        for (const e of ledger.entries.filter((e) => e.registeredDomain === RD)) {
          assert.ok(e.at <= NOW + CLOCK_SKEW_MS || ledger.version === 0, 'a future entry is never written back');
        }
        const future = raw.some((e) => e.domain === `a.${RD}` && e.registeredDomain === RD && e.at > NOW + CLOCK_SKEW_MS);
        if (future) assert.ok(reports.length > 0, 'a refused entry is reported');
      }),
      { numRuns: RUNS },
    );
  });

  it('grants a first issuance at once, whatever the future holds, while the window has room', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(fc.integer({ min: 1, max: 10_000 * HOUR }), { minLength: 1, maxLength: 12 }), async (ahead) => {
        const ledger = new MemoryLedger();
        ledger.entries = ahead.map((ms, i) => entry(`f${i}.${RD}`, NOW + CLOCK_SKEW_MS + ms, false));
        const budget = new IssuanceBudget({ limit: LE, store: ledger, clock: { now: () => NOW, sleep: async () => {} }, logger: silentLogger });
        budget.track(`new.${RD}`);
        assert.deepEqual(await budget.request(`new.${RD}`, {}, never), { kind: 'granted' });
        assert.deepEqual(
          ledger.entries.map((e) => e.domain),
          [`new.${RD}`],
          'the future entries are gone at the write',
        );
      }),
      { numRuns: RUNS },
    );
  });
});

describe("a name's issuances stay inside the CA's limit for its exact name set, whatever asks (properties)", () => {
  const D = `web.${RD}`;
  type Ask =
    | { kind: 'advance'; ms: number }
    | { kind: 'restart' }
    | { kind: 'renewal'; ok: boolean } // by expiry or the CA's word (ARI, a revocation): the loop asks requestReissue
    | { kind: 'renew'; ok: boolean }; // an operator's renew request (certshare renew)
  const ask = fc.oneof(
    fc.record({ kind: fc.constant('advance' as const), ms: fc.integer({ min: 1, max: 100 * HOUR }) }),
    fc.record({ kind: fc.constant('restart' as const) }),
    fc.record({ kind: fc.constant('renewal' as const), ok: fc.boolean() }),
    fc.record({ kind: fc.constant('renew' as const), ok: fc.boolean() }),
  );

  it('at most 5 certificates of a name in any 168 h, across restarts; renew-now never takes the last 2', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(ask, { maxLength: 60 }), async (asks: Ask[]) => {
        let now = NOW;
        const ledger = new MemoryLedger();
        ledger.entries = [entry(D, NOW - 200 * 24 * HOUR, true)];
        const open = () =>
          new IssuanceBudget({ limit: LE, nameLimit: LE, store: ledger, clock: { now: () => now, sleep: async () => {} }, logger: silentLogger });
        let budget = open();
        /** What the CA issued for D, when. */
        const issued: number[] = [];
        const inWindow = (at: number): number => issued.filter((t) => t > at - LE.windowMs && t <= at).length;
        let requests = 0;
        for (const a of asks) {
          if (a.kind === 'advance') now += a.ms;
          else if (a.kind === 'restart') budget = open();
          else if (a.kind === 'renewal') {
            const verdict = await budget.requestReissue(D, never);
            if (verdict.kind === 'name_limited') assert.ok(verdict.turnAt > now && verdict.turnAt <= now + LE.windowMs);
            else assert.equal(verdict.kind, 'granted');
            if (verdict.kind === 'granted' && a.ok) {
              issued.push(now);
              await budget.issued(D, never);
            }
          } else {
            const before = inWindow(now);
            const verdict = await budget.requestRenewal(D, `r-${++requests}`, never);
            if (verdict.kind === 'granted') {
              assert.ok(before < LE.count - RENEW_RESERVE, `renew-now granted with ${before} issued in the window`);
              if (a.ok) issued.push(now);
            } else assert.equal(verdict.reason, before >= LE.count - RENEW_RESERVE ? 'name_reserve' : verdict.reason);
          }
          for (const t of issued) assert.ok(inWindow(t) <= LE.count, `${inWindow(t)} certificates in the 168 h up to ${new Date(t).toISOString()}`);
        }
      }),
      { numRuns: RUNS },
    );
  });

  it('keeps RENEW_RESERVE issuances for ordinary renewals: after any burst of renew requests, two renewals still go ahead', async () => {
    await fc.assert(
      fc.asyncProperty(fc.integer({ min: 0, max: 20 }), async (burst) => {
        const ledger = new MemoryLedger();
        ledger.entries = [entry(D, NOW - 200 * 24 * HOUR, true)];
        const budget = new IssuanceBudget({ limit: LE, nameLimit: LE, store: ledger, clock: { now: () => NOW, sleep: async () => {} }, logger: silentLogger });
        let granted = 0;
        for (let i = 0; i < burst; i++) if ((await budget.requestRenewal(D, `burst-${i}`, never)).kind === 'granted') granted++;
        assert.equal(granted, Math.min(burst, LE.count - RENEW_RESERVE));
        for (let i = 0; i < RENEW_RESERVE; i++) {
          assert.equal((await budget.requestReissue(D, never)).kind, 'granted');
          await budget.issued(D, never);
        }
      }),
      { numRuns: RUNS },
    );
  });
});

describe('a renewal never waits on a ledger it cannot use', () => {
  it('goes ahead uncounted when the ledger cannot be read (a federation home away: break-glass)', async () => {
    const ledger = new MemoryLedger();
    ledger.failReads = true;
    const budget = new IssuanceBudget({ limit: LE, nameLimit: LE, store: ledger, clock: { now: () => NOW, sleep: async () => {} }, logger: silentLogger });
    assert.deepEqual(await budget.requestReissue(`web.${RD}`, never), { kind: 'exempt' });
    await assert.rejects(
      budget.request(`new.${RD}`, {}, never),
      /cannot read the memory ledger: 403 Forbidden/,
      'a first issuance still never issues without it',
    );
  });
});

describe("a name's limit filled by whoever writes the ledger (another group's token, in a shared one)", () => {
  const D = `web.${RD}`;
  const forged = (at: number): LedgerEntry[] => Array.from({ length: LE.count }, () => ({ domain: D, registeredDomain: RD, at, issued: true, renewal: true }));

  it('holds a renewal until its deadline (the safety point), never past it, however often the entries are written again', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.integer({ min: HOUR, max: 60 * 24 * HOUR }),
        fc.array(fc.integer({ min: 1, max: 100 * HOUR }), { maxLength: 30 }),
        async (lead, steps) => {
          let now = NOW;
          const deadline = NOW + lead;
          const ledger = new MemoryLedger();
          const budget = new IssuanceBudget({
            limit: LE,
            nameLimit: LE,
            store: ledger,
            clock: { now: () => now, sleep: async () => {} },
            logger: silentLogger,
          });
          for (const step of [0, ...steps]) {
            now = Math.min(now + step, deadline);
            ledger.entries = [...ledger.entries, ...forged(now)];
            const verdict = await budget.requestReissue(D, never, deadline);
            if (now < deadline) {
              assert.equal(verdict.kind, 'name_limited');
              if (verdict.kind === 'name_limited') assert.ok(verdict.turnAt > now && verdict.turnAt <= deadline, 'looks again by the deadline');
              continue;
            }
            assert.equal(verdict.kind, 'granted', 'at the deadline, whatever the ledger says');
            assert.equal(ledger.entries.filter((e) => e.domain === D && e.renewal && !e.issued).length, 1, 'counted: the renewal is in the ledger');
            return;
          }
        },
      ),
      { numRuns: RUNS },
    );
  });

  it('without a deadline still waits for the window (the limit holds for real issuances)', async () => {
    const ledger = new MemoryLedger();
    ledger.entries = forged(NOW);
    const budget = new IssuanceBudget({ limit: LE, nameLimit: LE, store: ledger, clock: { now: () => NOW, sleep: async () => {} }, logger: silentLogger });
    assert.deepEqual(await budget.requestReissue(D, never), { kind: 'name_limited', turnAt: NOW + LE.windowMs });
    assert.deepEqual(await budget.requestReissue(D, never, NOW + HOUR), { kind: 'name_limited', turnAt: NOW + HOUR });
    assert.equal((await budget.requestReissue(D, never, NOW)).kind, 'granted');
  });
});

describe('a ledger shared by the groups of a cluster: each believes its own part for its names, every part for the budget', () => {
  const D = `web.${RD}`;
  const clock = { now: () => NOW, sleep: async () => {} };
  const other = (entries: LedgerEntry[]): MemoryLedger => Object.assign(new MemoryLedger(), { others: [{ name: 'ledger.thief.json', entries }] });

  it("another part's renewals of this group's name never hold its renewal, however many", async () => {
    const forged = Array.from({ length: 50 }, () => ({ domain: D, registeredDomain: RD, at: NOW, issued: true, renewal: true as const }));
    const ledger = other(forged);
    const budget = new IssuanceBudget({ limit: LE, nameLimit: LE, store: ledger, clock, logger: silentLogger });
    assert.equal((await budget.requestReissue(D, never)).kind, 'granted');
    assert.deepEqual(ledger.others?.[0]?.entries, forged, 'the other part is never written');
  });

  it("a queued name's holders count the slot promised to a name of its own group ahead of it: the window's whole budget", async () => {
    // The other part holds 4 of 5; a and b of this group both wait: a's turn is now, b is queued before a's
    // reservation is written. b's reason is not computed again before its turn, so it must count a's slot.
    const firsts = Array.from({ length: LE.count - 1 }, (_, i) => ({ domain: `h${i}.${RD}`, registeredDomain: RD, at: NOW - HOUR, issued: true }));
    const budget = new IssuanceBudget({ limit: LE, store: other(firsts), clock, logger: silentLogger });
    const [a, b] = [`a.${RD}`, `b.${RD}`];
    for (const d of [a, b]) budget.track(d);
    const queued = budget.request(b, {}, never);
    const granted = budget.request(a, {}, never);
    assert.equal((await granted).kind, 'granted');
    const verdict = await queued;
    assert.equal(verdict.kind, 'queued');
    if (verdict.kind === 'queued') assert.equal(verdict.holders, `ledger.thief.json ${LE.count - 1}, own 1`);
  });

  it("another part's first issuances count for the registered domain's budget, and never exempt this group's name", async () => {
    const firsts = Array.from({ length: LE.count }, (_, i) => ({ domain: `h${i}.${RD}`, registeredDomain: RD, at: NOW - HOUR, issued: true }));
    const ledger = other([...firsts, { domain: D, registeredDomain: RD, at: NOW - 200 * HOUR, issued: true }]);
    const budget = new IssuanceBudget({ limit: LE, store: ledger, clock, logger: silentLogger });
    budget.track(D);
    const verdict = await budget.request(D, {}, never);
    assert.equal(verdict.kind, 'queued', "the five of the other part fill the window; its record of the name is not this group's");
    if (verdict.kind === 'queued') assert.equal(verdict.turnAt, NOW - HOUR + LE.windowMs);
    if (verdict.kind === 'queued') assert.equal(verdict.holders, 'ledger.thief.json 5', 'who holds the window, by part');
  });

  it('another part it cannot read counts for nothing (its writers could as well empty it), and is told', async () => {
    const reported: string[] = [];
    const ledger = Object.assign(new MemoryLedger(), { others: [{ name: 'ledger.thief.json', entries: [], fault: 'not JSON' }] });
    const budget = new IssuanceBudget({
      limit: LE,
      store: ledger,
      clock,
      logger: silentLogger,
      onOutOfBounds: (_where, v) => reported.push(`${v.field} ${v.value}`),
    });
    budget.track(D);
    assert.equal((await budget.request(D, {}, never)).kind, 'granted');
    assert.deepEqual(reported, ['ledger-part ledger.thief.json']);
  });
});
