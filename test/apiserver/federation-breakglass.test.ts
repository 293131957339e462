// Issue 40 (docs/federation.md, "The home unreachable"): a member cut off from the home across two renewal
// windows. Three real kube-apiservers with etcd (the home, east, west); group `shared` serves one name, one
// replica in east (straight to the home), two in west, whose home kubeconfig goes through a TCP relay the test
// cuts (a partition of west alone: east and the home keep talking). The JumpClock skips a 90-day certificate's
// days; every replica has its own LocalAPI emulator, so what west's emulators sign is west's own issuance.
//
// The chain found on 264753e: west breaks glass in one window, its certificate becomes the record everywhere,
// west is cut off again across that certificate's renewal and safety point: it never broke glass again (its
// record named the certificate it held), and once the copy expired the renewal was taken for a first
// issuance, which needs the ledger at the unreachable home (`issuance ledger unusable; not issuing`).
import assert from 'node:assert/strict';
import { X509Certificate, randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { breakGlassPoint } from '../../src/core/federation/home-verdicts.ts';
import { breakGlassClaimNames } from '../../src/kube/break-glass-claim.ts';
import { renewalTime } from '../../src/core/renewal/renewal.ts';
import type { StoredCert } from '../../src/core/ports/store.ts';
import {
  DAY,
  HOME_NS,
  LIFETIME,
  NS,
  relayToHome,
  secretAt,
  secretsHold,
  useFederation,
  type FederatedReplica as Replica,
  type Member,
  type SecretView,
} from '../support/federation.ts';
import { useTempDir } from '../support/standalone.ts';
import type { ControlPlane } from '../harness/control-plane.ts';
import type { TcpProxy } from '../support/tcp-proxy.ts';
import { applyClaimsPolicy, claimsPolicyInForce, must, namespaceAdmin } from '../support/kube.ts';
import { asAccount } from '../support/token-request.ts';
import { onEvent, until } from '../support/wait.ts';

const SHARED = 'shared.tailnet-0000.ts.net';
const BREAK_GLASS = 'certshare.io/break-glass';
const LEASES = `/apis/coordination.k8s.io/v1/namespaces/${NS}/leases`;

/**
 * A policy of `cp`'s refusing what `allowed` (CEL over `object`) does not admit in `rules` (admission holds for
 * cluster administrators too), in force once `probe` (a dry run) is refused; `remove` waits until it admits again.
 */
async function refusesIn(
  cp: ControlPlane,
  name: string,
  rules: { apiGroups: string[]; resources: string[]; operations: string[] },
  allowed: string,
  probe: () => Promise<{ status: number }>,
): Promise<{ remove(): Promise<void> }> {
  const policy = { apiVersion: 'admissionregistration.k8s.io/v1', kind: 'ValidatingAdmissionPolicy', metadata: { name } };
  const refusing = {
    ...policy,
    spec: {
      failurePolicy: 'Fail',
      matchConstraints: { resourceRules: [{ apiVersions: ['v1'], ...rules }] },
      validations: [{ expression: allowed, message: `refused by ${name}`, reason: 'Forbidden' }],
    },
  };
  const binding = { ...policy, kind: 'ValidatingAdmissionPolicyBinding', spec: { policyName: name, validationActions: ['Deny'] } };
  const inForce = async (want: boolean): Promise<void> => {
    const deadline = performance.now() + 30_000;
    while (((await probe()).status === 403) !== want) {
      assert.ok(performance.now() < deadline, `${name} never ${want ? 'took' : 'left'} effect`);
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
  };
  await must(cp.kubectl(['apply', '-f', '-'], { input: JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [refusing, binding] }) }));
  await inForce(true);
  let removed = false;
  return {
    // Once: a test removes it where its story says, and again in its `finally` (a failed test leaves no refusal behind).
    async remove() {
      if (removed) return;
      removed = true;
      await must(cp.kubectl(['delete', 'validatingadmissionpolicybinding,validatingadmissionpolicy', name]));
      await inForce(false);
    },
  };
}

/** `refusesIn` for updates of the shared Secret in `cp`'s namespace, probed by a dry-run merge patch of `probe`. */
function secretUpdatesRefusedIn(cp: ControlPlane, name: string, allowed: string, probe: Record<string, unknown>): Promise<{ remove(): Promise<void> }> {
  return refusesIn(cp, name, { apiGroups: [''], resources: ['secrets'], operations: ['UPDATE'] }, allowed, () =>
    cp.adminRequest('PATCH', `/api/v1/namespaces/${NS}/secrets/${SHARED}?dryRun=All`, {
      headers: { 'content-type': 'application/merge-patch+json' },
      body: probe,
    }),
  );
}

/** Replica helpers of both beds: what a replica holds, and the events that may change it. */
const current = (r: Replica): StoredCert | undefined => r.daemon.manager.loop(r.domain)?.current;
const serial = (r: Replica): string | undefined => current(r)?.info.serial;
const logged = (rs: Replica[], msg: RegExp): number => rs.reduce((n, r) => n + r.log.entries.filter((e) => msg.test(e.msg ?? '')).length, 0);
const changesOf = (rs: Replica[]): Array<(listener: () => void) => () => void> =>
  rs.flatMap((r) => [onEvent(r.daemon.events, 'planned'), onEvent(r.daemon.events, 'attempt'), onEvent(r.log.events, 'entry')]);
/** The serial every replica of `rs` holds, when they agree. */
const agreedIn = (rs: Replica[]): string | undefined => {
  const serials = new Set(rs.map(serial));
  return serials.size === 1 ? [...serials][0] : undefined;
};

describe('a member cut off across two renewal windows (issue 40): one break-glass issuance per window, never an expired copy', () => {
  const dir = useTempDir();
  const bed = useFederation(['shared']);
  const { clock, replicas } = bed;
  let east: Member;
  let west: Member;
  /** West's path to the home. */
  let relay: TcpProxy;
  /** West's home kubeconfig, through the relay. */
  let relayKubeconfig: string;

  before(async () => {
    east = bed.member('east');
    west = bed.member('west');
    const home = bed.home();
    ({ relay, kubeconfig: relayKubeconfig } = await relayToHome(home, dir(), 'west'));
    await bed.startReplica(east, 'shared', 'shared-0', { domains: [SHARED] });
    for (const pod of ['shared-0', 'shared-1'])
      await bed.startReplica(west, 'shared', pod, { domains: [SHARED], flags: ['--federation-kubeconfig', relayKubeconfig] });
  });
  after(async () => {
    await relay?.close();
  });

  const westReplicas = (): Replica[] => replicas.filter((r) => r.member === 'west');
  const signedBy = (rs: Replica[]): number => rs.reduce((n, r) => n + (r.emulator.stats().issuances[SHARED] ?? 0), 0);
  const anyChange = (): Array<(listener: () => void) => () => void> => changesOf(replicas);
  const agreed = (): string | undefined => agreedIn(replicas);
  const where = () => [
    { cp: bed.home(), ns: HOME_NS },
    { cp: east.cp, ns: NS },
    { cp: west.cp, ns: NS },
  ];

  /**
   * Once west's local writer has read its local copy `n` more times with the home cut off, or `done` holds.
   * A loop whose copy is not due sleeps until its next check (--check-interval 1h): the clock moves past it
   * before each read.
   */
  async function westOutageReads(n: number, done: () => boolean): Promise<void> {
    const reads = (): number => logged(westReplicas(), /^federation home unreachable: local read$/);
    for (let i = 0; i < n && !done(); i++) {
      const start = reads();
      clock.jump(61 * 60_000);
      await until(`read ${i + 1} of ${n} of west with the home cut off`, () => done() || reads() > start, anyChange(), 30_000);
    }
  }

  /** Every replica holds a certificate valid now. */
  const valid = (): boolean => replicas.every((r) => clock.now() < (current(r)?.info.notAfter ?? 0));

  /** West's replicas stopped and out of `replicas`: nothing of west runs. */
  async function stopWest(): Promise<void> {
    for (const r of westReplicas()) {
      await r.stop();
      replicas.splice(replicas.indexOf(r), 1);
    }
  }

  /** The clock a minute past the safety point of `cert` (west's copy), by `replica`'s settings. */
  function jumpPastSafetyPoint(cert: X509Certificate, replica: Replica): void {
    const copy = { notBefore: cert.validFromDate.getTime(), notAfter: cert.validToDate.getTime() };
    clock.jumpTo(Math.max(breakGlassPoint(copy, replica.config.renewal, replica.config.readinessLeadMs), clock.now()) + 60_000);
  }

  /** West's local writer breaks glass (its log says so, once the certificate is stored locally). */
  async function westBreaksGlass(from: number): Promise<void> {
    await until('west breaks glass', () => logged(westReplicas(), /^break-glass: issued/) > from, anyChange(), 30_000);
  }

  it('breaks glass in the window of the copy it held, while the home renewed for the others', async () => {
    await until('every replica holds the first certificate', () => agreed() !== undefined, anyChange(), 60_000);
    const first = current(replicas[0]!)!;
    assert.equal(bed.issued(SHARED), 1);
    const config = replicas[0]!.config;
    let local: SecretView;
    relay.cut();
    try {
      // The home's writer (east, or west's before the cut: its home Lease lapses in 3 s) renews at the renewal
      // point; west, cut off, serves its copy until that copy's safety point.
      clock.jumpTo(renewalTime(first.info, config.renewal) + 60_000);
      await until('east holds the home renewal', () => serial(replicas[0]!) !== first.info.serial, anyChange(), 60_000);
      assert.equal(bed.issued(SHARED), 2, 'one renewal by the home writer');
      for (const r of westReplicas()) assert.equal(serial(r), first.info.serial, 'west serves its copy before the safety point');
      clock.jumpTo(breakGlassPoint(first.info, config.renewal, config.readinessLeadMs) + 60_000);
      await westBreaksGlass(0);
      assert.equal(signedBy(westReplicas()), 1, 'west breaks glass once in the window of its copy');
      local = await secretAt(west.cp, NS, SHARED);
      assert.ok(local.annotations[BREAK_GLASS]?.startsWith(local.serial), 'west records its break-glass certificate');
      await westOutageReads(5, () => signedBy(westReplicas()) > 1);
      assert.equal(signedBy(westReplicas()), 1, 'never a second in that window');
    } finally {
      relay.restore();
    }
    // West back: its certificate is the newest (issued at its safety point, after the home's renewal): the
    // record everywhere; the record at west is superseded once west holds the home's copy.
    await secretsHold(where(), SHARED, local.serial, anyChange, 30_000);
    await until('every replica holds the break-glass certificate', () => agreed() === local.serial, anyChange(), 30_000);
    assert.equal(bed.issued(SHARED), 3);
    await until('west supersedes its record', () => logged(westReplicas(), /^break-glass record superseded/) > 0, anyChange(), 30_000);
    assert.equal((await secretAt(west.cp, NS, SHARED)).annotations[BREAK_GLASS], undefined, "west's record is gone");
  });

  it("cut off again across that certificate's renewal and safety point: its own break-glass issuance, never an expired copy", async () => {
    const adopted = current(replicas[0]!)!;
    const config = replicas[0]!.config;
    const orders = bed.issued(SHARED);
    let local: SecretView;
    relay.cut();
    try {
      clock.jumpTo(renewalTime(adopted.info, config.renewal) + 60_000);
      await until('east holds the home renewal', () => serial(replicas[0]!) !== adopted.info.serial, anyChange(), 60_000);
      assert.equal(bed.issued(SHARED), orders + 1, 'the home writer renews for the others');
      const westBefore = signedBy(westReplicas());
      const glassBefore = logged(westReplicas(), /^break-glass: issued/);
      clock.jumpTo(breakGlassPoint(adopted.info, config.renewal, config.readinessLeadMs) + 60_000);
      await westBreaksGlass(glassBefore);
      assert.equal(signedBy(westReplicas()), westBefore + 1, 'west breaks glass in the window of the certificate adopted everywhere (264753e: never)');
      local = await secretAt(west.cp, NS, SHARED);
      assert.equal(local.annotations[BREAK_GLASS], `${local.serial} replacing ${adopted.info.serial}`, 'the record names the window it was spent in');
      await until('both west replicas hold it', () => westReplicas().every((r) => serial(r) === local.serial), anyChange(), 30_000);

      // Past the adopted certificate's expiry, still cut off: west serves its own, valid; nothing more is signed.
      clock.jumpTo(adopted.info.notAfter + 60_000);
      await westOutageReads(5, () => signedBy(westReplicas()) > westBefore + 1);
      assert.equal(signedBy(westReplicas()), westBefore + 1, 'one break-glass issuance in that window');
      for (const r of westReplicas()) {
        const held = current(r);
        assert.ok(held && clock.now() < held.info.notAfter, `west/${r.pod} holds a valid certificate`);
      }
      assert.equal(logged(westReplicas(), /^issuance ledger unusable/), 0, 'a break-glass issuance is a renewal: no ledger asked');
    } finally {
      relay.restore();
    }
    // West's is the newest (issued at the safety point, after the home's renewal): the record everywhere.
    await secretsHold(where(), SHARED, local.serial, anyChange, 30_000);
  });

  it('a copy that expired while the member was cut off is renewed without the ledger at the home', async () => {
    // The clock passes the copy's whole margin at once (a CA that failed until then does the same): west's copy
    // expires unrenewed. The name was held: the issuance is a renewal, the ledger (at the home) not asked.
    await until('every replica holds one certificate', () => agreed() !== undefined, anyChange(), 60_000).catch((err: unknown) => {
      throw new Error(`${(err as Error).message}: ${replicas.map((r) => `${r.member}/${r.pod} ${serial(r)}`).join(', ')}`);
    });
    const held = current(replicas[0]!)!;
    const westBefore = signedBy(westReplicas());
    const glassBefore = logged(westReplicas(), /^break-glass: issued/);
    relay.cut();
    try {
      clock.jumpTo(held.info.notAfter + 60_000);
      await westBreaksGlass(glassBefore);
      assert.equal(logged(westReplicas(), /^issuance ledger unusable/), 0, 'the ledger is never asked (264753e: `issuance ledger unusable; not issuing`)');
      assert.equal(signedBy(westReplicas()), westBefore + 1, 'one break-glass renewal');
      const local = await secretAt(west.cp, NS, SHARED);
      assert.match(local.annotations[BREAK_GLASS] ?? '', new RegExp(`^${local.serial} replacing `), 'recorded');
      await until('both west replicas hold it', () => westReplicas().every((r) => serial(r) === local.serial), anyChange(), 30_000);
    } finally {
      relay.restore();
    }
    // East renewed its expired copy at the same moment: the later notAfter wins every Secret (a tie, both
    // issued in one second: the home's), and every replica serves what the Secrets hold (federation-tie.test.ts).
    await secretsHoldHomeCopy();
    const home = (await secretAt(bed.home(), HOME_NS, SHARED)).serial;
    await until("every replica serves the Secrets' copy", () => agreed() === home, anyChange(), 30_000);
  });

  it('a replica restarted after its only copy expired while cut off renews it without the ledger at the home', async () => {
    await until('every replica holds a valid certificate', valid, anyChange(), 30_000);
    const expiry = Math.max(...replicas.map((r) => current(r)!.info.notAfter));
    relay.cut();
    try {
      // Both west replicas stop; the copy in west's Secret expires while nothing of west runs.
      await stopWest();
      clock.jumpTo(expiry + 60_000);
      const restarted = await bed.startReplica(west, 'shared', 'shared-0', { domains: [SHARED], flags: ['--federation-kubeconfig', relayKubeconfig] });
      await westBreaksGlass(0);
      assert.equal(logged([restarted], /^issuance ledger unusable/), 0, 'the expired copy in the Secret says the name was held: no ledger asked');
      assert.equal(signedBy([restarted]), 1, 'one break-glass renewal');
      assert.ok(clock.now() < current(restarted)!.info.notAfter, 'it serves a valid certificate');
    } finally {
      relay.restore();
    }
    await until('every replica holds a valid certificate again', valid, anyChange(), 30_000);
  });

  it("cut off across its own break-glass certificate's lifetime: west breaks glass again, in that certificate's window", async () => {
    await until('every replica holds a valid certificate', valid, anyChange(), 30_000);
    const expiry = Math.max(...replicas.map((r) => current(r)!.info.notAfter));
    relay.cut();
    try {
      await stopWest();
      // What west's Secret holds once nothing of west writes it (a mirror of the home's may have landed last).
      const held = (await secretAt(west.cp, NS, SHARED)).serial;
      clock.jumpTo(expiry + 60_000);
      const restarted = await bed.startReplica(west, 'shared', 'shared-0', { domains: [SHARED], flags: ['--federation-kubeconfig', relayKubeconfig] });
      await westBreaksGlass(0);
      const first = await secretAt(west.cp, NS, SHARED);
      // The window is the expired copy's (on 06f08a1: `replacing none`, and once that certificate expired in turn
      // its window counted as spent: no call until the home came back).
      assert.equal(first.annotations[BREAK_GLASS], `${first.serial} replacing ${held}`, 'the record names the expired copy it renewed');
      clock.jumpTo(current(restarted)!.info.notAfter + 60_000);
      await westBreaksGlass(1);
      const second = await secretAt(west.cp, NS, SHARED);
      assert.equal(second.annotations[BREAK_GLASS], `${second.serial} replacing ${first.serial}`, "the next one is that certificate's window's");
      assert.equal(signedBy([restarted]), 2, 'one break-glass issuance per window');
      assert.ok(clock.now() < current(restarted)!.info.notAfter, 'it serves a valid certificate');
    } finally {
      relay.restore();
    }
    await until('every replica holds a valid certificate again', valid, anyChange(), 30_000);
  });

  it('restarted after its copy expired and a hand edit garbled it, cut off: west renews from the copy in its own files', async () => {
    await until('every replica holds a valid certificate', valid, anyChange(), 30_000);
    const expiry = Math.max(...replicas.map((r) => current(r)!.info.notAfter));
    const outDir = join(dir(), 'west-files');
    const flags = ['--federation-kubeconfig', relayKubeconfig, '--out-dir', outDir];
    let restarted: Replica | undefined;
    relay.cut();
    try {
      await stopWest();
      // A west replica projects the copy into its files (the Pod's volume, which outlives the container).
      const projecting = await bed.startReplica(west, 'shared', 'shared-0', { domains: [SHARED], flags });
      await until('west projects its copy', () => logged([projecting], /^certificate files written$/) > 0, anyChange(), 30_000);
      await projecting.stop();
      replicas.splice(replicas.indexOf(projecting), 1);
      // The copy expires while nothing of west runs, and a hand edit garbles the Secret's data.
      clock.jumpTo(expiry + 60_000);
      const edit = await west.cp.adminRequest('PATCH', `/api/v1/namespaces/${NS}/secrets/${SHARED}`, {
        headers: { 'content-type': 'application/merge-patch+json' },
        body: { data: { 'tls.crt': Buffer.from('not a certificate').toString('base64') } },
      });
      assert.equal(edit.status, 200, edit.body);
      restarted = await bed.startReplica(west, 'shared', 'shared-0', { domains: [SHARED], flags });
      // On main before this change: a first issuance, which waits for the ledger at the unreachable home.
      await westBreaksGlass(0);
      assert.equal(logged([restarted], /^issuance ledger unusable/), 0, "the files' expired copy says the name was held: no ledger asked");
      assert.equal(signedBy([restarted]), 1, 'one break-glass renewal');
    } finally {
      relay.restore();
    }
    await until('every replica holds a valid certificate again', valid, anyChange(), 30_000);
    // Stopped here: it writes into the test's directory, which goes before the bed's replicas stop.
    await restarted?.stop();
    if (restarted) replicas.splice(replicas.indexOf(restarted), 1);
  });

  it("the home writer's call hangs while west's break-glass copy reaches the home: the call is cancelled, the copy used at once", async () => {
    // Chaos seed 50 on da2c0a8: the group's certificate expired while the CA failed every call of the home's
    // writer; a cut-off member broke glass and pushed its certificate to the home when it came back, but the
    // home writer's next call hung (up to --cert-timeout, 5 minutes) and only after it did its Secret and files
    // take the valid copy: its members' files held an expired certificate meanwhile.
    if (westReplicas().length === 0)
      await bed.startReplica(west, 'shared', 'shared-0', { domains: [SHARED], flags: ['--federation-kubeconfig', relayKubeconfig] });
    await until('every replica holds a valid certificate', valid, anyChange(), 30_000);
    const eastReplica = replicas.find((r) => r.member === 'east')!;
    const expiry = Math.max(...replicas.map((r) => current(r)!.info.notAfter));
    const hangs = (): number => eastReplica.emulator.stats().certResponses[SHARED]?.hang ?? 0;
    const eastSigned = signedBy([eastReplica]);
    const glassBefore = logged(westReplicas(), /^break-glass: issued/);
    const attempts: string[] = [];
    const attempted = (a: { result: string }): number => attempts.push(a.result);
    eastReplica.daemon.events.on('attempt', attempted);
    eastReplica.emulator.injectFault({ target: 'cert', kind: 'hang', domain: SHARED });
    let local: SecretView;
    relay.cut();
    try {
      clock.jumpTo(expiry + 60_000);
      await westBreaksGlass(glassBefore);
      local = await secretAt(west.cp, NS, SHARED);
      const calls = onEvent(eastReplica.emulator.events, 'certResponse');
      await until("east's call hangs", () => hangs() > 0, [calls, ...anyChange()], 30_000);
    } finally {
      relay.restore();
    }
    // West, back, writes its copy to the home; east's writer sees it there while its call still hangs.
    await until("east holds west's copy", () => serial(eastReplica) === local.serial, anyChange(), 30_000);
    eastReplica.daemon.events.off('attempt', attempted);
    // On da2c0a8 the call ran to its timeout (`error`) before east took the copy.
    assert.deepEqual(attempts, ['superseded'], 'the hung call was cancelled for the copy');
    assert.equal(signedBy([eastReplica]), eastSigned, 'east signed nothing');
    await secretsHold(where(), SHARED, local.serial, anyChange, 30_000);
  });

  /** Every Secret (the home's, east's, west's) holds the home's copy, read again while it still moves (a mirror after a tie). */
  async function secretsHoldHomeCopy(): Promise<void> {
    for (let attempt = 1; ; attempt++) {
      const home = (await secretAt(bed.home(), HOME_NS, SHARED)).serial;
      try {
        await secretsHold(where(), SHARED, home, anyChange, 10_000);
        return;
      } catch (err) {
        if (attempt === 3) throw err;
      }
    }
  }

  it("a tenant of west's namespace (admin) puts the replaced pair back, drops the record, restarts west: no second break-glass", async () => {
    // The tenant: the rights of the default `admin` role (`edit`'s with them): it reads and writes the Secret and
    // deletes the Pods.
    const tenant = await namespaceAdmin(west.cp, NS, 'tenant');
    // West's platform keeps break-glass claims from the namespace's roles (manifests/base).
    await applyClaimsPolicy(west.cp);
    await claimsPolicyInForce(west.cp, NS, tenant);
    const secretPath = `/api/v1/namespaces/${NS}/secrets/${SHARED}`;
    const readSecret = async (): Promise<{ metadata: { annotations?: Record<string, string> }; data: Record<string, string> }> => {
      const res = await asAccount(west.cp, tenant, 'GET', secretPath);
      assert.equal(res.status, 200, res.body);
      return JSON.parse(res.body) as { metadata: { annotations?: Record<string, string> }; data: Record<string, string> };
    };
    await stopWest();
    const writer = await bed.startReplica(west, 'shared', 'shared-0', { domains: [SHARED], flags: ['--federation-kubeconfig', relayKubeconfig] });
    await until('every replica holds a valid certificate', valid, anyChange(), 30_000);
    // Every pair the tenant sees in the Secret, by serial: it puts back the one the break-glass replaced.
    const seen = new Map<string, Record<string, string>>();
    const keep = async (): Promise<X509Certificate> => {
      const { data } = await readSecret();
      const cert = new X509Certificate(Buffer.from(data['tls.crt']!, 'base64'));
      seen.set(cert.serialNumber, data);
      return cert;
    };
    await keep();
    let restarted: Replica | undefined;
    relay.cut();
    try {
      jumpPastSafetyPoint(await keep(), writer);
      await westBreaksGlass(0);
      assert.equal(signedBy([writer]), 1, 'west breaks glass once in the window');
      const window = / replacing ([0-9A-F]+)$/.exec((await readSecret()).metadata.annotations?.[BREAK_GLASS] ?? '')?.[1];
      const pairBefore = seen.get(window ?? '');
      assert.ok(pairBefore, `the tenant kept the replaced pair ${window}`);

      // The tenant deletes the Pods (their files go with them), puts the replaced pair back and drops the record.
      await stopWest();
      const edited = await readSecret();
      delete edited.metadata.annotations?.[BREAK_GLASS];
      edited.data = { ...edited.data, 'tls.crt': pairBefore['tls.crt']!, 'tls.key': pairBefore['tls.key']! };
      const put = await asAccount(west.cp, tenant, 'PUT', secretPath, edited);
      assert.equal(put.status, 200, put.body);
      // The claims are out of its reach.
      const claims = await west.cp.adminRequest('GET', `/apis/coordination.k8s.io/v1/namespaces/${NS}/leases?labelSelector=certshare.io/break-glass-claim`);
      for (const { metadata } of (JSON.parse(claims.body) as { items: Array<{ metadata: { name: string } }> }).items) {
        const path = `/apis/coordination.k8s.io/v1/namespaces/${NS}/leases/${metadata.name}`;
        assert.equal((await asAccount(west.cp, tenant, 'DELETE', path)).status, 403, `the tenant deletes the claim ${metadata.name}`);
      }

      restarted = await bed.startReplica(west, 'shared', 'shared-0', { domains: [SHARED], flags: ['--federation-kubeconfig', relayKubeconfig] });
      // Its writer decides once it holds the local Lease and has read its copy with the home cut off.
      const spent = (): boolean => restarted!.log.entries.some((e) => e.code === 'CERTSHARE_BREAK_GLASS_SPENT');
      await until("west's writer decides on the window", () => spent() || signedBy([restarted!]) > 0, anyChange(), 30_000);
      await westOutageReads(5, () => signedBy([restarted!]) > 0);
      assert.equal(signedBy([restarted]), 0, 'no second break-glass issuance in the window (6472496: one more each time)');
      assert.equal(serial(restarted), window, 'west serves the pair put back, valid until its expiry');
      assert.ok(spent(), 'the writer says the window is spent');

      // Then the Secret emptied of its pair and west restarted again: no copy, but a claim of this member's, so no
      // window of its own (on the claims' names alone: one more, `replacing none`). Without an issuance budget: with
      // one, a name the member does not know it held waits for the ledger at the unreachable home anyway.
      await stopWest();
      const emptied = await readSecret();
      delete emptied.metadata.annotations?.[BREAK_GLASS];
      emptied.data = { ...emptied.data, 'tls.crt': Buffer.from('not a certificate').toString('base64') };
      const garbled = await asAccount(west.cp, tenant, 'PUT', secretPath, emptied);
      assert.equal(garbled.status, 200, garbled.body);
      const flags = ['--federation-kubeconfig', relayKubeconfig, '--issuance-budget', '0'];
      const again = await bed.startReplica(west, 'shared', 'shared-0', { domains: [SHARED], flags });
      const refusedNone = (): boolean => again.log.entries.some((e) => e.code === 'CERTSHARE_BREAK_GLASS_SPENT');
      await until("west's writer decides on no copy", () => refusedNone() || signedBy([again]) > 0, anyChange(), 30_000);
      await westOutageReads(3, () => signedBy([again]) > 0);
      assert.equal(signedBy([again]), 0, 'no break-glass issuance replacing none after a claim');
      assert.ok(refusedNone(), 'the writer says so');
    } finally {
      relay.restore();
    }
    await until('every replica holds a valid certificate again', valid, anyChange(), 30_000);
  });

  /** `body` with west cut off from the home; then, west back, every replica holds a valid certificate again. */
  async function withWestCutOff(body: () => Promise<void>): Promise<void> {
    relay.cut();
    try {
      await body();
    } finally {
      relay.restore();
    }
    await until('every replica holds a valid certificate again', valid, anyChange(), 30_000);
  }

  /** Once `refusal` is removed, `writer` breaks glass: one issuance more than it had signed before. */
  async function breaksGlassOnceAdmitted(
    refusal: { remove(): Promise<void> },
    writer: Replica,
    before: { signed: number; glass: number },
    why: string,
  ): Promise<void> {
    await refusal.remove();
    await westOutageReads(3, () => logged([writer], /^break-glass: issued/) > before.glass);
    await westBreaksGlass(before.glass);
    assert.equal(signedBy([writer]), before.signed + 1, why);
  }

  /** West's break-glass claims, by name. */
  async function westClaims(): Promise<string[]> {
    const res = await west.cp.adminRequest('GET', `/apis/coordination.k8s.io/v1/namespaces/${NS}/leases?labelSelector=certshare.io/break-glass-claim`);
    return (JSON.parse(res.body) as { items: Array<{ metadata: { name: string } }> }).items.map((lease) => lease.metadata.name);
  }

  it('a writer that cannot call yet claims nothing: the claim is the last step before the call (chaos seed 51)', async () => {
    // Seed 51 on fc0720c: two writers of a cut-off member took the window's two claims and were killed before calling
    // (one while its intent's write failed, one while another writer's intent stood): the third, a valid copy at
    // hand nowhere, served the expired one. Here the intent's write is refused until the policy goes.
    await until('every replica holds a valid certificate', valid, anyChange(), 30_000);
    const writer = westReplicas()[0]!;
    const claimsBefore = await westClaims();
    const noIntent = await secretUpdatesRefusedIn(
      west.cp,
      'test-no-intent',
      "!has(object.metadata.annotations) || !('certshare.io/issuing' in object.metadata.annotations)",
      { metadata: { annotations: { 'certshare.io/issuing': '{"holder":"probe","at":"2026-01-01T00:00:00.000Z"}' } } },
    );
    const before = signedBy([writer]);
    const glassBefore = logged([writer], /^break-glass: issued/);
    const intentRefused = (): number => logged([writer], /^could not record the issuance intent/);
    try {
      await withWestCutOff(async () => {
        jumpPastSafetyPoint(new X509Certificate(current(writer)!.pair.certPem), writer);
        await until("west's writer is refused its intent", () => intentRefused() > 0 || signedBy([writer]) > before, anyChange(), 30_000);
        assert.deepEqual(await westClaims(), claimsBefore, 'no claim while it cannot call (fc0720c: the first claim, spent)');
        await breaksGlassOnceAdmitted(noIntent, writer, { signed: before, glass: glassBefore }, 'one break-glass issuance, once it could call');
      });
    } finally {
      await noIntent.remove();
    }
  });

  it('a claim the apiserver refuses: no break-glass issuance, CERTSHARE_BREAK_GLASS_UNCLAIMED once; once it may, the claim and the issuance', async () => {
    await until('every replica holds a valid certificate', valid, anyChange(), 30_000);
    // A policy of west's refusing every claim (admission holds for cluster administrators too).
    const noClaims = await refusesIn(
      west.cp,
      'test-no-claims',
      { apiGroups: ['coordination.k8s.io'], resources: ['leases'], operations: ['CREATE'] },
      "!object.metadata.name.startsWith('certshare-glass-')",
      () =>
        west.cp.adminRequest('POST', `/apis/coordination.k8s.io/v1/namespaces/${NS}/leases?dryRun=All`, {
          body: { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: 'certshare-glass-probe' } },
        }),
    );
    const writer = westReplicas()[0]!;
    // Counted from here: the writer has run since an earlier test, whose window's closing claim may have failed once
    // (the same code, logged at that test's time).
    const mark = writer.log.entries.length;
    const unclaimed = (): number => writer.log.entries.slice(mark).filter((e) => e.code === 'CERTSHARE_BREAK_GLASS_UNCLAIMED').length;
    const before = signedBy([writer]);
    const glassBefore = logged([writer], /^break-glass: issued/);
    try {
      await withWestCutOff(async () => {
        const res = await west.cp.adminRequest('GET', `/api/v1/namespaces/${NS}/secrets/${SHARED}`);
        const data = (JSON.parse(res.body) as { data: Record<string, string> }).data;
        jumpPastSafetyPoint(new X509Certificate(Buffer.from(data['tls.crt']!, 'base64')), writer);
        await until('west is refused its claim (or issues)', () => unclaimed() > 0 || signedBy([writer]) > before, anyChange(), 30_000);
        await westOutageReads(3, () => signedBy([writer]) > before);
        assert.equal(signedBy([writer]), before, 'no break-glass issuance without the claim (6472496: one)');
        assert.equal(unclaimed(), 1, 'the error once, not at every attempt');
        await breaksGlassOnceAdmitted(noClaims, writer, { signed: before, glass: glassBefore }, 'claimed at a later attempt: one break-glass issuance');
      });
    } finally {
      await noClaims.remove();
    }
  });

  it("a claim a tenant dates 9999 holds nothing back: west breaks glass in its window, the claim's time counted as out of bounds", async () => {
    await until('every replica holds a valid certificate', valid, anyChange(), 30_000);
    // Any Lease creator of the namespace (the default `admin` role) may create a Lease labelled as west's claims.
    const tenant = await namespaceAdmin(west.cp, NS, 'tenant-9999');
    const leases = `/apis/coordination.k8s.io/v1/namespaces/${NS}/leases`;
    const claims = await west.cp.adminRequest('GET', `${leases}?labelSelector=certshare.io/break-glass-claim`);
    const of = (JSON.parse(claims.body) as { items: Array<{ metadata: { labels: Record<string, string> } }> }).items[0]?.metadata.labels[
      'certshare.io/break-glass-of'
    ];
    assert.ok(of, "the earlier tests left claims of west's, labelled with the name they guard");
    const forged = {
      apiVersion: 'coordination.k8s.io/v1',
      kind: 'Lease',
      metadata: {
        name: 'tenant-claim-9999',
        labels: { 'certshare.io/break-glass-claim': 'last', 'certshare.io/break-glass-of': of },
        annotations: { 'certshare.io/break-glass-not-after': '9999-12-31T00:00:00.000Z' },
      },
    };
    const created = await asAccount(west.cp, tenant, 'POST', leases, forged);
    assert.equal(created.status, 201, created.body);
    const writer = westReplicas()[0]!;
    const before = signedBy([writer]);
    const glassBefore = logged([writer], /^break-glass: issued/);
    const ignored = (): boolean =>
      writer.log.entries.some((e) => e.code === 'CERTSHARE_UNTRUSTED_VALUE' && e.field === 'break-glass-claim' && /9999-12-31/.test(e.msg ?? ''));
    relay.cut();
    try {
      const res = await west.cp.adminRequest('GET', `/api/v1/namespaces/${NS}/secrets/${SHARED}`);
      const data = (JSON.parse(res.body) as { data: Record<string, string> }).data;
      jumpPastSafetyPoint(new X509Certificate(Buffer.from(data['tls.crt']!, 'base64')), writer);
      await westOutageReads(3, () => logged([writer], /^break-glass: issued/) > glassBefore);
      await westBreaksGlass(glassBefore);
      assert.equal(signedBy([writer]), before + 1, 'one break-glass issuance in the window (before 46736a0: none, for good)');
      assert.ok(ignored(), 'the forged time logged as a value out of its bound (7bec7cd: ignored silently)');
    } finally {
      relay.restore();
    }
    // The home's copy (west's if newer; the home's on a tie) in every Secret before the next test reads east's.
    await until('every replica holds a valid certificate again', valid, anyChange(), 30_000);
    await secretsHoldHomeCopy();
  });

  /** The label value of west's claims of the name (the earlier tests left some). */
  async function claimsOf(): Promise<string> {
    const res = await west.cp.adminRequest('GET', `${LEASES}?labelSelector=certshare.io/break-glass-claim`);
    const of = (JSON.parse(res.body) as { items: Array<{ metadata: { labels: Record<string, string> } }> }).items[0]?.metadata.labels[
      'certshare.io/break-glass-of'
    ];
    assert.ok(of, "the earlier tests left claims of west's, labelled with the name they guard");
    return of;
  }

  /** Leases `tenant` creates labelled as west's claims of the name, named as claims are; their creation stamp. */
  async function tenantClaims(tenant: string, annotations: Array<Record<string, string>>): Promise<number> {
    const of = await claimsOf();
    let stamp = 0;
    for (const annotation of annotations) {
      const lease = {
        apiVersion: 'coordination.k8s.io/v1',
        kind: 'Lease',
        metadata: {
          name: `certshare-glass-${randomBytes(16).toString('hex')}`,
          labels: { 'certshare.io/break-glass-claim': 'first', 'certshare.io/break-glass-of': of },
          annotations: annotation,
        },
      };
      const created = await asAccount(west.cp, tenant, 'POST', LEASES, lease);
      assert.equal(created.status, 201, created.body);
      stamp = Math.max(stamp, Date.parse((JSON.parse(created.body) as { metadata: { creationTimestamp: string } }).metadata.creationTimestamp));
    }
    return stamp;
  }

  /** West, cut off past its copy's safety point, breaks glass once (the other west replica may be its writer). */
  async function westBreaksGlassOnce(why: string): Promise<void> {
    const before = signedBy(westReplicas());
    const glassBefore = logged(westReplicas(), /^break-glass: issued/);
    await withWestCutOff(async () => {
      const res = await west.cp.adminRequest('GET', `/api/v1/namespaces/${NS}/secrets/${SHARED}`);
      const data = (JSON.parse(res.body) as { data: Record<string, string> }).data;
      jumpPastSafetyPoint(new X509Certificate(Buffer.from(data['tls.crt']!, 'base64')), westReplicas()[0]!);
      await westOutageReads(3, () => logged(westReplicas(), /^break-glass: issued/) > glassBefore);
      await westBreaksGlass(glassBefore);
      assert.equal(signedBy(westReplicas()), before + 1, why);
    });
    await secretsHoldHomeCopy();
  }

  it("101 Leases a tenant labels as west's claims of the name, named as claims: west still breaks glass once in its window", async () => {
    await until('every replica holds a valid certificate', valid, anyChange(), 30_000);
    const tenant = await namespaceAdmin(west.cp, NS, 'tenant-flood');
    await tenantClaims(
      tenant,
      Array.from({ length: 101 }, () => ({})),
    );
    // Named as claims, nobody but a cluster administrator deletes them (certshare-break-glass-claims).
    const one = (await westClaims()).find((name) => /^certshare-glass-[0-9a-f]{32}$/.test(name))!;
    assert.equal((await asAccount(west.cp, tenant, 'DELETE', `${LEASES}/${one}`)).status, 403);
    await westBreaksGlassOnce('one break-glass issuance (1043d72: none, "more than 100 break-glass claims", for every window of the name)');
  });

  it('claims a tenant dates a lifetime and more ahead, written once, never come due: west breaks glass past its safety point', async () => {
    await until('every replica holds a valid certificate', valid, anyChange(), 30_000);
    const tenant = await namespaceAdmin(west.cp, NS, 'tenant-ahead');
    // Every 5 days for 4 months past one lifetime from now: none believable now. On 1043d72 each was believed once
    // now came within a lifetime of it (at west's safety point, some 2 months ahead: a newer certificate recorded).
    const now = clock.now();
    const ahead = Array.from({ length: 24 }, (_, i) => ({
      'certshare.io/break-glass-not-after': new Date(now + LIFETIME + (i + 1) * 5 * DAY).toISOString(),
    }));
    const stamp = await tenantClaims(tenant, ahead);
    // The apiserver stamps whole seconds: the clock moves once that second has passed, so the stamp reads before it.
    while (Date.now() < stamp + 1000) await new Promise((resolve) => setTimeout(resolve, 50));
    await westBreaksGlassOnce("one break-glass issuance in its copy's window (1043d72: none, an earlier claim recorded a newer certificate)");
  });

  it("a tenant creates the current window's two claims before west: no break-glass in that window (what remains), west's next window its own", async () => {
    await until('every replica holds a valid certificate', valid, anyChange(), 30_000);
    const tenant = await namespaceAdmin(west.cp, NS, 'tenant-first');
    const of = await claimsOf();
    const writer = westReplicas()[0]!;
    const read = await west.cp.adminRequest('GET', `/api/v1/namespaces/${NS}/secrets/${SHARED}`);
    const copy = new X509Certificate(Buffer.from((JSON.parse(read.body) as { data: Record<string, string> }).data['tls.crt']!, 'base64'));
    // West's writer breaks glass in the window of the copy its Secret holds when it reads it cut off: this one.
    const window = copy.serialNumber;
    // Their names are computed from the serial the Secret (and every handshake) shows; the tenant writes what the writer would.
    const names = breakGlassClaimNames('shared', SHARED, window);
    for (const [name, which] of [
      [names.first, 'first'],
      [names.last, 'last'],
    ] as const) {
      const lease = {
        apiVersion: 'coordination.k8s.io/v1',
        kind: 'Lease',
        metadata: { name, labels: { 'certshare.io/break-glass-claim': which, 'certshare.io/break-glass-of': of } },
        spec: { holderIdentity: `${writer.pod}_forged` },
      };
      const created = await asAccount(west.cp, tenant, 'POST', LEASES, lease);
      assert.equal(created.status, 201, created.body);
    }
    const before = signedBy(westReplicas());
    const spent = (): boolean => westReplicas().some((r) => r.log.entries.some((e) => e.code === 'CERTSHARE_BREAK_GLASS_SPENT' && e.window === window));
    await withWestCutOff(async () => {
      jumpPastSafetyPoint(copy, writer);
      await until("west's writer decides on the window", () => spent() || signedBy(westReplicas()) > before, anyChange(), 30_000);
      await westOutageReads(5, () => signedBy(westReplicas()) > before);
      assert.equal(signedBy(westReplicas()), before, 'no break-glass issuance in the window the tenant took');
      assert.ok(spent(), 'the writer says the window is spent');
    });
    await secretsHoldHomeCopy();
    // Later windows are named by serials nobody knows yet: the tenant's claims hold that one window only.
    await westBreaksGlassOnce("one break-glass issuance in west's next window");
  });

  it("a hand edit of east's own Secret, its one replica reading through the home: that replica puts the home's copy back", async () => {
    const eastReplica = replicas.find((r) => r.member === 'east')!;
    await until('east holds a valid certificate', () => clock.now() < (current(eastReplica)?.info.notAfter ?? 0), anyChange(), 30_000);
    const held = current(eastReplica)!.info.serial;
    const orders = bed.issued(SHARED);
    const edit = await east.cp.adminRequest('PATCH', `/api/v1/namespaces/${NS}/secrets/${SHARED}`, {
      headers: { 'content-type': 'application/merge-patch+json' },
      body: { data: { 'tls.crt': Buffer.from('not a certificate').toString('base64') } },
    });
    assert.equal(edit.status, 200, edit.body);
    // No other candidate in east holds the pair: only the writer, whose home and last local pair agree, can (on
    // main before this change it read the two as in sync and left the garbage).
    await secretsHold([{ cp: east.cp, ns: NS }], SHARED, held, anyChange, 30_000);
    assert.equal(bed.issued(SHARED), orders, 'put back, not issued');
  });
});

describe("a mirror into a member's Secret that did not go through (chaos seed 56)", () => {
  const bed = useFederation(['shared']);
  const { clock, replicas } = bed;
  let west: Member;

  before(async () => {
    west = bed.member('west');
    await bed.startReplica(bed.member('east'), 'shared', 'shared-0', { domains: [SHARED] });
    for (const pod of ['shared-0', 'shared-1']) await bed.startReplica(west, 'shared', pod, { domains: [SHARED] });
  });

  const westReplicas = (): Replica[] => replicas.filter((r) => r.member === 'west');
  const anyChange = (): Array<(listener: () => void) => () => void> => changesOf(replicas);
  const agreed = (): string | undefined => agreedIn(replicas);

  it("a mirror into west's Secret that did not go through is tried again soon, not at the loop's next look (chaos seed 56)", async () => {
    // Seed 56 on 5fc7779: a member's writer could not write the home's renewal into its Secret ("trying again at the
    // next read"); its copy not due, its next read was its check interval away, and the member's reader projected
    // the copy the home had replaced until it expired. Here west's Secret refuses a new certificate for a while.
    await until('every replica holds the first certificate', () => agreed() !== undefined, anyChange(), 60_000);
    const held = agreed()!;
    const first = current(replicas[0]!)!.info;
    const noNewPair = await secretUpdatesRefusedIn(west.cp, 'test-no-new-pair', '!has(oldObject.data) || !has(object.data) || object.data == oldObject.data', {
      data: { 'tls.crt': Buffer.from('probe').toString('base64') },
    });
    const refusedMirrors = (): number =>
      logged(westReplicas(), /^(federation mirror write did not go through|could not mirror the new certificate locally yet)/);
    const refusedBefore = refusedMirrors();
    let renewed: string | undefined;
    try {
      clock.jumpTo(renewalTime(first, replicas[0]!.config.renewal) + 60_000);
      const eastReplica = replicas.find((r) => r.member === 'east')!;
      await until('east holds the renewal', () => serial(eastReplica) !== held, anyChange(), 60_000);
      renewed = serial(eastReplica);
      await secretsHold([{ cp: bed.home(), ns: HOME_NS }], SHARED, renewed!, anyChange, 30_000);
      await until("west's writer is refused the renewal's mirror", () => refusedMirrors() > refusedBefore, anyChange(), 30_000);
      assert.equal((await secretAt(west.cp, NS, SHARED)).serial, held, "west's Secret still holds the replaced copy");
    } finally {
      await noNewPair.remove();
    }
    // A second and a bit on (the first retry), within every Lease's 3 s and long before the next look a copy not due
    // gets (--check-interval 1h): the mirror is tried again.
    clock.jump(1100);
    await secretsHold([{ cp: west.cp, ns: NS }], SHARED, renewed!, anyChange, 30_000);
    await until("west's replicas hold the home's renewal", () => westReplicas().every((r) => serial(r) === renewed), anyChange(), 30_000);
  });
});
