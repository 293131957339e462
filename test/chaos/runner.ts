// The chaos run: a real control plane, the example namespace, three replicas as processes (each with
// its own emulated tailscaled) behind a fault-injecting proxy, the chaos schedule with quiet periods,
// and the invariant checker watching everything. Bounded: every phase has a deadline.
import { createWriteStream } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { startControlPlane, type ControlPlane } from '../harness/control-plane.ts';
import { allowDomains, exampleNamespace, GROUP, KUBE_DOMAIN, kubeconfigVia, must } from '../support/kube.ts';
import { Checker, GATE } from './checker.ts';
import { judgeAtEnd } from './end-check.ts';
import { FaultProxy } from './fault-proxy.ts';
import { AdminWatch, DirWatch, LedgerTail } from './observers.ts';
import { Replica, type Instance } from './replicas.ts';
import { buildReport, type ChaosReport } from './report.ts';
import { Rng } from './rng.ts';
import { Chaos, DEFAULT_TUNING, type ChaosTuning } from './schedule.ts';

export interface RunOptions {
  minutes: number;
  seed: number;
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

async function createPods(cp: ControlPlane, ns: string): Promise<void> {
  for (const name of REPLICAS) {
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

  let cp: ControlPlane | undefined;
  let proxy: FaultProxy | undefined;
  const replicas: Replica[] = [];
  const stoppers: Array<() => unknown> = [];
  let report: ChaosReport | undefined;
  try {
    // A stop is SIGTERM then SIGKILL after 1 s: a graceful kube-apiserver shutdown with clients attached
    // can take 10 s, too long an outage for 10 s renewal windows.
    cp = await startControlPlane({ stopGraceMs: 1000 });
    const ns = await namespaceWithRbac(cp, domains, log);
    await createPods(cp, ns);
    proxy = new FaultProxy({ upstream: cp.server, upstreamCaPem: cp.caPem, rng: new Rng(options.seed ^ 0x5eed) });
    await proxy.start();
    const ledger = join(runDir, 'ledger.jsonl');
    log(`namespace ${ns}, proxy ${proxy.url}, api ${cp.server}`);

    let chaos: Chaos | undefined;
    // A process that exits without being killed crashed: a violation (and it is restarted). A SIGTERM
    // handled but not ending in exit code 0 means the graceful stop overran --shutdown-timeout (or was
    // cut by our 8 s bound): reported.
    const crashes: string[] = [];
    const slowStops: string[] = [];
    // A process that runs but does not answer /healthz (event loop stuck, listener gone): half dead.
    const halfDead: string[] = [];
    const onExit = (r: Replica, inst: Instance): void => {
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
    for (const [i, name] of REPLICAS.entries()) {
      const r = new Replica(
        {
          name,
          namespace: ns,
          domains,
          group: GROUP,
          kubeconfig: await kubeconfigVia(cp, ns, join(runDir, `kubeconfig-${name}`), proxy, { pod: name }),
          ledger,
          certLifetime: T.certLifetime,
          podIp: `10.0.0.${10 + i}`,
          flags: timingFlags(k),
        },
        runDir,
        (replica, line) => {
          chaos?.observeLog(replica, line);
          if (line.msg === 'became the writer' || line.msg === 'no longer the writer') log(`${replica}: ${line.msg}`);
        },
        (inst) => onExit(r, inst),
      );
      await r.init();
      replicas.push(r);
    }
    await Promise.all(replicas.map((r) => r.startEmulator()));

    // Quiet periods: [start, end); the checker counts samples from start + settle time to end - grace.
    const quietPeriods: Array<[number, number]> = [];
    const byName = new Map(replicas.map((r) => [r.name, r]));
    let podWatch: AdminWatch | undefined;
    const checker = new Checker({
      domains,
      graceMs: T.graceMs,
      replicaNames: REPLICAS,
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
      quietAt: (t) => quietPeriods.some(([s, e]) => t >= s + T.settleMs && t < e - T.graceMs),
      podsInSync: () => podWatch?.connected ?? false,
      reachableSince: (now) => {
        const since = chaos?.reachableSince(now) ?? 0;
        return since === 0 ? 0 : since + T.recoveryMs;
      },
      verbose: log,
    });

    // Every Secret of the namespace (the admin may list them all); the checker keeps the domains' own.
    const secretWatch = new AdminWatch(
      cp,
      `/api/v1/namespaces/${ns}/secrets`,
      domains.length === 1 ? `fieldSelector=${encodeURIComponent(`metadata.name=${KUBE_DOMAIN}`)}` : '',
      (type, obj, at) => checker.secret(obj.metadata?.name ?? '', type === 'DELETED' ? undefined : obj, at),
      (items, at) => {
        const byName = new Map(items.map((obj) => [obj.metadata?.name ?? '', obj]));
        for (const d of domains) checker.secret(d, byName.get(d), at);
      },
    );
    podWatch = new AdminWatch(
      cp,
      `/api/v1/namespaces/${ns}/pods`,
      'labelSelector=app%3Dproxy',
      (type, obj, at) => checker.pods(obj.metadata?.name ?? '', type === 'DELETED' ? undefined : obj, at),
      (items, at) => {
        for (const obj of items) checker.pods(obj.metadata?.name ?? '', obj, at);
      },
    );
    const dirWatches = replicas.map((r) => new DirWatch(r.outDir, domains, (domain, state) => checker.files(r.name, domain, state)));
    const ledgerTail = new LedgerTail(ledger, (line) => checker.ledger(line));
    secretWatch.start();
    podWatch.start();
    for (const d of dirWatches) d.start();
    ledgerTail.start();
    // The continuous checks start once every replica holds every first certificate (below): before that
    // no replica has had files to keep valid. The start-up time is reported.
    let ticker: NodeJS.Timeout | undefined;
    stoppers.push(
      () => clearInterval(ticker),
      () => secretWatch.stop(),
      () => podWatch?.stop(),
      () => ledgerTail.stop(),
      ...dirWatches.map((d) => () => d.stop()),
    );

    chaos = new Chaos({ rng, replicas, proxy, cp, namespace: ns, tuning, log, domains, onHandEdit: (d, at) => checker.handEdited(d, at) });
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
    for (const r of replicas) r.start();
    const startedReplicasAt = Date.now();

    // Start-up: the first certificate of every domain reaches every replica (bounded).
    const startupBoundMs = 90_000 + 1000 * domains.length;
    const startupDeadline = Date.now() + startupBoundMs;
    while (!checker.converged()) {
      if (Date.now() > startupDeadline)
        throw new Error(`start-up: the first certificates did not reach every replica within ${startupBoundMs / 1000} s (see the logs in the run dir)`);
      await sleep(100);
    }
    const startupMs = Date.now() - startedReplicasAt;
    ticker = setInterval(() => checker.tick(Date.now()), 100);
    log(`start-up done in ${startupMs} ms: every replica holds the first certificate of each of ${domains.length} domain(s)`);
    const t0 = Date.now();
    const end = t0 + totalMs;
    const progressTimer = setInterval(() => {
      const s = checker.snapshot();
      progress(
        `[chaos] ${Math.round((Date.now() - t0) / 1000)}s/${Math.round(totalMs / 1000)}s ` +
          `domains ${domains.length} kills ${chaos!.stats.kills} issuances ${s.issuances} violations ${s.violations}`,
      );
    }, 20_000);
    stoppers.push(() => clearInterval(progressTimer));

    // Chaos segments with quiet periods in between, then the final quiet phase.
    for (;;) {
      const chaosLeft = end - T.finalQuietMs - Date.now();
      if (chaosLeft <= 1000) break;
      const segment = Math.min(T.chaosSegmentMs, chaosLeft);
      log(`chaos for ${Math.round(segment / 1000)} s`);
      await chaos.run(Date.now() + segment);
      const left = end - T.finalQuietMs - Date.now();
      if (left < T.quietSegmentMs + 10_000) continue;
      await chaos.settle();
      const qs = Date.now();
      log(`quiet for ${T.quietSegmentMs / 1000} s`);
      const period: [number, number] = [qs, qs + T.quietSegmentMs];
      quietPeriods.push(period);
      await sleep(T.settleMs);
      await probeHealth('in a quiet period');
      await sleep(Math.max(0, qs + T.quietSegmentMs - Date.now()));
    }
    await chaos.settle();
    const finalStart = Date.now();
    quietPeriods.push([finalStart, Number.POSITIVE_INFINITY]);
    log(`final quiet phase for ${Math.round(Math.max(T.finalQuietMs, end - finalStart) / 1000)} s`);
    await sleep(Math.max(T.finalQuietMs, end - finalStart));

    // The end: every replica holds every Secret's certificate (allowing the grace for one in flight).
    const holdDeadline = Date.now() + T.graceMs;
    while (Date.now() < holdDeadline && !checker.converged()) await sleep(50);
    await probeHealth('at the end');
    await ledgerTail.poll();
    // A renewal stored in the last moments (during the probes, say) gets its time before it is judged.
    const endCheck = await judgeAtEnd(checker, { boundMs: T.graceMs, now: Date.now, sleep: (ms) => sleep(ms) });
    log(`end-of-run check after ${endCheck.waitedMs} ms (allowance ${endCheck.allowanceMs} ms for a certificate stored at the end)`);
    const result = endCheck.result;
    const proxyApplied = Object.fromEntries(proxy.applied);
    report = buildReport({
      minutes: options.minutes,
      seed: options.seed,
      durationMs: 0,
      domainsPerGroup: domains.length,
      timeScale: k,
      startupMs,
      result,
      endCheck: { allowanceMs: endCheck.allowanceMs, waitedMs: endCheck.waitedMs },
      chaos: chaos.stats,
      proxyApplied,
      extraViolations: [...crashes, ...halfDead],
      slowStops,
    });
    log(`done: ${report.violations} violation(s)`);
    return report;
  } finally {
    for (const stop of stoppers) await Promise.resolve(stop()).catch(() => {});
    await Promise.all(replicas.map((r) => r.stopAll().catch(() => {})));
    await proxy?.close().catch(() => {});
    await cp?.stop().catch(() => {});
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
