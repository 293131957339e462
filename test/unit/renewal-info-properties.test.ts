// Property tests of the ARI guard (src/core/renewal/renewal-info.ts) over a certificate lifecycle: a writer that
// holds a certificate, asks the CA's renewalInfo endpoint on a schedule (answers arrive late, possibly
// after the certificate was replaced), renews by the expiry rule or when ARI says so; a CA whose answers
// are anything (pebble's default window, a window moved into the past, a revocation, windows years away,
// inverted, malformed), on a skewed clock, with notBefore backdated; renewals that sometimes hand back the
// same certificate (tailscaled's cache) and calls that fail (retried on the next look, as the loop's
// backoff does). Whatever happens: at most one ARI-driven renewal per certificate, each one driven by an
// answer fetched for that very certificate since it was held, none before the hold.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { renewalTime } from '../../src/core/renewal/renewal.ts';
import {
  NO_ARI_STATE,
  type AriState,
  ariRenewalDone,
  ariVerdict,
  holding,
  nextAriCheck,
  parseRenewalInfo,
  withAnswer,
} from '../../src/core/renewal/renewal-info.ts';
import { Rng } from '../chaos/rng.ts';

const S = 1000;
const H = 3600 * S;
const DAY = 24 * H;
const T0 = Date.UTC(2026, 10, 25);
const iso = (ms: number): string => (Number.isFinite(ms) && Math.abs(ms) < 8.64e15 ? new Date(ms).toISOString() : 'not a date');

/** What the CA answers for a certificate (times on the CA's clock). */
type CaAnswer =
  | { kind: 'pebble' } // the 2/3 point +/- 24 h, clamped to the lifetime (REFERENCE section 5)
  | { kind: 'past'; agoMs: number } // a revocation or an incident: a short window that ended agoMs ago
  | { kind: 'open'; agoMs: number } // a window that opened agoMs ago and lasts a day (cert-manager #8993's)
  | { kind: 'window'; startShare: number; lengthShare: number } // anything, relative to the lifetime (negative: before notBefore)
  | { kind: 'inverted' }
  | { kind: 'years_away' }
  | { kind: 'malformed' }
  | { kind: 'error' }; // 404, 500, a timeout: no answer at all

interface Scenario {
  lifetimeMs: number;
  backdateMs: number;
  /** CA clock minus the writer's. */
  skewMs: number;
  minHoldMs: number;
  ariIntervalMs: number;
  /** How long an answer takes to arrive: long ones land after the certificate was replaced. */
  latencyMs: number;
  /** The CA's answers, one per check, in order; the last one repeats. */
  answers: CaAnswer[];
  /** Per renewal, whether it hands back the certificate already held (tailscaled's cache), cycled. */
  sameCertificate: boolean[];
  /** Per ARI-driven CertPair call, whether it fails (nothing returned, retried later), cycled. */
  callFails: boolean[];
  /** Writer steps: time advanced between two looks, cycled. */
  stepsMs: number[];
  seed: number;
}

interface Cert {
  id: string;
  notBefore: number;
  notAfter: number;
}

function caBody(answer: CaAnswer, cert: Cert, caNow: number): string {
  const window = (start: number, end: number): string => JSON.stringify({ suggestedWindow: { start: iso(start), end: iso(end) } });
  const life = cert.notAfter - cert.notBefore;
  switch (answer.kind) {
    case 'pebble': {
      const mid = cert.notBefore + (2 * life) / 3;
      return window(Math.max(cert.notBefore, mid - DAY), Math.min(cert.notAfter, mid + DAY));
    }
    case 'past':
      return window(caNow - answer.agoMs - S, caNow - answer.agoMs);
    case 'open':
      return window(caNow - answer.agoMs, caNow - answer.agoMs + DAY);
    case 'window': {
      const start = cert.notBefore + answer.startShare * life;
      return window(start, start + answer.lengthShare * life);
    }
    case 'inverted':
      return window(cert.notBefore + life / 2, cert.notBefore + life / 3);
    case 'years_away':
      return window(cert.notAfter + 3 * 365 * DAY, cert.notAfter + 4 * 365 * DAY);
    case 'malformed':
      return '{"suggestedWindow": {"start": ';
    case 'error':
      return '';
  }
}

interface AriOrder {
  at: number;
  certId: string;
  cert: Cert;
  heldSince: number;
  answerFor: string;
  fetchedAt: number;
}

/** Runs the writer over `horizonMs` and returns what ARI ordered, and for which certificate. */
function simulate(s: Scenario, horizonMs: number): { ariOrders: AriOrder[]; failedCalls: number; certificates: number; violations: string[] } {
  const rng = new Rng(s.seed);
  const random = (): number => rng.next();
  const violations: string[] = [];
  const ariOrders: AriOrder[] = [];
  let serial = 0;
  let answerIndex = 0;
  let renewals = 0;
  let calls = 0;
  let failedCalls = 0;
  const issue = (now: number): Cert => {
    const caNow = now + s.skewMs;
    const notBefore = Math.floor((caNow - s.backdateMs) / S) * S;
    serial += 1;
    return { id: `aki.${serial}`, notBefore, notAfter: Math.floor((caNow + s.lifetimeMs) / S) * S };
  };
  let now = T0;
  let held = issue(now);
  let obtainedAt = now;
  let ari: AriState = holding(NO_ARI_STATE, held.id, now);
  let nextCheck = now;
  let inFlight: { cert: Cert; arrives: number } | undefined;
  const renew = (): void => {
    const same = s.sameCertificate[renewals % s.sameCertificate.length]!;
    renewals += 1;
    if (!same) {
      held = issue(now);
      obtainedAt = now;
      // A new certificate is asked about at once (the worst case for a CA that answers "now" to all).
      nextCheck = now;
    }
    ari = holding(ari, held.id, now);
  };
  for (let step = 0; now < T0 + horizonMs; step++) {
    now += s.stepsMs[step % s.stepsMs.length]!;
    if (inFlight && now >= inFlight.arrives) {
      const asked = inFlight.cert;
      inFlight = undefined;
      const answer = s.answers[Math.min(answerIndex++, s.answers.length - 1)]!;
      if (answer.kind !== 'error') {
        try {
          ari = withAnswer(ari, parseRenewalInfo(caBody(answer, asked, now + s.skewMs), { certId: asked.id, ...asked }, now), random);
        } catch {
          // CERTSHARE_ARI_BAD_RESPONSE: the expiry rule stays in force.
        }
      }
      nextCheck = nextAriCheck(now, rng.chance(0.5) ? undefined : rng.int(0, 10) * H, { floorMs: Math.min(60 * S, s.ariIntervalMs), capMs: s.ariIntervalMs });
    }
    if (!inFlight && now >= nextCheck) inFlight = { cert: held, arrives: now + s.latencyMs };
    const verdict = ariVerdict(ari, now, s.minHoldMs);
    if (verdict.kind === 'order' && s.callFails[calls++ % s.callFails.length]) {
      failedCalls += 1;
    } else if (verdict.kind === 'order') {
      const order = { at: now, certId: held.id, cert: held, heldSince: ari.heldSince, answerFor: verdict.answer.certId, fetchedAt: verdict.answer.fetchedAt };
      ariOrders.push(order);
      if (order.answerFor !== held.id) violations.push(`ARI order for ${held.id} driven by the answer for ${order.answerFor}`);
      if (order.fetchedAt < order.heldSince) violations.push(`ARI order for ${held.id} driven by an answer fetched before it was held`);
      if (order.at < order.heldSince + s.minHoldMs) violations.push(`ARI order for ${held.id} ${order.at - order.heldSince} ms after it was held`);
      ari = ariRenewalDone(ari);
      renew();
    } else if (now >= renewalTime({ ...held, obtainedAt }, { renewFraction: 1 / 3 })) {
      renew();
    }
  }
  const perCert = new Map<string, number>();
  for (const o of ariOrders) perCert.set(o.certId, (perCert.get(o.certId) ?? 0) + 1);
  for (const [id, n] of perCert) if (n > 1) violations.push(`${n} ARI-driven orders for certificate ${id}`);
  return { ariOrders, failedCalls, certificates: serial, violations };
}

const share = (min: number, max: number): fc.Arbitrary<number> => fc.double({ min, max, noNaN: true });
const answerArb: fc.Arbitrary<CaAnswer> = fc.oneof(
  fc.constant({ kind: 'pebble' as const }),
  fc.integer({ min: 0, max: 2 * 3600 }).map((sec) => ({ kind: 'past' as const, agoMs: sec * S })),
  fc.integer({ min: 0, max: 2 * 3600 }).map((sec) => ({ kind: 'open' as const, agoMs: sec * S })),
  fc.record({ kind: fc.constant('window' as const), startShare: share(-2, 1.2), lengthShare: share(0, 1.5) }),
  fc.constantFrom<CaAnswer>({ kind: 'inverted' }, { kind: 'years_away' }, { kind: 'malformed' }, { kind: 'error' }),
);

/** Lifetimes from a minute to 90 days; every other duration is a share of it. */
const scenarioArb: fc.Arbitrary<Scenario> = fc
  .record({
    lifetimeMs: fc.oneof(fc.integer({ min: 60, max: 3600 }), fc.integer({ min: 3600, max: 90 * 86_400 })).map((sec) => sec * S),
    backdate: fc.oneof(fc.constant(0), fc.constant(H), share(0, 2)),
    skew: fc.oneof(fc.constant(0), share(-0.5, 0.5)),
    minHold: share(0.001, 0.2),
    ariInterval: share(0.001, 0.5),
    latency: fc.oneof(fc.constant(0), share(0, 0.5)),
    answers: fc.array(answerArb, { minLength: 1, maxLength: 8 }),
    sameCertificate: fc.array(fc.boolean(), { minLength: 1, maxLength: 4 }),
    callFails: fc.oneof(fc.constant<boolean[]>([false]), fc.array(fc.boolean(), { minLength: 1, maxLength: 4 })),
    steps: fc.array(share(0.001, 0.3), { minLength: 1, maxLength: 6 }),
    seed: fc.integer(),
  })
  .map((r) => {
    const part = (x: number): number => Math.max(S, Math.round((r.lifetimeMs * x) / S) * S);
    return {
      lifetimeMs: r.lifetimeMs,
      backdateMs: typeof r.backdate === 'number' && r.backdate === H ? H : Math.round((r.lifetimeMs * r.backdate) / S) * S,
      skewMs: Math.round((r.lifetimeMs * r.skew) / S) * S,
      minHoldMs: part(r.minHold),
      ariIntervalMs: part(r.ariInterval),
      latencyMs: r.latency === 0 ? 0 : part(r.latency),
      answers: r.answers,
      sameCertificate: r.sameCertificate,
      callFails: r.callFails,
      stepsMs: r.steps.map(part),
      seed: r.seed,
    };
  });

const RUNS = Number(process.env.CERTSHARE_PROPERTY_RUNS ?? 300);

describe('ARI guard (properties)', () => {
  it('at most one ARI-driven order per certificate, from its own fresh answer, never before the hold', () => {
    fc.assert(
      fc.property(scenarioArb, (s) => {
        const { violations } = simulate(s, 4 * s.lifetimeMs);
        assert.deepEqual(violations, []);
      }),
      { numRuns: RUNS },
    );
  });

  it('a CA that answers "renew now" for every certificate gets one order per certificate, at most one per hold', () => {
    fc.assert(
      fc.property(scenarioArb, fc.integer({ min: 0, max: 7200 }), (s, agoSec) => {
        const always = { ...s, answers: [{ kind: 'past' as const, agoMs: agoSec * S }] };
        const horizon = 4 * s.lifetimeMs;
        const { ariOrders, violations } = simulate(always, horizon);
        assert.deepEqual(violations, []);
        assert.ok(ariOrders.length <= Math.floor(horizon / s.minHoldMs) + 1, `${ariOrders.length} ARI orders in ${horizon} ms, hold ${s.minHoldMs} ms`);
      }),
      { numRuns: RUNS },
    );
  });

  it("the previous certificate's open window, after a backdated notBefore, never orders for the new one (cert-manager #8993)", () => {
    // The first certificate's window opened half an hour ago (after the next certificate's notBefore,
    // backdated by an hour); every later certificate gets pebble's window, days ahead: an order for one
    // of them before its own window is the chain of #8993.
    const week = scenarioArb.filter((s) => s.lifetimeMs >= 7 * 86_400 * S && s.minHoldMs < DAY);
    fc.assert(
      fc.property(week, (s) => {
        const answers: CaAnswer[] = [{ kind: 'open', agoMs: 30 * 60 * S }, { kind: 'pebble' }];
        const { ariOrders, violations } = simulate({ ...s, backdateMs: H, answers }, 4 * s.lifetimeMs);
        assert.deepEqual(violations, []);
        for (const o of ariOrders.filter((o) => o.certId !== 'aki.1')) {
          const life = o.cert.notAfter - o.cert.notBefore;
          // The window's timestamps are the CA's, and the writer reads them as they are.
          const ownWindowStart = o.cert.notBefore + (2 * life) / 3 - DAY;
          assert.ok(o.at >= ownWindowStart, `${o.certId} ordered ${ownWindowStart - o.at} ms before its own window`);
        }
      }),
      { numRuns: RUNS },
    );
  });

  /** A 90-day certificate, Let's Encrypt's hour of backdating, a one-minute hold, a look every 10 s. */
  const REVOKED: Scenario = {
    lifetimeMs: 90 * DAY,
    backdateMs: H,
    skewMs: 0,
    minHoldMs: 60 * S,
    ariIntervalMs: 6 * H,
    latencyMs: S,
    answers: [{ kind: 'past', agoMs: H }],
    sameCertificate: [false],
    callFails: [false],
    stepsMs: [10 * S],
    seed: 1,
  };

  it('a revoked certificate is replaced once the hold has passed; a CA that keeps saying "now" gets one renewal per certificate per hold', () => {
    const s = REVOKED;
    const { ariOrders, violations } = simulate(s, 5 * 60 * S);
    assert.deepEqual(violations, []);
    assert.deepEqual(
      ariOrders.map((o) => [o.certId, o.at - T0]),
      [
        ['aki.1', 60 * S],
        ['aki.2', 120 * S],
        ['aki.3', 180 * S],
        ['aki.4', 240 * S],
        ['aki.5', 300 * S],
      ],
    );
  });

  it('a failed ARI-driven call is retried on the next look, not forgotten (a revoked certificate stays due)', () => {
    const s: Scenario = { ...REVOKED, answers: [{ kind: 'past', agoMs: H }, { kind: 'pebble' }], callFails: [true, true, false] };
    const { ariOrders, failedCalls, violations } = simulate(s, 10 * 60 * S);
    assert.deepEqual(violations, []);
    assert.equal(failedCalls, 2);
    assert.deepEqual(
      ariOrders.map((o) => [o.certId, o.at - T0]),
      [['aki.1', 80 * S]],
    );
  });
});
