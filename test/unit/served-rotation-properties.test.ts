// The served check and the Service advertisement as decisions over any order of events: certificates
// taken, what the proxy serves, checks that could not run, time passing, termination. The world is
// modelled here (what the proxy really serves, what certshare holds); the decisions are the core's.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { advertiseDecision, mergeAdvertised, parseServiceName, serviceDomain } from '../../src/core/served/advertisement.ts';
import { rotationExitTime } from '../../src/core/renewal/renewal.ts';
import {
  classifyServed,
  describeOutcome,
  holdLeaf,
  nextServedState,
  servedVerdict,
  servedVerdictEdge,
  type HeldLeaves,
  type ServedLeaf,
  type ServedProbe,
  type ServedState,
} from '../../src/core/served/served-certificate.ts';

const RUNS = Number(process.env.CERTSHARE_PROPERTY_RUNS ?? 300);
const HOUR = 3_600_000;
const T0 = Date.UTC(2026, 10, 1);

interface Leaf extends ServedLeaf {}

function leaf(id: number, notBefore: number, lifetimeMs: number, coversName = true): Leaf {
  return { fingerprint256: `FP:${id}`, serial: `${id}`, notBefore, notAfter: notBefore + lifetimeMs, coversName };
}

type Served = { kind: 'held'; back: number } | { kind: 'foreign' } | { kind: 'otherName' } | { kind: 'expired' } | { kind: 'none' };

type Event =
  | { e: 'hold'; lifetimeH: number; backdateH: number }
  | { e: 'proxy'; serves: Served }
  | { e: 'check' }
  | { e: 'checkFails' }
  | { e: 'tick'; ms: number }
  | { e: 'terminate' };

const servedArb: fc.Arbitrary<Served> = fc.oneof(
  fc.record({ kind: fc.constant('held' as const), back: fc.integer({ min: 0, max: 3 }) }),
  fc.constant({ kind: 'foreign' as const }),
  fc.constant({ kind: 'otherName' as const }),
  fc.constant({ kind: 'expired' as const }),
  fc.constant({ kind: 'none' as const }),
);
const eventArb: fc.Arbitrary<Event> = fc.oneof(
  {
    arbitrary: fc.record({ e: fc.constant('hold' as const), lifetimeH: fc.integer({ min: 1, max: 24 * 90 }), backdateH: fc.integer({ min: 0, max: 48 }) }),
    weight: 2,
  },
  { arbitrary: fc.record({ e: fc.constant('proxy' as const), serves: servedArb }), weight: 3 },
  { arbitrary: fc.constant({ e: 'check' as const }), weight: 3 },
  { arbitrary: fc.constant({ e: 'checkFails' as const }), weight: 2 },
  { arbitrary: fc.record({ e: fc.constant('tick' as const), ms: fc.integer({ min: 0, max: 40 * 24 * HOUR }) }), weight: 3 },
  { arbitrary: fc.constant({ e: 'terminate' as const }), weight: 1 },
);

/** The world and certshare's view of it, folded event by event with the core's functions. */
class World {
  now = T0;
  nextId = 1;
  /** Every leaf certshare held, oldest first. */
  leaves: Leaf[] = [];
  held: HeldLeaves = { current: undefined, previous: [] };
  proxy: Leaf | undefined;
  state: ServedState | undefined;
  terminating = false;
  readonly end = (h: { notBefore: number; notAfter: number }) => rotationExitTime(h, { renewFraction: 1 / 3 }, 60_000);

  apply(ev: Event): void {
    switch (ev.e) {
      case 'hold': {
        const l = leaf(this.nextId++, this.now - ev.backdateH * HOUR, ev.lifetimeH * HOUR + ev.backdateH * HOUR);
        this.leaves.push(l);
        this.held = holdLeaf(this.held, l.fingerprint256);
        return;
      }
      case 'proxy':
        this.proxy = this.#served(ev.serves);
        return;
      case 'check':
      case 'checkFails': {
        const probe: ServedProbe = ev.e === 'check' && this.proxy ? { leaf: this.proxy } : { failure: 'timeout', detail: 'no answer' };
        this.state = nextServedState(this.state, probe, classifyServed(probe, this.held, this.now));
        return;
      }
      case 'tick':
        this.now += ev.ms;
        return;
      case 'terminate':
        this.terminating = true;
        return;
    }
  }

  #served(s: Served): Leaf | undefined {
    switch (s.kind) {
      case 'held':
        return this.leaves[this.leaves.length - 1 - s.back];
      case 'foreign':
        return leaf(1000 + this.nextId++, this.now - HOUR, 90 * 24 * HOUR);
      case 'otherName':
        return leaf(2000 + this.nextId++, this.now - HOUR, 90 * 24 * HOUR, false);
      case 'expired':
        return leaf(3000 + this.nextId++, this.now - 91 * 24 * HOUR, 90 * 24 * HOUR);
      case 'none':
        return undefined;
    }
  }

  currentLeaf(): Leaf | undefined {
    return this.leaves.find((l) => l.fingerprint256 === this.held.current?.fingerprint256);
  }

  /** `fromFile`: tailscaled's config file lists the Service; certshare may only withdraw it. */
  advertise(fromFile = false): boolean {
    return advertiseDecision({
      terminating: this.terminating,
      held: this.currentLeaf(),
      served: servedVerdict(this.state, this.now, this.end),
      now: this.now,
      end: this.end,
      fromFile,
    }).advertise;
  }
}

describe('the advertise decision over any order of events', () => {
  it('never advertises while the last served certificate seen is expired, foreign or inside the readiness lead, nor after termination', () => {
    fc.assert(
      fc.property(fc.array(eventArb, { maxLength: 40 }), (events) => {
        const w = new World();
        for (const ev of events) {
          w.apply(ev);
          if (!w.advertise()) continue;
          assert.equal(w.terminating, false, 'advertised after termination');
          const known = w.state?.known;
          assert.ok(known, 'advertised before any TLS answer');
          assert.ok(known.outcome === 'current' || known.outcome === 'previous', `advertised while the proxy served ${known.outcome}`);
          assert.ok(w.now < w.end(known.leaf), 'advertised with the served certificate inside the readiness lead');
          assert.ok(w.now >= known.leaf.notBefore && w.now < known.leaf.notAfter, 'advertised with the served certificate not valid');
          const held = w.currentLeaf();
          assert.ok(held && w.now < w.end(held), 'advertised without a valid certificate held');
        }
      }),
      { numRuns: RUNS },
    );
  });

  it('under a config file: withdrawn exactly while the last served certificate seen is expired, foreign, for another name or inside its lead', () => {
    fc.assert(
      fc.property(fc.array(eventArb, { maxLength: 40 }), (events) => {
        const w = new World();
        for (const ev of events) {
          w.apply(ev);
          const known = w.state?.known;
          const bad =
            !w.terminating &&
            known !== undefined &&
            (!(known.outcome === 'current' || known.outcome === 'previous') ||
              w.now >= w.end(known.leaf) ||
              w.now < known.leaf.notBefore ||
              w.now >= known.leaf.notAfter);
          if (w.terminating) assert.equal(w.advertise(true), false, 'kept after termination');
          else assert.equal(w.advertise(true), !bad, bad ? `kept while the proxy served ${known?.outcome}` : 'withdrawn without a bad certificate seen');
        }
      }),
      { numRuns: RUNS },
    );
  });

  it('a check that could not run never withdraws a Service', () => {
    fc.assert(
      fc.property(fc.array(eventArb, { maxLength: 40 }), fc.integer({ min: 1, max: 5 }), (events, failures) => {
        const w = new World();
        for (const ev of events) w.apply(ev);
        const before = w.advertise();
        for (let i = 0; i < failures; i++) w.apply({ e: 'checkFails' });
        assert.equal(w.advertise(), before);
      }),
      { numRuns: RUNS },
    );
  });

  it('the proxy serving the current certificate, valid and before its lead, is advertised', () => {
    fc.assert(
      fc.property(fc.integer({ min: 2, max: 24 * 90 }), fc.integer({ min: 0, max: 48 }), (lifetimeH, backdateH) => {
        const w = new World();
        w.apply({ e: 'hold', lifetimeH, backdateH });
        w.apply({ e: 'proxy', serves: { kind: 'held', back: 0 } });
        w.apply({ e: 'check' });
        assert.equal(w.advertise(), true);
      }),
      { numRuns: RUNS },
    );
  });
});

describe('served outcomes', () => {
  const held: HeldLeaves = { current: { fingerprint256: 'FP:2' }, previous: ['FP:1'] };
  const now = T0;
  const cases: Array<[string, ServedProbe, string]> = [
    ['the current leaf', { leaf: leaf(2, now - HOUR, 10 * HOUR) }, 'current'],
    ['the previous leaf', { leaf: leaf(1, now - HOUR, 10 * HOUR) }, 'previous'],
    ['an expired leaf, even the current one', { leaf: leaf(2, now - 10 * HOUR, HOUR) }, 'expired'],
    ['a leaf not yet valid', { leaf: leaf(2, now + HOUR, HOUR) }, 'expired'],
    ['a leaf for another name', { leaf: leaf(2, now - HOUR, 10 * HOUR, false) }, 'other_name'],
    ['a self-signed or foreign leaf', { leaf: leaf(9, now - HOUR, 10 * HOUR) }, 'other'],
    ['no TLS answer', { failure: 'not_tls', detail: 'plain HTTP' }, 'unknown'],
    ['a TLS alert', { failure: 'alert', detail: 'ERR_SSL_TLSV1_ALERT_INTERNAL_ERROR' }, 'handshake_failed'],
  ];
  for (const [what, probe, outcome] of cases) it(`${what}: ${outcome}`, () => assert.equal(classifyServed(probe, held, now), outcome));

  it('takes the replica out at the second failed handshake in a row (the first may race the first write), in again at a leaf', () => {
    const end = (v: { notAfter: number }): number => v.notAfter;
    const alert: ServedProbe = { failure: 'alert', detail: 'ERR_SSL_TLSV1_ALERT_INTERNAL_ERROR' };
    const served: ServedProbe = { leaf: leaf(2, now - HOUR, 10 * HOUR) };
    const fold = (state: ServedState | undefined, probe: ServedProbe): ServedState => nextServedState(state, probe, classifyServed(probe, held, now));
    let state = fold(undefined, alert);
    assert.equal(servedVerdict(state, now, end).verdict, 'unconfirmed');
    state = fold(state, served);
    assert.equal(servedVerdict(fold(state, alert), now, end).verdict, 'ok', 'one alert after a leaf: the leaf still counts');
    state = fold(fold(state, alert), alert);
    assert.deepEqual(servedVerdict(state, now, end), { verdict: 'bad', why: describeOutcome('handshake_failed') });
    assert.equal(servedVerdictEdge(state, now, end), undefined);
    assert.equal(servedVerdict(fold(state, { failure: 'timeout', detail: 'slow' }), now, end).verdict, 'ok', 'no answer: the last leaf counts');
    assert.equal(servedVerdict(fold(state, served), now, end).verdict, 'ok');
  });

  it('holdLeaf keeps the last three replaced leaves, newest first', () => {
    let h: HeldLeaves = { current: undefined, previous: [] };
    for (const f of ['a', 'b', 'c', 'd', 'e']) h = holdLeaf(h, f);
    assert.deepEqual(h, { current: { fingerprint256: 'e' }, previous: ['d', 'c', 'b'] });
    assert.equal(holdLeaf(h, 'e'), h, 'the same leaf again changes nothing');
  });
});

describe('Service names and the prefs merge', () => {
  it('accepts svc:<dns-label> only', () => {
    assert.equal(parseServiceName('svc:web'), 'svc:web');
    for (const bad of ['web', 'svc:', 'svc:Web', 'svc:-web', 'svc:a.b', `svc:${'a'.repeat(64)}`, 'svc:web;rm']) {
      assert.throws(() => parseServiceName(bad), { code: 'CERTSHARE_BAD_FLAG' }, bad);
    }
  });

  it('maps a Service to the managed domain of its label', () => {
    assert.equal(serviceDomain('svc:web', ['api.t.ts.net', 'web.t.ts.net']), 'web.t.ts.net');
    assert.equal(serviceDomain('svc:we', ['web.t.ts.net']), undefined);
  });

  it("changes only the managed Services and keeps others' entries in place", () => {
    fc.assert(
      fc.property(
        fc.uniqueArray(fc.constantFrom('svc:a', 'svc:b', 'svc:c', 'svc:x', 'svc:y'), { maxLength: 5 }),
        fc.subarray(['svc:a', 'svc:b', 'svc:c']),
        fc.subarray(['svc:a', 'svc:b', 'svc:c']),
        (current, managedList, wantedList) => {
          const managed = new Set(managedList);
          const wanted = new Set(wantedList);
          const next = mergeAdvertised(current, managed, wanted) ?? current;
          const others = current.filter((s) => !managed.has(s));
          assert.deepEqual(
            next.filter((s) => !managed.has(s)),
            others,
            "others' entries unchanged, in order",
          );
          for (const s of managed) assert.equal(next.includes(s), wanted.has(s), s);
        },
      ),
      { numRuns: RUNS },
    );
  });
});
