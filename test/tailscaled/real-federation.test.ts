// The federation home (docs/federation.md) with a real tailscaled per member: the home and two member
// clusters are real kube-apiservers with etcd (test/support/federation.ts), and each member's one replica
// (in-process) asks its own real tailscaled, whose own tsenv has its own pebble. Both nodes are `proxy` in
// the tailnet `tailnet-0000.ts.net`: each tailscaled could order the shared name from its own CA, so an order
// that one of them should not have made shows in the sum of both pebbles' counts. Real time throughout: a
// real tailscaled keeps its own clock.
import assert from 'node:assert/strict';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { setTimeout as delay } from 'node:timers/promises';
import { ARI_MIN_HOLD_MS } from '../../src/core/renewal/renewal-info.ts';
import { connectKube } from '../../src/kube/connection.ts';
import { requestRenewal } from '../../src/kube/secret-renew-request.ts';
import { BUILD_AND_START_TIMEOUT_MS, startRealTailscaled, type RealTailscaled } from '../harness/tailscale.ts';
import { assertOneIssuance, type IssuanceCount, pebbleChallengeRaces } from '../support/ari-process.ts';
import {
  HOME_NS,
  NS,
  secretsHold as secretsHoldAt,
  startFederatedDaemon,
  startFederation,
  type FederatedDaemon,
  type Federation,
  type Member,
  type SecretView,
} from '../support/federation.ts';
import { GROUP, KUBE_DOMAIN, KUBE_DOMAIN_TAILSCALED } from '../support/kube.ts';
import { onEvent, until } from '../support/wait.ts';

/** A first certificate through tailscaled and pebble, or the renewal asked for, in place everywhere. */
const ISSUANCE_BOUND_MS = 60_000;

interface MemberRun {
  member: Member;
  ts: RealTailscaled;
  replica: FederatedDaemon;
}

describe('the federation home with a real tailscaled per member: one order for a name both could order', { timeout: BUILD_AND_START_TIMEOUT_MS }, () => {
  let federation: Federation | undefined;
  const tailscaleds: RealTailscaled[] = [];
  const members: MemberRun[] = [];

  before(
    async () => {
      // Everything at once: three apiservers, two namespaces each with tsenv (control, pebble) and tailscaled.
      const started = await Promise.allSettled([
        startFederation([GROUP]),
        startRealTailscaled(KUBE_DOMAIN_TAILSCALED),
        startRealTailscaled(KUBE_DOMAIN_TAILSCALED),
      ]);
      const [fed, ...ts] = started;
      if (fed.status === 'fulfilled') federation = fed.value;
      for (const t of ts) if (t.status === 'fulfilled') tailscaleds.push(t.value as RealTailscaled);
      const failed = started.find((s) => s.status === 'rejected');
      if (failed) throw failed.reason;
    },
    { timeout: BUILD_AND_START_TIMEOUT_MS },
  );
  after(
    async () => {
      await Promise.all(members.map((m) => m.replica.daemon.stop()));
      await Promise.all([...tailscaleds.map((t) => t.stop()), federation?.stop()]);
    },
    { timeout: 120_000 },
  );

  const held = (m: MemberRun): string | undefined => m.replica.daemon.manager.loop(KUBE_DOMAIN)?.current?.info.serial;
  const changes = () => members.flatMap((m) => [onEvent(m.replica.daemon.events, 'planned'), onEvent(m.replica.log.events, 'entry')]);
  /** CertPair calls of one replica (certshare_issuance_attempts_total, every result and reason). */
  const calls = async (m: MemberRun): Promise<number> => {
    const metric = m.replica.daemon.metrics.registry.getSingleMetric('certshare_issuance_attempts_total');
    return ((await metric?.get())?.values ?? []).reduce((n, v) => n + v.value, 0);
  };
  /** Orders and finalized orders of both members' pebbles, and CertPair calls of both replicas. */
  const count = async (): Promise<IssuanceCount & { perMember: IssuanceCount[] }> => {
    const perMember = await Promise.all(
      members.map(async (m) => {
        const stats = await m.ts.acmeStats();
        return { orders: stats.orders, finalizes: stats.finalizes, calls: await calls(m) };
      }),
    );
    const sum = (k: keyof IssuanceCount): number => perMember.reduce((n, c) => n + c[k], 0);
    return { orders: sum('orders'), finalizes: sum('finalizes'), calls: sum('calls'), perMember };
  };
  const races = (): number => pebbleChallengeRaces(members.flatMap((m) => m.replica.log.entries));

  /** The Secret of record at the home and each member's local Secret, once they all hold `serial`. */
  const secretsHold = (serial: string): Promise<SecretView[]> => {
    const where = [{ cp: federation!.home, ns: HOME_NS }, ...federation!.members.map((m) => ({ cp: m.cp, ns: NS }))];
    return secretsHoldAt(where, KUBE_DOMAIN, serial, changes, ISSUANCE_BOUND_MS);
  };

  async function withDiagnostics<T>(body: () => Promise<T>): Promise<T> {
    try {
      return await body();
    } catch (err) {
      for (const m of members) {
        process.stderr.write(`${m.member.name}: tailscaled (last lines):\n${m.ts.logs().tailscaled.slice(-20).join('\n')}\n`);
        const lines = m.replica.log.entries.slice(-30).map((e) => JSON.stringify(e));
        process.stderr.write(`${m.member.name}: certshare (last lines):\n${lines.join('\n')}\n`);
        const attempts = await m.replica.daemon.metrics.registry.getSingleMetricAsString('certshare_issuance_attempts_total');
        process.stderr.write(`${m.member.name}: ${attempts}\n`);
      }
      throw err;
    }
  }

  it('one order across both pebbles, the same certificate at the home and in both members', async () => {
    const fed = federation!;
    // Two nodes with the same cert domain, each with its own CA: either could order the name.
    assert.deepEqual(
      tailscaleds.map((t) => t.domain),
      [KUBE_DOMAIN, KUBE_DOMAIN],
    );
    // Each member trusts both pebbles' roots, as a user trusts a private CA that Node does not know: the home
    // holds what either member's CA issued.
    const anchors = join(tailscaleds[0]!.dir, 'federation-trust-anchors.pem');
    await writeFile(anchors, (await Promise.all(tailscaleds.map((t) => readFile(t.acmeCaBundle, 'utf8')))).join('\n'));
    await Promise.all(
      fed.members.map(async (member, i) => {
        const ts = tailscaleds[i]!;
        const replica = await startFederatedDaemon(member, fed.home.adminKubeconfigPath, {
          localapi: ts.socket,
          group: GROUP,
          domains: [KUBE_DOMAIN],
          pod: 'proxy-0',
          flags: ['--federation-trust-anchors', anchors],
        });
        members.push({ member, ts, replica });
      }),
    );
    await withDiagnostics(async () => {
      await until('both members hold a certificate', () => members.every((m) => held(m) !== undefined), changes(), ISSUANCE_BOUND_MS);
      const counts = await count();
      assertOneIssuance({ orders: 0, finalizes: 0, calls: 0 }, counts, races());
      const serial = held(members[0]!)!;
      assert.equal(held(members[1]!), serial, 'both members serve one certificate');
      await secretsHold(serial);
      // The member that did not issue never asked its tailscaled for a certificate, nor its CA for an order.
      const idle = counts.perMember.filter((c) => c.finalizes === 0);
      assert.equal(idle.length, 1, JSON.stringify(counts.perMember));
      assert.deepEqual(idle[0], { orders: 0, finalizes: 0, calls: 0 });
    });
  });

  it('renew-now at the home: one more order across both pebbles, a new key in every Secret', async () => {
    await withDiagnostics(async () => {
      const before = held(members[0]!)!;
      const keysBefore = new Set((await secretsHold(before)).map((s) => s.key));
      const counts = await count();
      const issuer = counts.perMember.findIndex((c) => c.finalizes > 0);
      const racesBefore = races();
      // Asked of a certificate held ARI_MIN_HOLD_MS (with the default --first-retry, sooner is refused): one
      // under a second or so old has as much life left, in whole seconds, as a fresh one, so the capped
      // min_validity (renewal-info.ts ariMinValidityMs) gets it back from tailscaled unchanged, and the writer
      // asks again at once until it is old enough (seen here: ten calls for the one order). Real time:
      // nothing to wait for but the certificate's age.
      const notBefore = members[issuer]!.replica.daemon.manager.loop(KUBE_DOMAIN)!.current!.info.notBefore;
      await delay(Math.max(0, notBefore + ARI_MIN_HOLD_MS - Date.now()));
      const connection = await connectKube({}, { kubeconfig: federation!.home.adminKubeconfigPath, namespace: HOME_NS });
      try {
        assert.equal((await requestRenewal(connection, KUBE_DOMAIN, 'renew-1')).kind, 'requested');
      } finally {
        connection.close();
      }
      await until('both members hold a new certificate', () => members.every((m) => held(m) !== before && held(m) !== undefined), changes(), ISSUANCE_BOUND_MS);
      const renewed = held(members[0]!)!;
      assert.equal(held(members[1]!), renewed, 'both members serve the new certificate');
      const secrets = await secretsHold(renewed);
      const after = await count();
      assertOneIssuance(counts, after, races() - racesBefore);
      for (const s of secrets) assert.ok(!keysBefore.has(s.key), 'a new key in every Secret');
      assert.equal(secrets[0]!.annotations['certshare.io/renew-answered'], 'renew-1');
      // The same member issued again (one home writer throughout), the other still never called CertPair.
      assert.deepEqual(after.perMember[1 - issuer], { orders: 0, finalizes: 0, calls: 0 }, JSON.stringify(after.perMember));
    });
  });
});
