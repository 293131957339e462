import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { believedEntries, IssuanceBudget, type BudgetLimit, type LedgerEntry } from '../../src/core/issuance-budget.ts';
import { silentLogger } from '../../src/core/logger.ts';
import { tailnetDomain } from '../../src/core/registered-domain.ts';
import { CLOCK_SKEW_MS, boundCoordination } from '../../src/core/untrusted-values.ts';
import { MemoryLedger } from '../support/memory-ledger.ts';

const RUNS = Number(process.env.CERTSHARE_PROPERTY_RUNS ?? 100);
const HOUR = 3_600_000;
const NOW = Date.UTC(2026, 10, 28, 12);
const RD = 'tailnet-7.ts.net';
const rule = (d: string): string => tailnetDomain(d) ?? d;
const never = new AbortController().signal;
const LE: BudgetLimit = { count: 5, windowMs: 168 * HOUR };

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
});
const withoutUndefined = (e: LedgerEntry): LedgerEntry =>
  e.renew === undefined ? { domain: e.domain, registeredDomain: e.registeredDomain, at: e.at, issued: e.issued } : e;

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
          (e) => e.domain === domain && e.registeredDomain === RD && e.issued && e.renew === undefined && e.at <= NOW + CLOCK_SKEW_MS,
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
