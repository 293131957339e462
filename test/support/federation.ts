// The federation home's test bed (docs/federation.md): three real kube-apiservers with etcd, the home and two
// member clusters (east and west), and replicas of a group in a member, in-process, each with its own LocalAPI
// emulator standing in for tailscaled (the emulators count the certificates they sign). A JumpClock shared by
// the daemons and the emulators skips the days of a certificate's life; everything else runs at the pace of
// real I/O. The pieces (startFederation, startFederatedDaemon, secretsHold) serve a bed with a real tailscaled
// per member too (test/tailscaled/real-federation.test.ts).
import assert from 'node:assert/strict';
import { X509Certificate } from 'node:crypto';
import type { EventEmitter } from 'node:events';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { after, before } from 'node:test';
import { parseFlags } from '../../src/flags/flags.ts';
import { RUN_FLAGS, daemonConfigFrom, type DaemonConfig } from '../../src/config/run-options.ts';
import type { Clock } from '../../src/core/ports/clock.ts';
import type { StoredCert } from '../../src/core/ports/store.ts';
import { startDaemon, type Daemon } from '../../src/daemon/daemon.ts';
import { startEmulator, type Emulator } from '../../src/emulator/server.ts';
import { createCertificateAuthority } from '../../src/pki/ca.ts';
import { startControlPlane, type ControlPlane } from '../harness/control-plane.ts';
import { CONTROL_PLANE_HOOK_TIMEOUT_MS } from '../harness/use-control-plane.ts';
import { JumpClock } from './jump-clock.ts';
import { must } from './kube.ts';
import { recordingLogger, type LogEntry } from './recording-logger.ts';
import { startTcpProxy, type TcpProxy } from './tcp-proxy.ts';
import { onEvent, until } from './wait.ts';
import { FAST_FLAGS, useTempDir } from './standalone.ts';

export const DAY = 86_400_000;
/** The emulators' certificate lifetime: Let's Encrypt's 90 days. */
export const LIFETIME = 90 * DAY;
/** The namespace at the home holding the groups' objects (the members' --federation-namespace). */
export const HOME_NS = 'certshare-home';
/** The groups' namespace in each member. */
export const NS = 'proxies';

export interface Member {
  name: 'east' | 'west';
  cp: ControlPlane;
}

export interface FederatedReplica {
  member: Member['name'];
  pod: string;
  domains: string[];
  /** The first of `domains`: the one domain of a one-domain replica. */
  domain: string;
  daemon: Daemon;
  emulator: Emulator;
  config: DaemonConfig;
  log: { entries: LogEntry[]; events: EventEmitter };
  stop(): Promise<void>;
}

export interface ReplicaOptions {
  domains: string[];
  /** Flags after the bed's own (later ones win), e.g. another --federation-kubeconfig. */
  flags?: string[];
  /** The Pod's namespace in the member (NS unless given). */
  namespace?: string | undefined;
  /** Its emulator's CA's own clock (the bed's unless given): where its certificates' validity is stamped. */
  caClock?: { now(): number } | undefined;
}

export interface FederationBed {
  clock: JumpClock;
  home(): ControlPlane;
  member(name: Member['name']): Member;
  members(): Member[];
  /** The home's admin kubeconfig: every replica's --federation-kubeconfig unless its flags say otherwise. */
  homeKubeconfig(): string;
  /** Every replica started so far (stopped after the describe block). */
  replicas: FederatedReplica[];
  /** A replica of `group` in member `m`: --mode auto, its home HOME_NS at the home. */
  startReplica(m: Member, group: string, pod: string, options: ReplicaOptions): Promise<FederatedReplica>;
  /** The PEM file of the CA every emulator of the bed signs with: every replica's --federation-trust-anchors. */
  trustAnchorsFile(): Promise<string>;
  /** Certificates signed for `domain` (every domain if none) by every replica's emulator: orders across the clusters. */
  issued(domain?: string): number;
}

/** The home and both members, started. */
export interface Federation {
  home: ControlPlane;
  members: Member[];
  stop(): Promise<void>;
}

/**
 * Starts the home and both members (three apiservers at once), creates the namespaces and the writer Lease of
 * each of `groups` at the home (the platform creates them: a member never makes up a group there). On a
 * failure, whatever started is stopped.
 */
export async function startFederation(groups: readonly string[]): Promise<Federation> {
  const started = await Promise.allSettled([startControlPlane(), startControlPlane(), startControlPlane()]);
  const cps = started.flatMap((s) => (s.status === 'fulfilled' ? [s.value] : []));
  const stop = async (): Promise<void> => {
    await Promise.all(cps.map((cp) => cp.stop()));
  };
  try {
    const failed = started.find((s) => s.status === 'rejected');
    if (failed) throw failed.reason;
    const [home, east, west] = cps as [ControlPlane, ControlPlane, ControlPlane];
    const members: Member[] = [
      { name: 'east', cp: east },
      { name: 'west', cp: west },
    ];
    await must(home.kubectl(['create', 'namespace', HOME_NS]));
    for (const m of members) await must(m.cp.kubectl(['create', 'namespace', NS]));
    for (const group of groups) {
      const lease = { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: `certshare-${group}` }, spec: {} };
      const res = await home.adminRequest('POST', `/apis/coordination.k8s.io/v1/namespaces/${HOME_NS}/leases`, { body: lease });
      assert.equal(res.status, 201, res.body);
    }
    return { home, members, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

export type FederatedDaemon = Pick<FederatedReplica, 'daemon' | 'config' | 'log'>;

export interface FederatedDaemonOptions {
  /** tailscaled's LocalAPI: an emulator's address or a real tailscaled's socket. */
  localapi: string;
  group: string;
  domains: string[];
  pod: string;
  /** The Pod's namespace in the member (NS unless given). */
  namespace?: string | undefined;
  /** Flags after the defaults (later ones win). */
  flags?: string[];
  clock?: Clock;
}

/**
 * A replica of `group` in member `m`, in-process: --mode auto with the kube store and the fast tier's timing,
 * its home HOME_NS at the home of `homeKubeconfig` as the cluster `m.name`; its log recorded.
 */
export async function startFederatedDaemon(m: Member, homeKubeconfig: string, options: FederatedDaemonOptions): Promise<FederatedDaemon> {
  const flags = [
    ...['--localapi', options.localapi, '--store', 'kube', ...options.domains.flatMap((d) => ['--domain', d]), '--group', options.group, '--mode', 'auto'],
    ...FAST_FLAGS,
    ...['--federation-kubeconfig', homeKubeconfig, '--federation-namespace', HOME_NS, '--federation-cluster', m.name],
    ...(options.flags ?? []),
  ];
  const env = { KUBECONFIG: m.cp.adminKubeconfigPath, POD_NAME: options.pod, POD_NAMESPACE: options.namespace ?? NS, POD_IPS: '10.0.0.10' };
  const { logger, entries, events } = recordingLogger();
  const config = daemonConfigFrom(parseFlags(RUN_FLAGS, flags, {}), env);
  const daemon = await startDaemon(config, { logger, env, ...(options.clock ? { clock: options.clock } : {}) });
  return { daemon, config, log: { entries, events } };
}

/**
 * A TCP relay to `home` and its admin kubeconfig through it, written in `dir` as `<name>-home.kubeconfig`: a member
 * whose replicas use it is cut off from the home alone when the test cuts the relay (a partition: east and the home
 * keep talking).
 */
export async function relayToHome(home: ControlPlane, dir: string, name: string): Promise<{ relay: TcpProxy; kubeconfig: string }> {
  const relay = await startTcpProxy(home.port);
  const admin = await readFile(home.adminKubeconfigPath, 'utf8');
  const via = admin.replace(/server: .*/, `server: "https://127.0.0.1:${relay.port}"`);
  assert.notEqual(via, admin, 'the kubeconfig points at the relay');
  const kubeconfig = join(dir, `${name}-home.kubeconfig`);
  await writeFile(kubeconfig, via, { mode: 0o600 });
  return { relay, kubeconfig };
}

export const serialOfPem = (pem: string): string => new X509Certificate(pem).serialNumber;

export interface SecretView {
  serial: string;
  key: string;
  annotations: Record<string, string>;
  /** The serial of the pair held for later (pending.crt), if any. */
  pending: string | undefined;
}

/** The domain's Secret in `namespace` of `cp`, as the admin reads it; its serial `(not a certificate)` for garbage. */
export async function secretAt(cp: ControlPlane, namespace: string, domain: string): Promise<SecretView> {
  const res = await cp.adminRequest('GET', `/api/v1/namespaces/${namespace}/secrets/${domain}`);
  assert.equal(res.status, 200, res.body);
  const s = JSON.parse(res.body) as { data: Record<string, string>; metadata: { annotations?: Record<string, string> } };
  const pem = Buffer.from(s.data['tls.crt']!, 'base64').toString('utf8');
  let serial: string;
  try {
    serial = serialOfPem(pem);
  } catch {
    serial = '(not a certificate)';
  }
  const later = s.data['pending.crt'];
  const pending = later === undefined ? undefined : serialOfPem(Buffer.from(later, 'base64').toString('utf8'));
  return { serial, key: Buffer.from(s.data['tls.key']!, 'base64').toString('utf8'), annotations: s.metadata.annotations ?? {}, pending };
}

type Subscribe = (listener: () => void) => () => void;

/**
 * `read()` again at each change a replica reports (`changes` gives fresh subscriptions) and every 500 ms (a write that
 * reports nothing to the replicas: the home's own), until `ok` holds for what it read; `what` says what it last read.
 */
export async function readUntil<T>(
  read: () => Promise<T>,
  ok: (value: T) => boolean,
  changes: () => Subscribe[],
  timeoutMs: number,
  what: (last: T) => string,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await read();
    if (ok(value)) return value;
    assert.ok(Date.now() < deadline, what(value));
    await new Promise<void>((resolve) => {
      const offs = changes().map((subscribe) => subscribe(done));
      const timer = setTimeout(done, 500);
      function done(): void {
        clearTimeout(timer);
        for (const off of offs) off();
        resolve();
      }
    });
  }
}

/**
 * The domain's Secrets in `where` (the home's of record, members' local ones), once they all hold `serial`
 * (readUntil: the local writes follow the home's by a round trip).
 */
export function secretsHold(
  where: Array<{ cp: ControlPlane; ns: string }>,
  domain: string,
  serial: string,
  changes: () => Subscribe[],
  timeoutMs = 15_000,
): Promise<SecretView[]> {
  return readUntil(
    () => Promise.all(where.map((w) => secretAt(w.cp, w.ns, domain))),
    (all) => all.every((s) => s.serial === serial),
    changes,
    timeoutMs,
    (all) => `${domain}: home and member Secrets hold ${all.map((s) => s.serial).join(', ')}, not all ${serial}`,
  );
}

/** Registers before()/after() hooks in the current describe block: startFederation(groups), stopped after it. */
export function useFederation(groups: readonly string[]): FederationBed {
  const dir = useTempDir();
  const clock = new JumpClock();
  let federation: Federation | undefined;
  let home: ControlPlane | undefined;
  let members: Member[] = [];
  const replicas: FederatedReplica[] = [];

  before(
    async () => {
      federation = await startFederation(groups);
      ({ home, members } = federation);
    },
    { timeout: CONTROL_PLANE_HOOK_TIMEOUT_MS },
  );
  after(
    async () => {
      await Promise.all(replicas.map((r) => r.stop()));
      await federation?.stop();
    },
    { timeout: 120_000 },
  );

  const started = (): ControlPlane => {
    if (!home) throw new Error('useFederation(): before() hook has not run');
    return home;
  };

  /**
   * One CA behind every emulator of the bed, as Let's Encrypt is behind every tailscaled, and its certificate as
   * every replica's --federation-trust-anchors: what a user whose CA Node does not know yet does.
   */
  let sharedCa: Promise<{ pem: { certPem: string; keyPem: string }; file: string }> | undefined;
  const bedCa = (): Promise<{ pem: { certPem: string; keyPem: string }; file: string }> =>
    (sharedCa ??= (async () => {
      const ca = await createCertificateAuthority({ name: 'certshare federation test CA', now: clock.now() });
      const file = join(dir(), 'trust-anchors.pem');
      await writeFile(file, ca.certPem);
      return { pem: { certPem: ca.certPem, keyPem: ca.keyPem }, file };
    })());

  async function startReplica(m: Member, group: string, pod: string, options: ReplicaOptions): Promise<FederatedReplica> {
    const ca = await bedCa();
    const emulator = await startEmulator({
      ca: ca.pem,
      listen: join(dir(), `${m.name}-${pod}.sock`),
      domains: options.domains,
      id: `${m.name}-${pod}`,
      clock,
      ...(options.caClock ? { caClock: options.caClock } : {}),
      certLifetimeMs: LIFETIME,
      asyncRenewal: false,
    });
    let running: FederatedDaemon;
    try {
      running = await startFederatedDaemon(m, started().adminKubeconfigPath, {
        localapi: emulator.address,
        group,
        domains: options.domains,
        pod,
        namespace: options.namespace,
        flags: ['--lease-duration', '3s', '--federation-lease-duration', '3s', '--federation-trust-anchors', ca.file, ...(options.flags ?? [])],
        clock,
      });
    } catch (err) {
      await emulator.close();
      throw err;
    }
    const { daemon, config, log } = running;
    const replica: FederatedReplica = {
      member: m.name,
      pod,
      domains: options.domains,
      domain: options.domains[0]!,
      daemon,
      emulator,
      config,
      log,
      async stop() {
        await daemon.stop();
        await emulator.close();
      },
    };
    replicas.push(replica);
    return replica;
  }

  return {
    clock,
    home: started,
    member: (name) => members.find((m) => m.name === name)!,
    members: () => members,
    homeKubeconfig: () => started().adminKubeconfigPath,
    replicas,
    startReplica,
    trustAnchorsFile: async () => (await bedCa()).file,
    issued: (domain) =>
      replicas.reduce((n, r) => {
        const stats = r.emulator.stats();
        return n + (domain === undefined ? stats.issuancesTotal : (stats.issuances[domain] ?? 0));
      }, 0),
  };
}

/** The certificate a replica's loop holds for its domain. */
export const currentOf = (r: FederatedReplica): StoredCert | undefined => r.daemon.manager.loop(r.domain)?.current;

/**
 * What a test follows of `replicas`: any change (a decision, a call, a log line), the serial they all hold (undefined
 * while they differ), and `decisions(n)`: once every replica's loop has decided `n` more times (each reads the home
 * first), or `stopEarly` holds.
 */
export function followReplicas(replicas: FederatedReplica[]): {
  anyChange: () => Subscribe[];
  agreed: () => string | undefined;
  decisions: (n: number, stopEarly: () => boolean) => Promise<void>;
} {
  const anyChange = (): Subscribe[] =>
    replicas.flatMap((r) => [onEvent(r.daemon.events, 'decided'), onEvent(r.daemon.events, 'attempt'), onEvent(r.log.events, 'entry')]);
  const agreed = (): string | undefined => {
    const serials = new Set(replicas.map((r) => currentOf(r)?.info.serial));
    return serials.size === 1 ? [...serials][0] : undefined;
  };
  async function decisions(n: number, stopEarly: () => boolean): Promise<void> {
    const count = new Map(replicas.map((r) => [r, 0]));
    const offs = replicas.map((r) => onEvent(r.daemon.events, 'decided')(() => count.set(r, count.get(r)! + 1)));
    try {
      await until(`${n} decisions of each replica`, () => stopEarly() || [...count.values()].every((c) => c >= n), anyChange(), 30_000);
    } finally {
      for (const off of offs) off();
    }
  }
  return { anyChange, agreed, decisions };
}
