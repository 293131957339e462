import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { CertLoop } from '../../src/core/loop/cert-loop.ts';
import { validateCertPair } from '../../src/core/certificates/certificate.ts';
import { HealthState } from '../../src/core/loop/health.ts';
import { IssuanceBudget } from '../../src/core/issuance/issuance-budget.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import { fanOut } from '../../src/core/ports/observer.ts';
import { staticRole } from '../../src/core/ports/store.ts';
import { makePair } from '../support/certs.ts';
import { MemoryLedger } from '../support/memory-ledger.ts';
import { MemoryStore } from '../support/memory-store.ts';

const domain = 'web.tailnet-9.ts.net';
const MIN = 60_000;
const signal = new AbortController().signal;

/** One loop driven turn by turn, with a budget of 1 first issuance per hour whose slot another domain took 10 minutes ago. */
function setup() {
  let now = Math.floor(Date.now() / 1000) * 1000;
  const clock = { now: () => now, sleep: () => Promise.reject(new Error('turn-by-turn')) };
  const ledger = new MemoryLedger();
  ledger.entries = [{ domain: 'other.tailnet-9.ts.net', registeredDomain: 'tailnet-9.ts.net', at: now - 10 * MIN, issued: true }];
  ledger.version = 1;
  const budget = new IssuanceBudget({ limit: { count: 1, windowMs: 60 * MIN }, store: ledger, clock, logger: silentLogger });
  const store = new MemoryStore();
  const health = new HealthState();
  health.manage([domain]);
  const calls: string[] = [];
  const loop = new CertLoop(domain, {
    localApi: {
      certPair: async (d) => {
        calls.push(d);
        return makePair(d, now, 90 * MIN);
      },
    },
    store,
    role: staticRole('writer-0', true),
    availability: { waitFor: async () => {} },
    clock,
    renewal: { renewFraction: 1 / 3, checkIntervalMs: 24 * 60 * MIN },
    backoff: { firstRetryMs: MIN, retryCapMs: 24 * 60 * MIN, rateLimitFirstRetryMs: 60 * MIN },
    observer: fanOut([health]),
    logger: silentLogger,
    intentTtlMs: 10 * MIN,
    budget,
  });
  return { loop, ledger, store, health, calls, advance: (ms: number) => (now += ms), now: () => now };
}

describe('CertLoop with the issuance budget', () => {
  it('waits for the slot without asking tailscaled, looks again exactly when it frees, then issues and marks the ledger', async () => {
    const s = setup();
    assert.equal(await s.loop.turn(signal), 50 * MIN, 'the next look is planned at the instant the slot frees');
    assert.deepEqual(s.calls, []);
    const reason = s.health.evaluate(s.now()).reason;
    assert.match(reason, /web\.tailnet-9\.ts\.net: waiting for the issuance budget \(1 per 3600s first issuances for tailnet-9\.ts\.net\): /);
    assert.match(reason, /1 of 1 in the queue, next slot frees at /);
    s.advance(50 * MIN);
    await s.loop.turn(signal);
    assert.deepEqual(s.calls, [domain]);
    assert.deepEqual(
      s.ledger.entries.map((e) => [e.domain, e.issued]),
      [
        ['other.tailnet-9.ts.net', true],
        [domain, true],
      ],
    );
  });

  it('renews a domain that holds a certificate whatever the budget (renewals are exempt)', async () => {
    const s = setup();
    const pair = await makePair(domain, s.now() - 80 * MIN, 90 * MIN);
    s.store.content.set(domain, { state: 'valid', cert: { pair, info: validateCertPair(pair, domain, s.now()) } });
    await s.loop.turn(signal);
    assert.deepEqual(s.calls, [domain]);
  });

  it('renews a name it held once its copy expired, without the ledger (away with the federation home); never serves the expired copy', async () => {
    // Issue 40: the expired copy was dropped and the renewal taken for a first issuance, refused while the
    // ledger could not be read (`issuance ledger unusable; not issuing`), at the home as in a cut-off member.
    const s = setup();
    const pair = await makePair(domain, s.now() - 30 * MIN, 90 * MIN);
    s.store.content.set(domain, { state: 'valid', cert: { pair, info: validateCertPair(pair, domain, s.now()) } });
    await s.loop.turn(signal);
    assert.deepEqual(s.calls, [], 'not due yet');
    s.ledger.failReads = true;
    s.store.content.set(domain, { state: 'unusable', reason: 'expired' });
    s.advance(61 * MIN);
    await s.loop.turn(signal);
    assert.deepEqual(s.calls, [domain], 'renewed: the ledger is for names never issued');
    assert.notEqual(s.loop.current?.info.serial, validateCertPair(pair, domain, s.now() - 61 * MIN).serial, 'the expired copy is not what it holds');
    assert.ok(s.loop.current && s.now() < s.loop.current.info.notAfter);
  });

  it('issues nothing while the ledger cannot be read', async () => {
    const s = setup();
    s.ledger.failReads = true;
    assert.equal(await s.loop.turn(signal), MIN);
    s.advance(60 * MIN);
    await s.loop.turn(signal);
    assert.deepEqual(s.calls, []);
    assert.match(s.health.evaluate(s.now()).reason, /issuance ledger unusable: cannot read the memory ledger: 403 Forbidden/);
  });
});
