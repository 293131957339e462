import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import {
  decideRotation,
  emptyRotationState,
  MAX_BUNDLE_CAS,
  rotationPolicyProblem,
  withLeaf,
  withObservation,
  withoutCa,
  withPublished,
  type LeafRecord,
  type RotationDecision,
  type RotationPolicy,
  type RotationState,
} from '../../../src/core/injector-ca/ca-rotation.ts';
import { withCa } from '../../support/rotation-state.ts';

/** True when every object's observed bundle contains the leaf's CA: the invariant the policy keeps. */
function leafTrustedEverywhere(s: RotationState, leaf: LeafRecord): boolean {
  return s.objects.every((object) => s.observed[object]?.[leaf.signedBy] !== undefined);
}

type Decide = (s: RotationState, p: RotationPolicy, now: number) => RotationDecision;

interface World {
  policy: RotationPolicy;
  objects: string[];
  /** Delay between a write and its observation, per write, drawn from this list in turn. */
  delays: number[];
  horizon: number;
}

/**
 * Drives a decide function the way the injector does (one action at a time until nothing is due, then
 * sleep until the next check or observation), with each write observed after a delay from `delays`.
 * Returns the first broken promise, or undefined. Leaves are taken as served the moment they are issued.
 */
function simulate(world: World, decide: Decide): string | undefined {
  const { policy, objects, delays, horizon } = world;
  let s = emptyRotationState(objects);
  let now = 0;
  let caCount = 0;
  let leafCount = 0;
  let delayIndex = 0;
  const leaves: LeafRecord[] = [];
  const arrivals: { at: number; object: string; caIds: string[] }[] = [];
  const lastArrival: Record<string, number> = {};
  // After the first CA had time to propagate, a valid leaf must always be there.
  const maxDelay = Math.max(0, ...delays);
  const servingFrom = maxDelay + policy.propagationGraceMs;
  const check = (): string | undefined => {
    const leaf = s.leaf;
    if (!leaf) return undefined;
    if (!leafTrustedEverywhere(s, leaf))
      return `at ${now}: leaf ${leaf.serial} signed by ${leaf.signedBy}, not in every observed bundle ${JSON.stringify(s.observed)}`;
    if (now < leaf.notBefore || now >= leaf.notAfter) return `at ${now}: leaf ${leaf.serial} outside ${leaf.notBefore}..${leaf.notAfter}`;
    if (!s.bundle.some((ca) => ca.id === leaf.signedBy)) return `at ${now}: leaf ${leaf.serial}'s CA left the bundle`;
    if (s.bundle.length > MAX_BUNDLE_CAS) return `at ${now}: ${s.bundle.length} CAs in the bundle, more than a reader believes (${MAX_BUNDLE_CAS})`;
    return undefined;
  };

  for (let steps = 0; now <= horizon; steps++) {
    if (steps > 100_000) return 'no progress (livelock)';
    arrivals.sort((a, b) => a.at - b.at);
    while (arrivals.length > 0 && arrivals[0]!.at <= now) {
      const a = arrivals.shift()!;
      s = withObservation(s, a.object, a.caIds, now);
    }
    let decision = decide(s, policy, now);
    for (let actions = 0; ; actions++) {
      const broken = check();
      if (broken) return broken;
      if (!decision.action) break;
      if (actions > 50) return `at ${now}: more than 50 actions without rest (${decision.action.kind})`;
      const action = decision.action;
      switch (action.kind) {
        case 'create-ca':
          s = withCa(s, { id: `ca${++caCount}`, notBefore: action.notBefore, notAfter: action.notAfter });
          break;
        case 'publish':
          for (const object of action.objects) {
            // Writes to one object are observed in order.
            const at = Math.max(now + delays[delayIndex++ % delays.length]!, lastArrival[object] ?? 0);
            lastArrival[object] = at;
            arrivals.push({ at, object, caIds: action.caIds });
          }
          s = withPublished(s, action.objects, action.caIds);
          break;
        case 'issue-leaf': {
          const leaf = { serial: `leaf${++leafCount}`, signedBy: action.signer, notBefore: action.notBefore, notAfter: action.notAfter };
          leaves.push(leaf);
          s = withLeaf(s, leaf);
          break;
        }
        case 'retire-ca': {
          const alive = leaves.find((l) => l.signedBy === action.caId && l.notAfter > now);
          if (alive) return `at ${now}: ${action.caId} left the bundle while its leaf ${alive.serial} is valid until ${alive.notAfter}`;
          s = withoutCa(s, action.caId);
          break;
        }
      }
      decision = decide(s, policy, now);
    }
    // At rest: once the first CA had time to propagate, a leaf must be there.
    if (!s.leaf && now >= servingFrom && !arrivals.some((a) => a.at <= now)) return `at ${now}: no leaf to serve`;
    if (arrivals.some((a) => a.at <= now)) continue;
    const wakeUps = [decision.nextCheckAt, ...arrivals.map((a) => a.at)].filter((t): t is number => t !== undefined && t > now);
    if (wakeUps.length === 0) return undefined;
    now = Math.min(...wakeUps);
  }
  return undefined;
}

/** Policies under which overlap can work, with delays shorter than the CA's rotation margin. */
const worlds: fc.Arbitrary<World> = fc
  .record({
    grace: fc.integer({ min: 0, max: 50 }),
    delays: fc.array(fc.integer({ min: 0, max: 200 }), { minLength: 1, maxLength: 8 }),
    objectCount: fc.integer({ min: 1, max: 3 }),
    caSpare: fc.integer({ min: 3, max: 5_000 }),
    rotateShare: fc.double({ min: 0, max: 1, noNaN: true }),
    leafLifetime: fc.integer({ min: 2, max: 6_000 }),
    renewShare: fc.double({ min: 0, max: 1, noNaN: true }),
  })
  .map(({ grace, delays, objectCount, caSpare, rotateShare, leafLifetime, renewShare }) => {
    const propagation = grace + Math.max(...delays);
    // The next CA must propagate before the current one expires, and before it is itself due for rotation.
    const caLifetime = 2 * propagation + caSpare;
    // At most 6/7 of the lifetime: never more than MAX_BUNDLE_CAS CAs at once.
    const caRotateBefore = propagation + 1 + Math.floor(rotateShare * Math.min(caSpare - 2, Math.floor((6 * caLifetime) / 7) - propagation - 1));
    const leafRenewBefore = 1 + Math.floor(renewShare * (leafLifetime - 2));
    const policy: RotationPolicy = {
      caLifetimeMs: caLifetime,
      caRotateBeforeMs: caRotateBefore,
      leafLifetimeMs: leafLifetime,
      leafRenewBeforeMs: leafRenewBefore,
      propagationGraceMs: grace,
    };
    return { policy, objects: Array.from({ length: objectCount }, (_, i) => `object${i}`), delays, horizon: 6 * caLifetime };
  });

/** cert-controller's way: sign with the newest CA as soon as it exists, assuming every object has it. */
const assumeEverywhere: Decide = (s, p, now) => {
  const observed: RotationState['observed'] = {};
  for (const object of s.objects) observed[object] = Object.fromEntries(s.bundle.map((ca) => [ca.id, -Infinity]));
  return decideRotation({ ...s, observed }, p, now);
};

describe('CA rotation policy', () => {
  it('serves only leaves that every observed bundle trusts, never expired, whatever the lifetimes and delays', () => {
    fc.assert(
      fc.property(worlds, (world) => {
        assert.equal(rotationPolicyProblem(world.policy), undefined);
        const broken = simulate(world, decideRotation);
        assert.equal(broken, undefined, broken);
      }),
      { numRuns: 300 },
    );
  });

  it('the same property catches a policy that assumes propagation instead of observing it', () => {
    const found = fc.check(
      fc.property(worlds, (world) => simulate(world, assumeEverywhere) === undefined),
      { numRuns: 300 },
    );
    assert.equal(found.failed, true, 'the property did not tell the assuming policy apart');
  });

  it('walks one rotation in order: new CA, publish, wait for observation, switch, retire after the last old leaf', () => {
    const p: RotationPolicy = { caLifetimeMs: 1000, caRotateBeforeMs: 400, leafLifetimeMs: 300, leafRenewBeforeMs: 100, propagationGraceMs: 10 };
    let s = emptyRotationState(['mwc']);
    assert.equal(decideRotation(s, p, 0).action?.kind, 'create-ca');
    s = withCa(s, { id: 'A', notBefore: 0, notAfter: 1000 });
    assert.deepEqual(decideRotation(s, p, 0).action, {
      kind: 'publish',
      reason: '1 object(s) do not carry the current bundle',
      objects: ['mwc'],
      caIds: ['A'],
    });
    s = withPublished(s, ['mwc'], ['A']);
    // Written but not yet observed: no leaf, and nothing else to do.
    assert.equal(decideRotation(s, p, 0).action, undefined);
    s = withObservation(s, 'mwc', ['A'], 15);
    // No leaf yet: nothing to keep working during a grace, the first leaf comes at once.
    const first = decideRotation(s, p, 15).action;
    assert.deepEqual(first && first.kind === 'issue-leaf' && [first.signer, first.notAfter], ['A', 315]);
    s = withLeaf(s, { serial: 'L1', signedBy: 'A', notBefore: 15, notAfter: 315 });
    assert.equal(decideRotation(s, p, 214).action, undefined);
    assert.equal(decideRotation(s, p, 215).action?.kind, 'issue-leaf');
    s = withLeaf(s, { serial: 'L2', signedBy: 'A', notBefore: 215, notAfter: 515 });
    // A's rotation point (1000 - 400): B joins the bundle; leaves stay A's until B is observed.
    assert.equal(decideRotation(s, p, 600).action?.kind, 'create-ca');
    s = withCa(s, { id: 'B', notBefore: 600, notAfter: 1600 });
    s = withLeaf(s, { serial: 'L3', signedBy: 'A', notBefore: 415, notAfter: 715 });
    assert.equal(decideRotation(s, p, 600).action?.kind, 'publish');
    s = withPublished(s, ['mwc'], ['A', 'B']);
    assert.equal(decideRotation(s, p, 605).action, undefined);
    s = withObservation(s, 'mwc', ['A', 'B'], 605);
    assert.equal(decideRotation(s, p, 614).action, undefined);
    const switched = decideRotation(s, p, 615).action;
    assert.deepEqual(switched && switched.kind === 'issue-leaf' && switched.signer, 'B');
    s = withLeaf(s, { serial: 'L4', signedBy: 'B', notBefore: 615, notAfter: 915 });
    // A signed L3, valid until 715: A stays until then.
    assert.equal(decideRotation(s, p, 714).action, undefined);
    assert.equal(decideRotation(s, p, 714).nextCheckAt, 715);
    assert.deepEqual(decideRotation(s, p, 715).action, { kind: 'retire-ca', reason: 'the last leaf signed by CA A has expired', caId: 'A' });
    s = withoutCa(s, 'A');
    assert.deepEqual(decideRotation(s, p, 715).action && decideRotation(s, p, 715).action!.kind, 'publish');
  });

  it('does not re-issue a leaf capped at its CA expiry while the next CA propagates', () => {
    const p: RotationPolicy = { caLifetimeMs: 1000, caRotateBeforeMs: 400, leafLifetimeMs: 800, leafRenewBeforeMs: 500, propagationGraceMs: 0 };
    let s = withObservation(withPublished(withCa(emptyRotationState(['mwc']), { id: 'A', notBefore: 0, notAfter: 1000 }), ['mwc'], ['A']), 'mwc', ['A'], 0);
    s = withLeaf(s, { serial: 'L1', signedBy: 'A', notBefore: 500, notAfter: 1000 });
    s = withPublished(withCa(s, { id: 'B', notBefore: 600, notAfter: 1600 }), ['mwc'], ['A', 'B']);
    assert.equal(decideRotation(s, p, 700).action, undefined);
  });

  it('a CA whose key is lost (recovered from the bundle) stays trusted until its last leaf expires, and signs nothing', () => {
    const p: RotationPolicy = { caLifetimeMs: 1000, caRotateBeforeMs: 400, leafLifetimeMs: 300, leafRenewBeforeMs: 100, propagationGraceMs: 10 };
    // Recovered: A's certificate from the objects, the served leaf L1 (signed by A, until 315), no key.
    let s = withObservation(
      withPublished(withCa(emptyRotationState(['mwc']), { id: 'A', notBefore: 0, notAfter: 1000, canSign: false }), ['mwc'], ['A']),
      'mwc',
      ['A'],
      0,
    );
    s = withLeaf(s, { serial: 'L1', signedBy: 'A', notBefore: 15, notAfter: 315 });
    // At once, long before A's rotation point: a CA that can sign joins, next to A.
    assert.deepEqual(decideRotation(s, p, 100).action, { kind: 'create-ca', reason: 'no CA in the bundle has its key', notBefore: 100, notAfter: 1100 });
    s = withCa(s, { id: 'B', notBefore: 100, notAfter: 1100 });
    assert.deepEqual(decideRotation(s, p, 100).action && decideRotation(s, p, 100).action!.kind, 'publish');
    s = withObservation(withPublished(s, ['mwc'], ['A', 'B']), 'mwc', ['A', 'B'], 105);
    // Leaves move to B once it has been seen for its grace (115), A never signs.
    assert.equal(decideRotation(s, p, 114).action, undefined);
    const moved = decideRotation(s, p, 115).action;
    assert.deepEqual(moved && moved.kind === 'issue-leaf' && moved.signer, 'B');
    s = withLeaf(s, { serial: 'L2', signedBy: 'B', notBefore: 115, notAfter: 415 });
    // A stays while L1, the last leaf it signed, may still be served.
    assert.equal(decideRotation(s, p, 314).action, undefined);
    assert.equal(decideRotation(s, p, 315).action?.kind, 'issue-leaf', 'L2 renewal first');
    s = withLeaf(s, { serial: 'L3', signedBy: 'B', notBefore: 315, notAfter: 615 });
    assert.deepEqual(decideRotation(s, p, 315).action, { kind: 'retire-ca', reason: 'the last leaf signed by CA A has expired', caId: 'A' });
  });

  it('rejects policies that cannot overlap', () => {
    const ok: RotationPolicy = { caLifetimeMs: 1000, caRotateBeforeMs: 400, leafLifetimeMs: 300, leafRenewBeforeMs: 100, propagationGraceMs: 10 };
    assert.equal(rotationPolicyProblem(ok), undefined);
    assert.match(rotationPolicyProblem({ ...ok, caRotateBeforeMs: 1000 }) ?? '', /CA rotation point/);
    assert.match(rotationPolicyProblem({ ...ok, leafRenewBeforeMs: 300 }) ?? '', /leaf renewal point/);
    assert.match(rotationPolicyProblem({ ...ok, propagationGraceMs: 400 }) ?? '', /propagation grace/);
    // A new CA every 140 ms, each kept 1000: 9 at once, more than a reader of the CA Secret believes.
    assert.equal(rotationPolicyProblem({ ...ok, caRotateBeforeMs: 857 }), undefined);
    assert.match(rotationPolicyProblem({ ...ok, caRotateBeforeMs: 860 }) ?? '', /at most 8 CAs/);
  });
});
