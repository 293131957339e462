// The federation's outage rules (docs/federation.md, "The home unreachable", "The home back") over any order of cuts
// and heals: a home and 2 or 3 members, each member cut off from the home (a partition) or every member at once (an
// outage), any lifetime from a minute to 90 days, each member's CA clock behind by up to 2 minutes (never more than
// 5% of the lifetime; ahead too, with writers killed, in the last property), whole-second validity stamps (so
// certificates of one second tie). The world is modelled here (a CA that answers at once, the Secrets, the claims'
// Leases, the home Lease kept by its holder while it reaches the home and taken at once otherwise: a cut stands for
// one longer than the Lease); the decisions are the core's: homeOutageVerdict, breakGlassPoint, windowClaimable,
// reconcile, and what each member's replicas serve (HeldCertificate, fed what the member's Secret holds as the loop
// does).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import type { CertInfo } from '../../src/core/certificates/certificate.ts';
import { breakGlassPoint, homeOutageVerdict, reconcile, windowClaimable, type ClaimRead } from '../../src/core/federation/home-verdicts.ts';
import { HeldCertificate } from '../../src/core/loop/held-certificate.ts';
import { latestPendingStart } from '../../src/core/loop/pending-pair.ts';
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
  /** Per member: its writer killed as the segment begins (what it held only in memory is lost). */
  killed: boolean[];
}

interface Scenario {
  lifetimeMs: number;
  readinessLeadMs: number;
  /**
   * Per member: how far its CA's clock is off the members', as a share of the bound (2 minutes, 5% of the lifetime):
   * negative behind, positive ahead (its certificates valid only from a moment later).
   */
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
  /**
   * A renewal its writer obtained valid only from a moment later (its CA's clock ahead): held in the writer's memory
   * (HeldCertificate.keepPending), lost if the writer dies; stored at once too (`localPending`, and the home's).
   */
  pending: StoredCert | undefined;
  /** The pair valid only later in its Secret (pending.crt, pending.key): the member's replicas hold it. */
  localPending: StoredCert | undefined;
}

interface Issuance {
  by: number;
  at: number;
  breakGlass: boolean;
  /** The copy it replaced (a break-glass issuance's window; the home's copy for a renewal). */
  window: string | null;
  cert: StoredCert;
}

/** `ahead`: a CA's clock may also be ahead of the members' (else only behind). */
const scenarios = (ahead: boolean): fc.Arbitrary<Scenario> =>
  fc.integer({ min: 2, max: 3 }).chain((members) =>
    fc.record({
      lifetimeMs: fc.oneof(fc.constantFrom(20 * SECOND, 6 * DAY, 45 * DAY, 90 * DAY), fc.integer({ min: MIN, max: 90 * DAY })),
      readinessLeadMs: fc.constantFrom(0, 10 * SECOND, MIN, 5 * MIN),
      skewShares: fc.array(fc.double({ min: -1, max: ahead ? 1 : 0, noNaN: true }), { minLength: members, maxLength: members }),
      segments: fc.array(
        fc.record({
          share: fc.double({ min: 0.005, max: 1.3, noNaN: true }),
          outage: fc.integer({ min: 0, max: 3 }).map((x) => x === 0),
          cut: fc.array(fc.boolean(), { minLength: members, maxLength: members }),
          killed: fc.array(
            fc.integer({ min: 0, max: 3 }).map((x) => x === 0),
            { minLength: members, maxLength: members },
          ),
        }),
        { minLength: 1, maxLength: 14 },
      ),
    }),
  );

/** A share of the lifetime: at one of the copy's points (R, S, E, notAfter and around them), or anywhere. */
const shareAt = fc.oneof(fc.constantFrom(0.5, 0.6, 2 / 3, 0.75, 0.8, 5 / 6, 0.9, 0.95, 0.99, 1, 1.01), fc.double({ min: 0.005, max: 1.2, noNaN: true }));

/**
 * One member cut off from the home two or three times (another with it, or every member: the home down), each cut
 * starting a share of the lifetime after the last heal (before R, between R and S, across S, E and notAfter) and
 * lasting from a moment to more than a lifetime: the home's writer's member (0 at first) cut off makes another
 * member's writer the home's. Each gap and cut is split in two at any point, and any member's writer may be killed
 * at the start of each part (a kill between any two steps); CA clocks ahead and behind.
 */
const cutPatterns: fc.Arbitrary<Scenario> = fc.integer({ min: 2, max: 3 }).chain((members) => {
  const kills = fc.array(
    fc.integer({ min: 0, max: 3 }).map((x) => x === 0),
    { minLength: members, maxLength: members },
  );
  const part = fc.record({ share: shareAt, split: fc.double({ min: 0, max: 1, noNaN: true }), kills: fc.tuple(kills, kills) });
  const length = fc.oneof(
    fc.double({ min: 0.005, max: 0.05, noNaN: true }),
    fc.double({ min: 0.05, max: 0.5, noNaN: true }),
    fc.double({ min: 0.5, max: 1.3, noNaN: true }),
  );
  const cut = fc.record({ gap: part, cut: part.chain((p) => length.map((share) => ({ ...p, share }))), with: fc.integer({ min: -1, max: members }) });
  return fc
    .record({
      lifetimeMs: fc.oneof(fc.constantFrom(20 * SECOND, 6 * DAY, 45 * DAY, 90 * DAY), fc.integer({ min: MIN, max: 90 * DAY })),
      readinessLeadMs: fc.constantFrom(0, 10 * SECOND, MIN, 5 * MIN),
      skewShares: fc.array(fc.oneof(fc.constantFrom(-1, 1), fc.double({ min: -1, max: 1, noNaN: true })), { minLength: members, maxLength: members }),
      victim: fc.integer({ min: 0, max: members - 1 }),
      cuts: fc.array(cut, { minLength: 2, maxLength: 3 }),
    })
    .map(({ lifetimeMs, readinessLeadMs, skewShares, victim, cuts }) => {
      const segments: Segment[] = [];
      const halves = (p: { share: number; split: number; kills: [boolean[], boolean[]] }, cutOff: boolean[], outage: boolean): void => {
        const first = Math.max(0.005, p.share * p.split);
        for (const [i, share] of [first, Math.max(0.005, p.share - first)].entries()) segments.push({ share, outage, cut: cutOff, killed: p.kills[i]! });
      };
      for (const c of cuts) {
        halves(
          c.gap,
          skewShares.map(() => false),
          false,
        );
        // `with`: -1 the victim alone, `members` every member (the home down), else that member too.
        halves(
          c.cut,
          skewShares.map((_, m) => m === victim || m === c.with),
          c.with === members,
        );
      }
      return { lifetimeMs, readinessLeadMs, skewShares, segments };
    });
});

/**
 * Runs `s`, then two lifetimes with every member reaching the home; checks every rule as it goes. `kills`: the
 * segments' writer kills happen (else they are ignored).
 */
function simulate(s: Scenario, kills = false): { issuances: Issuance[]; members: Member[]; home: StoredCert; apart: string[] } {
  const n = s.skewShares.length;
  let t = T0;
  let serials = 0;
  const clock = { now: () => t, sleep: () => Promise.resolve() } as unknown as Clock;
  const skew = s.skewShares.map((x) => Math.round(x * Math.min(2 * MIN, s.lifetimeMs / 20)));
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
  // The first certificate, issued a skew bound before the start: valid then whatever its CA's clock.
  t = T0 - Math.min(2 * MIN, s.lifetimeMs / 20);
  let home = issue(0);
  /** The pair valid only later in the home's Secret. */
  let homePending: StoredCert | undefined;
  issuances.push({ by: 0, at: t, breakGlass: false, window: null, cert: home });
  t = T0;
  /** What a member's writer holds once started, from its Secret: a successor knows only what was stored. */
  const started = (local: StoredCert | undefined): HeldCertificate => {
    const held = new HeldCertificate({ domain, clock, observer: { certificate: () => {} }, log: silentLogger, minIssueIntervalMs: 0 });
    if (valid(local)) held.considerStored(local, true);
    return held;
  };
  const members: Member[] = s.skewShares.map(() => ({ local: home, record: undefined, held: started(home), pending: undefined, localPending: undefined }));
  /** The claims' Leases in each member's namespace: windows taken, and what each recorded. */
  const claimed = members.map(() => new Set<string | null>());
  const claims: ClaimRead[][] = members.map(() => []);

  /** The member whose writer holds the home Lease (-1: none yet). */
  let writer = -1;
  const segments = [...s.segments, { share: 2, outage: false, cut: members.map(() => false), killed: members.map(() => false) }];
  let segEnd = T0;
  for (const [i, seg] of segments.entries()) {
    segEnd += Math.max(SECOND, Math.round(seg.share * s.lifetimeMs));
    const connected = (m: number): boolean => !seg.outage && !seg.cut[m];
    // A writer killed: what it held in memory only is lost (its pair valid only later, renewal or break-glass, is
    // in its Secret, recorded: federation-home.ts savePending), and its Lease taken by whoever campaigns first.
    const killed = (m: number): boolean => kills && seg.killed[m] === true;
    for (const [m, member] of members.entries()) if (killed(m)) [member.pending, member.held] = [undefined, started(member.local)];
    if (writer >= 0 && killed(writer)) writer = -1;
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
        // The home Lease stays with its holder while it reaches the home; once not, a member that does takes it.
        if (writer < 0 || !connected(writer)) writer = members.findIndex((_, m) => connected(m));
        for (const [m, member] of members.entries()) {
          adoptPending(member, connected(m));
          if (connected(m)) {
            const plan = reconcile(view(home), view(member.local), t);
            if (plan.kind === 'mirror_to_local') member.local = home;
            else if (plan.kind === 'push_to_home') home = member.local!;
            if (member.local?.info.serial === home.info.serial) member.record = undefined;
            if (m === writer && !member.pending && !member.held.pending && (!valid(home) || t >= renewalTime(home.info, policy))) {
              const cert = issue(m);
              issuances.push({ by: m, at: t, breakGlass: false, window: home.info.serial, cert });
              if (valid(cert)) [home, member.local] = [cert, cert];
              else [member.pending, homePending, member.localPending] = [cert, cert, cert];
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
        if (member.pending) wakes.push(member.pending.info.notBefore);
        if (member.held.pending) wakes.push(member.held.pending.info.notBefore);
      }
      t = Math.max(t + 1, Math.min(...wakes.filter((w) => w > t)));
    }
    t = Math.min(t, segEnd);
  }
  return { issuances, members, home, apart };

  /**
   * The pairs valid only later that the member's replicas read (its Secret's, the home's while it reaches it; a
   * member's own goes to a home that ends earlier: the federation's reconcile), held as the loop does; one valid now:
   * its writer puts it in its store (the home's, or its own cut off) unless the store holds one that ends as late
   * (the restore rule).
   */
  function adoptPending(member: Member, reaches: boolean): void {
    const ends = (c: StoredCert | undefined) => (c ? c.info.notAfter : 0);
    if (reaches && member.localPending && ends(homePending) < member.localPending.info.notAfter && ends(home) < member.localPending.info.notAfter)
      homePending = member.localPending;
    // As the loop reads its store: a pair stored for later counts only up to latestPendingStart (the safety point of
    // the copy held, a pair valid now always), its writer's own in memory always.
    const believed = (c: StoredCert): boolean => {
      const read = { ...(valid(member.local) ? { state: 'valid' as const, cert: member.local } : { state: 'absent' as const }), pending: c };
      const latest = latestPendingStart(read, { best: member.held.best, pending: member.pending }, t, {
        renewal: policy,
        readinessLeadMs: s.readinessLeadMs,
        retryCapMs: DAY,
      });
      return latest === undefined || c.info.notBefore <= latest;
    };
    if (member.pending) member.held.considerPending(member.pending);
    if (member.localPending && believed(member.localPending)) member.held.considerPending(member.localPending);
    if (reaches && homePending && believed(homePending)) member.held.considerPending(homePending);
    const cert = member.pending ?? member.held.pending;
    if (!cert || t < cert.info.notBefore) return;
    member.held.adoptPending();
    member.pending = undefined;
    if (member.localPending?.info.serial === cert.info.serial) member.localPending = undefined;
    if (reaches && homePending?.info.serial === cert.info.serial) homePending = undefined;
    if (reaches && (!valid(home) || home.info.notAfter < cert.info.notAfter)) home = cert;
    if (!valid(member.local) || member.local.info.notAfter < cert.info.notAfter) member.local = cert;
  }

  /** Member `m`, cut off: its verdict, then its window's claim, then the call (which the CA answers at once). */
  function breakGlass(m: number, member: Member): void {
    const copy = member.local;
    if (member.pending || member.held.pending) return;
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
    // Served at once, or stored at once beside the copy (valid only later): recorded either way, so a successor that
    // moves a pair for later into tls.crt knows the window spent (federation-home.ts savePending).
    if (valid(cert)) member.local = cert;
    else [member.pending, member.localPending] = [cert, cert];
    member.record = { serial: cert.info.serial, window };
  }
}

/** Each member broke glass at most once in the window of each copy. */
function oneBreakGlassPerMemberWindow(issuances: Issuance[]): void {
  const glass = new Map<string, number>();
  for (const i of issuances.filter((x) => x.breakGlass)) {
    const key = `${i.by}/${i.window}`;
    glass.set(key, (glass.get(key) ?? 0) + 1);
    assert.equal(glass.get(key), 1, `member ${i.by} broke glass twice in the window of ${i.window}`);
  }
}

/** The home renewed each copy once (every issuance listed in the message). */
function oneRenewalPerWindow(issuances: Issuance[]): void {
  const renewals = new Map<string | null, number>();
  for (const i of issuances.filter((x) => !x.breakGlass)) renewals.set(i.window, (renewals.get(i.window) ?? 0) + 1);
  const list = issuances
    .map((i) => {
      const { serial, notBefore, notAfter } = i.cert.info;
      return `${serial} by ${i.by} at ${i.at - T0}${i.breakGlass ? ' (break-glass)' : ''}, valid ${notBefore - T0}..${notAfter - T0}`;
    })
    .join('; ');
  for (const [window, count] of renewals) assert.equal(count, 1, `the home renewed the copy ${window} ${count} times: ${list}`);
}

describe("a member's outage rules over any order of cuts and heals (properties)", () => {
  it('never an expired certificate served, one break-glass issuance per member and window, one renewal per window of the home', () => {
    fc.assert(
      fc.property(scenarios(false), (s) => {
        const { issuances } = simulate(s);
        oneBreakGlassPerMemberWindow(issuances);
        oneRenewalPerWindow(issuances);
      }),
      { numRuns: RUNS },
    );
  });

  it("a member reaching the home holds and serves the home's copy at once (a tie by notAfter included), its record gone", () => {
    fc.assert(
      fc.property(scenarios(false), (s) => {
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

  // A writer that obtains a certificate valid only from a moment later (its CA's clock ahead) stores it at once,
  // beside the served pair, at the home and in its own Secret (issue-call.ts; HeldCertificate.considerPending is how
  // every replica holds it): killed before its notBefore, or cut off from the home past the Lease, its successor
  // waits for it instead of renewing the same copy again (it did, while the pair lived only in the writer's memory).
  // Here member 0's CA is 3 s ahead: it renews at 30 s a copy valid from 33 s, and is killed at 31 s.
  it("one renewal per window when the home's writer is killed or cut off before its renewal's notBefore (its CA clock ahead)", () => {
    const quiet = { outage: false, cut: [false, false] };
    const killedAfterRenewal: Scenario = {
      lifetimeMs: 60 * SECOND,
      readinessLeadMs: 0,
      skewShares: [1, 0],
      segments: [
        { ...quiet, share: 31 / 60, killed: [false, false] },
        { ...quiet, share: 0.1, killed: [true, false] },
      ],
    };
    oneRenewalPerWindow(simulate(killedAfterRenewal, true).issuances);
    fc.assert(
      fc.property(scenarios(true), (s) => oneRenewalPerWindow(simulate(s, true).issuances)),
      { numRuns: RUNS },
    );
  });

  // A member cut off twice, then a third time, at any point of its copy's window, writers killed between any two steps,
  // CA clocks ahead and behind: every rule at once. Found on 109210d: a pair a killed writer stored for later, started
  // past the safety point of the copy (a break-glass one always does), was never believed by its successor, even
  // once valid: the member served nothing after its copy expired (pending-pair.ts latestPendingStart).
  it('two and three cuts of one member at any point of the window, writers killed between any two steps, CA clocks ahead and behind', () => {
    // The home down from before R to just before S; back, its writer (member 0, CA 3 s ahead) renews a pair valid
    // from past S, and is killed a second later (on 109210d its successor renewed the window again).
    const at = (ms: number): number => ms / 60_000;
    const connected = { outage: false, cut: [false, false], killed: [false, false] };
    const lateRenewal: Scenario = {
      lifetimeMs: 60 * SECOND,
      readinessLeadMs: 10 * SECOND,
      skewShares: [1, 0],
      segments: [
        { ...connected, share: at(29_000) },
        { ...connected, share: at(12_500), outage: true },
        { ...connected, share: at(1000) },
        { ...connected, share: at(6000), killed: [true, false] },
      ],
    };
    oneRenewalPerWindow(simulate(lateRenewal, true).issuances);
    fc.assert(
      fc.property(cutPatterns, (s) => {
        const { issuances, members, home } = simulate(s, true);
        oneBreakGlassPerMemberWindow(issuances);
        oneRenewalPerWindow(issuances);
        for (const [m, member] of members.entries())
          assert.equal(member.held.best?.info.serial, home.info.serial, `member ${m} serves the home's copy at the end`);
      }),
      { numRuns: RUNS },
    );
  });
});
