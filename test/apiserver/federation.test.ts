// The federation home (issue 34, docs/federation.md) against three real kube-apiservers with etcd: the home and
// two member clusters. Group `shared` serves one name in both members (two replicas in A, one in B); A also runs
// group `alpha`, B group `beta`, each its own name. Every replica has its own LocalAPI emulator standing in for
// tailscaled (the emulators count the certificates they sign). A JumpClock shared by the daemons and the
// emulators skips the days of a 90-day certificate's life; everything else runs at the pace of real I/O.
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { writeFile, readFile } from 'node:fs/promises';
import { createServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { before, describe, it } from 'node:test';
import { breakGlassPoint } from '../../src/core/federation/home-verdicts.ts';
import { renewalTime } from '../../src/core/renewal/renewal.ts';
import { connectKube } from '../../src/kube/connection.ts';
import { requestRenewal } from '../../src/kube/secret-renew-request.ts';
import type { ControlPlane } from '../harness/control-plane.ts';
import {
  DAY,
  HOME_NS,
  NS,
  secretAt,
  secretsHold as secretsHoldAt,
  serialOfPem,
  useFederation,
  type FederatedReplica as Replica,
  type Member,
  type SecretView,
} from '../support/federation.ts';
import { makePair, selfSignedPair, testCa } from '../support/certs.ts';
import { KUBE_DOMAIN, must } from '../support/kube.ts';
import { asAccount } from '../support/token-request.ts';
import { useTempDir } from '../support/standalone.ts';
import type { LogEntry } from '../support/recording-logger.ts';
import { onEvent, until } from '../support/wait.ts';

const SHARED = 'shared.tailnet-0000.ts.net';
const ALPHA = 'alpha.tailnet-0000.ts.net';
const BETA = 'beta.tailnet-0000.ts.net';
const GROUPS: Record<string, string> = { shared: SHARED, alpha: ALPHA, beta: BETA };
const FEDERATION = fileURLToPath(new URL('../../manifests/federation', import.meta.url));

describe('the federation home: three apiservers, two members, one shared name', () => {
  const dir = useTempDir();
  const bed = useFederation(Object.keys(GROUPS));
  const { clock, replicas, member, issued } = bed;
  let home: ControlPlane;
  let members: Member[] = [];
  let homeKubeconfig: string;
  before(() => {
    home = bed.home();
    members = bed.members();
    homeKubeconfig = bed.homeKubeconfig();
  });

  /** A replica of `group` in member `m` (namespace NS unless given), its home the admin's HOME_NS unless `extra` says otherwise. */
  function startMemberReplica(
    m: Member,
    group: string,
    pod: string,
    extra: string[] = [],
    where: { domain?: string; namespace?: string } = {},
  ): Promise<Replica> {
    return bed.startReplica(m, group, pod, { domains: [where.domain ?? GROUPS[group]!], flags: extra, namespace: where.namespace });
  }

  const of = (domain: string): Replica[] => replicas.filter((r) => r.domain === domain);
  const held = (r: Replica): string | undefined => r.daemon.manager.loop(r.domain)?.current?.info.serial;
  const heldCert = (r: Replica) => r.daemon.manager.loop(r.domain)?.current;
  const anyChange = (): Array<(listener: () => void) => () => void> =>
    replicas.flatMap((r) => [onEvent(r.daemon.events, 'planned'), onEvent(r.daemon.events, 'attempt'), onEvent(r.log.events, 'entry')]);

  /** Every replica of `domain` holds one and the same certificate, other than those in `not`. */
  const agreed = (domain: string, not: Set<string> = new Set()): string | undefined => {
    const serials = new Set(of(domain).map(held));
    const [serial] = serials;
    return serials.size === 1 && serial !== undefined && !not.has(serial) ? serial : undefined;
  };
  async function converge(domain: string, not: Set<string> = new Set(), timeoutMs = 30_000): Promise<string> {
    await until(
      `every replica of ${domain} holds one certificate (not ${[...not].join(', ')})`,
      () => agreed(domain, not) !== undefined,
      anyChange(),
      timeoutMs,
    );
    return agreed(domain, not)!;
  }

  /** The Secret of record at the home and the local Secrets of the members running `domain`, once they all hold `serial`. */
  const secretsHold = (domain: string, serial: string, timeoutMs = 15_000): Promise<SecretView[]> => {
    const where = [{ cp: home, ns: HOME_NS }, ...members.filter((m) => of(domain).some((r) => r.member === m.name)).map((m) => ({ cp: m.cp, ns: NS }))];
    return secretsHoldAt(where, domain, serial, anyChange, timeoutMs);
  };

  /**
   * Resolves once each listed replica's loop has read its local copy `n` times with the home away, or
   * as soon as `broken` holds (what the caller then asserts against).
   */
  async function outageReads(rs: Replica[], n: number, broken: () => boolean): Promise<void> {
    const count = (r: Replica): number => r.log.entries.filter((e) => e.msg === 'federation home unreachable: local read').length;
    const start = new Map(rs.map((r) => [r, count(r)]));
    // Only the local writer reads the home; the group has one per member.
    const byMember = new Map<string, Replica[]>();
    for (const r of rs) byMember.set(r.member, [...(byMember.get(r.member) ?? []), r]);
    await until(
      `${n} reads with the home away in each member`,
      () => broken() || [...byMember.values()].every((group) => group.some((r) => count(r) - start.get(r)! >= n)),
      [...rs.map((r) => onEvent(r.log.events, 'entry')), ...anyChange()],
      30_000,
    );
  }

  it('issues each name exactly once across both clusters, and renews it once per window', async () => {
    const east = member('east');
    const west = member('west');
    for (const [m, group, pod] of [
      [east, 'shared', 'shared-0'],
      [east, 'shared', 'shared-1'],
      [east, 'alpha', 'alpha-0'],
      [west, 'shared', 'shared-0'],
      [west, 'beta', 'beta-0'],
    ] as const) {
      await startMemberReplica(m, group, pod);
    }
    const first = await converge(SHARED);
    await converge(ALPHA);
    await converge(BETA);
    assert.equal(issued(SHARED), 1, 'one order for the shared name across both clusters');
    assert.equal(issued(ALPHA), 1);
    assert.equal(issued(BETA), 1);
    await secretsHold(SHARED, first);
    // certshare_home_writer: the one replica of each group holding its Lease at the home, whichever cluster.
    const homeWriters = async (domain: string): Promise<number> => {
      const values = await Promise.all(of(domain).map(async (r) => (await r.daemon.metrics.homeWriter.get()).values[0]?.value ?? 0));
      return values.reduce((a, b) => a + b, 0);
    };
    assert.deepEqual([await homeWriters(SHARED), await homeWriters(ALPHA), await homeWriters(BETA)], [1, 1, 1], 'one home writer per group');

    // The renewal window: one renewal across the clusters, mirrored everywhere.
    const cert = heldCert(of(SHARED)[0]!)!;
    const alpha = agreed(ALPHA)!;
    clock.jumpTo(renewalTime(cert.info, of(SHARED)[0]!.config.renewal) + 60_000);
    const renewed = await converge(SHARED, new Set([first]));
    await converge(ALPHA, new Set([alpha]));
    assert.equal(issued(ALPHA), 2);
    assert.equal(issued(SHARED), 2, 'one renewal across both clusters');
    await secretsHold(SHARED, renewed);
  });

  it('a home outage ending before the safety point: no issuance, the local copies served, one renewal when the home is back', async () => {
    const shared = of(SHARED);
    const before = agreed(SHARED)!;
    const cert = heldCert(shared[0]!)!;
    const config = shared[0]!.config;
    const renewal = renewalTime(cert.info, config.renewal);
    const safety = breakGlassPoint(cert.info, config.renewal, config.readinessLeadMs);
    const orders = issued(SHARED);
    await home.stopApiServer();
    // Past the renewal point, before the safety point: due, but the home's to renew.
    clock.jumpTo(renewal + Math.floor((safety - renewal) / 2));
    await outageReads(shared, 5, () => issued(SHARED) !== orders);
    assert.equal(issued(SHARED), orders, 'no issuance while the home is away before the safety point');
    for (const r of shared) assert.equal(held(r), before, `${r.member}/${r.pod} serves its local copy`);
    assert.ok(clock.now() < cert.info.notAfter);
    for (const m of members) assert.equal((await secretAt(m.cp, NS, SHARED)).serial, before, `${m.name}'s local Secret kept`);

    await home.startApiServer();
    const renewed = await converge(SHARED, new Set([before]));
    assert.equal(issued(SHARED), orders + 1, 'one renewal, by the home writer, once the home is back');
    await secretsHold(SHARED, renewed);
  });

  it('a home outage past the safety point: one break-glass issuance per member and window, then one certificate everywhere within 30 s', async () => {
    const shared = of(SHARED);
    const before = agreed(SHARED)!;
    const cert = heldCert(shared[0]!)!;
    const config = shared[0]!.config;
    const orders = issued(SHARED);
    const breakGlass = new Set<string>();
    await home.stopApiServer();
    try {
      clock.jumpTo(breakGlassPoint(cert.info, config.renewal, config.readinessLeadMs) + 60_000);
      // Recorded: the emulator counts a certificate when it signs it, the member once it stored it locally.
      const recorded = (): number => shared.reduce((n, r) => n + r.log.entries.filter((e) => /^break-glass: issued/.test(e.msg ?? '')).length, 0);
      await until('a break-glass issuance recorded in each member', () => recorded() >= 2 || issued(SHARED) > orders + 2, anyChange(), 30_000);
      assert.equal(issued(SHARED), orders + 2, 'one break-glass issuance per member');
      const locals = await Promise.all(members.map((m) => secretAt(m.cp, NS, SHARED)));
      for (const local of locals) breakGlass.add(local.serial);
      for (const [i, local] of locals.entries()) {
        assert.notEqual(local.serial, before);
        const window = `${local.serial} replacing ${before}`;
        assert.equal(local.annotations['certshare.io/break-glass'], window, `${members[i]!.name} records its break-glass certificate and window`);
      }
      const metrics = await Promise.all(shared.map((r) => r.daemon.metrics.registry.getSingleMetricAsString('certshare_break_glass_issuances_total')));
      const counted = metrics.reduce((n, text) => n + Number(/domain="shared[^}]*} (\d+)/.exec(text)?.[1] ?? 0), 0);
      assert.equal(counted, 2, 'the metric counts one per member');

      // Fresh copies sleep until their next check (--check-interval 1h): the clock passes it before each read.
      for (let i = 0; i < 3 && issued(SHARED) === orders + 2; i++) {
        clock.jump(61 * 60_000);
        await outageReads(shared, 1, () => issued(SHARED) !== orders + 2);
      }
      assert.equal(issued(SHARED), orders + 2, 'never a second in that window');

      // The break-glass certificates pass their own safety point with the home still away: their window is a
      // later one, which has its own (issue 40), one per member again.
      const latest = Math.max(...shared.map((r) => breakGlassPoint(heldCert(r)!.info, config.renewal, config.readinessLeadMs)));
      clock.jumpTo(latest + 60_000);
      await until('a break-glass issuance of the next window in each member', () => recorded() >= 4 || issued(SHARED) > orders + 4, anyChange(), 30_000);
      for (let i = 0; i < 3 && issued(SHARED) === orders + 4; i++) {
        clock.jump(61 * 60_000);
        await outageReads(shared, 1, () => issued(SHARED) !== orders + 4);
      }
      assert.equal(issued(SHARED), orders + 4, 'one break-glass issuance per member in the next window, never a second');
      const firstRound = [...breakGlass];
      for (const local of await Promise.all(members.map((m) => secretAt(m.cp, NS, SHARED)))) {
        assert.ok(!breakGlass.has(local.serial), 'a new certificate');
        assert.match(local.annotations['certshare.io/break-glass'] ?? '', new RegExp(`^${local.serial} replacing (${firstRound.join('|')})$`));
        breakGlass.add(local.serial);
      }
    } finally {
      await home.startApiServer();
    }
    // The home back: the newest break-glass certificate (not due) wins every Secret, no issuance (two expiring
    // in the same second: the home's; a replica keeps its own of that second).
    const back = Date.now();
    let secrets: SecretView[] = [];
    for (let attempt = 1; secrets.length === 0; attempt++) {
      const recordNow = (await secretAt(home, HOME_NS, SHARED)).serial;
      secrets = await secretsHold(SHARED, recordNow, 10_000).catch((err: unknown) => {
        if (attempt === 3) throw err;
        return [];
      });
    }
    assert.ok(Date.now() - back < 30_000, `converged ${Date.now() - back} ms after the home came back`);
    assert.equal(issued(SHARED), orders + 4, 'no issuance after the home came back');
    assert.equal(new Set(secrets.map((s) => s.key)).size, 1);
    // Its renewal point: one renewal by the home writer, held by every replica.
    clock.jumpTo(renewalTime(heldCert(shared[0]!)!.info, config.renewal) + 60_000);
    const renewed = await converge(SHARED, new Set([before, ...breakGlass]), 30_000);
    await secretsHold(SHARED, renewed);
    assert.equal(issued(SHARED), orders + 5);
  });

  it('renew-now through the home: exactly one order, a new key in every cluster', async () => {
    // Past the minimum interval (--first-retry) after the certificate the test before made: else the request
    // is refused (min_interval) when it lands within it, as it did about one run in four under load.
    clock.jump(60_000);
    const before = agreed(SHARED)!;
    const keysBefore = new Set((await secretsHold(SHARED, before)).map((s) => s.key));
    const orders = issued(SHARED);
    const connection = await connectKube({}, { kubeconfig: homeKubeconfig, namespace: HOME_NS });
    try {
      const first = await requestRenewal(connection, SHARED, 'renew-1');
      const second = await requestRenewal(connection, SHARED, 'renew-2');
      assert.equal(first.kind, 'requested');
      assert.deepEqual(second, { kind: 'pending', id: 'renew-1' });
    } finally {
      connection.close();
    }
    const renewed = await converge(SHARED, new Set([before]));
    const secrets = await secretsHold(SHARED, renewed);
    assert.equal(issued(SHARED), orders + 1, 'exactly one order');
    for (const s of secrets) assert.ok(!keysBefore.has(s.key), 'a new key in every cluster');
    assert.equal(secrets[0]!.annotations['certshare.io/renew-answered'], 'renew-1');
  });

  it('a Secret of record edited by hand at the home is restored from the members, without an issuance', async () => {
    const current = agreed(SHARED)!;
    const orders = issued(SHARED);
    const path = `/api/v1/namespaces/${HOME_NS}/secrets/${SHARED}`;
    const edit = await home.adminRequest('PATCH', path, {
      headers: { 'content-type': 'application/merge-patch+json' },
      body: { data: { 'tls.crt': Buffer.from('not a certificate').toString('base64') } },
    });
    assert.equal(edit.status, 200, edit.body);
    const edited = (JSON.parse(edit.body) as { metadata: { resourceVersion: string } }).metadata.resourceVersion;
    await secretsHold(SHARED, current);
    const after = JSON.parse((await home.adminRequest('GET', path)).body) as { metadata: { resourceVersion: string } };
    assert.notEqual(after.metadata.resourceVersion, edited, 'a member wrote the certificate back');
    assert.equal(issued(SHARED), orders, 'restored, not issued again');
    for (const r of of(SHARED)) assert.equal(held(r), current);
  });

  it("a member's own Secret edited by hand is restored from the home's, without an issuance", async () => {
    // The member's writer has seen the home's certificate and the local one alike: that the two were the same
    // pair must not make it skip the repair of a local Secret that now holds garbage.
    const current = agreed(SHARED)!;
    const orders = issued(SHARED);
    const east = members.find((m) => m.name === 'east')!;
    const path = `/api/v1/namespaces/${NS}/secrets/${SHARED}`;
    const edit = await east.cp.adminRequest('PATCH', path, {
      headers: { 'content-type': 'application/merge-patch+json' },
      body: { data: { 'tls.crt': Buffer.from('not a certificate').toString('base64') } },
    });
    assert.equal(edit.status, 200, edit.body);
    await secretsHold(SHARED, current);
    assert.equal(issued(SHARED), orders, 'restored, not issued again');
  });

  /** certshare_untrusted_certificates_total{store} of SHARED, summed over its replicas. */
  async function untrustedCounted(store: 'home' | 'local'): Promise<number> {
    const texts = await Promise.all(of(SHARED).map((r) => r.daemon.metrics.registry.getSingleMetricAsString('certshare_untrusted_certificates_total')));
    return texts.reduce((n, text) => n + Number(new RegExp(`domain="shared[^}]*store="${store}"[^}]*} (\\d+)`).exec(text)?.[1] ?? 0), 0);
  }

  /**
   * Writes a self-signed pair for SHARED, valid ten years, into the Secret `namespace` of `cp` holds (what the holder
   * of a stolen credential can write: key, name and dates pass), and waits until a replica refused it, or took it:
   * no replica may serve it. Then every Secret holds the valid certificate again and no issuance was made.
   */
  async function selfSignedRefused(cp: ControlPlane, namespace: string): Promise<{ forged: string; refusals: LogEntry[] }> {
    const current = agreed(SHARED)!;
    const orders = issued(SHARED);
    const pair = await selfSignedPair(SHARED, clock.now() - DAY, 3650 * DAY);
    const forged = serialOfPem(pair.certPem);
    const edit = await cp.adminRequest('PATCH', `/api/v1/namespaces/${namespace}/secrets/${SHARED}`, {
      headers: { 'content-type': 'application/merge-patch+json' },
      body: { data: { 'tls.crt': Buffer.from(pair.certPem).toString('base64'), 'tls.key': Buffer.from(pair.keyPem).toString('base64') } },
    });
    assert.equal(edit.status, 200, edit.body);
    const refusals = () =>
      of(SHARED).flatMap((r) => r.log.entries.filter((e) => e.code === 'CERTSHARE_CERT_UNTRUSTED' && e.serial === forged && e.namespace === namespace));
    const taken = () => of(SHARED).filter((r) => held(r) === forged);
    await until('a replica refused the self-signed pair (or took it)', () => refusals().length >= 1 || taken().length > 0, anyChange(), 30_000);
    assert.deepEqual(
      taken().map((r) => `${r.member}/${r.pod}`),
      [],
      'no replica serves the self-signed pair',
    );
    const secrets = await secretsHold(SHARED, current);
    assert.ok(secrets.every((s) => s.key !== pair.keyPem));
    assert.equal(issued(SHARED), orders, 'no issuance: each member keeps its copy until its own renewal point');
    for (const r of of(SHARED)) {
      assert.equal(held(r), current, `${r.member}/${r.pod} serves its valid copy`);
      const uses = r.log.entries.filter((e) => e.serial === forged && e.code !== 'CERTSHARE_CERT_UNTRUSTED');
      assert.deepEqual(uses, [], `${r.member}/${r.pod} never took the self-signed pair into use`);
    }
    for (const e of refusals()) assert.match(e.msg ?? '', new RegExp(`not trusted: its chain ends at the self-signed CN=${SHARED.replaceAll('.', '\\.')}`));
    return { forged, refusals: refusals() };
  }

  it('a self-signed pair at the home (a stolen federation credential): never mirrored or served, the valid copy written back, no issuance', async () => {
    assert.equal(await untrustedCounted('home'), 0);
    const { refusals } = await selfSignedRefused(home, HOME_NS);
    assert.equal(await untrustedCounted('home'), refusals.length, 'certshare_untrusted_certificates_total{store="home"}: once per refusal logged');
  });

  it("a self-signed pair in a member's own Secret (a stolen writer token of one cluster): not served there, put back from the home", async () => {
    assert.equal(await untrustedCounted('local'), 0);
    const { refusals } = await selfSignedRefused(member('east').cp, NS);
    assert.equal(await untrustedCounted('local'), refusals.length, 'certshare_untrusted_certificates_total{store="local"}: once per refusal logged');
  });

  it('refuses an unknown group, a kubeconfig without the rights and a home answering garbage at start: CERTSHARE_HOME_UNUSABLE', async () => {
    const east = member('east');
    const unusable = (err: unknown): boolean => (err as { code?: string }).code === 'CERTSHARE_HOME_UNUSABLE';
    // A group the home does not know: no Lease there.
    GROUPS.gamma = 'gamma.tailnet-0000.ts.net';
    await assert.rejects(startMemberReplica(east, 'gamma', 'gamma-0'), unusable);

    // An account of the home without any right there.
    await must(home.kubectl(['-n', HOME_NS, 'create', 'serviceaccount', 'nobody']));
    const nobody = await home.kubeconfigFor(HOME_NS, 'nobody');
    await assert.rejects(startMemberReplica(east, 'shared', 'shared-9', ['--federation-kubeconfig', nobody]), (err: unknown) => {
      return unusable(err) && /rights/.test(String((err as Error).message));
    });

    // Something that is not an apiserver (over HTTPS: a kubeconfig naming a plain-HTTP server is refused before).
    const { certPem: cert, keyPem: key } = await makePair('localhost', Date.now() - 60_000, DAY);
    const garbage = createServer({ cert, key }, (_req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end('{"hello": "world"}'));
    garbage.listen(0, '127.0.0.1');
    await once(garbage, 'listening');
    try {
      const path = join(dir(), 'garbage.kubeconfig');
      const ca = Buffer.from((await testCa()).certPem).toString('base64');
      const text = (await readFile(nobody, 'utf8'))
        .replace(/server: .*/, `server: "https://localhost:${(garbage.address() as AddressInfo).port}"`)
        .replace(/certificate-authority-data: .*/, `certificate-authority-data: "${ca}"`);
      await writeFile(path, text, { mode: 0o600 });
      await assert.rejects(startMemberReplica(east, 'shared', 'shared-8', ['--federation-kubeconfig', path]), unusable);
    } finally {
      garbage.close();
    }
  });

  /** A home namespace of its own with manifests/federation applied: the federation account's kubeconfig there. */
  async function federationNamespace(ns: string): Promise<string> {
    await must(home.kubectl(['create', 'namespace', ns]));
    await must(home.kubectl(['apply', '-k', FEDERATION, '-n', ns]));
    return home.kubeconfigFor(ns, 'certshare-federation');
  }

  it("the federation account's rights at the home: its group's Lease, Secret and ledger by name, everything else refused", async () => {
    const east = member('east');
    const ns = 'fed-rights';
    const token = await federationNamespace(ns);
    const secrets = `/api/v1/namespaces/${ns}/secrets`;
    const secret = `${secrets}/${KUBE_DOMAIN}`;
    const leases = `/apis/coordination.k8s.io/v1/namespaces/${ns}/leases`;
    const lease = `${leases}/certshare-proxy`;
    const ledger = `/api/v1/namespaces/${ns}/configmaps/certshare-proxy-ledger`;
    // The policy applies once the apiserver has loaded it (an informer, a second or so after apply).
    const read = JSON.parse((await asAccount(home, token, 'GET', secret)).body) as { metadata: Record<string, unknown>; data: Record<string, string> };
    const deadline = performance.now() + 30_000;
    for (;;) {
      const r = await asAccount(home, token, 'PUT', `${secret}?dryRun=All`, { ...read, data: { ...read.data, extra: 'eA==' } });
      if (r.status === 403 && /tls\.crt and tls\.key only/.test(r.body)) break;
      assert.ok(performance.now() < deadline, `the federation policy never took effect: ${r.status} ${r.body}`);
      await new Promise((resolve) => setTimeout(resolve, 200));
    }

    // Allowed, and enough: a member's writer under this token elects itself at the home, takes a slot of the
    // group's ledger there, issues once and stores the certificate of record.
    const orders = (r: Replica): number => r.emulator.stats().issuances[KUBE_DOMAIN] ?? 0;
    const writer = await startMemberReplica(east, 'proxy', 'proxy-0', ['--federation-kubeconfig', token, '--federation-namespace', ns], {
      domain: KUBE_DOMAIN,
    });
    await until('the writer holds a certificate', () => held(writer) !== undefined, [onEvent(writer.daemon.events, 'planned')], 30_000);
    assert.equal(orders(writer), 1);
    assert.equal((await secretAt(home, ns, KUBE_DOMAIN)).serial, held(writer));
    const holder = JSON.parse((await asAccount(home, token, 'GET', lease)).body) as { spec: { holderIdentity?: string } };
    assert.match(holder.spec.holderIdentity ?? '', /^east\/proxy-0_/);
    const entries = JSON.parse((await asAccount(home, token, 'GET', ledger)).body) as { data: Record<string, string> };
    assert.match(entries.data['ledger.json']!, new RegExp(KUBE_DOMAIN.replace(/\./g, '\\.')));
    const watch = await asAccount(home, token, 'GET', `${secrets}?watch=1&timeoutSeconds=1&fieldSelector=metadata.name%3D${KUBE_DOMAIN}`);
    assert.equal(watch.status, 200, watch.body);

    // Updates without a resourceVersion (unconditional): the writer may write meanwhile, and a stale one
    // would be answered 409 before the policy is asked.
    const unconditional = <T extends { metadata: Record<string, unknown> }>(o: T): T => ({ ...o, metadata: { ...o.metadata, resourceVersion: undefined } });
    const current = unconditional(
      JSON.parse((await asAccount(home, token, 'GET', secret)).body) as {
        metadata: { labels: Record<string, string>; annotations: Record<string, string> };
        data: Record<string, string>;
      },
    );
    const currentLedger = unconditional(
      JSON.parse((await asAccount(home, token, 'GET', ledger)).body) as { metadata: Record<string, unknown>; data: Record<string, string> },
    );
    // A Lease takes no unconditional update: read it again when the writer's renewal got in between.
    const leaseUpdate = async (change: (l: { metadata: Record<string, unknown> }) => unknown): Promise<{ status: number; body: string }> => {
      for (let attempt = 1; ; attempt++) {
        const fresh = JSON.parse((await asAccount(home, token, 'GET', lease)).body) as { metadata: Record<string, unknown> };
        const r = await asAccount(home, token, 'PUT', lease, change(fresh));
        if (r.status !== 409 || attempt === 5) return r;
      }
    };
    const refusals: Array<[string, Promise<{ status: number; body: string }>, RegExp]> = [
      ['list Secrets', asAccount(home, token, 'GET', secrets), /cannot list/],
      ['another Secret', asAccount(home, token, 'GET', `${secrets}/other.tailnet-0000.ts.net`), /cannot get/],
      [
        'create a Secret',
        asAccount(home, token, 'POST', secrets, { apiVersion: 'v1', kind: 'Secret', metadata: { name: 'other.tailnet-0000.ts.net' } }),
        /cannot create/,
      ],
      ['delete the Secret', asAccount(home, token, 'DELETE', secret), /cannot delete/],
      ['patch the Secret', asAccount(home, token, 'PATCH', secret, {}), /cannot patch/],
      ['a label of the Secret', asAccount(home, token, 'PUT', secret, { ...current, metadata: { ...current.metadata, labels: {} } }), /labels/],
      [
        'an annotation not certshare.io/*',
        asAccount(home, token, 'PUT', secret, { ...current, metadata: { ...current.metadata, annotations: { ...current.metadata.annotations, x: 'y' } } }),
        /certshare\.io\/\* annotations/,
      ],
      [
        'another key in the Secret',
        asAccount(home, token, 'PUT', secret, { ...current, data: { ...current.data, extra: 'eA==' } }),
        /tls\.crt and tls\.key only/,
      ],
      [
        'create a Lease',
        asAccount(home, token, 'POST', leases, { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: 'certshare-x' } }),
        /cannot create/,
      ],
      ['another Lease', asAccount(home, token, 'GET', `${leases}/certshare-other`), /cannot get/],
      ['delete the Lease', asAccount(home, token, 'DELETE', lease), /cannot delete/],
      ['a label of the Lease', leaseUpdate((l) => ({ ...l, metadata: { ...l.metadata, labels: { x: 'y' } } })), /labels/],
      // One write each, kept after the credential is rotated: no member could write either again (on 3d853d5 admitted).
      [
        'the Secret made immutable',
        asAccount(home, token, 'PUT', secret, { ...current, immutable: true }),
        /never makes a Secret of record or a ledger immutable/,
      ],
      [
        'the ledger made immutable',
        asAccount(home, token, 'PUT', ledger, { ...currentLedger, immutable: true }),
        /never makes a Secret of record or a ledger immutable/,
      ],
      [
        'another key in the ledger',
        asAccount(home, token, 'PUT', ledger, { ...currentLedger, data: { ...currentLedger.data, x: 'y' } }),
        /one key, ledger\.json/,
      ],
      ['another ConfigMap', asAccount(home, token, 'GET', `/api/v1/namespaces/${ns}/configmaps/other`), /cannot get/],
      // The rest of what docs/security.md says it cannot do: patch or delete the others, their metadata, the ledger's form.
      ['patch the Lease', asAccount(home, token, 'PATCH', lease, {}), /cannot patch/],
      ['delete the ledger', asAccount(home, token, 'DELETE', ledger), /cannot delete/],
      [
        'a finalizer on the Secret',
        asAccount(home, token, 'PUT', secret, { ...current, metadata: { ...current.metadata, finalizers: ['example.com/keep'] } }),
        /labels, owners or finalizers/,
      ],
      [
        'an annotation of the ledger',
        asAccount(home, token, 'PUT', ledger, { ...currentLedger, metadata: { ...currentLedger.metadata, annotations: { x: 'y' } } }),
        /annotations of the Lease or the ledger/,
      ],
      [
        "a ledger not in certshare's form",
        asAccount(home, token, 'PUT', ledger, { ...currentLedger, data: { 'ledger.json': '{"not":"entries"}' } }),
        /one key, ledger\.json, as certshare writes it/,
      ],
      ['another namespace', asAccount(home, token, 'GET', `/api/v1/namespaces/${HOME_NS}/secrets/${SHARED}`), /cannot get/],
      ['Pods', asAccount(home, token, 'GET', `/api/v1/namespaces/${ns}/pods`), /cannot list/],
    ];
    for (const [what, result, expected] of refusals) {
      const r = await result;
      assert.equal(r.status, 403, `${what}: ${r.status} ${r.body}`);
      assert.match(r.body, expected, what);
    }

    // A domain whose Secret the Role does not name: refused at the first call, and never a reason to issue
    // on the member's own (a 403 is no outage: no break-glass), however late it gets.
    await must(east.cp.kubectl(['create', 'namespace', 'proxies-b']));
    const other = 'other.tailnet-0000.ts.net';
    // No budget: nothing but the home's answer stands between this member and an issuance.
    const refused = await startMemberReplica(
      east,
      'proxy',
      'proxy-b-0',
      ['--federation-kubeconfig', token, '--federation-namespace', ns, '--issuance-budget', '0'],
      { domain: other, namespace: 'proxies-b' },
    );
    const problems: string[] = [];
    refused.daemon.events.on('problem', (p: { message: string }) => problems.push(p.message));
    const issuedOther = (): number => refused.emulator.stats().issuances[other] ?? 0;
    const unreadable = (): number => refused.log.entries.filter((e) => e.msg === 'certificate store unreadable').length;
    const sources = [onEvent(refused.daemon.events, 'problem'), onEvent(refused.daemon.events, 'attempt'), onEvent(refused.log.events, 'entry')];
    await until('a refusal reported (or an issuance)', () => issuedOther() > 0 || problems.some((m) => /403|forbidden/i.test(m)), sources, 30_000);
    const before = unreadable();
    clock.jump(120 * DAY);
    await until('the loop reads again after the jump', () => issuedOther() > 0 || unreadable() >= before + 3, sources, 30_000);
    assert.equal(issuedOther(), 0, 'no issuance without the rights');
    assert.ok(
      problems.some((m) => /CERTSHARE|403|forbidden/i.test(m)),
      problems.join('; '),
    );
  });

  it('a stolen federation credential writes the home Lease once (2^31 s, 2^31 - 1 takeovers): a member takes it over after twice its duration', async () => {
    const east = member('east');
    const ns = 'fed-lease';
    const token = await federationNamespace(ns);
    const lease = `/apis/coordination.k8s.io/v1/namespaces/${ns}/leases/certshare-proxy`;
    const read = JSON.parse((await asAccount(home, token, 'GET', lease)).body) as { metadata: Record<string, unknown> };
    // One write, by a token that may be rotated or expire right after: on 7bec7cd no member ever held the Lease (its
    // duration), on 080ee30 neither (a takeover wrote a count past the int32 the field is, refused).
    const renewTime = new Date(clock.now()).toISOString().replace('Z', '000Z');
    const spec = { holderIdentity: 'thief', leaseDurationSeconds: 2_147_483_647, leaseTransitions: 2_147_483_647, renewTime };
    const written = await asAccount(home, token, 'PUT', lease, { ...read, spec });
    assert.equal(written.status, 200, `the federation account updates its group's home Lease: ${written.body}`);
    await must(east.cp.kubectl(['create', 'namespace', 'proxies-lease']));
    // A Pod name of its own: the rights test's replica (east, proxy-0) still runs, its emulator's socket taken.
    const writer = await startMemberReplica(east, 'proxy', 'proxy-lease-0', ['--federation-kubeconfig', token, '--federation-namespace', ns], {
      domain: KUBE_DOMAIN,
      namespace: 'proxies-lease',
    });
    await until('the member holds a certificate', () => held(writer) !== undefined, [onEvent(writer.daemon.events, 'planned')], 30_000);
    const holder = JSON.parse((await asAccount(home, token, 'GET', lease)).body) as { spec: { holderIdentity?: string } };
    assert.match(holder.spec.holderIdentity ?? '', /^east\/proxy-lease-0_/);
    assert.ok(
      writer.log.entries.some((e) => e.code === 'CERTSHARE_UNTRUSTED_VALUE' && /lease-duration of the Lease fed-lease\/certshare-proxy/.test(e.msg ?? '')),
      'the duration reported',
    );
    assert.ok(
      writer.log.entries.some((e) => e.code === 'CERTSHARE_UNTRUSTED_VALUE' && /lease-transitions of the Lease fed-lease\/certshare-proxy/.test(e.msg ?? '')),
      'the count reported',
    );
  });
});
