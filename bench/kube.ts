// Kubernetes figures on the real test control plane (etcd + kube-apiserver on loopback, RBAC on): idle
// RSS of a writer and of readers, API requests per replica at rest, and renewal propagation from the
// writer's Secret update to a reader's files.
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { ControlPlane } from '../test/harness/control-plane.ts';
import { exampleNamespace, GROUP, KUBE_DOMAIN } from '../test/support/kube.ts';
import { labelsOf, longestSilenceS, metricSeries, readAudit, seriesDelta, sum, watchSecret, type WatchEvent } from './lib/apiserver.ts';
import { CertFileWatch, spawnDaemon, startEmulator, type EmulatorProc } from './lib/certshare.ts';
import { probeAsKubelet, sendProbesOf } from './lib/kubelet-probes.ts';
import { idleRss, memStatus, threadsCpuMs, type MemStatus, type Proc } from './lib/proc.ts';
import type { BenchSize } from './lib/size.ts';
import { percentile, progress } from './lib/stats.ts';

export interface KubeReplica {
  name: string;
  emulator: EmulatorProc;
  daemon: Proc;
  files: CertFileWatch;
  /** The port of its /healthz, once it said it started. */
  port: Promise<number>;
  stop(): Promise<void>;
}

export interface ReplicaOptions {
  /** The group and its one domain: the example's (GROUP, KUBE_DOMAIN) unless given. */
  group?: string;
  domain?: string;
  emulatorArgs?: string[];
  flags?: string[];
  nodeArgs?: string[];
  env?: Record<string, string>;
  main?: string;
}

export async function startReplica(ns: string, kubeconfig: string, dir: string, name: string, mode: 'rw' | 'ro', o: ReplicaOptions = {}): Promise<KubeReplica> {
  const replicaDir = join(dir, name);
  const domain = o.domain ?? KUBE_DOMAIN;
  const emulator = await startEmulator(replicaDir, name, ['--domain', domain, ...(o.emulatorArgs ?? [])]);
  const outDir = join(replicaDir, 'certs');
  const files = await CertFileWatch.start(outDir, domain);
  const daemon = spawnKubeDaemon(ns, kubeconfig, name, mode, emulator.socket, outDir, { ...o, flags: ['--domain', domain, ...(o.flags ?? [])] });
  const port = daemon.waitForLog((e) => e.msg === 'certshare started', 120_000, 'its start').then((e) => Number(/:(\d+)\/?$/.exec(String(e.address))?.[1]));
  port.catch(() => {}); // awaited by whoever needs it; its exit is reported by the bench
  return {
    name,
    emulator,
    daemon,
    files,
    port,
    async stop() {
      files.close();
      await daemon.stop();
      await emulator.proc.stop();
    },
  };
}

/** `certshare run` as a replica of the example group (or `o.group`) in kube mode, projecting into `outDir`; the domains come in `o.flags` or `o.env`. */
export function spawnKubeDaemon(
  ns: string,
  kubeconfig: string,
  name: string,
  mode: 'rw' | 'ro',
  localapi: string,
  outDir: string,
  o: Omit<ReplicaOptions, 'emulatorArgs' | 'domain'>,
): Proc {
  return spawnDaemon(
    `certshare ${name}`,
    [
      '--localapi',
      localapi,
      '--store',
      'kube',
      '--mode',
      mode,
      '--group',
      o.group ?? GROUP,
      '--out-dir',
      outDir,
      '--listen',
      '127.0.0.1:0',
      ...(o.flags ?? []),
    ],
    { KUBECONFIG: kubeconfig, POD_NAME: name, POD_NAMESPACE: ns, POD_IPS: '10.0.0.10', ...o.env },
    o.nodeArgs,
    o.main,
  );
}

/**
 * A writer's flags for certificates of seconds: one transient error (or an emulated tailscaled still
 * holding the last pair) must not stall a run of renewals for the default first retry of a minute. A rate
 * limit's first wait too, which start-up validation holds within --retry-cap.
 */
export const FAST_RETRIES = ['--first-retry', '500ms', '--retry-cap', '5s', '--rate-limit-retry', '5s'];

export interface RestResults {
  /** Idle RSS once every replica had the certificate on disk (proc.ts idleRss). */
  writer: MemStatus;
  readers: MemStatus[];
  /**
   * What a replica pays at rest in a Pod: the probes the kubelet sends the injected container in `probeHours`
   * sent first (kubelet-probes.ts sendProbesOf), then the window with the probes at their periods; its RSS at
   * the end and its CPU time over the window per hour (every thread).
   */
  steady: { writer: ReplicaAtRest; readers: ReplicaAtRest[]; probeHours: number; probesAnswered: number; probesFailed: number };
  windowS: number;
  replicas: number;
  /** apiserver_request_total, all series, increase over the window. */
  allSeriesDelta: number;
  /** The same, on series of namespaced Secrets and Pods (what certshare uses in rw/ro mode; the apiserver's own informers watch cluster-wide). */
  certshareSeriesDelta: number;
  /** Audit log: requests completed in the window by the replicas' ServiceAccount. */
  auditCompleted: number;
  /** Audit log: watches the replicas started in the window. */
  auditWatchesStarted: number;
  /** Series that moved in the window, with their increase (top ones). */
  topSeries: Array<[string, number]>;
  /** Open namespaced Secret WATCH requests (apiserver_longrunning_requests) at both scrapes, our probe excluded. */
  openSecretWatches: [number, number];
  /** Bookmarks our own probe watch received, and the gaps between events on it (s). */
  probeBookmarks: number;
  probeMaxGapS: number;
  /** apiserver_watch_events_total{resource="secrets"} increase in the window (events sent to every Secret watcher, the apiserver's own included). */
  secretWatchEvents: number;
}

export interface ReplicaAtRest {
  mem: MemStatus;
  restCpuMsPerHour: number;
}

export interface PropagationResults {
  samplesMs: number[];
  renewals: number;
  missed: number;
  writer: string;
}

/** Writer + 2 readers with 90-day certificates: idle RSS, then hours of probes, then API requests over a quiet window. */
export async function restPhase(cp: ControlPlane, dir: string, auditLog: string, windowS: number, size: BenchSize, probeHours: number): Promise<RestResults> {
  const ns = await exampleNamespace(cp, 'bench');
  const kubeconfig = await cp.kubeconfigFor(ns, 'certshare');
  progress(`kube (${ns}): writer + 2 readers, 90-day certificates`);
  const replicas: KubeReplica[] = [];
  try {
    replicas.push(await startReplica(ns, kubeconfig, dir, 'proxy-0', 'rw'));
    replicas.push(...(await Promise.all(['proxy-1', 'proxy-2'].map((n) => startReplica(ns, kubeconfig, dir, n, 'ro')))));
    await Promise.all(replicas.map((r) => r.files.next(60_000, 0)));
    progress('kube: every replica has the certificate on disk; idle RSS');
    const [writer, ...readers] = await idleRss(
      replicas.map((r) => r.daemon.pid),
      size.idle,
    );

    progress(`kube: the kubelet's probes of ${probeHours} h sent to each replica, then API requests, CPU time and RSS at rest over ${windowS} s`);
    const ports = await Promise.all(replicas.map((r) => r.port));
    const earlier = await Promise.all(ports.map((port) => sendProbesOf(port, probeHours)));
    const probes = ports.map(probeAsKubelet);
    const probe = await watchSecret(cp, ns, KUBE_DOMAIN);
    await sleep(2000);
    const m1 = await cp.metrics();
    const t1 = Date.now();
    const cpu1 = await Promise.all(replicas.map((r) => threadsCpuMs(r.daemon.pid)));
    await sleep(windowS * 1000);
    const cpu2 = await Promise.all(replicas.map((r) => threadsCpuMs(r.daemon.pid)));
    const m2 = await cp.metrics();
    const t2 = Date.now();
    const mems = await Promise.all(replicas.map((r) => memStatus(r.daemon.pid)));
    for (const p of probes) p.stop();
    probe.close();
    const [writerAtRest, ...readersAtRest] = replicas.map((_, i) => ({ mem: mems[i]!, restCpuMsPerHour: (cpu2[i]! - cpu1[i]!) * (3_600_000 / (t2 - t1)) }));

    const delta = seriesDelta(metricSeries(m1, 'apiserver_request_total'), metricSeries(m2, 'apiserver_request_total'));
    const certshareSeries = [...delta].filter(([k]) => {
      const l = labelsOf(k);
      return (l.resource === 'secrets' || l.resource === 'pods') && l.scope !== 'cluster';
    });
    const openWatches = (text: string): number =>
      sum(
        [...metricSeries(text, 'apiserver_longrunning_requests')]
          .filter(([k]) => {
            const l = labelsOf(k);
            // A watch with fieldSelector metadata.name=X is scope "resource"; the apiserver's own informer is "cluster".
            return l.resource === 'secrets' && l.verb === 'WATCH' && l.scope !== 'cluster';
          })
          .map(([, v]) => v),
      ) - 1; // our probe
    const watchEvents = (text: string): number =>
      sum([...metricSeries(text, 'apiserver_watch_events_total')].filter(([k]) => labelsOf(k).resource === 'secrets').map(([, v]) => v));
    const user = `system:serviceaccount:${ns}:certshare`;
    const audit = (await readAudit(auditLog)).filter((e) => e.user.username === user);
    // The replicas' start-up requests (list, get, create...) must be there, or the audit log is not working.
    if (audit.length === 0) throw new Error(`the audit log ${auditLog} holds no request of ${user}: is auditing on?`);
    const inWindow = (ts: string): boolean => {
      const t = Date.parse(ts);
      return t >= t1 && t <= t2;
    };
    return {
      writer: writer!,
      readers,
      steady: {
        writer: writerAtRest!,
        readers: readersAtRest,
        probeHours,
        probesAnswered: sum([...probes, ...earlier].map((p) => p.answered)),
        probesFailed: sum([...probes, ...earlier].map((p) => p.failed)),
      },
      windowS: (t2 - t1) / 1000,
      replicas: replicas.length,
      allSeriesDelta: sum(delta.values()),
      certshareSeriesDelta: sum(certshareSeries.map(([, v]) => v)),
      auditCompleted: audit.filter((e) => e.stage === 'ResponseComplete' && inWindow(e.stageTimestamp)).length,
      auditWatchesStarted: audit.filter((e) => e.stage === 'ResponseStarted' && e.verb === 'watch' && inWindow(e.stageTimestamp)).length,
      topSeries: [...delta]
        .sort((a, b) => b[1] - a[1])
        .slice(0, 8)
        .map(([k, v]) => [shortLabels(k), v]),
      openSecretWatches: [openWatches(m1), openWatches(m2)],
      probeBookmarks: probe.events.filter((e) => e.type === 'BOOKMARK').length,
      probeMaxGapS: longestSilenceS(probe),
      secretWatchEvents: watchEvents(m2) - watchEvents(m1),
    };
  } finally {
    await Promise.all(replicas.map((r) => r.stop()));
  }
}

function shortLabels(labels: string): string {
  const l = labelsOf(labels);
  return `${l.verb} ${l.group ? `${l.group}/` : ''}${l.resource || '-'}${l.subresource ? `/${l.subresource}` : ''} scope=${l.scope || '-'} code=${l.code}`;
}

/**
 * Writer with short certificates (renewal every ~2 s) + 2 readers: for each renewal, the time from the
 * writer's Secret update (seen by an admin watch) to each reader's files changing (fs.watch).
 */
export async function propagationPhase(cp: ControlPlane, dir: string, renewals: number, lifetimeS: number): Promise<PropagationResults> {
  const certLifetime = `${lifetimeS}s`;
  const ns = await exampleNamespace(cp, 'bench');
  const kubeconfig = await cp.kubeconfigFor(ns, 'certshare');
  progress(`kube (${ns}): propagation over ${renewals} renewals (${certLifetime} certificates)`);
  // First time each certificate (decoded tls.crt) appeared in the Secret, as seen by the admin watch.
  const firstSeen = new Map<string, number>();
  const onEvent = (e: WatchEvent): void => {
    const crt = e.object?.data?.['tls.crt'];
    if ((e.type === 'ADDED' || e.type === 'MODIFIED') && crt) {
      const pem = Buffer.from(crt, 'base64').toString('utf8');
      if (!firstSeen.has(pem)) firstSeen.set(pem, e.at);
    }
  };
  const probe = await watchSecret(cp, ns, KUBE_DOMAIN, onEvent);
  const replicas: KubeReplica[] = [];
  try {
    replicas.push(await startReplica(ns, kubeconfig, dir, 'proxy-0', 'rw', { emulatorArgs: ['--cert-lifetime', certLifetime], flags: FAST_RETRIES }));
    replicas.push(...(await Promise.all(['proxy-1', 'proxy-2'].map((n) => startReplica(ns, kubeconfig, dir, n, 'ro')))));
    const readers = replicas.slice(1);
    const timeoutMs = 30_000 + renewals * lifetimeS * 1000;
    // The first certificate plus `renewals` renewals on every reader.
    await Promise.all(readers.map((r) => r.files.next(timeoutMs, renewals)));
    const samplesMs: number[] = [];
    let missed = 0;
    for (const r of readers) {
      for (const change of r.files.changes.slice(1, renewals + 1)) {
        const at = firstSeen.get(change.pem);
        if (at === undefined) missed++;
        else samplesMs.push(change.at - at);
      }
    }
    return { samplesMs, renewals, missed, writer: 'proxy-0' };
  } finally {
    probe.close();
    await Promise.all(replicas.map((r) => r.stop()));
  }
}

export function propagationSummary(p: PropagationResults): { p50: number; p99: number } {
  return { p50: percentile(p.samplesMs, 50), p99: percentile(p.samplesMs, 99) };
}
