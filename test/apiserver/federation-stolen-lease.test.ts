// A stolen federation credential holds the group's Lease at the home without issuing (docs/security.md, "A stolen
// federation credential"; docs/federation.md, "A home writer judged by its results"). Every member's sidecars hold
// that credential, and a member namespace's `edit` tenants read its kubeconfig Secret. Three real kube-apiservers with
// etcd (the home, east, west); the home set up by manifests/federation, group `proxy` with one replica in each
// member, both under the credential's real token. The thief, with that token, writes the Lease as a holder would,
// again every 500 ms, and never issues: while the home answers no member breaks glass, and on 109210d no member
// renewed, so the certificate ran out (the replicas leave rotation at its readiness exit).
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { describe, it } from 'node:test';
import { breakGlassPoint, failedWindowIntentBound } from '../../src/core/federation/home-verdicts.ts';
import { intentTtl } from '../../src/core/issuance/issuance-policy.ts';
import { LEASE_DURATION_FACTOR } from '../../src/core/values/untrusted-values.ts';
import { renewalTime, rotationExitTime } from '../../src/core/renewal/renewal.ts';
import type { ControlPlane } from '../harness/control-plane.ts';
import { currentOf, followReplicas, NS, secretsHold, useFederation, type FederatedReplica as Replica } from '../support/federation.ts';
import { KUBE_DOMAIN, must } from '../support/kube.ts';
import { asAccount } from '../support/token-request.ts';
import { until } from '../support/wait.ts';

const FEDERATION = fileURLToPath(new URL('../../manifests/federation', import.meta.url));
const HOME = 'fed-stolen';
const LEASE = `/apis/coordination.k8s.io/v1/namespaces/${HOME}/leases/certshare-proxy`;

const current = currentOf;
const logged = (r: Replica, code: string): number => r.log.entries.filter((e) => e.code === code).length;

const SECRET = `/api/v1/namespaces/${HOME}/secrets/${KUBE_DOMAIN}`;

/**
 * The thief: the credential's real token writes the Lease as its holder every 500 ms (its own pace, not a wait of the
 * test); with `records`, the Secret of record's intent (`certshare.io/issuing`, stamped now) and a rate limit up to the
 * retry cap (5 s in the bed) too, as the writer of a call under way would.
 */
function holdLease(
  home: ControlPlane,
  token: string,
  now: () => number,
  records = false,
): { writes(): number; written(n: number): Promise<void>; stop(): Promise<void> } {
  let stopped = false;
  let writes = 0;
  const waiters: Array<{ at: number; resolve: () => void }> = [];
  const running = (async () => {
    while (!stopped) {
      const read = await asAccount(home, token, 'GET', LEASE);
      assert.equal(read.status, 200, read.body);
      const lease = JSON.parse(read.body) as { spec: Record<string, unknown> };
      const renewTime = new Date(now()).toISOString().replace('Z', '000Z');
      const spec = { ...lease.spec, holderIdentity: 'thief', leaseDurationSeconds: 3, renewTime };
      const written = await asAccount(home, token, 'PUT', LEASE, { ...lease, spec });
      if (records) {
        const secret = JSON.parse((await asAccount(home, token, 'GET', SECRET)).body) as { metadata: { annotations?: Record<string, string> } };
        const at = new Date(now()).toISOString();
        const annotations = {
          ...secret.metadata.annotations,
          'certshare.io/issuing': JSON.stringify({ holder: 'thief', at }),
          'certshare.io/retry-not-before': new Date(now() + 4_000).toISOString(),
        };
        const put = await asAccount(home, token, 'PUT', SECRET, { ...secret, metadata: { ...secret.metadata, annotations } });
        assert.ok([200, 409].includes(put.status), `the federation account writes the Secret of record's coordination: ${put.body}`);
      }
      if (written.status === 200) {
        writes++;
        for (const w of waiters.filter((w) => writes >= w.at)) w.resolve();
      } else assert.equal(written.status, 409, `the federation account updates its group's home Lease: ${written.body}`);
      await new Promise((resolve) => setTimeout(resolve, 500));
    }
  })();
  return {
    writes: () => writes,
    written: (n) => new Promise<void>((resolve) => waiters.push({ at: writes + n, resolve })),
    async stop() {
      stopped = true;
      await running;
    },
  };
}

describe("a stolen federation credential holding the group's home Lease without issuing", () => {
  const bed = useFederation([]);
  const { clock, replicas } = bed;
  const { anyChange, agreed, decisions } = followReplicas(replicas);

  /** Three looks of every replica, two hours apart (past --check-interval 1h): no issuance more, `serial` served. */
  async function renewedWindowHolds(serial: string, orders: number): Promise<void> {
    for (let i = 0; i < 3 && bed.issued(KUBE_DOMAIN) === orders; i++) {
      const looked = decisions(1, () => bed.issued(KUBE_DOMAIN) > orders);
      clock.jump(2 * 3_600_000);
      await looked;
    }
    assert.equal(bed.issued(KUBE_DOMAIN), orders, 'no issuance in the renewed window');
    assert.equal(agreed(), serial);
  }

  it('a member takes the Lease over once the copy passes its safety point unrenewed: one renewal, by one member, before the exit', async () => {
    const home = bed.home();
    await must(home.kubectl(['create', 'namespace', HOME]));
    await must(home.kubectl(['apply', '-k', FEDERATION, '-n', HOME]));
    const token = await home.kubeconfigFor(HOME, 'certshare-federation');
    const flags = ['--federation-kubeconfig', token, '--federation-namespace', HOME];
    const east = await bed.startReplica(bed.member('east'), 'proxy', 'proxy-0', { domains: [KUBE_DOMAIN], flags });
    await bed.startReplica(bed.member('west'), 'proxy', 'proxy-0', { domains: [KUBE_DOMAIN], flags });
    await until('both members hold the first certificate', () => agreed() !== undefined, anyChange(), 60_000);
    const first = current(east)!;
    assert.equal(bed.issued(KUBE_DOMAIN), 1);

    const thief = holdLease(home, token, () => clock.now());
    try {
      const homeWriters = async (): Promise<number> => {
        const values = await Promise.all(replicas.map(async (r) => (await r.daemon.metrics.homeWriter.get()).values[0]?.value ?? 0));
        return values.reduce((a, b) => a + b, 0);
      };
      await thief.written(3);
      const deadline = performance.now() + 30_000;
      while ((await homeWriters()) !== 0) {
        assert.ok(performance.now() < deadline, 'the thief holds the Lease: no member is the home writer');
        await decisions(1, () => false);
      }

      // Past the renewal point, before the safety point: the holder's to renew; the thief renews nothing.
      const { renewal: policy, readinessLeadMs } = east.config;
      const safety = breakGlassPoint(first.info, policy, readinessLeadMs);
      clock.jumpTo(renewalTime(first.info, policy) + Math.floor((safety - renewalTime(first.info, policy)) / 2));
      await decisions(5, () => bed.issued(KUBE_DOMAIN) > 1);
      assert.equal(bed.issued(KUBE_DOMAIN), 1, 'before the safety point the Lease rules: the delay the thief has');

      // Past the safety point, the home answering: no break-glass (not cut off), a takeover and one renewal.
      clock.jumpTo(safety + 60_000);
      await until('a renewal in both members', () => ![undefined, first.info.serial].includes(agreed()), anyChange(), 30_000);
      const renewed = agreed()!;
      assert.equal(bed.issued(KUBE_DOMAIN), 2, 'one renewal across the members');
      assert.ok(clock.now() < rotationExitTime(first.info, policy, readinessLeadMs), 'before the readiness exit');
      assert.ok(
        replicas.some((r) => logged(r, 'CERTSHARE_HOME_WRITER_FAILED') > 0),
        'the takeover logged (CERTSHARE_HOME_WRITER_FAILED)',
      );
      const takeovers = await Promise.all(replicas.map(async (r) => (await r.daemon.metrics.homeTakeovers.get()).values[0]?.value ?? 0));
      assert.ok(takeovers.reduce((a, b) => a + b, 0) >= 1, 'counted in certshare_home_takeovers_total');
      const breakGlass = await Promise.all(replicas.map(async (r) => (await r.daemon.metrics.breakGlass.get()).values.length));
      assert.deepEqual(breakGlass, [0, 0], 'no break-glass: the home answers');
      await secretsHold([{ cp: home, ns: HOME }, ...bed.members().map((m) => ({ cp: m.cp, ns: NS }))], KUBE_DOMAIN, renewed, anyChange, 30_000);

      // The thief holds the Lease again: nothing changes for the window renewed, past the first copy's expiry.
      await thief.written(2);
      clock.jumpTo(first.info.notAfter + 60_000);
      await renewedWindowHolds(renewed, 2);
    } finally {
      await thief.stop();
    }
  });
  it("and writes the Secret of record's intent and a rate limit again and again: renewed before the exit, at most once per member", async () => {
    const home = bed.home();
    const token = await home.kubeconfigFor(HOME, 'certshare-federation');
    const east = replicas[0]!;
    const held = current(east)!;
    const orders = bed.issued(KUBE_DOMAIN);
    const thief = holdLease(home, token, () => clock.now(), true);
    try {
      await thief.written(3);
      const { renewal: policy, readinessLeadMs, certTimeoutMs } = east.config;
      // Past the safety point a member believes the thief's intents (each a call under way to wait for) as stamped no
      // later than a bound from when it judged the window failed (boundFailedWindow), and takes no Lease over while one
      // blocks. The thief's writes follow real time: its intent is stamped again at the new time before the safety
      // point comes, then the clock passes the bound and one intent's lifetime 10 s after each of the thief's writes.
      const safety = breakGlassPoint(held.info, policy, readinessLeadMs);
      clock.jumpTo(safety - 20_000);
      await thief.written(2);
      const window = { since: safety, leaseBoundMs: LEASE_DURATION_FACTOR * east.config.federation!.leaseDurationMs, intentTtlMs: intentTtl(certTimeoutMs) };
      const end = failedWindowIntentBound(window) + window.intentTtlMs + 60_000;
      while (clock.now() <= end && agreed() === held.info.serial) {
        // Two writes: the second one's stamp is taken after the last jump.
        await thief.written(2);
        await decisions(2, () => agreed() !== held.info.serial);
        clock.jump(10_000);
      }
      await until('a renewal in both members', () => ![undefined, held.info.serial].includes(agreed()), anyChange(), 30_000);
      // Whoever holds the home credential can erase a member's intent and hold the others up to the same bound, so a
      // second member may call while the first one's call runs: one issuance per member at most (docs/security.md).
      const renewals = bed.issued(KUBE_DOMAIN) - orders;
      assert.ok(renewals >= 1 && renewals <= replicas.length, `${renewals} renewals across ${replicas.length} members`);
      assert.ok(clock.now() < rotationExitTime(held.info, policy, readinessLeadMs), 'before the readiness exit');
      assert.ok(
        replicas.some((r) => r.log.entries.some((e) => e.code === 'CERTSHARE_UNTRUSTED_VALUE' && e.field === 'issuing')),
        "the thief's intent told as a value out of its bound",
      );
      // The renewed window: the thief's records and Lease change nothing.
      await renewedWindowHolds(agreed()!, bed.issued(KUBE_DOMAIN));
    } finally {
      await thief.stop();
    }
  });
  it('past the safety point, the writer elected first only slow: the other member takes the Lease over, waits for its call, one renewal', async () => {
    // The thief is gone. Each member's CA answers its next call after 5 s (under --cert-timeout, 10 s in the bed): the
    // first member to call after the safety point (an ordinary election, or a takeover) is slow, and the other one
    // takes the Lease over from it while its call is under way (the copy still unrenewed past its safety point).
    const held = current(replicas[0]!)!;
    const orders = bed.issued(KUBE_DOMAIN);
    const takeovers = (): number => replicas.reduce((n, r) => n + logged(r, 'CERTSHARE_HOME_WRITER_FAILED'), 0);
    const before = takeovers();
    const signed = (r: Replica): number => r.emulator.stats().issuances[KUBE_DOMAIN] ?? 0;
    const signedBefore = replicas.map(signed);
    const { renewal: policy, readinessLeadMs } = replicas[0]!.config;
    // Where the members put it: from the copy's obtained-at, as its renewal point.
    const safety = breakGlassPoint({ ...held.info, obtainedAt: held.obtainedAt }, policy, readinessLeadMs);
    const requested = replicas.map(
      (r) =>
        new Promise<Replica>((resolve) => {
          r.emulator.injectFault({ target: 'cert', kind: 'slow', domain: KUBE_DOMAIN, delayMs: 5_000 });
          r.emulator.events.once('certRequest', () => resolve(r));
        }),
    );
    clock.jumpTo(safety + 1_000);
    const writer = await Promise.race(requested);
    await until('the slow renewal in both members', () => ![undefined, held.info.serial].includes(agreed()), anyChange(), 30_000);
    assert.ok(takeovers() > before, 'a member took the Lease over past the safety point');
    await renewedWindowHolds(agreed()!, orders + 1);
    assert.deepEqual(
      replicas.map((r) => signed(r) - (r === writer ? 1 : 0)),
      signedBefore,
      "the slow writer's renewal, the other's none",
    );
  });
});
