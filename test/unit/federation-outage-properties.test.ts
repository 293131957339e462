// The federation's outage rules (docs/federation.md, "The home unreachable", "The home back") over any order of cuts
// and heals: a home and 2 or 3 members, each member cut off from the home (a partition) or every member at once (an
// outage), any lifetime from a minute to 90 days, each member's CA clock behind by up to 2 minutes (never more than
// 5% of the lifetime), whole-second validity stamps (so certificates of one second tie). The world is modelled here
// (a CA that answers at once, the Secrets, the claims' Leases); the decisions are the core's: homeOutageVerdict,
// breakGlassPoint, windowClaimable, reconcile, and what each member's replicas serve (HeldCertificate, fed what the
// member's Secret holds as the loop does).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import type { CertInfo } from '../../src/core/certificates/certificate.ts';
import { breakGlassPoint, homeOutageVerdict, reconcile, windowClaimable, type ClaimRead } from '../../src/core/federation/home-verdicts.ts';
import { HeldCertificate } from '../../src/core/loop/held-certificate.ts';
import type { Clock } from '../../src/core/ports/clock.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import type { StoredCert } from '../../src/core/ports/store.ts';
import { renewalTime } from '../../src/core/renewal/renewal.ts';

const RUNS = Number(process.env.CERTSHARE_PROPERTY_RUNS ?? 300);
const SECOND = 1000;
const MIN = 60 * SECOND;
const DAY = 86_400_000;
const T0 = Date.UTC(2026, 10, 1);
const policy = { renewFraction: 1 / 3 };
const domain = 'shared.tailnet-0000.ts.net';

interface Segment {
  /** Its length, as a share of the lifetime. */
  share: number;
  /** The home's apiserver down: every member cut off. */
  outage: boolean;
  /** Per member: cut off from the home (a partition). */
  cut: boolean[];
}

interface Scenario {
  lifetimeMs: number;
  readinessLeadMs: number;
  /** Per member: how far its CA's clock is behind the members', as a share of the bound (2 minutes, 5% of the lifetime). */
  skewShares: number[];
  segments: Segment[];
}

interface Member {
  /** The member's Secret. */
  local: StoredCert | undefined;
  /** The break-glass record in it. */
  record: { serial: string; window: string | null } | undefined;
  /** What its replicas serve. */
  held: HeldCertificate;
}

interface Issuance {
  by: number;
  at: number;
  breakGlass: boolean;
  /** The copy it replaced (a break-glass issuance's window; the home's copy for a renewal). */
  window: string | null;
  cert: StoredCert;
}

const scenario: fc.Arbitrary<Scenario> = fc.integer({ min: 2, max: 3 }).chain((members) =>
  fc.record({
    lifetimeMs: fc.oneof(fc.constantFrom(20 * SECOND, 6 * DAY, 45 * DAY, 90 * DAY), fc.integer({ min: MIN, max: 90 * DAY })),
    readinessLeadMs: fc.constantFrom(0, 10 * SECOND, MIN, 5 * MIN),
    skewShares: fc.array(fc.double({ min: 0, max: 1, noNaN: true }), { minLength: members, maxLength: members }),
    segments: fc.array(
      fc.record({
        share: fc.double({ min: 0.005, max: 1.3, noNaN: true }),
        outage: fc.integer({ min: 0, max: 3 }).map((x) => x === 0),
        cut: fc.array(fc.boolean(), { minLength: members, maxLength: members }),
      }),
      { minLength: 1, maxLength: 14 },
    ),
  }),
);

/** Runs `s`, then two lifetimes with every member reaching the home; checks every rule as it goes. */
function simulate(s: Scenario): { issuances: Issuance[]; members: Member[]; home: StoredCert; apart: string[] } {
  const n = s.skewShares.length;
  let t = T0;
  let serials = 0;
  const clock = { now: () => t, sleep: () => Promise.resolve() } as unknown as Clock;
  const skew = s.skewShares.map((x) => -Math.round(x * Math.min(2 * MIN, s.lifetimeMs / 20)));
  const issue = (m: number): StoredCert => {
    const at = Math.floor((t + skew[m]!) / SECOND) * SECOND;
    const info: CertInfo = { domain, notBefore: at, notAfter: at + s.lifetimeMs, serial: `${++serials}`.padStart(4, '0'), fingerprint256: `FP${serials}` };
    return { pair: { certPem: '', keyPem: '' }, info };
  };
  const valid = (c: StoredCert | undefined): c is StoredCert => c !== undefined && c.info.notBefore <= t && t < c.info.notAfter;
  const view = (c: StoredCert | undefined) => c && { serial: c.info.serial, notBefore: c.info.notBefore, notAfter: c.info.notAfter };
  const issuances: Issuance[] = [];
  /** Instants a member reaching the home held or served another certificate than the home's. */
  const apart: string[] = [];
  let home = issue(0);
  issuances.push({ by: 0, at: t, breakGlass: false, window: null, cert: home });
  const members: Member[] = s.skewShares.map(() => {
    const held = new HeldCertificate({ domain, clock, observer: { certificate: () => {} }, log: silentLogger, minIssueIntervalMs: 0 });
    held.considerStored(home, true);
    return { local: home, record: undefined, held };
  });
  /** The claims' Leases in each member's namespace: windows taken, and what each recorded. */
  const claimed = members.map(() => new Set<string | null>());
  const claims: ClaimRead[][] = members.map(() => []);

  const segments = [...s.segments, { share: 2, outage: false, cut: members.map(() => false) }];
  let segEnd = T0;
  for (const [i, seg] of segments.entries()) {
    segEnd += Math.max(SECOND, Math.round(seg.share * s.lifetimeMs));
    const connected = (m: number): boolean => !seg.outage && !seg.cut[m];
    for (let steps = 0; t < segEnd; steps++) {
      assert.ok(steps < 10_000, 'the simulation advances');
      // What each member's replicas serve is valid until the instant anything may change it (never an expired copy).
      for (const [m, member] of members.entries()) {
        member.held.dropIfExpired();
        const best = member.held.best;
        assert.ok(
          best && valid(best),
          `member ${m} serves ${best ? `${best.info.serial}, expired at ${best.info.notAfter - T0}` : 'nothing'} at ${t - T0} (segment ${i})`,
        );
      }
      // Writes reach the others within the instant: a member's push is mirrored by the next.
      for (let pass = 0; pass < n + 1; pass++) {
        const writer = members.findIndex((_, m) => connected(m));
        for (const [m, member] of members.entries()) {
          if (connected(m)) {
            const plan = reconcile(view(home), view(member.local), t);
            if (plan.kind === 'mirror_to_local') member.local = home;
            else if (plan.kind === 'push_to_home') home = member.local!;
            if (member.local?.info.serial === home.info.serial) member.record = undefined;
            if (m === writer && (!valid(home) || t >= renewalTime(home.info, policy))) {
              const cert = issue(m);
              issuances.push({ by: m, at: t, breakGlass: false, window: home.info.serial, cert });
              [home, member.local] = [cert, cert];
            }
          } else breakGlass(m, member);
          if (member.local) member.held.considerStored(member.local, true);
        }
      }
      for (const [m, member] of members.entries()) {
        const [local, served] = [member.local?.info.serial, member.held.best?.info.serial];
        if (connected(m) && (local !== home.info.serial || served !== home.info.serial))
          apart.push(`member ${m} at ${t - T0} (segment ${i}): the home holds ${home.info.serial}, its Secret ${local}, its replicas ${served}`);
      }
      const wakes = [segEnd];
      for (const [m, member] of members.entries()) {
        wakes.push(member.held.best!.info.notAfter);
        if (connected(m)) wakes.push(renewalTime(home.info, policy));
        const copy = member.local;
        if (!connected(m) && valid(copy)) wakes.push(breakGlassPoint(copy.info, policy, s.readinessLeadMs));
      }
      t = Math.max(t + 1, Math.min(...wakes.filter((w) => w > t)));
    }
    t = Math.min(t, segEnd);
  }
  return { issuances, members, home, apart };

  /** Member `m`, cut off: its verdict, then its window's claim, then the call (which the CA answers at once). */
  function breakGlass(m: number, member: Member): void {
    const copy = member.local;
    const verdict = homeOutageVerdict({ held: copy && { ...copy.info }, now: t, policy, readinessLeadMs: s.readinessLeadMs, breakGlass: member.record });
    if (verdict.kind !== 'break_glass') return;
    const window = copy?.info.serial ?? null;
    if (!windowClaimable(copy?.info, claims[m]!, t) || claimed[m]!.has(window)) return;
    claimed[m]!.add(window);
    claims[m]!.push({ recorded: copy?.info.notAfter, created: t });
    if (valid(copy)) assert.ok(t >= breakGlassPoint(copy.info, policy, s.readinessLeadMs), 'no break-glass before the safety point');
    const cert = issue(m);
    issuances.push({ by: m, at: t, breakGlass: true, window, cert });
    claims[m]!.push({ recorded: cert.info.notAfter, created: t });
    member.local = cert;
    member.record = { serial: cert.info.serial, window };
  }
}

describe("a member's outage rules over any order of cuts and heals (properties)", () => {
  it('never an expired certificate served, one break-glass issuance per member and window, one renewal per window of the home', () => {
    fc.assert(
      fc.property(scenario, (s) => {
        const { issuances } = simulate(s);
        const glass = new Map<string, number>();
        for (const i of issuances.filter((x) => x.breakGlass)) {
          const key = `${i.by}/${i.window}`;
          glass.set(key, (glass.get(key) ?? 0) + 1);
          assert.equal(glass.get(key), 1, `member ${i.by} broke glass twice in the window of ${i.window}`);
        }
        const renewals = new Map<string | null, number>();
        for (const i of issuances.filter((x) => !x.breakGlass)) renewals.set(i.window, (renewals.get(i.window) ?? 0) + 1);
        for (const [window, count] of renewals) assert.equal(count, 1, `the home renewed the copy ${window} ${count} times`);
      }),
      { numRuns: RUNS },
    );
  });

  it("a member reaching the home holds and serves the home's copy at once (a tie by notAfter included), its record gone", () => {
    fc.assert(
      fc.property(scenario, (s) => {
        const { members, home, apart } = simulate(s);
        assert.deepEqual(apart, []);
        for (const [m, member] of members.entries()) {
          assert.equal(member.local?.info.serial, home.info.serial, `member ${m}'s Secret`);
          assert.equal(member.held.best?.info.serial, home.info.serial, `member ${m}'s replicas`);
          assert.equal(member.record, undefined, `member ${m}'s record superseded`);
        }
      }),
      { numRuns: RUNS },
    );
  });
});
