// The federation home's test bed (docs/federation.md): three real kube-apiservers with etcd, the home and two
// member clusters (east and west), and replicas of a group in a member, in-process, each with its own LocalAPI
// emulator standing in for tailscaled (the emulators count the certificates they sign). A JumpClock shared by
// the daemons and the emulators skips the days of a certificate's life; everything else runs at the pace of
// real I/O.
import assert from 'node:assert/strict';
import type { EventEmitter } from 'node:events';
import { join } from 'node:path';
import { after, before } from 'node:test';
import { parseFlags } from '../../src/flags/flags.ts';
import { RUN_FLAGS, daemonConfigFrom, type DaemonConfig } from '../../src/config/run-options.ts';
import { startDaemon, type Daemon } from '../../src/daemon.ts';
import { startEmulator, type Emulator } from '../../src/emulator/server.ts';
import { startControlPlane, type ControlPlane } from '../harness/control-plane.ts';
import { CONTROL_PLANE_HOOK_TIMEOUT_MS } from '../harness/use-control-plane.ts';
import { JumpClock } from './jump-clock.ts';
import { must } from './kube.ts';
import { recordingLogger, type LogEntry } from './recording-logger.ts';
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
  /** Certificates signed for `domain` (every domain if none) by every replica's emulator: orders across the clusters. */
  issued(domain?: string): number;
}

/**
 * Registers before()/after() hooks in the current describe block: the home and both members started, the
 * namespaces created, and the writer Lease of each of `groups` at the home (the platform creates them: a
 * member never makes up a group there).
 */
export function useFederation(groups: readonly string[]): FederationBed {
  const dir = useTempDir();
  const clock = new JumpClock();
  let home: ControlPlane | undefined;
  let members: Member[] = [];
  const replicas: FederatedReplica[] = [];

  before(
    async () => {
      const [h, east, west] = await Promise.all([startControlPlane(), startControlPlane(), startControlPlane()]);
      home = h!;
      members = [
        { name: 'east', cp: east! },
        { name: 'west', cp: west! },
      ];
      await must(home.kubectl(['create', 'namespace', HOME_NS]));
      for (const m of members) await must(m.cp.kubectl(['create', 'namespace', NS]));
      for (const group of groups) {
        const lease = { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: `certshare-${group}` }, spec: {} };
        const res = await home.adminRequest('POST', `/apis/coordination.k8s.io/v1/namespaces/${HOME_NS}/leases`, { body: lease });
        assert.equal(res.status, 201, res.body);
      }
    },
    { timeout: CONTROL_PLANE_HOOK_TIMEOUT_MS },
  );
  after(
    async () => {
      await Promise.all(replicas.map((r) => r.stop()));
      await Promise.all([home?.stop(), ...members.map((m) => m.cp.stop())]);
    },
    { timeout: 120_000 },
  );

  const started = (): ControlPlane => {
    if (!home) throw new Error('useFederation(): before() hook has not run');
    return home;
  };

  async function startReplica(m: Member, group: string, pod: string, options: ReplicaOptions): Promise<FederatedReplica> {
    const emulator = await startEmulator({
      listen: join(dir(), `${m.name}-${pod}.sock`),
      domains: options.domains,
      id: `${m.name}-${pod}`,
      clock,
      certLifetimeMs: LIFETIME,
      asyncRenewal: false,
    });
    const flags = [
      ...['--localapi', emulator.address, '--store', 'kube', ...options.domains.flatMap((d) => ['--domain', d]), '--group', group, '--mode', 'auto'],
      ...['--lease-duration', '3s', ...FAST_FLAGS],
      ...['--federation-kubeconfig', started().adminKubeconfigPath, '--federation-namespace', HOME_NS, '--federation-cluster', m.name],
      ...['--federation-lease-duration', '3s'],
      ...(options.flags ?? []),
    ];
    const env = { KUBECONFIG: m.cp.adminKubeconfigPath, POD_NAME: pod, POD_NAMESPACE: options.namespace ?? NS, POD_IPS: '10.0.0.10' };
    const { logger, entries, events } = recordingLogger();
    let daemon: Daemon;
    let config: DaemonConfig;
    try {
      config = daemonConfigFrom(parseFlags(RUN_FLAGS, flags, {}), env);
      daemon = await startDaemon(config, { logger, env, clock });
    } catch (err) {
      await emulator.close();
      throw err;
    }
    const replica: FederatedReplica = {
      member: m.name,
      pod,
      domains: options.domains,
      domain: options.domains[0]!,
      daemon,
      emulator,
      config,
      log: { entries, events },
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
    issued: (domain) =>
      replicas.reduce((n, r) => {
        const stats = r.emulator.stats();
        return n + (domain === undefined ? stats.issuancesTotal : (stats.issuances[domain] ?? 0));
      }, 0),
  };
}
