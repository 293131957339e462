// A member's break-glass certificate and the home's renewal expiring in the same second (docs/federation.md, "The
// home back": a tie goes to the home's copy). Three real kube-apiservers with etcd (the home, east, west); group
// `shared` serves one name, one replica in east (straight to the home), two in west, whose home kubeconfig goes
// through a TCP relay the test cuts. West's CA stamps its certificates on a clock the test pins to the instant
// east's CA stamped the home's renewal: west's break-glass certificate ends in the same second.
//
// Found on f7c7eb2: every Secret took the home's copy, but west's two replicas kept serving their break-glass
// certificate (a loop took a stored pair only for a later notAfter): a certificate no Secret held any more,
// served by one member until the next renewal, and a west replica restarted meanwhile served the other one.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { breakGlassPoint } from '../../src/core/federation/home-verdicts.ts';
import type { StoredCert } from '../../src/core/ports/store.ts';
import { renewalTime } from '../../src/core/renewal/renewal.ts';
import { HOME_NS, NS, relayToHome, secretAt, secretsHold, useFederation, type FederatedReplica as Replica } from '../support/federation.ts';
import { useTempDir } from '../support/standalone.ts';
import type { TcpProxy } from '../support/tcp-proxy.ts';
import { onEvent, until } from '../support/wait.ts';

const SHARED = 'shared.tailnet-0000.ts.net';
const BREAK_GLASS = 'certshare.io/break-glass';
/** The emulator backdates notBefore a minute before the instant its CA stamps (lifetimes of an hour or more). */
const BACKDATE_MS = 60_000;

const current = (r: Replica): StoredCert | undefined => r.daemon.manager.loop(r.domain)?.current;
const serial = (r: Replica): string | undefined => current(r)?.info.serial;
const logged = (rs: Replica[], msg: RegExp): number => rs.reduce((n, r) => n + r.log.entries.filter((e) => msg.test(e.msg ?? '')).length, 0);

describe('a break-glass certificate and the home renewal expiring in the same second', () => {
  const dir = useTempDir();
  const bed = useFederation(['shared']);
  const { clock, replicas } = bed;
  let relay: TcpProxy;
  /** West's CA's clock reading while pinned (undefined: the bed's clock). */
  let pinned: number | undefined;
  const westCa = { now: () => pinned ?? clock.now() };

  before(async () => {
    const east = bed.member('east');
    const west = bed.member('west');
    const home = bed.home();
    const cut = await relayToHome(home, dir(), 'west');
    relay = cut.relay;
    const relayKubeconfig = cut.kubeconfig;
    await bed.startReplica(east, 'shared', 'shared-0', { domains: [SHARED] });
    for (const pod of ['shared-0', 'shared-1'])
      await bed.startReplica(west, 'shared', pod, { domains: [SHARED], flags: ['--federation-kubeconfig', relayKubeconfig], caClock: westCa });
  });
  after(async () => {
    await relay?.close();
  });

  const east = (): Replica => replicas.find((r) => r.member === 'east')!;
  const westReplicas = (): Replica[] => replicas.filter((r) => r.member === 'west');
  const signedBy = (rs: Replica[]): number => rs.reduce((n, r) => n + (r.emulator.stats().issuances[SHARED] ?? 0), 0);
  const anyChange = () => replicas.flatMap((r) => [onEvent(r.daemon.events, 'planned'), onEvent(r.daemon.events, 'attempt'), onEvent(r.log.events, 'entry')]);
  const agreed = (): string | undefined => {
    const serials = new Set(replicas.map(serial));
    return serials.size === 1 ? [...serials][0] : undefined;
  };
  const held = (): string => replicas.map((r) => `${r.member}/${r.pod} ${serial(r)}`).join(', ');
  const where = () => [
    { cp: bed.home(), ns: HOME_NS },
    { cp: bed.member('east').cp, ns: NS },
    { cp: bed.member('west').cp, ns: NS },
  ];

  it("every replica serves the home's copy, and the next window has one renewal", async () => {
    await until('every replica holds the first certificate', () => agreed() !== undefined, anyChange(), 60_000);
    const first = current(east())!;
    const config = east().config;
    let homeCopy: StoredCert;
    let glass: string;
    relay.cut();
    try {
      // East (the home's writer once west's home Lease lapses) renews at the renewal point; west serves its copy.
      clock.jumpTo(renewalTime(first.info, config.renewal) + 60_000);
      await until('east holds the home renewal', () => serial(east()) !== first.info.serial, anyChange(), 60_000);
      homeCopy = current(east())!;
      assert.equal(bed.issued(SHARED), 2, 'one renewal by the home writer');
      // West's CA stamps its next certificate at the instant east's stamped the renewal.
      pinned = homeCopy.info.notBefore + BACKDATE_MS;
      clock.jumpTo(breakGlassPoint(first.info, config.renewal, config.readinessLeadMs) + 60_000);
      await until('west breaks glass', () => logged(westReplicas(), /^break-glass: issued/) > 0, anyChange(), 30_000);
      assert.equal(signedBy(westReplicas()), 1, 'west breaks glass once');
      glass = (await secretAt(bed.member('west').cp, NS, SHARED)).serial;
      await until('both west replicas serve it', () => westReplicas().every((r) => serial(r) === glass), anyChange(), 30_000);
      const tie = current(westReplicas()[0]!)!.info;
      assert.notEqual(glass, homeCopy.info.serial);
      assert.equal(tie.notAfter, homeCopy.info.notAfter, 'the tie: both expire in the same second');
    } finally {
      pinned = undefined;
      relay.restore();
    }
    // West back: the tie goes to the home's copy in every Secret, and every replica serves what the Secrets hold.
    await secretsHold(where(), SHARED, homeCopy.info.serial, anyChange, 30_000);
    await until("every replica serves the Secrets' copy", () => agreed() === homeCopy.info.serial, anyChange(), 30_000).catch((err: unknown) => {
      throw new Error(`${(err as Error).message}: ${held()} (west's break-glass certificate ${glass}, in no Secret)`);
    });
    await until('west supersedes its record', () => logged(westReplicas(), /^break-glass record superseded/) > 0, anyChange(), 30_000);
    assert.equal((await secretAt(bed.member('west').cp, NS, SHARED)).annotations[BREAK_GLASS], undefined, "west's record is gone");
    assert.equal(bed.issued(SHARED), 3, 'nothing more signed');

    // The next window: one renewal, by the home's writer, served everywhere.
    clock.jumpTo(renewalTime(homeCopy.info, config.renewal) + 60_000);
    await until('every replica serves the renewal', () => ![undefined, homeCopy.info.serial].includes(agreed()), anyChange(), 60_000).catch((err: unknown) => {
      throw new Error(`${(err as Error).message}: ${held()}`);
    });
    assert.equal(bed.issued(SHARED), 4, 'one renewal in the next window');
    await secretsHold(where(), SHARED, agreed()!, anyChange, 30_000);
  });
});
