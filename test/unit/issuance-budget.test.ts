import assert from 'node:assert/strict';
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import type { CertshareError } from '../../src/core/errors.ts';
import {
  IssuanceBudget,
  parseBudget,
  planTurns,
  type BudgetLimit,
  type BudgetVerdict,
  type LedgerEntry,
  type LedgerStore,
} from '../../src/core/issuance/issuance-budget.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import { loadRegisteredDomainRule, tailnetDomain } from '../../src/core/issuance/registered-domain.ts';
import { AcmeLimiter, type AcmeRateLimited } from '../../src/emulator/acme-limits.ts';
import { DirLedgerStore } from '../../src/store/dir-ledger.ts';
import { MemoryLedger } from '../support/memory-ledger.ts';
import { useTempDir } from '../support/standalone.ts';

/** The public suffix rule the daemon loads on its first decision. */
const registeredDomain = await loadRegisteredDomainRule();
const RUNS = Number(process.env.CERTSHARE_PROPERTY_RUNS ?? 100);
const never = new AbortController().signal;

function manualClock(start = Date.UTC(2026, 0, 1)) {
  let now = start;
  return { now: () => now, sleep: async () => {}, advance: (ms: number) => (now += ms) };
}

const budgetOn = (store: LedgerStore, limit: BudgetLimit, clock: { now(): number }) =>
  new IssuanceBudget({ limit, store, clock: { now: clock.now, sleep: async () => {} }, logger: silentLogger });

describe('--issuance-budget parsing', () => {
  it('reads COUNT/WINDOW, and 0 as no budget', () => {
    assert.deepEqual(parseBudget('50/168h'), { count: 50, windowMs: 168 * 3_600_000 });
    assert.deepEqual(parseBudget('3/20s'), { count: 3, windowMs: 20_000 });
    assert.equal(parseBudget('0'), undefined);
  });
  for (const bad of ['0/1h', 'abc', '-1/5m', '5', '5/0s', '5/abc', '1.5/1h', '']) {
    it(`refuses ${JSON.stringify(bad)} with CERTSHARE_BAD_FLAG naming the flag`, () => {
      assert.throws(
        () => parseBudget(bad),
        (err: CertshareError) => err.code === 'CERTSHARE_BAD_FLAG' && /--issuance-budget: .*want COUNT\/WINDOW/.test(err.message),
      );
    });
  }
});

describe('registered domain (public suffix list, private section)', () => {
  it('makes every <tailnet>.ts.net a registered domain of its own', () => {
    assert.equal(registeredDomain('web.tailnet-1234.ts.net'), 'tailnet-1234.ts.net');
    assert.equal(registeredDomain('a.b.tailnet-1234.ts.net'), 'tailnet-1234.ts.net');
    assert.equal(registeredDomain('www.example.co.uk'), 'example.co.uk');
    assert.equal(registeredDomain('api.example.com'), 'example.com');
  });
  it("answers Tailscale's names without loading the list, exactly as the list does", () => {
    const names = ['web.tailnet-1234.ts.net', 'a.b.tail9.ts.net', 'x.c.ts.net', 'a.x.c.ts.net', 'tailnet.ts.net', 'ts.net', 'a.ts.net.example.com'];
    for (const name of names) {
      const fast = tailnetDomain(name);
      if (fast !== undefined) assert.equal(fast, registeredDomain(name), name);
    }
    assert.equal(tailnetDomain('web.tailnet-1234.ts.net'), 'tailnet-1234.ts.net');
    assert.equal(tailnetDomain('x.c.ts.net'), undefined, 'the list has *.c.ts.net');
    assert.equal(tailnetDomain('api.example.com'), undefined);
  });
});

describe('planTurns: who gets the next slots', () => {
  const limit = { count: 2, windowMs: 10_000 };
  it('puts domains without a certificate first, then the soonest to expire, and frees slots a window after they were taken', () => {
    const now = 100_000;
    const entries: LedgerEntry[] = [{ domain: 'x.t.ts.net', registeredDomain: 't.ts.net', at: now - 4_000, issued: true }];
    const plan = planTurns(
      limit,
      entries,
      [
        { domain: 'late.t.ts.net', expiresAt: now + 90_000 },
        { domain: 'b.t.ts.net' },
        { domain: 'soon.t.ts.net', expiresAt: now + 5_000 },
        { domain: 'a.t.ts.net' },
      ],
      now,
    );
    assert.deepEqual(
      plan.map((t) => [t.domain, t.turnAt - now]),
      [
        ['a.t.ts.net', 0],
        ['b.t.ts.net', 6_000], // x's slot frees at now - 4 s + 10 s
        ['soon.t.ts.net', 10_000], // a's slot, taken now
        ['late.t.ts.net', 16_000], // b's slot
      ],
    );
  });
});

describe('IssuanceBudget', () => {
  it('never counts a renewal, and retries a failed first issuance on its own reservation', async () => {
    const clock = manualClock();
    const store = new MemoryLedger();
    const budget = budgetOn(store, { count: 1, windowMs: 60_000 }, clock);
    assert.equal((await budget.request('a.t.ts.net', {}, never)).kind, 'granted');
    // The call failed: the retry reuses the slot instead of taking a second one.
    clock.advance(1000);
    assert.equal((await budget.request('a.t.ts.net', {}, never)).kind, 'granted');
    assert.equal(store.entries.length, 1);
    await budget.issued('a.t.ts.net', never);
    assert.equal((await budget.request('a.t.ts.net', {}, never)).kind, 'exempt');
    const queued = await budget.request('b.t.ts.net', {}, never);
    assert.equal(queued.kind, 'queued');
    // Another registered domain has its own budget.
    assert.equal((await budget.request('a.other.ts.net', {}, never)).kind, 'granted');
  });

  it('marks a first issuance done however many writers of a shared ledger win the compare-and-swap before it', async () => {
    const clock = manualClock();
    const store = new MemoryLedger();
    const budget = budgetOn(store, { count: 5, windowMs: 60_000 }, clock);
    assert.equal((await budget.request('a.t.ts.net', {}, never)).kind, 'granted');
    // Eight other writers (other groups sharing the ledger) write between each read and write of ours.
    let others = 8;
    const write = store.write.bind(store);
    store.write = async (entries, previous) => {
      if (others-- > 0) store.version++;
      return write(entries, previous);
    };
    await budget.issued('a.t.ts.net', never);
    assert.deepEqual(
      store.entries.map((e) => [e.domain, e.issued]),
      [['a.t.ts.net', true]],
    );
  });

  it('moves the domains behind one that left the queue up, and tells their loops', async () => {
    const clock = manualClock();
    const store = new MemoryLedger();
    const budget = budgetOn(store, { count: 1, windowMs: 60_000 }, clock);
    assert.equal((await budget.request('x.t.ts.net', {}, never)).kind, 'granted');
    const turns = new Map<string, number>();
    for (const d of ['a.t.ts.net', 'b.t.ts.net', 'c.t.ts.net']) {
      const v = await budget.request(d, {}, never);
      assert.equal(v.kind, 'queued');
      if (v.kind === 'queued') turns.set(d, v.turnAt - clock.now());
    }
    assert.deepEqual([...turns.values()], [60_000, 120_000, 180_000]);
    const told: string[][] = [];
    budget.onQueueShift((domains) => told.push(domains));
    budget.withdraw('a.t.ts.net'); // it got its certificate from another writer
    assert.deepEqual(told, [['b.t.ts.net', 'c.t.ts.net']]);
    const b = await budget.request('b.t.ts.net', {}, never);
    assert.equal(b.kind === 'queued' && b.turnAt - clock.now(), 60_000);
    // A grant at its turn moves nobody: no wake-ups.
    clock.advance(60_000);
    assert.equal((await budget.request('b.t.ts.net', {}, never)).kind, 'granted');
    assert.equal(told.length, 1);
  });

  it('refuses to decide on a ledger it cannot read: the error, never an empty budget', async () => {
    const store = new MemoryLedger();
    store.failReads = true;
    const budget = budgetOn(store, { count: 50, windowMs: 60_000 }, manualClock());
    await assert.rejects(budget.request('a.t.ts.net', {}, never), (err: CertshareError) => err.code === 'CERTSHARE_STORE_UNAVAILABLE');
    assert.equal(store.entries.length, 0);
  });

  it('waits at start-up until every domain of the registered domain had its first look, so the first asker does not jump the queue', async () => {
    const clock = manualClock();
    const budget = budgetOn(new MemoryLedger(), { count: 1, windowMs: 60_000 }, clock);
    for (const d of ['a.t.ts.net', 'z.t.ts.net']) budget.track(d);
    const z = budget.request('z.t.ts.net', {}, never);
    await new Promise((r) => setImmediate(r));
    const a = budget.request('a.t.ts.net', {}, never);
    assert.equal((await a).kind, 'granted');
    const zv = (await z) as Extract<BudgetVerdict, { kind: 'queued' }>;
    assert.equal(zv.kind, 'queued');
    assert.equal(zv.turnAt, clock.now() + 60_000);
    assert.deepEqual(budget.queues(), [{ registeredDomain: 't.ts.net', queued: 1, expiringBeforeTurn: 0, nextSlotAt: clock.now() + 60_000 }]);
  });

  it('property: whatever the restarts, failovers and concurrent writers, never more than COUNT first issuances in any WINDOW', async () => {
    type Op = { kind: 'ask'; domain: number; writers: number } | { kind: 'advance'; ms: number } | { kind: 'issued'; domain: number } | { kind: 'restart' };
    const op: fc.Arbitrary<Op> = fc.oneof(
      fc.record({ kind: fc.constant('ask' as const), domain: fc.nat(11), writers: fc.integer({ min: 1, max: 3 }) }),
      fc.record({ kind: fc.constant('advance' as const), ms: fc.integer({ min: 0, max: 25_000 }) }),
      fc.record({ kind: fc.constant('issued' as const), domain: fc.nat(11) }),
      fc.record({ kind: fc.constant('restart' as const) }),
    );
    await fc.assert(
      fc.asyncProperty(
        fc.integer({ min: 1, max: 4 }),
        fc.integer({ min: 1_000, max: 20_000 }),
        fc.array(op, { maxLength: 60 }),
        async (count, windowMs, ops) => {
          const limit = { count, windowMs };
          const clock = manualClock();
          const store = new MemoryLedger();
          // Three writer processes at most (a failover overlap), each restarting now and then with nothing in memory.
          let writers = [0, 1, 2].map(() => budgetOn(store, limit, clock));
          const domains = Array.from({ length: 12 }, (_, i) => `d${i}.${i % 2 ? 'odd' : 'even'}.ts.net`);
          const firstIssuances: Array<{ rd: string; at: number }> = [];
          const everGranted = new Set<string>();
          for (const o of ops) {
            if (o.kind === 'advance') clock.advance(o.ms);
            else if (o.kind === 'restart') writers = [0, 1, 2].map(() => budgetOn(store, limit, clock));
            else if (o.kind === 'issued') {
              if (everGranted.has(domains[o.domain]!)) await writers[0]!.issued(domains[o.domain]!, never);
            } else {
              const domain = domains[o.domain]!;
              const verdicts = await Promise.all(writers.slice(0, o.writers).map((w) => w.request(domain, {}, never)));
              for (const v of verdicts) {
                // A grant to a domain holding a reservation reuses it; only a domain's first grant is a new first issuance.
                if (v.kind === 'granted' && !everGranted.has(domain)) {
                  everGranted.add(domain);
                  firstIssuances.push({ rd: registeredDomain(domain), at: clock.now() });
                }
                if (v.kind === 'queued') assert.ok(v.turnAt > clock.now());
              }
            }
          }
          for (const rd of new Set(firstIssuances.map((f) => f.rd))) {
            const times = firstIssuances.filter((f) => f.rd === rd).map((f) => f.at);
            for (let i = 0; i + count < times.length; i++)
              assert.ok(times[i + count]! - times[i]! >= windowMs, `${count + 1} first issuances within ${windowMs} ms`);
          }
        },
      ),
      { numRuns: RUNS },
    );
  });

  it('property: slots go by priority and the queue drains, one window per COUNT domains, at the instants planned', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.integer({ min: 1, max: 4 }),
        fc.array(fc.option(fc.integer({ min: 1, max: 1_000_000 }), { nil: undefined }), { minLength: 1, maxLength: 12 }),
        async (count, expiries) => {
          const windowMs = 10_000;
          const clock = manualClock();
          const budget = budgetOn(new MemoryLedger(), { count, windowMs }, clock);
          const start = clock.now();
          const contenders = expiries.map((e, i) => ({
            domain: `d${String(i).padStart(2, '0')}.t.ts.net`,
            expiresAt: e === undefined ? undefined : start + e,
          }));
          for (const c of contenders) budget.track(c.domain);
          const expected = planTurns({ count, windowMs }, [], contenders, start).map((t) => t.domain);
          // Everyone asks at once (in a shuffled order); then each asks again at the turn it was given.
          const pending = new Map<string, number>();
          const granted: string[] = [];
          const verdicts = await Promise.all(
            [...contenders].reverse().map((c) => budget.request(c.domain, { expiresAt: c.expiresAt }, never).then((v) => [c, v] as const)),
          );
          for (const [c, v] of verdicts) {
            if (v.kind === 'granted') granted.push(c.domain);
            else if (v.kind === 'queued') pending.set(c.domain, v.turnAt);
            budget.settled(c.domain); // its loop's turn ended
          }
          granted.sort((a, b) => expected.indexOf(a) - expected.indexOf(b));
          let rounds = 0;
          while (pending.size > 0) {
            assert.ok(rounds++ < 100, 'the queue does not drain');
            const next = Math.min(...pending.values());
            clock.advance(next - clock.now());
            // Domains due at the same instant both fit: the order among them is whichever loop asks first.
            const due = contenders.filter((x) => pending.get(x.domain) === next).sort((x, y) => expected.indexOf(x.domain) - expected.indexOf(y.domain));
            for (const c of due) {
              const v = await budget.request(c.domain, { expiresAt: c.expiresAt }, never);
              if (v.kind === 'granted') {
                granted.push(c.domain);
                pending.delete(c.domain);
              } else if (v.kind === 'queued') pending.set(c.domain, v.turnAt);
            }
          }
          assert.deepEqual(granted, expected);
          assert.ok(clock.now() - start <= Math.floor((contenders.length - 1) / count) * windowMs, 'drained later than the budget allows');
          assert.deepEqual(budget.queues(), [{ registeredDomain: 't.ts.net', queued: 0, expiringBeforeTurn: 0, nextSlotAt: undefined }]);
        },
      ),
      { numRuns: RUNS },
    );
  });
});

describe('DirLedgerStore (.state/ledger.json)', () => {
  const dir = useTempDir();
  it('keeps every slot across a restart, and refuses a damaged ledger instead of starting from an empty budget', async () => {
    const root = join(dir(), 'certs');
    const clock = manualClock();
    const limit = { count: 2, windowMs: 60_000 };
    const first = budgetOn(new DirLedgerStore(root), limit, clock);
    assert.equal((await first.request('a.t.ts.net', {}, never)).kind, 'granted');
    assert.equal((await first.request('b.t.ts.net', {}, never)).kind, 'granted');
    // A restart: a new process, the same directory.
    const second = budgetOn(new DirLedgerStore(root), limit, clock);
    assert.equal((await second.request('c.t.ts.net', {}, never)).kind, 'queued');
    await mkdir(join(root, '.state'), { recursive: true });
    await writeFile(join(root, '.state', 'ledger.json'), '{"entries": [{"domain": 1}');
    const third = budgetOn(new DirLedgerStore(root), limit, clock);
    await assert.rejects(third.request('c.t.ts.net', {}, never), (err: CertshareError) => {
      assert.equal(err.code, 'CERTSHARE_STORE_CORRUPT');
      assert.match(err.message, /ledger\.json is damaged \(not JSON/);
      return true;
    });
  });
});

describe("the emulator's Let's Encrypt limits", () => {
  it('refuses the first issuance past the per-registered-domain limit with the CA text and Retry-After, never a renewal', () => {
    const limiter = new AcmeLimiter(
      { newCertsPerRegisteredDomain: { count: 2, windowMs: 60_000 }, ordersPerAccount: { count: 4, windowMs: 3_600_000 } },
      registeredDomain,
    );
    const t0 = Date.UTC(2026, 0, 1);
    for (const d of ['a.t.ts.net', 'b.t.ts.net']) {
      limiter.order(d, t0);
      limiter.issued(d);
    }
    assert.throws(
      () => limiter.order('c.t.ts.net', t0 + 10_000),
      (err: AcmeRateLimited) => {
        assert.equal(err.retryAfterSeconds, 50);
        assert.equal(
          err.message,
          '429 urn:ietf:params:acme:error:rateLimited: too many certificates (2) already issued for "t.ts.net" in the last 1m0s, ' +
            'retry after 2026-01-01 00:01:00 UTC: see https://letsencrypt.org/docs/rate-limits/#new-certificates-per-registered-domain',
        );
        return true;
      },
    );
    limiter.order('a.t.ts.net', t0 + 10_000); // a renewal: exempt from the per-domain limit
    limiter.order('c.other.ts.net', t0 + 10_000);
    assert.throws(() => limiter.order('a.t.ts.net', t0 + 20_000), /too many new orders \(4\) from this account in the last 1h0m0s/);
    assert.deepEqual(limiter.refusals, { newCerts: 1, orders: 1 });
  });
});
