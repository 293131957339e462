import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { CertLoopDeps } from '../../src/core/loop/cert-loop.ts';
import { LoopSupervisor } from '../../src/core/loop/loop-supervisor.ts';
import { validateCertPair } from '../../src/core/certificates/certificate.ts';
import type { Clock } from '../../src/core/ports/clock.ts';
import { IssuanceSlots } from '../../src/core/issuance/issuance-slots.ts';
import type { CertPair, CertPairOptions } from '../../src/core/ports/localapi.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import { fanOut } from '../../src/core/ports/observer.ts';
import { staticRole } from '../../src/core/ports/store.ts';
import { makePair } from '../support/certs.ts';
import { FakeClock } from '../support/fake-clock.ts';
import { MemoryStore } from '../support/memory-store.ts';

const MIN = 60_000;
const LIFETIME = 90 * MIN; // under 10 days: renewal is due at half of it
const domains = (n: number): string[] => Array.from({ length: n }, (_, i) => `proxy-${i}.tailnet-9.ts.net`);

/** A tailscaled double whose CertPair calls stay open until the test answers them (or their signal aborts). */
class HeldCertPair {
  readonly open: Array<{ domain: string; answer(pair: CertPair): void }> = [];
  readonly called: string[] = [];
  maxOpen = 0;
  #waiters: Array<() => void> = [];

  certPair = (domain: string, options: CertPairOptions): Promise<CertPair> =>
    new Promise((resolve, reject) => {
      const call = {
        domain,
        answer: (pair: CertPair) => {
          this.#remove(call);
          resolve(pair);
        },
      };
      options.signal.addEventListener(
        'abort',
        () => {
          this.#remove(call);
          reject(options.signal.reason);
        },
        { once: true },
      );
      this.called.push(domain);
      this.open.push(call);
      this.maxOpen = Math.max(this.maxOpen, this.open.length);
      for (const wake of this.#waiters.splice(0)) wake();
    });

  /** Resolves once at least `n` calls are open. */
  async untilOpen(n: number): Promise<void> {
    while (this.open.length < n) await new Promise<void>((resolve) => this.#waiters.push(resolve));
  }

  #remove(call: (typeof this.open)[number]): void {
    const i = this.open.indexOf(call);
    if (i >= 0) this.open.splice(i, 1);
  }
}

function managerDeps(clock: Clock, store: MemoryStore, localApi: CertLoopDeps['localApi'], slots?: IssuanceSlots): CertLoopDeps {
  return {
    localApi,
    store,
    role: staticRole('writer-0', true),
    availability: { waitFor: async () => {} },
    clock,
    renewal: { renewFraction: 1 / 3, checkIntervalMs: 24 * 60 * MIN },
    backoff: { firstRetryMs: MIN, retryCapMs: 60 * MIN, rateLimitFirstRetryMs: 60 * MIN },
    observer: fanOut([]),
    logger: silentLogger,
    intentTtlMs: 10 * MIN,
    issuanceSlots: slots,
  };
}

/** Resolves once every domain has a valid certificate in the store whose serial differs from `before`'s. */
function storedAll(store: MemoryStore, names: string[], before = new Map<string, string | undefined>()): boolean {
  return names.every((d) => store.serial(d) !== undefined && store.serial(d) !== before.get(d));
}

describe('IssuanceSlots', () => {
  it('hands out at most its limit, first come first served, and passes a released slot to the next waiter', async () => {
    const slots = new IssuanceSlots(2);
    const signal = new AbortController().signal;
    const order: string[] = [];
    const a = await slots.acquire(signal);
    const b = await slots.acquire(signal);
    const taken = (name: string) => (release: () => void) => {
      order.push(name);
      return release;
    };
    const c = slots.acquire(signal).then(taken('c'));
    const d = slots.acquire(signal).then(taken('d'));
    assert.equal(slots.inUse, 2);
    assert.equal(slots.waiting, 2);
    a();
    a(); // releasing twice frees one slot only
    const releaseC = await c;
    assert.deepEqual(order, ['c']);
    assert.equal(slots.inUse, 2);
    assert.equal(slots.waiting, 1);
    b();
    const releaseD = await d;
    assert.deepEqual(order, ['c', 'd']);
    releaseC();
    releaseD();
    assert.equal(slots.inUse, 0);
  });

  it('drops a waiter whose signal aborts: it rejects with the reason and never takes a slot', async () => {
    const slots = new IssuanceSlots(1);
    const release = await slots.acquire(new AbortController().signal);
    const abort = new AbortController();
    const waiting = slots.acquire(abort.signal);
    const next = slots.acquire(new AbortController().signal);
    abort.abort(new Error('domain no longer managed'));
    await assert.rejects(waiting, /domain no longer managed/);
    assert.equal(slots.waiting, 1);
    release();
    (await next)();
    assert.equal(slots.inUse, 0);
    await assert.rejects(slots.acquire(abort.signal), /domain no longer managed/, 'an aborted signal never waits');
  });

  it('refuses a limit that is not a positive integer', () => {
    for (const bad of [0, -1, 1.5, Number.NaN]) assert.throws(() => new IssuanceSlots(bad), RangeError);
  });
});

describe('LoopSupervisor with issuance slots', () => {
  it('never has more CertPair calls in flight than the limit, and issues every domain', async () => {
    const clock = new FakeClock();
    const store = new MemoryStore();
    const tailscaled = new HeldCertPair();
    const names = domains(10);
    const manager = new LoopSupervisor(managerDeps(clock, store, tailscaled, new IssuanceSlots(3)));
    manager.setDomains(names);
    try {
      for (let answered = 0; answered < names.length; answered++) {
        // Whoever can call has called: 3 at first, then as many as the domains left allow.
        await tailscaled.untilOpen(Math.min(3, names.length - answered));
        assert.ok(tailscaled.open.length <= 3, `${tailscaled.open.length} CertPair calls in flight`);
        const call = tailscaled.open[0]!;
        call.answer(await makePair(call.domain, clock.now() - MIN, LIFETIME));
      }
      await clock.waitForSleepers(names.length);
      assert.equal(tailscaled.maxOpen, 3);
      assert.ok(storedAll(store, names), 'every domain stored');
      assert.equal(tailscaled.called.length, names.length, 'one call per domain');
    } finally {
      await manager.stop();
    }
  });

  it('bounds a manager given no slots by the default', async () => {
    const { DEFAULT_ISSUANCE_CONCURRENCY } = await import('../../src/core/issuance/issuance-slots.ts');
    const clock = new FakeClock();
    const tailscaled = new HeldCertPair();
    const manager = new LoopSupervisor(managerDeps(clock, new MemoryStore(), tailscaled));
    manager.setDomains(domains(DEFAULT_ISSUANCE_CONCURRENCY + 3));
    try {
      await tailscaled.untilOpen(DEFAULT_ISSUANCE_CONCURRENCY);
      // Let every other loop run as far as it can.
      await new Promise((resolve) => setImmediate(resolve));
      assert.equal(tailscaled.open.length, DEFAULT_ISSUANCE_CONCURRENCY);
    } finally {
      await manager.stop();
    }
  });

  it('ends loops waiting for a slot on stop, without a call; after stopIssuing a slot freed starts no call', async () => {
    const clock = new FakeClock();
    const store = new MemoryStore();
    const tailscaled = new HeldCertPair();
    const names = domains(4);
    const manager = new LoopSupervisor(managerDeps(clock, store, tailscaled, new IssuanceSlots(1)));
    manager.setDomains(names);
    await tailscaled.untilOpen(1);
    const first = tailscaled.open[0]!;
    const settled = manager.stopIssuing();
    first.answer(await makePair(first.domain, clock.now() - MIN, LIFETIME));
    await settled;
    assert.equal(store.serial(first.domain) !== undefined, true, 'the call under way is stored');
    // The freed slot went to a waiting loop, which saw the daemon stopping and left it.
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(tailscaled.called, [first.domain], 'no CertPair call after stopIssuing');
    assert.equal(store.intents.length, 1, 'no intent recorded after stopIssuing');
    await manager.stop();
    assert.deepEqual(tailscaled.called, [first.domain]);
  });

  it('a domain removed while it waits for a slot leaves the queue and never calls', async () => {
    const clock = new FakeClock();
    const store = new MemoryStore();
    const tailscaled = new HeldCertPair();
    const [a, b, c] = domains(3) as [string, string, string];
    const slots = new IssuanceSlots(1);
    const manager = new LoopSupervisor(managerDeps(clock, store, tailscaled, slots));
    manager.setDomains([a, b, c]);
    await tailscaled.untilOpen(1);
    const first = tailscaled.open[0]!;
    const [removed, kept] = [a, b, c].filter((d) => d !== first.domain) as [string, string];
    while (slots.waiting < 2) await new Promise((resolve) => setImmediate(resolve));
    manager.setDomains([first.domain, kept]);
    while (slots.waiting > 1) await new Promise((resolve) => setImmediate(resolve));
    first.answer(await makePair(first.domain, clock.now() - MIN, LIFETIME));
    await tailscaled.untilOpen(1);
    assert.equal(tailscaled.open[0]!.domain, kept);
    tailscaled.open[0]!.answer(await makePair(kept, clock.now() - MIN, LIFETIME));
    await clock.waitForSleepers(2);
    assert.ok(!tailscaled.called.includes(removed), 'the removed domain never called');
    await manager.stop();
  });

  it('a loop queued behind a slow renewal still renews before its certificate expires', async () => {
    const clock = new FakeClock();
    const store = new MemoryStore();
    const [slow, queued] = domains(2) as [string, string];
    // Both certificates are due in a minute (renewal at half of 90 minutes) and expire 46 minutes from now.
    const issuedAt = clock.now() - 44 * MIN;
    for (const d of [slow, queued]) {
      const pair = await makePair(d, issuedAt, LIFETIME);
      store.content.set(d, { state: 'valid', cert: { pair, info: validateCertPair(pair, d, clock.now()) } });
    }
    const before = new Map([slow, queued].map((d) => [d, store.serial(d)]));
    const expiresAt = issuedAt + LIFETIME;
    const renewedAt = new Map<string, number>();
    const fresh = new Map<string, CertPair>();
    for (const d of [slow, queued]) fresh.set(d, await makePair(d, issuedAt + 44 * MIN, LIFETIME));
    const localApi: CertLoopDeps['localApi'] = {
      certPair: async (d, { signal }) => {
        // tailscaled takes 30 minutes over the first renewal (an ACME order stuck in its queue).
        if (d === slow) await clock.sleep(30 * MIN, signal);
        renewedAt.set(d, clock.now());
        return fresh.get(d)!;
      },
    };
    const manager = new LoopSupervisor(managerDeps(clock, store, localApi, new IssuanceSlots(1)));
    manager.setDomains([slow, queued]);
    await clock.waitForSleepers(2);
    await clock.advance(MIN);
    await clock.waitForSleepers(1); // the slow call; the queued loop waits for its slot, not for time
    assert.equal(renewedAt.size, 0);
    await clock.advance(30 * MIN);
    await clock.waitForSleepers(2);
    assert.ok(storedAll(store, [slow, queued], before), 'both renewed');
    assert.ok(renewedAt.get(queued)! < expiresAt, 'the queued domain renewed before its certificate expired');
    assert.equal(renewedAt.get(queued), renewedAt.get(slow), 'as soon as the slot was free');
    await manager.stop();
  });
});
