// `npm run bench [-- --json]`: certshare's figures, each next to its baseline, measured in one run on
// this machine against the production build (dist/, built first) on the real Node binary.
//
//   --json          the last stdout line is one JSON object with every figure and the targets
//   --window S      API-requests-at-rest window in seconds (default 90)
//   --load S        seconds of measured load per HTTP server, in interleaved rounds of ~2 s (default 25)
//   --renewals N    renewals for the propagation figure (default 20)
//   --memory        also: where the memory goes (import costs, V8 heap of running daemons, V8 flags)
//   --skip-kube     standalone figures only (no control plane)
//   --pods N        Pods created through the injector's webhook for its latency figures (default 300)
//   --deadline S    give up (stopping every process) after this long (default 1800)
//   --domains N[,N...]  instead of the phases above: one group serving N domains (writer + 2 readers, kube
//                   mode), per N: RSS, TCP connections, delivery and mass-renewal times, API requests at rest
//                   (bench/domains.ts). With it: --watch-scope SCOPE and --replica-args 'ARGS' pass flags to
//                   every replica; --renewal-lifetime S sets the certificate lifetime (default: fitted to --window)
//
// The bench reports and never fails on targets: it exits 0 with MISS lines; non-zero only on errors.
import { rmSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { startControlPlane, type ControlPlane } from '../test/harness/control-plane.ts';
import { writeAuditPolicy } from './lib/apiserver.ts';
import { buildDist } from './lib/certshare.ts';
import { stopAll } from './lib/proc.ts';
import { median, progress, round, type Target, verdictOf } from './lib/stats.ts';
import { injectorPhase, type InjectorResults } from './injector.ts';
import { propagationPhase, propagationSummary, restPhase, type PropagationResults, type RestResults } from './kube.ts';
import { domainsPhase, domainsReport, type DomainsRun } from './domains.ts';
import { memoryPhase, printMemoryReport, type MemoryReport } from './memory.ts';
import { bareNodeRss, standalonePhase, type StandaloneResults } from './standalone.ts';

const { values: opts } = parseArgs({
  options: {
    json: { type: 'boolean', default: false },
    window: { type: 'string', default: '90' },
    load: { type: 'string', default: '25' },
    renewals: { type: 'string', default: '20' },
    memory: { type: 'boolean', default: false },
    'skip-kube': { type: 'boolean', default: false },
    pods: { type: 'string', default: '300' },
    deadline: { type: 'string', default: '1800' },
    domains: { type: 'string' },
    'watch-scope': { type: 'string' },
    'replica-args': { type: 'string' },
    'renewal-lifetime': { type: 'string' },
  },
  strict: true,
});
const windowS = Number(opts.window);
const loadS = Number(opts.load);
const renewals = Number(opts.renewals);
if (!(windowS >= 10 && loadS >= 2 && Number.isInteger(renewals) && renewals >= 1)) {
  process.stderr.write('bench: --window >= 10, --load >= 2, --renewals >= 1\n');
  process.exit(2);
}
/** src/kube/secret-watch.ts: each watch asks for a server-side timeout drawn from this range (seconds). */
const WATCH_SECONDS = [1800, 3600];
/** One ended-and-resumed WATCH per mean watch lifetime. */
const WATCH_RENEWALS_PER_HOUR = 3600 / ((WATCH_SECONDS[0]! + WATCH_SECONDS[1]!) / 2);
/** Certificate lifetime for the propagation phase: under 10 days renew at half, so one renewal every ~2 s. */
const PROPAGATION_LIFETIME_S = 4;

const TARGETS: Record<string, Target> = {
  rssKubeReaderMB: { op: '<=', limit: 100 },
  rssStandaloneMB: { op: '<=', limit: 90 },
  healthzVsBareFastify: { op: '>=', limit: 0.9 },
  propagationP99Ms: { op: '<=', limit: 1000 },
  startupToHealthyMs: { op: '<=', limit: 1000 },
  apiRequestsPerReplicaHour: { op: '<=', limit: 10 },
};

// --- cleanup, whatever happens -------------------------------------------------------------------
let cp: ControlPlane | undefined;
let tmp: string | undefined;
let cleaning: Promise<void> | undefined;
function cleanup(): Promise<void> {
  cleaning ??= (async () => {
    await stopAll().catch(() => {});
    await cp?.stop().catch(() => {});
    if (tmp) await rm(tmp, { recursive: true, force: true }).catch(() => {});
  })();
  return cleaning;
}
// Last resort (a crash): children are SIGKILLed by lib/proc.ts and the harness; the temp dir goes here.
process.on('exit', () => {
  if (tmp) rmSync(tmp, { recursive: true, force: true });
});
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, () => {
    progress(`${signal}: stopping every process`);
    void cleanup().finally(() => process.exit(130));
  });
}

// Every step has its own timeout; this bounds the whole run (e.g. a first run building the control plane).
const deadline = setTimeout(() => {
  progress(`deadline of ${opts.deadline} s reached: stopping every process`);
  void cleanup().finally(() => process.exit(1));
}, Number(opts.deadline) * 1000);
deadline.unref();

// --- run ------------------------------------------------------------------------------------------
const started = performance.now();
// Everything measured runs on this binary (npm run puts node_modules/.bin, the pinned Node 24, first on PATH).
if (!process.version.startsWith('v24.')) progress(`warning: running on Node ${process.version} (${process.execPath}); the project pins Node 24`);
let standalone: StandaloneResults | undefined;
let rest: RestResults | undefined;
let propagation: PropagationResults | undefined;
let memory: MemoryReport | undefined;
let injector: InjectorResults | undefined;
let buildMs = 0;
if (opts.domains !== undefined) await runDomains(opts.domains);
try {
  tmp = await mkdtemp(join(tmpdir(), 'certshare-bench-'));
  progress('building dist/ (scripts/build.ts: the bundle)');
  buildMs = await buildDist();
  progress('bare node: idle RSS');
  const bare = await bareNodeRss();
  standalone = await standalonePhase(join(tmp, 'standalone'), { loadSeconds: loadS, connections: 10, startupRuns: 5, domainRuns: 5 }, bare);
  if (!opts['skip-kube']) {
    progress('starting the control plane (etcd + kube-apiserver; the first run builds them, see test/k8s-binaries)');
    const auditPolicy = join(tmp, 'audit-policy.yaml');
    const auditLog = join(tmp, 'audit.log');
    await writeAuditPolicy(auditPolicy);
    cp = await startControlPlane({ extraApiServerArgs: [`--audit-policy-file=${auditPolicy}`, `--audit-log-path=${auditLog}`, '--audit-log-format=json'] });
    rest = await restPhase(cp, join(tmp, 'rest'), auditLog, windowS);
    propagation = await propagationPhase(cp, join(tmp, 'propagation'), renewals, PROPAGATION_LIFETIME_S);
    injector = await injectorPhase(cp, Number(opts.pods));
  }
  if (opts.memory) memory = await memoryPhase(join(tmp, 'memory'), cp);
} catch (err) {
  process.stderr.write(`bench failed: ${(err as Error).stack ?? String(err)}\n`);
  await cleanup();
  process.exit(1);
}
await cleanup();
const benchSeconds = (performance.now() - started) / 1000;

// --- figures --------------------------------------------------------------------------------------
const s = standalone!;
// Medians over the interleaved rounds. The ratio is the median of each round's pair (daemon, then bare
// fastify right after): on a shared machine the load varies over a run, and a pair sees the same.
const healthzRps = median(s.healthz.map((r) => r.rps));
const pairRatios = s.healthz.map((r, i) => r.rps / s.fastify[i]!.rps);
const fastifyRps = median(s.fastify.map((r) => r.rps));
const healthzP99 = median(s.healthz.map((r) => r.p99Ms));
const fastifyP99 = median(s.fastify.map((r) => r.p99Ms));
const prop = propagation ? propagationSummary(propagation) : undefined;
let apiPerReplicaHour: number | null = null;
if (rest) {
  // Requests the replicas made in the window: apiserver_request_total on the series they use (namespaced
  // Secrets/Pods), cross-checked with the audit log (every request of their ServiceAccount); the larger.
  const count = Math.max(rest.certshareSeriesDelta, rest.auditCompleted);
  apiPerReplicaHour = (count / rest.replicas) * (3600 / rest.windowS);
}

const figures: Record<string, number | null> = {
  rssBareNodeMB: round(s.bareNode.rss),
  rssStandaloneMB: round(s.standalone.rss),
  rssKubeReaderMB: rest ? round(Math.max(...rest.readers.map((r) => r.rss))) : null,
  rssKubeWriterMB: rest ? round(rest.writer.rss) : null,
  startupToHealthyMs: Math.round(median(s.startupMs)),
  domainToCertMs: Math.round(median(s.domainToCertMs)),
  propagationP50Ms: prop ? Math.round(prop.p50) : null,
  propagationP99Ms: prop ? Math.round(prop.p99) : null,
  healthzRps: Math.round(healthzRps),
  healthzP99Ms: healthzP99,
  healthzVsBareFastify: round(median(pairRatios), 2),
  apiRequestsPerReplicaHour: apiPerReplicaHour === null ? null : round(apiPerReplicaHour, 1),
  rssInjectorMB: injector ? round(injector.rss.rss) : null,
  injectorAdmissionP50Ms: injector ? round(injector.p50Ms) : null,
  injectorAdmissionP99Ms: injector ? round(injector.p99Ms) : null,
};

function verdict(key: string): 'PASS' | 'MISS' | '-' {
  return verdictOf(TARGETS[key], figures[key]);
}

const mb = (m: { rss: number; anon: number; file: number }): string => `${round(m.rss)} MB (anon ${round(m.anon)}, file-backed ${round(m.file)})`;
const baseline: Record<string, string> = {
  rssBareNodeMB: `baseline: ${mb(s.bareNode)}`,
  rssStandaloneMB: `target <= 90; bare node ${round(s.bareNode.rss)}; anon ${round(s.standalone.anon)} / file ${round(s.standalone.file)}`,
  rssKubeReaderMB: rest ? `target <= 100; readers ${rest.readers.map((r) => round(r.rss)).join(' / ')}; anon ${round(rest.readers[0]!.anon)}` : 'skipped',
  rssKubeWriterMB: rest ? `no target; bare node ${round(s.bareNode.rss)}; anon ${round(rest.writer.anon)}` : 'skipped',
  startupToHealthyMs: `target <= 1000; median of ${s.startupMs.length}: ${s.startupMs.map(Math.round).join(', ')}`,
  domainToCertMs: `no target; median of ${s.domainToCertMs.length}: ${s.domainToCertMs.map(Math.round).join(', ')}`,
  propagationP50Ms: propagation
    ? `${propagation.samplesMs.length} samples (${propagation.renewals} renewals x 2 readers, ${propagation.missed} missed)`
    : 'skipped',
  propagationP99Ms: propagation ? `target <= 1000; max ${Math.round(Math.max(...propagation.samplesMs))}` : 'skipped',
  healthzRps:
    `bare fastify ${Math.round(fastifyRps)} req/s ` +
    `(medians of ${s.healthz.length} interleaved rounds, ${loadS} s each in all, 10 connections${s.pinned ? ', 1 CPU each' : ''})`,
  healthzP99Ms: `bare fastify ${fastifyP99} ms`,
  healthzVsBareFastify: `target >= 0.9; median of round pairs: ${pairRatios.map((r) => round(r, 2)).join(', ')}`,
  apiRequestsPerReplicaHour: rest
    ? `target <= 10; window ${round(rest.windowS, 0)} s x ${rest.replicas} replicas; all series ${rest.allSeriesDelta} (apiserver's own)`
    : 'skipped',
  rssInjectorMB: injector ? `no target; idle after ${injector.pods} injections; anon ${round(injector.rss.anon)}` : 'skipped',
  injectorAdmissionP50Ms: injector ? `as the apiserver measures it; ${injector.pods} Pods created, ${injector.failures} failed` : 'skipped',
  injectorAdmissionP99Ms: injector ? `as the apiserver measures it; first certificate served ${Math.round(injector.firstCertMs)} ms after start` : 'skipped',
};

const rows = Object.keys(figures).map((k) => [k, figures[k] === null ? 'n/a' : String(figures[k]), baseline[k] ?? '', verdict(k)]);
const widths = [0, 1, 2, 3].map((i) => Math.max(...[['figure', 'value', 'baseline / target', 'verdict'], ...rows].map((r) => r[i]!.length)));
const line = (r: string[]): string =>
  r
    .map((c, i) => c.padEnd(widths[i]!))
    .join('  ')
    .trimEnd();
const out: string[] = [line(['figure', 'value', 'baseline / target', 'verdict']), line(widths.map((w) => '-'.repeat(w)))];
for (const r of rows) out.push(line(r));
out.push('');
if (rest) {
  const naivePerReplicaHour = round((rest.allSeriesDelta / rest.replicas) * (3600 / rest.windowS), 0);
  const topSeries = rest.topSeries.map(([k, v]) => `${k} +${v}`).join('; ');
  out.push(
    `API at rest (${round(rest.windowS, 0)} s): replicas' series ${rest.certshareSeriesDelta}, ` +
      `audit (their ServiceAccount) ${rest.auditCompleted} completed / ${rest.auditWatchesStarted} watches started;`,
    `  all series ${rest.allSeriesDelta} = ${naivePerReplicaHour}/replica/h if naively attributed; top: ${topSeries}`,
    `  open Secret watches ${rest.openSecretWatches.join(' -> ')}; ` +
      `probe watch: ${rest.probeBookmarks} bookmarks, longest silence ${round(rest.probeMaxGapS, 0)} s; Secret watch events sent ${rest.secretWatchEvents}`,
    `  beyond the window: each replica's watch ends at its server-side timeout (${WATCH_SECONDS.join('-')} s) ` +
      `and resumes: ~${round(WATCH_RENEWALS_PER_HOUR, 1)} WATCH/replica/h`,
  );
}
out.push(`bench ${round(benchSeconds, 0)} s (build ${round(buildMs / 1000, 1)} s)`);
process.stdout.write(`${out.join('\n')}\n`);
if (memory) printMemoryReport(memory);

if (opts.json) {
  const targets = Object.fromEntries(Object.entries(TARGETS).map(([k, t]) => [k, { ...t, value: figures[k], verdict: verdict(k) }]));
  const details = {
    node: `${process.version} ${process.execPath}`,
    benchSeconds: round(benchSeconds, 0),
    buildSeconds: round(buildMs / 1000, 1),
    fastifyHelloRps: Math.round(fastifyRps),
    fastifyHelloP99Ms: fastifyP99,
    healthzRounds: s.healthz.map((r) => Math.round(r.rps)),
    fastifyRounds: s.fastify.map((r) => Math.round(r.rps)),
    rss: {
      bareNode: s.bareNode,
      standalone: s.standalone,
      fastifyHelloTs: s.fastifyHello,
      kubeWriter: rest?.writer,
      kubeReaders: rest?.readers,
    },
    startupMs: s.startupMs.map(Math.round),
    domainToCertMs: s.domainToCertMs.map(Math.round),
    propagationMs: propagation?.samplesMs.map(Math.round),
    apiAtRest: rest && {
      windowS: round(rest.windowS, 1),
      replicas: rest.replicas,
      replicaSeriesDelta: rest.certshareSeriesDelta,
      auditCompleted: rest.auditCompleted,
      auditWatchesStarted: rest.auditWatchesStarted,
      allSeriesDelta: rest.allSeriesDelta,
      naivePerReplicaHour: round((rest.allSeriesDelta / rest.replicas) * (3600 / rest.windowS), 0),
      topSeries: rest.topSeries,
      openSecretWatches: rest.openSecretWatches,
      probeBookmarks: rest.probeBookmarks,
      probeMaxGapS: round(rest.probeMaxGapS, 1),
      secretWatchEvents: rest.secretWatchEvents,
      expectedWatchRenewalsPerReplicaHour: round(WATCH_RENEWALS_PER_HOUR, 2),
    },
  };
  const memoryDetails = memory && {
    importChain: memory.chain.map((c) => ({ step: c.step, rssMB: round(c.mem.rss), anonMB: round(c.mem.anon), heapUsedMB: round(c.heapUsedMB) })),
    daemons: memory.daemons.map((d) => ({
      name: d.name,
      rssMB: round(d.mem.rss),
      anonMB: round(d.mem.anon),
      heapTotalMB: round(d.heapTotalMB),
      heapUsedMB: round(d.heapUsedMB),
      newSpaceMB: round(d.spaces.new_space ?? 0),
      externalMB: round(d.externalMB),
      topPackages: d.packages.slice(0, 5).map((p) => `${p.pkg}: ${p.files} files, ${round(p.sourceMB, 2)} MB`),
    })),
    standaloneFlags: memory.flags.map((f) => ({ flags: f.flags, idleMB: round(f.idle.rss), afterLoadMB: round(f.afterLoad.rss), rps: Math.round(f.rps) })),
    kubeReaderFlags: memory.kubeFlags.map((f) => ({ flags: f.flags, idleMB: round(f.idle.rss) })),
  };
  process.stdout.write(`${JSON.stringify({ ...figures, targets, details: { ...details, ...(memoryDetails ? { memory: memoryDetails } : {}) } })}\n`);
}

/** `--domains`: only the many-domain phase, then its table (and JSON line); exits. */
async function runDomains(list: string): Promise<never> {
  const counts = list.split(',').map(Number);
  if (!counts.every((n) => Number.isInteger(n) && n >= 1 && n <= 9999)) {
    process.stderr.write('bench: --domains wants whole numbers from 1 to 9999, comma separated\n');
    process.exit(2);
  }
  // All N domains share one registered domain (tailnet-0000.ts.net): the default budget (50 first issuances a week)
  // would queue all but 50 of them, which is the budget's job, not what this phase measures. --replica-args can set one.
  const replicaFlags = [
    '--issuance-budget',
    '0',
    ...(opts['watch-scope'] ? ['--watch-scope', opts['watch-scope']] : []),
    ...(opts['replica-args']?.split(' ').filter(Boolean) ?? []),
  ];
  const lifetimeS = opts['renewal-lifetime'] === undefined ? undefined : Number(opts['renewal-lifetime']);
  const runs: DomainsRun[] = [];
  const failed: Array<{ n: number; error: string }> = [];
  try {
    tmp = await mkdtemp(join(tmpdir(), 'certshare-bench-'));
    progress('building dist/ (scripts/build.ts: the bundle)');
    buildMs = await buildDist();
    progress('starting the control plane (etcd + kube-apiserver; the first run builds them, see test/k8s-binaries)');
    const auditPolicy = join(tmp, 'audit-policy.yaml');
    const auditLog = join(tmp, 'audit.log');
    await writeAuditPolicy(auditPolicy);
    cp = await startControlPlane({ extraApiServerArgs: [`--audit-policy-file=${auditPolicy}`, `--audit-log-path=${auditLog}`, '--audit-log-format=json'] });
    for (const n of counts) {
      // One N failing (a start-up that never completes) leaves the others' figures standing.
      await domainsPhase(cp, join(tmp, 'domains'), auditLog, n, { windowS, replicaFlags, ...(lifetimeS ? { lifetimeS } : {}) }).then(
        (run) => runs.push(run),
        (err: unknown) => {
          failed.push({ n, error: (err as Error).message });
          progress(`domains ${n} failed: ${(err as Error).stack ?? String(err)}`);
        },
      );
    }
  } catch (err) {
    process.stderr.write(`bench failed: ${(err as Error).stack ?? String(err)}\n`);
    await cleanup();
    process.exit(1);
  }
  await cleanup();
  if (runs.length === 0) {
    process.stderr.write('bench failed: no domain count completed\n');
    process.exit(1);
  }
  const { lines, json } = domainsReport(runs, replicaFlags);
  for (const f of failed) lines.push(`FAILED at N = ${f.n}: ${f.error.split('\n')[0]}`);
  const benchSeconds = round((performance.now() - started) / 1000, 0);
  process.stdout.write(`${lines.join('\n')}\nbench ${benchSeconds} s (build ${round(buildMs / 1000, 1)} s)\n`);
  if (opts.json) process.stdout.write(`${JSON.stringify({ ...json, failed, details: { node: `${process.version} ${process.execPath}`, benchSeconds } })}\n`);
  process.exit(0);
}
