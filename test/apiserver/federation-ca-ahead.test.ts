// The home's writer renews with a CA whose clock is ahead (docs/design.md, "a certificate valid only later"): the
// renewal is valid only from a moment later, and the writer keeps it in memory until then. Three real
// kube-apiservers with etcd (the home, east, west); group `shared` serves one name, one replica in each member.
// East's CA stamps its certificates 5 minutes ahead of the bed's clock (valid from 4 minutes on: the emulator
// backdates one). East renews, then stops (a rollout) before its renewal is valid: west's writer takes the home
// Lease and must not renew the same copy again, and every Secret and replica (east's next Pod too) must have east's
// renewal from its notBefore. Found by test/unit/federation-outage-properties.test.ts: west renewed again while the pair lived only
// in east's memory; it is stored at once now (pending.crt, pending.key), at the home too.
import assert from 'node:assert/strict';
import { after, describe, it } from 'node:test';
import { breakGlassPoint } from '../../src/core/federation/home-verdicts.ts';
import type { StoredCert } from '../../src/core/ports/store.ts';
import { renewalTime } from '../../src/core/renewal/renewal.ts';
import { HOME_NS, NS, readUntil, relayToHome, secretAt, secretsHold, useFederation, type FederatedReplica as Replica } from '../support/federation.ts';
import { useTempDir } from '../support/standalone.ts';
import type { TcpProxy } from '../support/tcp-proxy.ts';
import { onEvent, until } from '../support/wait.ts';

const SHARED = 'shared.tailnet-0000.ts.net';
const AHEAD_MS = 5 * 60_000;
const BREAK_GLASS = 'certshare.io/break-glass';

const current = (r: Replica): StoredCert | undefined => r.daemon.manager.loop(r.domain)?.current;
/** The serials `r` logged as obtained valid only later (issue-call.ts), oldest first. */
const pending = (r: Replica): string[] => r.log.entries.filter((e) => /not valid yet/.test(e.msg ?? '')).map((e) => String(e.serial));

describe("the home's writer stopped before its renewal is valid (its CA's clock ahead)", () => {
  const bed = useFederation(['shared']);
  const { clock, replicas } = bed;
  const anyChange = () => replicas.flatMap((r) => [onEvent(r.daemon.events, 'planned'), onEvent(r.daemon.events, 'attempt'), onEvent(r.log.events, 'entry')]);
  const where = () => [
    { cp: bed.home(), ns: HOME_NS },
    { cp: bed.member('east').cp, ns: NS },
    { cp: bed.member('west').cp, ns: NS },
  ];

  it('one renewal in the window, served everywhere from its notBefore', async () => {
    const east = await bed.startReplica(bed.member('east'), 'shared', 'shared-0', { domains: [SHARED], caClock: { now: () => clock.now() + AHEAD_MS } });
    // East's first certificate is valid only later too: the clock moves to it.
    await until('east holds a certificate pending', () => pending(east).length === 1, anyChange(), 60_000);
    clock.jump(AHEAD_MS);
    await until('east holds the first certificate', () => current(east) !== undefined, anyChange(), 60_000);
    const first = current(east)!;
    await secretsHold(where().slice(0, 2), SHARED, first.info.serial, anyChange, 30_000);
    const west = await bed.startReplica(bed.member('west'), 'shared', 'shared-0', { domains: [SHARED] });
    await until('west holds the first certificate', () => current(west)?.info.serial === first.info.serial, anyChange(), 60_000);

    clock.jumpTo(renewalTime(first.info, east.config.renewal) + 60_000);
    await until("east's writer renews, valid only later", () => pending(east).length === 2, anyChange(), 60_000);
    const renewal = pending(east)[1]!;
    assert.equal(bed.issued(SHARED), 2);
    await east.stop();
    // West's writer takes the home Lease (3 s in the bed), and the renewal becomes valid.
    clock.jump(AHEAD_MS);
    await until('west serves a renewal', () => ![undefined, first.info.serial].includes(current(west)?.info.serial), anyChange(), 60_000);
    assert.equal(bed.issued(SHARED), 2, 'the window has one renewal: east stored its own, west renewed nothing');
    assert.equal(current(west)?.info.serial, renewal, "west serves east's renewal");
    await secretsHold([where()[0]!, where()[2]!], SHARED, renewal, anyChange, 30_000);
    // The rollout's new Pod in east: it takes the renewal from the home, and orders nothing either.
    const east2 = await bed.startReplica(bed.member('east'), 'shared', 'shared-1', { domains: [SHARED] });
    await until('the new east replica serves the renewal', () => current(east2)?.info.serial === renewal, anyChange(), 60_000);
    await secretsHold(where(), SHARED, renewal, anyChange, 30_000);
    assert.equal(bed.issued(SHARED), 2);
  });
});

describe("a member cut off breaks glass with its CA's clock ahead: its writer stopped before the pair is valid", () => {
  const dir = useTempDir();
  const bed = useFederation(['shared']);
  const { clock, replicas } = bed;
  let relay: TcpProxy | undefined;
  after(async () => {
    await relay?.close();
  });
  const anyChange = () => replicas.flatMap((r) => [onEvent(r.daemon.events, 'planned'), onEvent(r.daemon.events, 'attempt'), onEvent(r.log.events, 'entry')]);
  const westReplicas = (): Replica[] => replicas.filter((r) => r.member === 'west');
  const signedBy = (rs: Replica[]): number => rs.reduce((n, r) => n + (r.emulator.stats().issuances[SHARED] ?? 0), 0);

  // West's writer broke glass past its copy's safety point and got a pair valid only later; it stored the pair at
  // once and stopped before its notBefore. Its successor moved the pair into tls.crt with no break-glass record
  // (it knew nothing of the call), and once it judged the pair by its own safety point (the pair started past it)
  // it broke glass again in the same window, on the window's second claim.
  it('its successor serves that pair from its notBefore, recorded as the break-glass issuance it is; nothing more is ordered', async () => {
    const west = bed.member('west');
    const cut = await relayToHome(bed.home(), dir(), 'west');
    relay = cut.relay;
    const east = await bed.startReplica(bed.member('east'), 'shared', 'shared-0', { domains: [SHARED] });
    await until('east holds the first certificate', () => current(east) !== undefined, anyChange(), 60_000);
    const first = current(east)!;
    const westCa = { now: () => clock.now() + AHEAD_MS };
    for (const pod of ['shared-0', 'shared-1'])
      await bed.startReplica(west, 'shared', pod, { domains: [SHARED], flags: ['--federation-kubeconfig', cut.kubeconfig], caClock: westCa });
    const holdFirst = () => westReplicas().every((r) => current(r)?.info.serial === first.info.serial);
    await until('west holds the first certificate', holdFirst, anyChange(), 60_000);
    relay.cut();
    let glass: string;
    try {
      clock.jumpTo(breakGlassPoint(first.info, east.config.renewal, east.config.readinessLeadMs) + 60_000);
      await until('west breaks glass, valid only later', () => westReplicas().some((r) => pending(r).length > 0), anyChange(), 60_000);
      const writer = westReplicas().find((r) => pending(r).length > 0)!;
      glass = pending(writer)[0]!;
      const stored = await readUntil(
        () => secretAt(west.cp, NS, SHARED),
        (s) => s.pending === glass,
        anyChange,
        30_000,
        (s) => `west's Secret holds ${s.pending ?? 'no pair'} for later, not ${glass}`,
      );
      assert.equal(stored.annotations[BREAK_GLASS], `${glass} replacing ${first.info.serial}`, 'recorded as it is stored (before: no record)');
      await writer.stop();
      replicas.splice(replicas.indexOf(writer), 1);
      const [successor] = westReplicas();
      clock.jump(AHEAD_MS);
      await until("west's successor serves a new pair", () => current(successor!)?.info.serial !== first.info.serial, anyChange(), 60_000);
      assert.equal(current(successor!)?.info.serial, glass, "the successor serves its predecessor's break-glass pair");
      assert.equal(signedBy([successor!]), 0, 'the successor orders nothing: one break-glass issuance in the window');
      const local = await secretAt(west.cp, NS, SHARED);
      assert.equal(local.annotations[BREAK_GLASS], `${glass} replacing ${first.info.serial}`, 'the record stands once the pair is served');
    } finally {
      relay.restore();
    }
    // West's is the newest (issued at the safety point, its CA ahead): the record everywhere.
    await secretsHold(
      [
        { cp: bed.home(), ns: HOME_NS },
        { cp: bed.member('east').cp, ns: NS },
        { cp: west.cp, ns: NS },
      ],
      SHARED,
      glass,
      anyChange,
      30_000,
    );
  });
});
