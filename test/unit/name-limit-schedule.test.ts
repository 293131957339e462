// The name limit (--name-limit, Let's Encrypt's 5 certificates per exact name per 168 h) against the renewal
// schedule. The default held back the sixth renewal in a week of a 40 s certificate (the e2e's proxies tier had
// to turn it off): a limit meant to stop issuance storms must never hold back the schedule itself, or a
// short-lived certificate expires while certshare waits. One CertLoop, driven turn by turn on a hand-set clock,
// with the default limit in a ledger: for any lifetime from 30 s to 90 days, a renewal at each renewal point
// is made; a storm (the certificate lost before its renewal point, again and again: a hand edit and a restart
// each time) is still held at the limit.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { CertLoop } from '../../src/core/loop/cert-loop.ts';
import { held } from '../../src/core/loop/held-certificate.ts';
import { IssuanceBudget, parseBudget } from '../../src/core/issuance/issuance-budget.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import { fanOut } from '../../src/core/ports/observer.ts';
import { staticRole } from '../../src/core/ports/store.ts';
import { renewalTime } from '../../src/core/renewal/renewal.ts';
import { makePair } from '../support/certs.ts';
import { MemoryLedger } from '../support/memory-ledger.ts';
import { MemoryStore } from '../support/memory-store.ts';

const domain = 'web.tailnet-9.ts.net';
const SECOND = 1000;
const DAY = 86_400_000;
/** The flag's default (run-options.ts). */
const NAME_LIMIT = parseBudget('5/168h', '--name-limit')!;
const RENEWAL = { renewFraction: 1 / 3, checkIntervalMs: DAY };
/** Renewals in a row: more than the limit in one window for every lifetime shorter than about a day and a half. */
const RENEWALS = 8;
const RUNS = Number(process.env.FC_RUNS ?? 25);
const signal = new AbortController().signal;

/** A group's writer, its Secret and its ledger; `restart()` is a new loop (a new process) on the same store and ledger. */
function group(lifetimeMs: number) {
  let now = Date.UTC(2026, 10, 1);
  const clock = { now: () => now, sleep: () => Promise.reject(new Error('turn by turn')) };
  const ledger = new MemoryLedger();
  const store = new MemoryStore();
  const decisions: string[] = [];
  let calls = 0;
  const budget = new IssuanceBudget({ limit: { count: 50, windowMs: 7 * DAY }, nameLimit: NAME_LIMIT, store: ledger, clock, logger: silentLogger });
  const loop = (): CertLoop =>
    new CertLoop(domain, {
      localApi: {
        certPair: async (d) => {
          calls++;
          return makePair(d, now, lifetimeMs);
        },
      },
      store,
      role: staticRole('writer-0', true),
      availability: { waitFor: async () => {} },
      clock,
      renewal: RENEWAL,
      backoff: { firstRetryMs: SECOND, retryCapMs: DAY, rateLimitFirstRetryMs: DAY },
      observer: fanOut([{ decided: (_d, decision) => decisions.push(decision.reason) }]),
      logger: silentLogger,
      intentTtlMs: 10 * SECOND,
      budget,
    });
  return {
    loop,
    store,
    decisions,
    calls: () => calls,
    now: () => now,
    set: (t: number) => (now = t),
  };
}

describe('the name limit never holds back the renewal schedule', () => {
  it('renews at every renewal point for any lifetime from 30 s to 90 days; a storm off the schedule is held at the limit', async () => {
    await fc.assert(
      fc.asyncProperty(fc.integer({ min: 30 * SECOND, max: 90 * DAY }), fc.double({ min: 0, max: 0.99, noNaN: true }), async (lifetimeMs, late) => {
        const g = group(lifetimeMs);
        let loop = g.loop();
        const firstAt = g.now();
        await loop.turn(signal); // the first issuance
        assert.equal(g.calls(), 1);
        for (let i = 1; i <= RENEWALS; i++) {
          const current = loop.current!;
          // At the renewal point, or later within what the certificate has left.
          const point = renewalTime(held(current), RENEWAL);
          g.set(point + Math.floor(late * (current.info.notAfter - point)));
          await loop.turn(signal);
          assert.equal(g.calls(), 1 + i, `renewal ${i} of a ${lifetimeMs} ms certificate held back (${g.decisions.at(-1)})`);
          assert.notEqual(loop.current!.info.serial, current.info.serial);
        }
        // The storm: the certificate lost before its renewal point (a hand edit), each time seen by a new process
        // that holds nothing: every one of these is off the schedule.
        const before = g.calls();
        for (let i = 0; i <= NAME_LIMIT.count; i++) {
          g.store.content.set(domain, { state: 'unusable', reason: 'edited by hand' });
          loop = g.loop();
          await loop.turn(signal);
        }
        // Off the schedule in the window: the storm's, and the first issuance if still inside it.
        const offSchedule = g.calls() - before + (g.now() - firstAt < NAME_LIMIT.windowMs ? 1 : 0);
        assert.ok(offSchedule <= NAME_LIMIT.count, `${offSchedule} issuances off the schedule in one window`);
        assert.equal(g.decisions.at(-1), 'name_limited', 'the storm is held at the limit');
      }),
      { numRuns: RUNS },
    );
  });
});
