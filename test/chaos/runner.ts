// The chaos run: a real control plane, the example namespace, three replicas as processes (each with
// its own emulated tailscaled) behind a fault-injecting proxy, the chaos schedule with quiet periods,
// and the invariant checker watching everything. Bounded: every phase has a deadline. With --clusters
// C > 1, the same per member cluster (two replicas each, federated), plus a home (home.ts) and its chaos.
import { createWriteStream } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { startControlPlane, type ControlPlane } from '../harness/control-plane.ts';
import { writeSharedCa } from '../support/certs.ts';
import { allowDomains, exampleNamespace, GROUP, KUBE_DOMAIN, kubeconfigVia, must } from '../support/kube.ts';
import { Checker, GATE, type CheckerResult } from './checker.ts';
import { judgeAtEnd } from './end-check.ts';
import { FaultProxy } from './fault-proxy.ts';
import { DEFAULT_HOME_TUNING, FEDERATION_ACCOUNT, HomeChaos, homeNamespace, type HomeTuning } from './home.ts';
import { AdminWatch, DirWatch, LedgerTail } from './observers.ts';
import { Replica, type Instance } from './replicas.ts';
import { buildReport, type ChaosReport, processStarts } from './report.ts';
import { ClaimedWindows } from './claimed-windows.ts';
import { strandedIn } from './cross-cluster.ts';
import type { Issuance } from './ledger.ts';
import { Rng } from './rng.ts';
import { SecretBoard } from './secret-board.ts';
import { Chaos, DEFAULT_TUNING, type ChaosStats, type ChaosTuning } from './schedule.ts';

export interface RunOptions {
  minutes: number;
  seed: number;
  /**
   * Member clusters (default 1). With more, a federation home (a further apiserver, manifests/federation)
   * holds the group's Lease, Secrets of record and ledger; each member has its own apiserver, proxy and
   * replicas with the federation flags, and its own chaos; the home has outages and partitions.
   */
  clusters?: number;
  /** Domains of the group (one Secret each, all served by every emulator). Default 1. */
  domainsPerGroup?: number;
  /**
   * The run's compressed clock made K times slower (default 1): certificate lifetime, the replicas'
   * lease, retry and CertPair timings, the checker's grace, settling and recovery allowances, the
   * segments and the mean times between chaos actions. Process start-up, request latencies and fault
   * episodes are not compressed, so with many domains on a loaded machine the same invariants can be
   * checked at a time scale the work per renewal fits in.
   */
  timeScale?: number;
  /** Event log on stderr too (it always goes to <run dir>/chaos.log). */
  verbose?: boolean;
  /** Keep the run directory (logs, ledger) even when every invariant held. */
  keep?: boolean;
  tuning?: Partial<ChaosTuning>;
  /** The home's chaos over its defaults (federated runs); its mean times scale with timeScale as theirs do. */
  homeTuning?: Partial<HomeTuning>;
  /**
   * The last member's CA clock this far ahead (negative: behind) of its replicas' (emulator --clock-skew),
   * federated runs only: its certificates' notAfter lands that far off the home's for an issuance as late.
   */
  lastMemberCaSkewMs?: number;
  /** Progress lines (default: stderr). */
  progress?: (line: string) => void;
}

export const REPLICAS = ['proxy-0', 'proxy-1', 'proxy-2'];
/** Scaled certificate lifetime: under 10 days, so renewal is due at half: a 10 s renewal window. */
export const CERT_LIFETIME = '20s';
export const GRACE_MS = 2000;
/** After a quiet period begins (faults cleared, every replica up), time allowed for the system to settle. */
export const SETTLE_MS = 5000;
/**
 * After the API was unreachable (server stopped, proxy blackout), extra time before the grace starts:
 * the replicas retry reads with a backoff capped at 8 x --first-retry = 2.4 s.
 */
export const RECOVERY_MS = 3000;
const FINAL_QUIET_MS = 30_000;
const CHAOS_SEGMENT_MS = 50_000;
const QUIET_SEGMENT_MS = 20_000;

export const TIMING_FLAGS = timingFlags(1);

/** The replicas' timing flags on the run's clock, `k` times slower than the default compression. */
export function timingFlags(k: number): string[] {
  const ms = (v: number): string => `${Math.round(v * k)}ms`;
  return [
    '--lease-duration',
    ms(2000),
    '--first-retry',
    ms(300),
    '--retry-cap',
    ms(5000),
    '--rate-limit-retry',
    ms(3000),
    '--check-interval',
    '1h',
    // The CA's limit per exact name counts a real 168 h: the run's compressed windows renew more often.
    '--name-limit',
    '0',
    '--cert-timeout',
    ms(5000),
    '--drain-delay',
    '200ms',
    '--shutdown-timeout',
    '3s',
    '--log-level',
    'info',
  ];
}

/** The harness's own times (see the constants above) on the run's clock. */
function scaledTimes(k: number): {
  certLifetime: string;
  graceMs: number;
  settleMs: number;
  recoveryMs: number;
  finalQuietMs: number;
  chaosSegmentMs: number;
  quietSegmentMs: number;
} {
  return {
    certLifetime: `${Math.round(parseInt(CERT_LIFETIME, 10) * k)}s`,
    graceMs: GRACE_MS * k,
    settleMs: SETTLE_MS * k,
    recoveryMs: RECOVERY_MS * k,
    finalQuietMs: FINAL_QUIET_MS * k,
    chaosSegmentMs: CHAOS_SEGMENT_MS * k,
    quietSegmentMs: QUIET_SEGMENT_MS * k,
  };
}

/** Mean times between chaos actions on the run's clock (durations of fault episodes stay as they are). */
function scaledTuning(t: ChaosTuning, k: number): ChaosTuning {
  return {
    ...t,
    killEveryMs: t.killEveryMs * k,
    proxyPauseMeanMs: t.proxyPauseMeanMs * k,
    emulatorFaultEveryMs: t.emulatorFaultEveryMs * k,
    apiOutageEveryMs: t.apiOutageEveryMs * k,
    massKillEveryMs: t.massKillEveryMs * k,
    handEditEveryMs: t.handEditEveryMs * k,
    domainRateLimitEveryMs: t.domainRateLimitEveryMs * k,
  };
}

/** The home's mean times between faults on the run's clock (their durations stay as they are). */
function scaledHomeTuning(t: HomeTuning, k: number): HomeTuning {
  return {
    ...t,
    outageEveryMs: t.outageEveryMs * k,
    partitionEveryMs: t.partitionEveryMs * k,
    // Tied to the certificates' lifetime, which scales.
    doublePartitionEveryMs: t.doublePartitionEveryMs * k,
    doublePartitionMs: [t.doublePartitionMs[0] * k, t.doublePartitionMs[1] * k, t.doublePartitionMs[2] * k],
  };
}

const sum = (values: number[]): number => values.reduce((a, b) => a + b, 0);

function addCounts(into: Record<string, number>, from: Record<string, number>): Record<string, number> {
  for (const [key, n] of Object.entries(from)) into[key] = (into[key] ?? 0) + n;
  return into;
}

/** Every member's chaos counters added up (one member: its own). */
function sumStats(all: ChaosStats[]): ChaosStats {
  if (all.length === 1) return all[0]!;
  const total: ChaosStats = { ...all[0]!, apiOutageMs: [], proxyEpisodes: {}, emulatorFaults: {} };
  const counters = [
    'kills',
    'sigkills',
    'sigterms',
    'writerKills',
    'restarts',
    'apiOutages',
    'busDrops',
    'massRenewalKills',
    'handEdits',
    'domainRateLimits',
  ] as const;
  for (const key of counters) total[key] = sum(all.map((s) => s[key]));
  for (const s of all) {
    total.apiOutageMs.push(...s.apiOutageMs);
    addCounts(total.proxyEpisodes, s.proxyEpisodes);
    addCounts(total.emulatorFaults, s.emulatorFaults);
  }
  return total;
}

/**
 * The members' findings as one. Every checker saw every issuance (one ledger), so the window analysis,
 * the issuance counts and the invariant-1 findings are the first's (the others' are the same texts); the
 * rest is per member: violations (each names its replica, so none is lost in the de-duplication), the
 * Secrets' certificates, requests and convergence (the slowest member's figures).
 */
function mergeResults(results: CheckerResult[]): CheckerResult {
  if (results.length === 1) return results[0]!;
  const first = results[0]!;
  const conv = results.map((r) => r.convergence);
  return {
    ...first,
    violations: [...new Set(results.flatMap((r) => r.violations))],
    unsharedRateLimits: results.flatMap((r) => r.unsharedRateLimits),
    convergence: {
      quietSamples: sum(conv.map((c) => c.quietSamples)),
      quietP50Ms: Math.max(...conv.map((c) => c.quietP50Ms)),
      quietP99Ms: Math.max(...conv.map((c) => c.quietP99Ms)),
      quietMaxMs: Math.max(...conv.map((c) => c.quietMaxMs)),
      allSamples: sum(conv.map((c) => c.allSamples)),
      allP99Ms: Math.max(...conv.map((c) => c.allP99Ms)),
      allMaxMs: Math.max(...conv.map((c) => c.allMaxMs)),
    },
    secretCerts: sum(results.map((r) => r.secretCerts)),
    secretInvalidMs: sum(results.map((r) => r.secretInvalidMs)),
    requests: sum(results.map((r) => r.requests)),
    rateLimitedAnswers: sum(results.map((r) => r.rateLimitedAnswers)),
    handEdits: {
      count: sum(results.map((r) => r.handEdits.count)),
      repaired: sum(results.map((r) => r.handEdits.repaired)),
      repairMaxMs: Math.max(...results.map((r) => r.handEdits.repairMaxMs)),
      repairP50Ms: Math.max(...results.map((r) => r.handEdits.repairP50Ms)),
    },
  };
}

/** The group's domains: the example's own first, then proxy-2, proxy-3, ... in the same tailnet. */
export function chaosDomains(count: number): string[] {
  const [, tailnet] = /^[^.]+\.(.*)$/.exec(KUBE_DOMAIN)!;
  return [KUBE_DOMAIN, ...Array.from({ length: count - 1 }, (_, i) => `proxy-${i + 2}.${tailnet}`)];
}

/** Fallback when manifests/example cannot be applied: the same least-privilege rules, inline. */
function inlineRbac(domains: string[]): string {
  return JSON.stringify({
    apiVersion: 'v1',
    kind: 'List',
    items: [
      { apiVersion: 'v1', kind: 'ServiceAccount', metadata: { name: 'certshare' } },
      {
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: 'Role',
        metadata: { name: 'certshare' },
        rules: [
          { apiGroups: [''], resources: ['secrets'], resourceNames: domains, verbs: ['get', 'list', 'watch', 'update'] },
          { apiGroups: [''], resources: ['secrets'], verbs: ['create'] },
          { apiGroups: ['coordination.k8s.io'], resources: ['leases'], verbs: ['create'] },
          { apiGroups: ['coordination.k8s.io'], resources: ['leases'], resourceNames: [`certshare-${GROUP}`], verbs: ['get', 'update'] },
          { apiGroups: [''], resources: ['pods/status'], verbs: ['patch'] },
          // The issuance budget's ledger (--issuance-budget): without it no first issuance happens.
          { apiGroups: [''], resources: ['configmaps'], verbs: ['create'] },
          { apiGroups: [''], resources: ['configmaps'], resourceNames: [`certshare-${GROUP}-ledger`], verbs: ['get', 'update'] },
        ],
      },
      {
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: 'RoleBinding',
        metadata: { name: 'certshare' },
        roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'certshare' },
        subjects: [{ kind: 'ServiceAccount', name: 'certshare' }],
      },
    ],
  });
}

async function namespaceWithRbac(cp: ControlPlane, domains: string[], log: (m: string) => void): Promise<string> {
  try {
    const ns = await exampleNamespace(cp, 'chaos');
    if (domains.length > 1) await allowDomains(cp, ns, domains);
    return ns;
  } catch (err) {
    log(`manifests/example could not be applied (${(err as Error).message.split('\n')[0]}); using inline RBAC`);
    const ns = `chaos-inline-${process.pid}`;
    await must(cp.kubectl(['create', 'namespace', ns]));
    await must(cp.kubectl(['apply', '-n', ns, '-f', '-'], { input: inlineRbac(domains) }));
    return ns;
  }
}

async function createPods(cp: ControlPlane, ns: string, names: string[]): Promise<void> {
  for (const name of names) {
    const pod = {
      apiVersion: 'v1',
      kind: 'Pod',
      metadata: { name, labels: { app: 'proxy' } },
      // Under certshare's account: each replica's token is bound to its Pod (kubeconfigVia with the Pod's name).
      spec: { serviceAccountName: 'certshare', readinessGates: [{ conditionType: GATE }], containers: [{ name: 'proxy', image: 'nginx' }] },
    };
    await must(cp.kubectl(['-n', ns, 'create', '-f', '-'], { input: JSON.stringify(pod) }));
  }
}

/** One member cluster of the run (the only one without a home). */
interface Member {
  cp: ControlPlane;
  ns: string;
  proxy: FaultProxy;
  replicas: Replica[];
  checker: Checker;
  chaos: Chaos;
  podWatch?: AdminWatch;
  /** Its name on the SecretBoard: c1, c2, ... */
  where: string;
}

/** A federated run's replicas per member: two (a writer and a standby) keep 3 members on 2 cores. */
const FEDERATED_REPLICAS = 2;

export async function runChaos(options: RunOptions): Promise<ChaosReport> {
  const started = Date.now();
  const totalMs = Math.round(options.minutes * 60_000);
  const progress = options.progress ?? ((line: string) => process.stderr.write(`${line}\n`));
  const runDir = await mkdtemp(join(tmpdir(), 'certshare-chaos-'));
  const eventLog = createWriteStream(join(runDir, 'chaos.log'), { flags: 'a' });
  const log = (message: string): void => {
    const line = `${new Date().toISOString().slice(11, 23)} ${message}`;
    eventLog.write(`${line}\n`);
    if (options.verbose) process.stderr.write(`${line}\n`);
  };
  const rng = new Rng(options.seed);
  const k = options.timeScale ?? 1;
  const tuning: ChaosTuning = scaledTuning({ ...DEFAULT_TUNING, ...options.tuning }, k);
  const T = scaledTimes(k);
  const domains = chaosDomains(options.domainsPerGroup ?? 1);
  log(`run dir ${runDir}, seed ${options.seed}, ${options.minutes} min, ${domains.length} domain(s) per group, time scale ${k}`);

  const clusters = options.clusters ?? 1;
  const federated = clusters > 1;
  const members: Member[] = [];
  const controlPlanes: ControlPlane[] = [];
  const proxies: FaultProxy[] = [];
  let home: ControlPlane | undefined;
  let homeChaos: HomeChaos | undefined;
  const replicas: Replica[] = [];
  const stoppers: Array<() => unknown> = [];
  let report: ChaosReport | undefined;
  try {
    // A stop is SIGTERM then SIGKILL after 1 s: a graceful kube-apiserver shutdown with clients attached
    // can take 10 s, too long an outage for 10 s renewal windows.
    const started = await Promise.all(Array.from({ length: clusters + (federated ? 1 : 0) }, () => startControlPlane({ stopGraceMs: 1000 })));
    controlPlanes.push(...started);
    const memberPlanes = federated ? started.slice(1) : started;
    // Each member reaches the home through its own proxy: a partition cuts one member off, not all.
    const homeLinks: FaultProxy[] = [];
    let homeNs = '';
    // Every Secret of every cluster (the home's as `home`, the members' as c1, c2, ...): invariant 2 across
    // the clusters and the convergence after the home's return (secret-board.ts).
    const board = new SecretBoard(
      memberPlanes.map((_, c) => `c${c + 1}`),
      (m) => log(m),
    );
    if (federated) {
      home = started[0]!;
      homeNs = await homeNamespace(home, domains);
      for (const [c] of memberPlanes.entries()) {
        const link = new FaultProxy({ upstream: home.server, upstreamCaPem: home.caPem, rng: new Rng(options.seed ^ 0x40e ^ c) });
        await link.start();
        proxies.push(link);
        homeLinks.push(link);
      }
      homeChaos = new HomeChaos({
        home,
        links: homeLinks,
        rng: new Rng(options.seed ^ 0x40e),
        tuning: scaledHomeTuning({ ...DEFAULT_HOME_TUNING, ...options.homeTuning }, k),
        log,
        onReturn: (at, _member, what) => board.homeReturned(at, what, domains),
        onLoss: () => board.homeLost(),
      });
      log(`home ${home.server}, namespace ${homeNs}`);
    }
    const ledger = join(runDir, 'ledger.jsonl');
    const byName = new Map<string, Replica>();
    /** Each replica's watch of its projected files (made once the checkers are). */
    const filesOf = new Map<string, DirWatch>();
    // Quiet periods: [start, end); the checker counts samples from start + settle time to end - grace.
    const quietPeriods: Array<[number, number]> = [];
    // Serials a member issued on its own while the home was away (its log says so): outside invariant 1.
    const breakGlass = new Set<string>();
    // Break-glass issuances per member, domain and window (the serial of the copy it replaced, from the log).
    const breakGlassWindows = new Map<string, Set<string>>();
    // Windows claimed by a writer that may have lost the certificate before storing it (claimed-windows.ts).
    const claimedWindows = new ClaimedWindows();
    /**
     * A break-glass issuance of member c, from its writer's log or its Secret's record (whichever is seen first;
     * the record stands when the log line was lost). A log without the window (an older certshare): the serial
     * stands for it. `none` (the member held no valid copy) is no window of its own: the last pair its Secret
     * held valid names it.
     */
    const noteBreakGlass = (c: number, domain: string, serial: string, window: string | undefined, source: string): void => {
      const key = serial.toLowerCase();
      if (breakGlass.has(key)) return;
      breakGlass.add(key);
      const replaced = window === 'none' ? `none after ${board.lastHeldBefore(`c${c + 1}`, domain, serial) ?? 'nothing'}` : window;
      const name = `${federated ? `c${c + 1}-` : ''}${domain} replacing ${replaced ?? `? (${serial})`}`;
      breakGlassWindows.set(name, (breakGlassWindows.get(name) ?? new Set()).add(key));
      log(`${source}: break-glass issuance ${serial} (${domain}, window ${window ?? '?'})`);
    };

    // A process that exits without being killed crashed: a violation (and it is restarted). A SIGTERM
    // handled but not ending in exit code 0 means the graceful stop overran --shutdown-timeout (or was
    // cut by our 8 s bound): reported.
    const crashes: string[] = [];
    const slowStops: string[] = [];
    // A process that runs but does not answer /healthz (event loop stuck, listener gone): half dead.
    const halfDead: string[] = [];
    /** Since when each replica has been its member's writer, by its log (cleared when it says otherwise or exits). */
    const writerSince = new Map<string, number>();
    const onExit = (r: Replica, inst: Instance): void => {
      writerSince.delete(r.name);
      const how = `code ${inst.exit?.code}, signal ${inst.exit?.signal}`;
      if (inst.killedWith === undefined) {
        crashes.push(
          `crash ${new Date(inst.exitedAt!).toISOString().slice(11, 23)} ${r.name} (pid ${inst.pid}) exited by itself (${how}); see ${r.name}/certshare.log`,
        );
        log(`CRASH ${r.name} pid ${inst.pid} (${how}); restarting in 1 s`);
        setTimeout(() => {
          if (!r.running && !r.stopping) r.start();
        }, 1000).unref();
      } else if (inst.killedWith === 'SIGTERM' && inst.exit?.signal === 'SIGTERM') {
        // Still starting: no handler yet, the default action ended it (nothing to drain then).
        log(`${r.name} pid ${inst.pid} took SIGTERM while starting (${how})`);
      } else if (inst.killedWith === 'SIGTERM' && inst.exit?.code !== 0) {
        slowStops.push(`${r.name} (pid ${inst.pid}) after SIGTERM: ${how}`);
        log(`slow stop: ${r.name} pid ${inst.pid} (${how})`);
      }
    };

    // Federated: one CA behind every emulator (as Let's Encrypt is behind every tailscaled), which every member
    // trusts (--federation-trust-anchors): a restarted emulator signs with the same one.
    const sharedCa = federated ? await writeSharedCa(runDir, 'certshare chaos CA') : undefined;
    /** A federated replica's (and its emulator's) member, 0-based, from its name (c1-proxy-0: 0). */
    const memberIndex = (name: string): number | undefined => {
      const m = /^c(\d+)-/.exec(name);
      return m ? Number(m[1]) - 1 : undefined;
    };
    for (const [c, cp] of memberPlanes.entries()) {
      // Without a home the names are today's; with one, each member's are prefixed (c1-proxy-0, ...):
      // the emulators' ids in the shared ledger tell the clusters apart.
      const prefix = federated ? `c${c + 1}-` : '';
      const names = (federated ? REPLICAS.slice(0, FEDERATED_REPLICAS) : REPLICAS).map((n) => `${prefix}${n}`);
      const ns = await namespaceWithRbac(cp, domains, log);
      await createPods(cp, ns, names);
      const proxy = new FaultProxy({ upstream: cp.server, upstreamCaPem: cp.caPem, rng: new Rng(options.seed ^ 0x5eed ^ c) });
      await proxy.start();
      proxies.push(proxy);
      log(`${federated ? `member ${c + 1}: ` : ''}namespace ${ns}, proxy ${proxy.url}, api ${cp.server}`);
      const federation = federated
        ? [
            '--federation-kubeconfig',
            await kubeconfigVia(home!, homeNs, join(runDir, `home-kubeconfig-c${c + 1}`), homeLinks[c]!, { serviceAccount: FEDERATION_ACCOUNT }),
            '--federation-namespace',
            homeNs,
            '--federation-cluster',
            `c${c + 1}`,
            '--federation-lease-duration',
            `${Math.round(2000 * k)}ms`,
            '--federation-trust-anchors',
            sharedCa!.anchorsFile,
          ]
        : [];
      let chaos: Chaos | undefined;
      const own: Replica[] = [];
      /** Each replica's bearer token: how the fault proxy tells its requests apart. */
      const tokens = new Map<string, string>();
      for (const [i, name] of names.entries()) {
        const kubeconfig = await kubeconfigVia(cp, ns, join(runDir, `kubeconfig-${name}`), proxy, { pod: name });
        const token = /token: "?([^"\s]+)"?/.exec(await readFile(kubeconfig, 'utf8'))?.[1];
        if (!token) throw new Error(`no token in ${kubeconfig}`);
        tokens.set(name, token);
        const r = new Replica(
          {
            name,
            namespace: ns,
            domains,
            group: GROUP,
            kubeconfig,
            ledger,
            certLifetime: T.certLifetime,
            podIp: `10.0.${c}.${10 + i}`,
            flags: [...timingFlags(k), ...federation],
            emulatorCa: sharedCa?.caFile,
            emulatorFlags: federated && c === memberPlanes.length - 1 && options.lastMemberCaSkewMs ? [`--clock-skew=${options.lastMemberCaSkewMs}ms`] : [],
          },
          runDir,
          (replica, line) => {
            chaos?.observeLog(replica, line);
            if (line.msg === 'became the writer' || line.msg === 'no longer the writer') log(`${replica}: ${line.msg}`);
            if (line.msg === 'became the writer') writerSince.set(replica, Date.now());
            else if (line.msg === 'no longer the writer') writerSince.delete(replica);
            const at = typeof line.time === 'string' ? Date.parse(line.time) : Date.now();
            if (line.msg === 'certshare started') claimedWindows.started(replica, at);
            if (line.msg === 'break-glass: window claimed' && typeof line.window === 'string')
              claimedWindows.claimed(c, replica, String(line.domain), line.window, at);
            if (typeof line.msg === 'string' && line.msg.startsWith('break-glass: issued') && typeof line.serial === 'string') {
              noteBreakGlass(c, String(line.domain), line.serial, typeof line.window === 'string' ? line.window : undefined, replica);
            }
          },
          (inst) => onExit(r, inst),
        );
        await r.init();
        own.push(r);
        byName.set(name, r);
      }
      replicas.push(...own);
      const member: Partial<Member> = { cp, ns, proxy, replicas: own, where: `c${c + 1}` };
      const checker = new Checker({
        domains,
        graceMs: T.graceMs,
        replicaNames: names,
        running: (name) => byName.get(name)?.current,
        instanceAt: (emulator, t) => {
          const inst = byName.get(emulator)?.instanceAt(t);
          return inst ? `${emulator}/${inst.pid}` : undefined;
        },
        endedAround: (emulator, t) => {
          // Ended while its CertPair call was open (up to --cert-timeout before the issuance was recorded:
          // the emulator finishes an issuance whose caller went away) or before it could store the result.
          const certTimeoutMs = 5000 * k;
          const inst = byName.get(emulator)?.instances.find((i) => i.exitedAt !== undefined && i.exitedAt >= t - certTimeoutMs && i.exitedAt <= t + T.graceMs);
          if (!inst) return undefined;
          return inst.killedWith === 'SIGKILL' ? 'SIGKILL' : inst.killedWith === 'SIGTERM' ? 'SIGTERM' : 'crash';
        },
        ...(federated
          ? {
              strandedBetween: (cover: Issuance, extra: Issuance) =>
                strandedIn(cover, memberIndex(cover.emulator), extra, memberIndex(extra.emulator), (m, t) => homeChaos!.linkAt(m, t), T.graceMs),
            }
          : {}),
        quietAt: (t) => quietPeriods.some(([s, e]) => t >= s + T.settleMs && t < e - T.graceMs),
        podsInSync: () => member.podWatch?.connected ?? false,
        reachableSince: (now) => {
          const since = chaos?.reachableSince(now) ?? 0;
          return since === 0 ? 0 : since + T.recoveryMs;
        },
        refreshFiles: (name, domain) => filesOf.get(name)?.readNow(domain),
        secretsReachableSince: (name) => proxy.secretsReachableSince(tokens.get(name)!),
        statusReachableSince: (name) => proxy.statusReachableSince(tokens.get(name)!),
        excusedIssuance: (i) => {
          // Taken first in any case: a claim stands for one issuance, the one its log line named included.
          const claim = claimedWindows.take(i);
          if (breakGlass.has(i.serial.toLowerCase())) return true;
          if (claim) noteBreakGlass(claim.member, i.domain, i.serial, claim.window, `${i.emulator} (claimed, never stored)`);
          return claim !== undefined;
        },
        breakGlassRecorded: (domain, serial, window) => noteBreakGlass(c, domain, serial, window, `c${c + 1}-secret`),
        ...(federated
          ? {
              federation: {
                link: () => homeChaos!.link(c),
                linkAt: (t) => homeChaos!.linkAt(c, t),
                writerSince: () => {
                  const since = names.flatMap((n) => writerSince.get(n) ?? []);
                  return since.length ? Math.min(...since) : undefined;
                },
                validAt: (domain: string, now: number) => ({
                  home: board.validElsewhere(domain, `c${c + 1}`, now, 'home'),
                  elsewhere: board.validElsewhere(domain, `c${c + 1}`, now),
                }),
              },
            }
          : {}),
        verbose: (m) => log(`${prefix}${m}`),
      });
      chaos = new Chaos({
        rng: c === 0 ? rng : new Rng(options.seed ^ (0x9e37 * c)),
        replicas: own,
        proxy,
        cp,
        namespace: ns,
        tuning,
        log: (m) => log(`${prefix}${m}`),
        domains,
        onHandEdit: (d, at) => checker.handEdited(d, at),
      });
      members.push(Object.assign(member, { checker, chaos }) as Member);
    }
    await Promise.all(replicas.map((r) => r.startEmulator()));

    for (const m of members) {
      const { checker } = m;
      // Every Secret of the namespace (the admin may list them all); the checker keeps the domains' own.
      const secretWatch = new AdminWatch(
        m.cp,
        `/api/v1/namespaces/${m.ns}/secrets`,
        domains.length === 1 ? `fieldSelector=${encodeURIComponent(`metadata.name=${KUBE_DOMAIN}`)}` : '',
        (type, obj, at) => {
          checker.secret(obj.metadata?.name ?? '', type === 'DELETED' ? undefined : obj, at);
          if (federated && domains.includes(obj.metadata?.name ?? '')) board.update(m.where, obj.metadata!.name!, type === 'DELETED' ? undefined : obj, at);
        },
        (items, at) => {
          const byName = new Map(items.map((obj) => [obj.metadata?.name ?? '', obj]));
          for (const d of domains) checker.secret(d, byName.get(d), at);
          if (federated) for (const d of domains) board.update(m.where, d, byName.get(d), at);
        },
      );
      const podWatch = new AdminWatch(
        m.cp,
        `/api/v1/namespaces/${m.ns}/pods`,
        'labelSelector=app%3Dproxy',
        (type, obj, at) => checker.pods(obj.metadata?.name ?? '', type === 'DELETED' ? undefined : obj, at),
        (items, at) => {
          for (const obj of items) checker.pods(obj.metadata?.name ?? '', obj, at);
        },
      );
      m.podWatch = podWatch;
      const dirWatches = m.replicas.map((r) => new DirWatch(r.outDir, domains, (domain, state) => checker.files(r.name, domain, state)));
      for (const [i, r] of m.replicas.entries()) filesOf.set(r.name, dirWatches[i]!);
      secretWatch.start();
      podWatch.start();
      for (const d of dirWatches) d.start();
      stoppers.push(
        () => secretWatch.stop(),
        () => podWatch.stop(),
        ...dirWatches.map((d) => () => d.stop()),
      );
    }
    if (home) {
      // The home's Secrets of record, as the admin sees them there.
      const homeWatch = new AdminWatch(
        home,
        `/api/v1/namespaces/${homeNs}/secrets`,
        '',
        (type, obj, at) => {
          if (domains.includes(obj.metadata?.name ?? '')) board.update('home', obj.metadata!.name!, type === 'DELETED' ? undefined : obj, at);
        },
        (items, at) => {
          const byName = new Map(items.map((obj) => [obj.metadata?.name ?? '', obj]));
          for (const d of domains) board.update('home', d, byName.get(d), at);
        },
      );
      homeWatch.start();
      stoppers.push(() => homeWatch.stop());
    }
    // One ledger for every emulator of every cluster: each checker sees every issuance (the Secrets it
    // watches may hold any cluster's certificate), and only its own cluster's requests (rate limits are
    // per process and Secret).
    const memberOf = new Map(members.flatMap((m) => m.replicas.map((r) => [r.name, m] as const)));
    const ledgerTail = new LedgerTail(ledger, (line) => {
      for (const m of members) if (line.kind !== 'request' || memberOf.get(String(line.emulator)) === m) m.checker.ledger(line);
    });
    ledgerTail.start();
    // The continuous checks start once every replica holds every first certificate (below): before that
    // no replica has had files to keep valid. The start-up time is reported.
    let ticker: NodeJS.Timeout | undefined;
    stoppers.push(
      () => clearInterval(ticker),
      () => ledgerTail.stop(),
    );

    const probeHealth = async (when: string): Promise<void> => {
      await Promise.all(
        replicas.map(async (r) => {
          const inst = r.current;
          if (!inst) return;
          try {
            await r.healthz(3000);
          } catch (err) {
            if (r.current !== inst) return; // killed meanwhile
            halfDead.push(`half-dead ${new Date().toISOString().slice(11, 23)} ${r.name} (pid ${inst.pid}) ${when}: ${(err as Error).message}`);
            log(`HALF-DEAD ${r.name} pid ${inst.pid}: ${(err as Error).message}`);
          }
        }),
      );
    };
    const converged = (): boolean => members.every((m) => m.checker.converged());
    for (const r of replicas) r.start();
    const startedReplicasAt = Date.now();

    // Start-up: the first certificate of every domain reaches every replica (bounded).
    const startupBoundMs = 90_000 + 1000 * domains.length;
    const startupDeadline = Date.now() + startupBoundMs;
    while (!converged()) {
      if (Date.now() > startupDeadline)
        throw new Error(`start-up: the first certificates did not reach every replica within ${startupBoundMs / 1000} s (see the logs in the run dir)`);
      await sleep(100);
    }
    const startupMs = Date.now() - startedReplicasAt;
    ticker = setInterval(() => {
      for (const m of members) m.checker.tick(Date.now());
    }, 100);
    log(`start-up done in ${startupMs} ms: every replica holds the first certificate of each of ${domains.length} domain(s)`);
    const t0 = Date.now();
    const end = t0 + totalMs;
    const progressTimer = setInterval(() => {
      const snapshots = members.map((m) => m.checker.snapshot());
      progress(
        `[chaos] ${Math.round((Date.now() - t0) / 1000)}s/${Math.round(totalMs / 1000)}s ` +
          `${federated ? `clusters ${clusters} ` : ''}domains ${domains.length} kills ${sum(members.map((m) => m.chaos.stats.kills))} ` +
          `issuances ${snapshots[0]!.issuances} violations ${sum(snapshots.map((s) => s.violations))}`,
      );
    }, 20_000);
    stoppers.push(() => clearInterval(progressTimer));
    const settleAll = async (): Promise<void> => {
      await homeChaos?.settle();
      await Promise.all(members.map((m) => m.chaos.settle()));
    };

    // Chaos segments with quiet periods in between, then the final quiet phase.
    for (;;) {
      const chaosLeft = end - T.finalQuietMs - Date.now();
      if (chaosLeft <= 1000) break;
      const segment = Math.min(T.chaosSegmentMs, chaosLeft);
      log(`chaos for ${Math.round(segment / 1000)} s`);
      const until = Date.now() + segment;
      await Promise.all([...members.map((m) => m.chaos.run(until)), homeChaos?.run(until)]);
      const left = end - T.finalQuietMs - Date.now();
      if (left < T.quietSegmentMs + 10_000) continue;
      await settleAll();
      const qs = Date.now();
      log(`quiet for ${T.quietSegmentMs / 1000} s`);
      const period: [number, number] = [qs, qs + T.quietSegmentMs];
      quietPeriods.push(period);
      await sleep(T.settleMs);
      await probeHealth('in a quiet period');
      await sleep(Math.max(0, qs + T.quietSegmentMs - Date.now()));
    }
    await settleAll();
    const finalStart = Date.now();
    quietPeriods.push([finalStart, Number.POSITIVE_INFINITY]);
    log(`final quiet phase for ${Math.round(Math.max(T.finalQuietMs, end - finalStart) / 1000)} s`);
    await sleep(Math.max(T.finalQuietMs, end - finalStart));

    // The end: every replica holds every Secret's certificate (allowing the grace for one in flight).
    const holdDeadline = Date.now() + T.graceMs;
    while (Date.now() < holdDeadline && !converged()) await sleep(50);
    await probeHealth('at the end');
    await ledgerTail.poll();
    // A renewal stored in the last moments (during the probes, say) gets its time before it is judged.
    const endChecks = [];
    for (const m of members) endChecks.push(await judgeAtEnd(m.checker, { boundMs: T.graceMs, now: Date.now, sleep: (ms) => sleep(ms) }));
    const endCheck = {
      allowanceMs: Math.max(...endChecks.map((e) => e.allowanceMs)),
      waitedMs: sum(endChecks.map((e) => e.waitedMs)),
    };
    log(`end-of-run check after ${endCheck.waitedMs} ms (allowance ${endCheck.allowanceMs} ms for a certificate stored at the end)`);
    const result = mergeResults(endChecks.map((e) => e.result));
    const proxyApplied: Record<string, number> = {};
    for (const p of proxies) for (const [fault, n] of p.applied) proxyApplied[fault] = (proxyApplied[fault] ?? 0) + n;
    report = buildReport({
      minutes: options.minutes,
      seed: options.seed,
      durationMs: 0,
      domainsPerGroup: domains.length,
      timeScale: k,
      startupMs,
      processStartMs: processStarts(replicas),
      result,
      endCheck,
      chaos: sumStats(members.map((m) => m.chaos.stats)),
      clusters,
      breakGlassIssuances: breakGlass.size,
      ...(federated
        ? {
            breakGlassPerMemberWindowMax: Math.max(0, ...[...breakGlassWindows.values()].map((serials) => serials.size)),
            breakGlassWindows: Object.fromEntries([...breakGlassWindows].map(([window, serials]) => [window, serials.size])),
            homeReturn: board.convergence(),
          }
        : {}),
      home: homeChaos?.stats,
      proxyApplied,
      extraViolations: [
        ...crashes,
        ...halfDead,
        ...[...breakGlassWindows]
          .filter(([, serials]) => serials.size > 1)
          .map(([window, serials]) => `break-glass ${serials.size} times in one window of one member: ${window} (${[...serials].join(', ')})`),
      ],
      slowStops,
    });
    log(`done: ${report.violations} violation(s)`);
    return report;
  } finally {
    for (const stop of stoppers) await Promise.resolve(stop()).catch(() => {});
    await Promise.all(replicas.map((r) => r.stopAll().catch(() => {})));
    await Promise.all(proxies.map((p) => p.close().catch(() => {})));
    await Promise.all(controlPlanes.map((cp) => cp.stop().catch(() => {})));
    await new Promise<void>((r) => eventLog.end(() => r()));
    if (report) {
      report.durationMs = Date.now() - started;
      if (report.violations === 0 && !options.keep) await rm(runDir, { recursive: true, force: true });
      else report.runDir = runDir;
    } else {
      progress(`[chaos] run failed; logs kept in ${runDir}`);
    }
  }
}
