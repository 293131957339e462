// The home's writer renews with a CA whose clock is ahead (docs/design.md, "a certificate valid only later"): the
// renewal is valid only from a moment later, and the writer keeps it in memory until then. Three real
// kube-apiservers with etcd (the home, east, west); group `shared` serves one name, one replica in each member.
// East's CA stamps its certificates 5 minutes ahead of the bed's clock (valid from 4 minutes on: the emulator
// backdates one). East renews, then stops (a rollout) before its renewal is valid: west's writer takes the home
// Lease and must not renew the same copy again, and every Secret and replica (east's next Pod too) must have east's
// renewal from its notBefore. Found by test/unit/federation-outage-properties.test.ts: west renewed again while the pair lived only
// in east's memory; it is stored at once now (pending.crt, pending.key), at the home too.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { StoredCert } from '../../src/core/ports/store.ts';
import { renewalTime } from '../../src/core/renewal/renewal.ts';
import { HOME_NS, NS, secretsHold, useFederation, type FederatedReplica as Replica } from '../support/federation.ts';
import { onEvent, until } from '../support/wait.ts';

const SHARED = 'shared.tailnet-0000.ts.net';
const AHEAD_MS = 5 * 60_000;

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
