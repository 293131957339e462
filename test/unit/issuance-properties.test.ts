// Property-based tests of the renewal rule and the issuance loop against issuers that backdate, hand out
// shorter certificates than asked for, and run on a skewed clock. tailscaled is modelled by its cache
// policy (REFERENCE §1): a CertPair call returns the cached pair unless it is not valid now, has less
// than min_validity left, or (min_validity 0) is past 2/3 of its life, in which case it orders anew
// (in the background for min_validity 0).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { CertLoop } from '../../src/core/loop/cert-loop.ts';
import type { CertPair } from '../../src/core/ports/localapi.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import { fanOut } from '../../src/core/ports/observer.ts';
import { isRenewalDue, minValidityFor, renewalTime, rotationExitTime } from '../../src/core/renewal/renewal.ts';
import { staticRole } from '../../src/core/ports/store.ts';
import { DAY, makePair } from '../support/certs.ts';
import { FakeClock } from '../support/fake-clock.ts';
import { MemoryStore } from '../support/memory-store.ts';

const domain = 'storm.tailnet-7.ts.net';
const S = 1000;
const SHORT_LIFETIME_MS = 10 * DAY;

/**
 * The share of the validity that remains at the renewal point (REFERENCE §5: half for certificates that
 * live under 10 days), stated independently of renewal.ts.
 */
const remainingShare = (lifetime: number, fraction: number): number => (lifetime < SHORT_LIFETIME_MS ? Math.max(fraction, 0.5) : fraction);

interface Issuer {
  /** Fresh validity (notAfter - issuer's now) of the k-th certificate: the last one repeats. Shorter ones model "less than asked". */
  validitiesMs: number[];
  backdateMs: number;
  /** Issuer clock minus daemon clock. */
  skewMs: number;
  /** With min_validity set, the certificate is valid this much less than asked (a CA that gives less than asked). */
  shortByMs?: number;
}

interface Cached {
  pair: CertPair;
  notBefore: number;
  notAfter: number;
}

interface Issuance extends Cached {
  /** Daemon time of the issuance. */
  at: number;
  trigger: 'request' | 'background';
}

/** tailscaled's cert cache in front of a CA, on the daemon's clock. */
class TailscaledModel {
  cache: Cached | undefined;
  #asked = 0;
  readonly issuances: Issuance[] = [];
  readonly calls: number[] = [];
  readonly clock: FakeClock;
  readonly issuer: Issuer;
  readonly maxIssuances: number;
  constructor(clock: FakeClock, issuer: Issuer, maxIssuances: number) {
    this.clock = clock;
    this.issuer = issuer;
    this.maxIssuances = maxIssuances;
  }

  async certPair(minValidityMs: number): Promise<CertPair> {
    this.#asked = minValidityMs;
    const now = this.clock.now();
    this.calls.push(minValidityMs);
    const cached = this.cache;
    if (cached && now >= cached.notBefore && now < cached.notAfter) {
      if (minValidityMs > 0) {
        if (cached.notAfter - now >= minValidityMs) return cached.pair;
      } else {
        if (now - cached.notBefore > ((cached.notAfter - cached.notBefore) * 2) / 3) await this.#issue('background');
        return cached.pair;
      }
    }
    return (await this.#issue('request')).pair;
  }

  async #issue(trigger: Issuance['trigger']): Promise<Cached> {
    if (this.issuances.length >= this.maxIssuances)
      throw new Error(`issuance storm: ${this.issuances.length} issuances by ${new Date(this.clock.now()).toISOString()}`);
    const { validitiesMs, backdateMs, skewMs, shortByMs } = this.issuer;
    let validity = validitiesMs[Math.min(this.issuances.length, validitiesMs.length - 1)]!;
    if (shortByMs !== undefined && this.#asked > 0) validity = Math.min(validity, Math.max(S, Math.floor((this.#asked - shortByMs) / S) * S));
    const issuerNow = Math.floor((this.clock.now() + skewMs) / S) * S;
    const pair = await makePair(domain, issuerNow - backdateMs, backdateMs + validity);
    const cert = { pair, notBefore: issuerNow - backdateMs, notAfter: issuerNow + validity };
    this.issuances.push({ ...cert, at: this.clock.now(), trigger });
    this.cache = cert;
    return cert;
  }
}

interface Scenario {
  issuer: Issuer;
  renewFraction: number;
  /** The loop's minimum interval between issuances (= backoff.firstRetryMs). */
  floorMs: number;
}

interface Run {
  model: TailscaledModel;
  /** Violations of "never an expired certificate while a valid one was on offer". */
  gaps: string[];
  /** Intervals (daemon time) during which the daemon held no valid certificate, after its first one. */
  uncovered: Array<[number, number]>;
}

const MAX_TURNS = 60;
const MAX_ISSUANCES = 12;

/** Drives one loop turn by turn on a virtual clock until it has made enough decisions. */
async function simulate(s: Scenario): Promise<Run> {
  const clock = new FakeClock();
  const model = new TailscaledModel(clock, s.issuer, MAX_ISSUANCES);
  const loop = new CertLoop(domain, {
    localApi: { certPair: (_d, options) => model.certPair(options.minValidityMs) },
    store: new MemoryStore(),
    role: staticRole('writer-0', true),
    availability: { waitFor: async () => {} },
    clock,
    renewal: { renewFraction: s.renewFraction, checkIntervalMs: 400 * DAY },
    backoff: { firstRetryMs: s.floorMs, retryCapMs: 64 * s.floorMs, rateLimitFirstRetryMs: 8 * s.floorMs },
    observer: fanOut([]),
    logger: silentLogger,
    intentTtlMs: 10 * 60 * S,
  });
  const signal = new AbortController().signal;
  const gaps: string[] = [];
  const uncovered: Array<[number, number]> = [];
  let zeroWaits = 0;
  for (let turn = 0; turn < MAX_TURNS && model.issuances.length < MAX_ISSUANCES; turn++) {
    let wait: number;
    try {
      wait = await loop.turn(signal);
    } catch (err) {
      if (err instanceof Error && err.message.startsWith('issuance storm')) break;
      throw err;
    }
    zeroWaits = wait <= 0 ? zeroWaits + 1 : 0;
    if (zeroWaits > 5) break; // a busy loop; the issuance count tells
    const from = clock.now();
    const to = from + Math.max(0, wait);
    // Between two turns what the daemon holds is fixed: is there an instant when it is not valid while
    // tailscaled's cached pair is?
    const held = loop.current?.info;
    const heldFrom = held ? held.notBefore : Infinity;
    const heldTo = held ? held.notAfter : -Infinity;
    const offer = model.cache;
    if (offer) {
      for (const t of [from, Math.max(from, offer.notBefore), Math.min(to - 1, offer.notAfter - 1), Math.min(to - 1, Math.max(from, heldTo))]) {
        if (t < from || t >= to) continue;
        const offered = t >= offer.notBefore && t < offer.notAfter;
        const holding = t >= heldFrom && t < heldTo;
        if (offered && !holding) {
          const holds = held ? `a pair valid ${iso(heldFrom)}..${iso(heldTo)}` : 'nothing';
          gaps.push(`at +${t - clock.now()} ms after turn ${turn}: daemon holds ${holds}, tailscaled offers ${iso(offer.notBefore)}..${iso(offer.notAfter)}`);
        }
      }
    }
    const firstAt = model.issuances[0]?.at;
    if (firstAt !== undefined && to > Math.max(from, firstAt)) {
      const a = Math.max(from, firstAt);
      if (heldFrom > a) uncovered.push([a, Math.min(to, heldFrom)]);
      if (heldTo < to) uncovered.push([Math.max(a, heldTo), to]);
    }
    await clock.advance(Math.max(0, wait));
  }
  return { model, gaps, uncovered };
}

const iso = (ms: number): string => (Number.isFinite(ms) ? new Date(ms).toISOString() : String(ms));

/**
 * At most one issuance per renewal window: after an issuance at t of a pair valid (on the daemon's
 * clock) from max(notBefore, t) for V, the next one comes no sooner than that pair's renewal point
 * measured over V, and never sooner than the minimum interval. min_validity travels in whole seconds
 * and carries a margin of up to 1 s, hence the tolerance.
 */
function windowViolations(run: Run, s: Scenario): string[] {
  const out: string[] = [];
  const list = run.model.issuances;
  for (let i = 0; i + 1 < list.length; i++) {
    const c = list[i]!;
    const start = Math.max(c.notBefore, c.at);
    const validity = c.notAfter - start;
    const window = validity > 0 ? start - c.at + (1 - remainingShare(c.notAfter - c.notBefore, s.renewFraction)) * validity : 0;
    const tolerance = Math.min(S, Math.max(0, validity) / 10) + S;
    const required = Math.max(window - tolerance, s.floorMs);
    const gap = list[i + 1]!.at - c.at;
    if (gap < required) {
      out.push(
        `issuance ${i + 1} (${list[i + 1]!.trigger}) ${gap} ms after issuance ${i} (valid ${iso(c.notBefore)}..${iso(c.notAfter)}, issued at ${iso(c.at)}): ` +
          `its renewal window is ${Math.round(window)} ms, the floor ${s.floorMs} ms`,
      );
    }
  }
  return out;
}

const seconds = (min: number, max: number): fc.Arbitrary<number> => fc.integer({ min, max }).map((n) => n * S);

/** Validity from 2 s to 90 days, weighted towards the short end where storms happen. */
const validityArb = fc.oneof(seconds(2, 300), seconds(300, 86_400), seconds(86_400, 90 * 86_400));

const scenarioArb: fc.Arbitrary<Scenario> = fc
  .record({
    validity: validityArb,
    /** Later certificates as a share of the first: an issuer handing out shorter ones than asked. */
    shrink: fc.array(fc.double({ min: 0.05, max: 1, noNaN: true }), { maxLength: 3 }),
    backdateShare: fc.oneof(fc.constant(0), fc.double({ min: 0, max: 2.5, noNaN: true })),
    skewShare: fc.oneof(fc.constant(0), fc.double({ min: -1.2, max: 1.2, noNaN: true })),
    shortByShare: fc.option(fc.double({ min: 0, max: 0.5, noNaN: true }), { freq: 3 }),
    renewFraction: fc.double({ min: 0.01, max: 0.99, noNaN: true }),
    floorMs: fc.constantFrom(S, 10 * S, 60 * S),
  })
  .map(({ validity, shrink, backdateShare, skewShare, shortByShare, renewFraction, floorMs }) => ({
    issuer: {
      validitiesMs: [validity, ...shrink.map((f) => Math.max(S, Math.round((validity * f) / S) * S))],
      backdateMs: Math.round((validity * backdateShare) / S) * S,
      skewMs: Math.round((validity * skewShare) / S) * S,
      ...(shortByShare === null ? {} : { shortByMs: Math.round((validity * shortByShare) / S) * S }),
    },
    renewFraction,
    floorMs,
  }));

/** The storm of issue 10: 45 s certificates with notBefore 60 s back. */
const STORM: Scenario = { issuer: { validitiesMs: [45 * S], backdateMs: 60 * S, skewMs: 0 }, renewFraction: 1 / 3, floorMs: S };

// 150 under `npm test`; `npm run test:fast` sets fewer (scripts/test-fast.ts) for the edit-test loop.
const RUNS = Number(process.env.CERTSHARE_PROPERTY_RUNS ?? 150);

describe('renewal rule (properties)', () => {
  it('a certificate just obtained is never due, and min_validity never exceeds what a fresh one has', () => {
    fc.assert(
      fc.property(scenarioArb, fc.integer({ min: 0, max: 10 * 86_400 }), ({ issuer, renewFraction }, offsetSec) => {
        const now = Date.UTC(2026, 0, 1) + offsetSec * S;
        const validity = issuer.validitiesMs[0]!;
        const issuerNow = now + issuer.skewMs;
        const notBefore = issuerNow - issuer.backdateMs;
        const notAfter = issuerNow + validity;
        if (!(now >= notBefore && now < notAfter)) return; // not valid on the daemon's clock: handled by the loop
        const held = { notBefore, notAfter, obtainedAt: now };
        const policy = { renewFraction };
        assert.equal(isRenewalDue(held, now, policy), false, 'due the moment it was obtained');
        // At its renewal point, the min_validity asked for replaces it, and a fresh twin satisfies it.
        const at = renewalTime(held, policy);
        const asked = minValidityFor(held, at, policy);
        const fresh = notAfter - now;
        assert.ok(asked <= Math.max(S, fresh), `asked ${asked} ms, a fresh one has ${fresh} ms`);
        assert.ok(
          asked <= fresh * remainingShare(notAfter - notBefore, renewFraction) + 2 * S,
          `asked ${asked} ms, more than the renewal share of a fresh one (${fresh} ms)`,
        );
        assert.ok(at >= renewalTime({ notBefore, notAfter }, policy), 'never renewed earlier than measured from notBefore');
        if (fresh >= 2 * S) assert.ok(asked > notAfter - at, `asked ${asked} ms, the held one still has ${notAfter - at} ms`);
      }),
      { numRuns: 2000 },
    );
  });

  it('leaves rotation ahead of expiry, by at most the lead asked, and never before halfway from the renewal point', () => {
    fc.assert(
      fc.property(
        scenarioArb,
        fc.option(fc.integer({ min: -86_400, max: 86_400 }), { nil: undefined }),
        fc.oneof(fc.constant(0), seconds(1, 3600)),
        ({ issuer, renewFraction }, obtainedOffsetSec, maxLeadMs) => {
          const notBefore = Date.UTC(2026, 0, 1) - issuer.backdateMs;
          const notAfter = notBefore + issuer.backdateMs + issuer.validitiesMs[0]!;
          const held = { notBefore, notAfter, obtainedAt: obtainedOffsetSec === undefined ? undefined : notBefore + obtainedOffsetSec * S };
          const exit = rotationExitTime(held, { renewFraction }, maxLeadMs);
          const renewAt = renewalTime(held, { renewFraction });
          assert.ok(exit <= notAfter, 'out of rotation by expiry');
          assert.ok(notAfter - exit <= maxLeadMs, `lead ${notAfter - exit} ms, more than the ${maxLeadMs} ms asked`);
          assert.ok(notAfter - exit <= (notAfter - notBefore) / 20, 'lead over 5% of the lifetime');
          assert.ok(exit >= renewAt + (notAfter - renewAt) / 2 - 1, 'a working renewal would take the Pod out of rotation');
        },
      ),
      { numRuns: 2000 },
    );
  });

  it('leaves rotation a minute ahead for a 90-day certificate, a second for a 20-second one', () => {
    const t0 = Date.UTC(2026, 0, 1);
    const policy = { renewFraction: 1 / 3 };
    assert.equal(t0 + 90 * DAY - rotationExitTime({ notBefore: t0, notAfter: t0 + 90 * DAY }, policy, 60 * S), 60 * S);
    assert.equal(t0 + 20 * S - rotationExitTime({ notBefore: t0, notAfter: t0 + 20 * S, obtainedAt: t0 }, policy, 60 * S), S);
    assert.equal(rotationExitTime({ notBefore: t0, notAfter: t0 + 20 * S }, policy, 0), t0 + 20 * S, 'no lead asked');
  });
});

describe('issuance loop against backdating, short and skewed issuers (properties)', () => {
  it('the storm case of issue 10 issues once per window, not in a loop', async () => {
    const run = await simulate(STORM);
    assert.deepEqual(windowViolations(run, STORM), []);
    assert.ok(run.model.issuances.length >= 3, 'and it keeps renewing');
  });

  it('at most one issuance per renewal window, and never an expired certificate while a valid one is on offer', { timeout: 300_000 }, async () => {
    await fc.assert(
      fc.asyncProperty(scenarioArb, async (s) => {
        const run = await simulate(s);
        assert.deepEqual(windowViolations(run, s), [], 'one issuance per window');
        assert.deepEqual(run.gaps, [], 'no expired certificate while a valid one is on offer');
      }),
      {
        numRuns: RUNS,
        examples: [
          [STORM],
          // Found by this property: a shorter pair not valid yet on arrival (issuer clock ahead) and refused
          // as older than the held one is still tailscaled's cache; calling before its notBefore reorders.
          [{ issuer: { validitiesMs: [1_393_000, 70_000], backdateMs: 0, skewMs: 2000 }, renewFraction: 0.01, floorMs: 1000 }],
        ],
      },
    );
  });

  it('a sane issuer (certificates valid on arrival, windows longer than the floor) is renewed without a gap', { timeout: 300_000 }, async () => {
    const sane = scenarioArb
      .map((s) => ({
        ...s,
        issuer: { validitiesMs: [s.issuer.validitiesMs[0]!], backdateMs: s.issuer.backdateMs, skewMs: Math.min(s.issuer.skewMs, s.issuer.backdateMs) },
      }))
      .filter((s) => {
        const validity = s.issuer.validitiesMs[0]! + Math.min(0, s.issuer.skewMs);
        const lifetime = s.issuer.validitiesMs[0]! + s.issuer.backdateMs;
        return (1 - remainingShare(lifetime, s.renewFraction)) * validity >= 2 * s.floorMs + 2 * S;
      });
    await fc.assert(
      fc.asyncProperty(sane, async (s) => {
        const run = await simulate(s);
        assert.deepEqual(run.uncovered, [], 'held a valid certificate from the first issuance on');
        assert.ok(run.model.issuances.length >= 2, 'renewed');
      }),
      { numRuns: Math.ceil(RUNS / 2) },
    );
  });
});
