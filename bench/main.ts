// `npm run bench [-- --json]`: certshare's figures, each next to its target and baseline, measured in one
// run on this machine against the production build (the bundle of scripts/build.ts, built first) on the
// real Node binary. `npm run bench -- --help` lists the flags.
//
// The bench reports each figure beside its goal, and the goal's floor measured in the same run (a bare
// fastify, the injector's packages: bench/lib/goals.ts); it exits 0 with MISS lines, unless `--check`
// asks it to exit 1 on a miss. Errors exit non-zero, among them a daemon or emulator that exits while the
// bench needs it (it ends the bench at once, with that process's stderr). `--tiny` runs every phase (--memory and --domains included) in seconds, and
// `--federation --tiny` the federation home's, for test/bench/bench-tiny.test.ts: the bench cannot break
// without `npm test` seeing it.
import { rmSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startControlPlane, type ControlPlane } from '../test/harness/control-plane.ts';
import { startAuditedControlPlane } from './lib/apiserver.ts';
import { type CommandLine, exitWithUsageError, numberFlag, parseScriptArgs } from './lib/command-line.ts';
import { buildDist } from './lib/certshare.ts';
import { buildBaseline, FASTIFY_HELLO, INJECTOR_PACKAGES } from './lib/baseline.ts';
import { failOnUnexpectedExit, stopAll, UnexpectedExitError } from './lib/proc.ts';
import { FULL_SIZE, TINY_SIZE } from './lib/size.ts';
import { median, progress, round } from './lib/stats.ts';
import { BENCH_GOALS, describeGoal, FLOOR_NAMES, judge, misses, verdictLabel } from './lib/goals.ts';
import { injectorPhase, type InjectorResults } from './injector.ts';
import { FAST_RETRIES, propagationPhase, propagationSummary, restPhase, type PropagationResults, type RestResults } from './kube.ts';
import { domainsPhase, domainsReport, type DomainsRun } from './domains.ts';
import { federationPhase, federationReport, type FederationRun } from './federation.ts';
import { memoryPhase, printMemoryReport, type MemoryReport } from './memory.ts';
import { bareNodeRss, standalonePhase, type StandaloneResults } from './standalone.ts';
import { agentPhase, type AgentPhaseResults } from './advertise-agent.ts';

const SCRIPT: CommandLine = {
  name: 'bench',
  invocation: 'npm run bench --',
  summary:
    "certshare's figures (memory, start-up, /healthz throughput, the advertise agent's, propagation, API requests at rest, the injector's), " +
    'each next to its target, on the production bundle and a real etcd + kube-apiserver; exits 0 with MISS lines, non-zero only on errors.',
  flags: [
    {
      name: 'json',
      boolean: true,
      help: 'The last stdout line is one JSON object with every figure and, in `goals`, each goal with its floor from the same run and whether it holds.',
    },
    { name: 'check', boolean: true, help: 'Exit 1 when a figure misses its goal (after the report): for a quiet machine, not for npm test.' },
    {
      name: 'tiny',
      boolean: true,
      help: 'Every phase (--memory and one --domains count included) at a tiny size, in seconds: checks that the bench works; its figures mean little.',
    },
    { name: 'window', placeholder: 'S', help: 'API-requests-at-rest window in seconds [default 90; 2 with --tiny].' },
    { name: 'load', placeholder: 'S', help: 'Seconds of measured load per HTTP server, in interleaved rounds of ~2 s [default 25; 2 with --tiny].' },
    { name: 'renewals', placeholder: 'N', help: 'Renewals for the propagation figure [default 20; 2 with --tiny].' },
    { name: 'memory', boolean: true, help: 'Also: where the memory goes (import costs, V8 heap of running daemons, V8 flags).' },
    { name: 'skip-kube', boolean: true, help: 'Standalone figures only (no control plane).' },
    { name: 'pods', placeholder: 'N', help: "Pods created through the injector's webhook for its latency figures [default 300; 5 with --tiny]." },
    { name: 'deadline', placeholder: 'S', help: 'Give up (stopping every process) after this long [default 1800; 300 with --tiny].' },
    {
      name: 'domains',
      placeholder: 'N[,N...]',
      help:
        'Instead of the phases above: one group serving N domains (writer + 2 readers, kube mode), per N: RSS, TCP connections, ' +
        'delivery and mass-renewal times, API requests at rest (bench/domains.ts).',
    },
    { name: 'watch-scope', placeholder: 'SCOPE', help: 'With --domains: --watch-scope for every replica.' },
    { name: 'replica-args', placeholder: "'ARGS'", help: 'With --domains: more flags for every replica.' },
    { name: 'renewal-lifetime', placeholder: 'S', help: 'With --domains: the certificate lifetime [default: fitted to --window].' },
    {
      name: 'federation',
      boolean: true,
      help:
        'Instead of the phases above: what a federation home costs at rest (bench/federation.ts): a home and a member apiserver, ' +
        'requests at the home per group-hour and its open watches over --window per lease duration, sidecar memory with a home against without.',
    },
    {
      name: 'lease-durations',
      placeholder: 'S[,S...]',
      help: 'With --federation: the home Lease durations (--federation-lease-duration) measured at rest, in seconds [default 10,30; 3,6 with --tiny].',
    },
    {
      name: 'groups',
      placeholder: 'N',
      help: 'With --federation: federated groups of one domain each, a writer and a reader each [default 2; 1 with --tiny].',
    },
    {
      name: 'samples',
      placeholder: 'N',
      help: 'With --federation: pairs of sidecars (without, with a home) for the memory figures [default 5; 1 with --tiny].',
    },
  ],
};

const opts = parseScriptArgs(SCRIPT);
const tiny = opts.tiny === true;
const size = tiny ? TINY_SIZE : FULL_SIZE;
const windowS = numberFlag(SCRIPT, opts, 'window', tiny ? 2 : 90, tiny ? 'seconds, at least 1' : 'seconds, at least 10', (n) => n >= (tiny ? 1 : 10));
const loadS = numberFlag(SCRIPT, opts, 'load', tiny ? 2 : 25, 'seconds, at least 2', (n) => n >= 2);
const renewals = numberFlag(SCRIPT, opts, 'renewals', tiny ? 2 : 20, 'a whole number, at least 1', (n) => Number.isInteger(n) && n >= 1);
const pods = numberFlag(SCRIPT, opts, 'pods', tiny ? 5 : 300, 'a whole number, at least 1', (n) => Number.isInteger(n) && n >= 1);
const deadlineS = numberFlag(SCRIPT, opts, 'deadline', tiny ? 300 : 1800, 'seconds, more than 0', (n) => n > 0);
const domainCounts = opts.domains === undefined ? undefined : String(opts.domains).split(',').map(Number);
if (domainCounts && !domainCounts.every((n) => Number.isInteger(n) && n >= 1 && n <= 9999)) {
  exitWithUsageError(SCRIPT, '--domains wants whole numbers from 1 to 9999, comma separated');
}
if (tiny && domainCounts) exitWithUsageError(SCRIPT, '--tiny runs one small --domains count itself; give one of the two');
if (opts.federation && domainCounts) exitWithUsageError(SCRIPT, '--federation and --domains are two runs; give one of the two');
if (opts.check && (tiny || domainCounts || opts.federation))
  exitWithUsageError(SCRIPT, '--check judges a full run of the phases; not with --tiny, --domains or --federation');
const lifetimeFlag = opts['renewal-lifetime'] === undefined ? undefined : numberFlag(SCRIPT, opts, 'renewal-lifetime', 0, 'seconds, more than 0', (n) => n > 0);
/** --tiny: the domains phase's count and certificate lifetime (renewal at half of it: no rest window, a quick mass renewal, fast retries). */
const TINY_DOMAINS = { n: 2, lifetimeS: 12 };
// All N domains share one registered domain (tailnet-0000.ts.net): the default budget (50 first issuances a week)
// would queue all but 50 of them, which is the budget's job, not what the domains phase measures. --replica-args can set one.
const DOMAINS_REPLICA_FLAGS = [
  '--issuance-budget',
  '0',
  ...(opts['watch-scope'] ? ['--watch-scope', String(opts['watch-scope'])] : []),
  ...String(opts['replica-args'] ?? '')
    .split(' ')
    .filter(Boolean),
];
const leaseDurations = String(opts['lease-durations'] ?? (tiny ? '3,6' : '10,30'))
  .split(',')
  .map(Number);
if (!leaseDurations.every((n) => Number.isInteger(n) && n >= 1 && n <= 3600))
  exitWithUsageError(SCRIPT, '--lease-durations wants whole seconds from 1 to 3600, comma separated');
const federationGroups = numberFlag(SCRIPT, opts, 'groups', tiny ? 1 : 2, 'a whole number from 1 to 20', (n) => Number.isInteger(n) && n >= 1 && n <= 20);
const federationSamples = numberFlag(SCRIPT, opts, 'samples', tiny ? 1 : 5, 'a whole number from 0 to 50', (n) => Number.isInteger(n) && n >= 0 && n <= 50);
/** src/kube/secret-watch.ts: each watch asks for a server-side timeout drawn from this range (seconds). */
const WATCH_SECONDS = [1800, 3600];
/** One ended-and-resumed WATCH per mean watch lifetime. */
const WATCH_RENEWALS_PER_HOUR = 3600 / ((WATCH_SECONDS[0]! + WATCH_SECONDS[1]!) / 2);
/** Certificate lifetime for the propagation phase: under 10 days renew at half, so one renewal every ~2 s. */
const PROPAGATION_LIFETIME_S = 4;
/**
 * The hours of the kubelet's probes each replica of the rest phase answers before its window: enough for V8 to
 * have optimized what they run, as in a Pod after a few hours (docs/performance.md, resources).
 */
const PROBE_HOURS = 6;

// --- cleanup, whatever happens -------------------------------------------------------------------
let cp: ControlPlane | undefined;
/** --federation: the member cluster's control plane (cp is the home's). */
let memberCp: ControlPlane | undefined;
let tmp: string | undefined;
let cleaning: Promise<void> | undefined;
function cleanup(): Promise<void> {
  cleaning ??= (async () => {
    progress('stopping every process');
    await stopAll().catch(() => {});
    await Promise.all([cp?.stop().catch(() => {}), memberCp?.stop().catch(() => {})]);
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
let failing = false;
/** Reports the first error only (a process that exited, then the phase that waited for it), stops everything, exits 1. */
async function fail(err: unknown): Promise<never> {
  if (!failing) {
    failing = true;
    const text = err instanceof UnexpectedExitError ? err.message : ((err as Error).stack ?? String(err));
    process.stderr.write(`bench failed: ${text}\n`);
  }
  await cleanup();
  process.exit(1);
}
failOnUnexpectedExit((err) => void fail(err));

// Every step has its own timeout; this bounds the whole run (e.g. a first run building the control plane).
const deadline = setTimeout(() => {
  progress(`deadline of ${deadlineS} s reached: stopping every process`);
  void cleanup().finally(() => process.exit(1));
}, deadlineS * 1000);
deadline.unref();

/** The bundle every measured process runs: dist/ for a real run; --tiny builds its own in the temp dir (npm test runs beside other tests). */
async function build(dir: string): Promise<number> {
  progress('building the bundle (scripts/build.ts)');
  return buildDist(tiny ? join(dir, 'dist') : undefined);
}

// --- run ------------------------------------------------------------------------------------------
const started = performance.now();
// Everything measured runs on this binary (npm run puts node_modules/.bin, the pinned Node 24, first on PATH).
if (!process.version.startsWith('v24.')) progress(`warning: running on Node ${process.version} (${process.execPath}); the project pins Node 24`);
let standalone: StandaloneResults | undefined;
let agent: AgentPhaseResults | undefined;
let rest: RestResults | undefined;
let propagation: PropagationResults | undefined;
let memory: MemoryReport | undefined;
let injector: InjectorResults | undefined;
let domainsRun: DomainsRun | undefined;
let buildMs = 0;
if (domainCounts) await runDomains(domainCounts);
if (opts.federation) await runFederation();
try {
  tmp = await mkdtemp(join(tmpdir(), 'certshare-bench-'));
  buildMs = await build(tmp);
  progress("building the baselines: a bare fastify, the injector's packages (bench/lib/baseline.ts)");
  const hello = await buildBaseline(join(tmp, FASTIFY_HELLO), FASTIFY_HELLO);
  progress('bare node: idle RSS');
  const bare = await bareNodeRss(size);
  standalone = await standalonePhase(join(tmp, 'standalone'), { loadSeconds: loadS, connections: 10, size, hello }, bare);
  agent = await agentPhase(join(tmp, 'agent'), { size, runs: tiny ? 1 : 3, cycles: tiny ? 2 : 20, restSeconds: tiny ? 1 : 30 });
  let auditLog: string | undefined;
  if (!opts['skip-kube']) {
    ({ cp, auditLog } = await startAuditedControlPlane(tmp));
    rest = await restPhase(cp, join(tmp, 'rest'), auditLog, windowS, size, tiny ? 0.05 : PROBE_HOURS);
    propagation = await propagationPhase(cp, join(tmp, 'propagation'), renewals, PROPAGATION_LIFETIME_S);
    injector = await injectorPhase(cp, pods, size, await buildBaseline(join(tmp, INJECTOR_PACKAGES), INJECTOR_PACKAGES));
  }
  if (opts.memory || tiny) memory = await memoryPhase(join(tmp, 'memory'), cp, size);
  if (tiny && cp && auditLog) {
    domainsRun = await domainsPhase(cp, join(tmp, 'domains'), auditLog, TINY_DOMAINS.n, {
      windowS,
      replicaFlags: [...DOMAINS_REPLICA_FLAGS, ...FAST_RETRIES],
      lifetimeS: TINY_DOMAINS.lifetimeS,
      size,
    });
  }
} catch (err) {
  await fail(err);
}
await cleanup();
const benchSeconds = (performance.now() - started) / 1000;

// --- figures --------------------------------------------------------------------------------------
const s = standalone!;
// Medians over the interleaved rounds. The ratio is the median of each round's pair (daemon, then bare
// fastify right after): on a shared machine the load varies over a run, and a pair sees the same.
const healthzRps = median(s.healthz.map((r) => r.rps));
const startupPairDiffs = s.startupCpuMs.map((ms, i) => ms - s.fastifyStartupCpuMs[i]!);
const pairRatios = s.healthz.map((r, i) => r.rps / s.fastify[i]!.rps);
// The same pairs of two bare fastify processes: how far from 1 they land is what the comparison can tell apart.
const twinRatios = s.twin.map((r, i) => r.rps / s.fastify[i]!.rps);
// The same comparison in CPU time per request (bare fastify's over the daemon's): what each server costs,
// which a busy neighbour on the machine does not change as much as it changes requests per second.
const cpuRatios = s.healthzCpuUs.map((us, i) => s.fastifyCpuUs[i]! / us);
const fastifyRps = median(s.fastify.map((r) => r.rps));
const healthzP99 = median(s.healthz.map((r) => r.p99Ms));
const fastifyP99 = median(s.fastify.map((r) => r.p99Ms));
const prop = propagation ? propagationSummary(propagation) : undefined;
const a = agent!;
type AgentStartOf = AgentPhaseResults['agent'][number];
const agentMedian = (starts: AgentStartOf[], f: (x: AgentStartOf) => number): number => round(median(starts.map(f)));
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
  rssFastifyHelloMB: round(s.fastifyHello.rss),
  rssAdvertiseAgentMB: agentMedian(a.agent, (x) => x.idleAfter.rss),
  rssAdvertiseAgentStartMB: agentMedian(a.agent, (x) => x.idleStart.rss),
  rssNodeHttpFsMB: agentMedian(a.httpFs, (x) => x.idleAfter.rss),
  advertiseAgentStartupCpuMs: agentMedian(a.agent, (x) => x.startCpuMs),
  advertiseAgentRestCpuMsPerHour: Math.round(median(a.agent.map((x) => x.restCpuMsPerHour))),
  advertiseAgentCycleMs: agentMedian(a.agent, (x) => median(x.cyclesMs)),
  rssKubeReaderMB: rest ? round(Math.max(...rest.readers.map((r) => r.rss))) : null,
  rssKubeWriterMB: rest ? round(rest.writer.rss) : null,
  rssKubeReaderAtRestMB: rest ? round(Math.max(...rest.steady.readers.map((r) => r.mem.rss))) : null,
  rssKubeWriterAtRestMB: rest ? round(rest.steady.writer.mem.rss) : null,
  kubeReaderRestCpuMsPerHour: rest ? Math.round(median(rest.steady.readers.map((r) => r.restCpuMsPerHour))) : null,
  kubeWriterRestCpuMsPerHour: rest ? Math.round(rest.steady.writer.restCpuMsPerHour) : null,
  startupToHealthyMs: Math.round(median(s.startupMs)),
  startupCpuMs: round(median(s.startupCpuMs)),
  startupFastifyHelloCpuMs: round(median(s.fastifyStartupCpuMs)),
  startupCpuOverFastifyMs: round(median(startupPairDiffs)),
  startupFastifyHelloMs: Math.round(median(s.fastifyStartupMs)),
  domainToCertMs: Math.round(median(s.domainToCertMs)),
  propagationP50Ms: prop ? Math.round(prop.p50) : null,
  propagationP99Ms: prop ? Math.round(prop.p99) : null,
  healthzRps: Math.round(healthzRps),
  healthzP99Ms: healthzP99,
  healthzVsBareFastify: round(median(pairRatios), 2),
  bareFastifyTwinVsBareFastify: round(median(twinRatios), 2),
  healthzCpuUsPerRequest: round(median(s.healthzCpuUs), 1),
  healthzCpuVsBareFastify: round(median(cpuRatios), 2),
  apiRequestsPerReplicaHour: apiPerReplicaHour === null ? null : round(apiPerReplicaHour, 1),
  rssInjectorMB: injector ? round(injector.rss.rss) : null,
  rssInjectorPackagesMB: injector ? round(injector.packagesRss.rss) : null,
  injectorAdmissionP50Ms: injector ? round(injector.p50Ms) : null,
  injectorAdmissionP99Ms: injector ? round(injector.p99Ms) : null,
  injectorCpuMsPerAdmission: injector ? round(injector.cpuPerAdmissionMs) : null,
};

const verdicts = judge(figures, BENCH_GOALS);
function verdict(key: string): 'PASS' | 'MISS' | '-' {
  return tiny ? '-' : verdictLabel(verdicts[key]);
}
/** "goal <= 63.1 (bare fastify 58.1 + 5)", "goal <= 75" or "no goal", for the baseline column. */
function target(key: string): string {
  const g = BENCH_GOALS[key];
  return describeGoal(verdicts[key], g, g?.floor && FLOOR_NAMES[g.floor]);
}

const mb = (m: { rss: number; anon: number; file: number }): string => `${round(m.rss)} MB (anon ${round(m.anon)}, file-backed ${round(m.file)})`;
const fastifyCpuStarts = s.fastifyStartupCpuMs.map((ms) => round(ms)).join(', ');
const baseline: Record<string, string> = {
  rssBareNodeMB: `baseline: ${mb(s.bareNode)}`,
  rssStandaloneMB:
    `${target('rssStandaloneMB')}; bare node ${round(s.bareNode.rss)}, bare fastify ${round(s.fastifyHello.rss)}; ` +
    `anon ${round(s.standalone.anon)} / file ${round(s.standalone.file)}`,
  rssFastifyHelloMB: `no target; the bare fastify hello bundled as dist/ is (bench/lib/baseline.ts): ${mb(s.fastifyHello)}`,
  rssAdvertiseAgentMB:
    `${target('rssAdvertiseAgentMB')}; the agent as the injector runs it, idle after ${a.cycles} request cycles, median of ${a.agent.length}: ` +
    `${a.agent.map((x) => round(x.idleAfter.rss)).join(', ')}; anon ${agentMedian(a.agent, (x) => x.idleAfter.anon)} / file ` +
    `${agentMedian(a.agent, (x) => x.idleAfter.file)}; a bare node -e ${agentMedian(a.node, (x) => x.idleAfter.rss)} started beside it`,
  rssAdvertiseAgentStartMB: `no target; idle after ${a.restSeconds} s at rest, before any request; VmHWM at the end ${agentMedian(a.agent, (x) => x.peakMB)}`,
  rssNodeHttpFsMB: `no target; node -e loading node:http and node:fs only, started in turn with the agent: ${mb(a.httpFs[0]!.idleAfter)}`,
  advertiseAgentStartupCpuMs: `no target; CPU time of every thread until it logged its start: ${a.agent.map((x) => round(x.startCpuMs)).join(', ')}`,
  advertiseAgentRestCpuMsPerHour: `${target('advertiseAgentRestCpuMsPerHour')}; its CPU time over ${a.restSeconds} s at rest, per hour`,
  advertiseAgentCycleMs: "no target; certshare's request written to the agent's status naming it (median of each start's median)",
  rssKubeReaderMB: rest
    ? `${target('rssKubeReaderMB')}; readers ${rest.readers.map((r) => round(r.rss)).join(' / ')}; anon ${round(rest.readers[0]!.anon)}`
    : 'skipped',
  rssKubeWriterMB: rest ? `${target('rssKubeWriterMB')}; bare node ${round(s.bareNode.rss)}; anon ${round(rest.writer.anon)}` : 'skipped',
  rssKubeReaderAtRestMB: rest
    ? `no target; the readers after ${rest.steady.probeHours} h of the kubelet's probes and ${round(rest.windowS, 0)} s at rest ` +
      `(${rest.steady.probesAnswered} probes answered, ${rest.steady.probesFailed} failed): ${rest.steady.readers.map((r) => mb(r.mem)).join(' / ')}`
    : 'skipped',
  rssKubeWriterAtRestMB: rest ? `no target; the writer, the same way: ${mb(rest.steady.writer.mem)}` : 'skipped',
  kubeReaderRestCpuMsPerHour: rest
    ? `no target; CPU time of every thread over the window, per hour: ${rest.steady.readers.map((r) => Math.round(r.restCpuMsPerHour)).join(' / ')}`
    : 'skipped',
  kubeWriterRestCpuMsPerHour: rest ? 'no target; the writer, the same way' : 'skipped',
  startupToHealthyMs:
    `no goal (wall time: the neighbours' too; start-up is judged by startupCpuOverFastifyMs); bare fastify ${Math.round(median(s.fastifyStartupMs))}; ` +
    `median of ${s.startupMs.length}: ${s.startupMs.map(Math.round).join(', ')}`,
  startupFastifyHelloMs: `no target; the bare fastify hello's first answer, in turn with the daemon's: ${s.fastifyStartupMs.map(Math.round).join(', ')}`,
  startupCpuMs:
    `no goal (judged paired: startupCpuOverFastifyMs); the image's entry (its start-up snapshot), CPU time of every thread until healthy (schedstat), ` +
    `median of ${s.startupCpuMs.length}: ${s.startupCpuMs.map((ms) => round(ms)).join(', ')}`,
  startupFastifyHelloCpuMs: `no target; the bare fastify hello's CPU time until its first answer, measured the same way: ${fastifyCpuStarts}`,
  startupCpuOverFastifyMs:
    `${target('startupCpuOverFastifyMs')}; each start's CPU time until healthy minus the bare fastify's started beside it, ` +
    `median of ${startupPairDiffs.length} pairs: ${startupPairDiffs.map((ms) => round(ms)).join(', ')}`,
  domainToCertMs: `${target('domainToCertMs')}; median of ${s.domainToCertMs.length}: ${s.domainToCertMs.map(Math.round).join(', ')}`,
  propagationP50Ms: propagation
    ? `${propagation.samplesMs.length} samples (${propagation.renewals} renewals x 2 readers, ${propagation.missed} missed)`
    : 'skipped',
  propagationP99Ms: propagation ? `${target('propagationP99Ms')}; max ${Math.round(Math.max(...propagation.samplesMs))}` : 'skipped',
  healthzRps:
    `bare fastify ${Math.round(fastifyRps)} req/s ` +
    `(medians of ${s.healthz.length} interleaved rounds of fresh processes, ${loadS} s each in all, 10 connections${s.pinned ? ', 1 CPU each' : ''})`,
  healthzP99Ms: `bare fastify ${fastifyP99} ms`,
  healthzCpuUsPerRequest: `server CPU time per response; bare fastify ${round(median(s.fastifyCpuUs), 1)} us`,
  healthzCpuVsBareFastify: `bare fastify's CPU per response over the daemon's; rounds: ${cpuRatios.map((r) => round(r, 2)).join(', ')}`,
  healthzVsBareFastify: `${target('healthzVsBareFastify')}; median of round pairs: ${pairRatios.map((r) => round(r, 2)).join(', ')}`,
  bareFastifyTwinVsBareFastify:
    'no goal; a second bare fastify measured as the daemon is: its distance from 1 is the resolution of healthzVsBareFastify in this run; ' +
    `rounds: ${twinRatios.map((r) => round(r, 2)).join(', ')}`,
  apiRequestsPerReplicaHour: rest
    ? `${target('apiRequestsPerReplicaHour')}; window ${round(rest.windowS, 0)} s x ${rest.replicas} replicas; ` +
      `all series ${rest.allSeriesDelta} (apiserver's own)`
    : 'skipped',
  rssInjectorMB: injector
    ? `${target('rssInjectorMB')}; its packages alone ${round(injector.packagesRss.rss)}, itself before any admission ` +
      `${round(injector.freshRss.rss)}; idle after ${injector.pods} injections; anon ${round(injector.rss.anon)}`
    : 'skipped',
  rssInjectorPackagesMB: injector
    ? `no target; client-node, x509 and prom-client bundled as dist/ is, used once, serving HTTPS (bench/injector-packages.ts): ${mb(injector.packagesRss)}`
    : 'skipped',
  injectorAdmissionP50Ms: injector ? `as the apiserver measures it; ${injector.pods} Pods created, ${injector.failures} failed` : 'skipped',
  injectorAdmissionP99Ms: injector ? `as the apiserver measures it; first certificate served ${Math.round(injector.firstCertMs)} ms after start` : 'skipped',
  injectorCpuMsPerAdmission: injector
    ? `no target; the injector's CPU time while the ${injector.pods} Pods were created, per Pod ` +
      '(V8 without its optimizing compilers: src/http/heap-saving.ts)'
    : 'skipped',
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
const domainsJson = domainsRun && domainsReport([domainsRun], [...DOMAINS_REPLICA_FLAGS, ...FAST_RETRIES], !tiny);
if (domainsJson) out.push(...domainsJson.lines, '');
if (tiny) out.push('--tiny: one quick sample per figure, no verdicts; the figures come from a full run.');
out.push(`bench ${round(benchSeconds, 0)} s (build ${round(buildMs / 1000, 1)} s)`);
process.stdout.write(`${out.join('\n')}\n`);
if (memory) printMemoryReport(memory);

if (opts.json) {
  // --tiny: the verdicts are computed (the bench tier checks that) but judge one quick sample each.
  const goals = Object.fromEntries(Object.entries(verdicts).map(([k, v]) => [k, { ...v, verdict: verdict(k) }]));
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
      fastifyHello: s.fastifyHello,
      kubeWriter: rest?.writer,
      kubeReaders: rest?.readers,
      kubeAtRest: rest?.steady,
      injector: injector && { afterAdmissions: injector.rss, beforeAdmissions: injector.freshRss, packagesAlone: injector.packagesRss },
    },
    startupMs: s.startupMs.map(Math.round),
    startupCpuMs: s.startupCpuMs.map((ms) => round(ms)),
    startupFastifyHelloCpuMs: s.fastifyStartupCpuMs.map((ms) => round(ms)),
    startupFastifyHelloMs: s.fastifyStartupMs.map(Math.round),
    healthzCpuUsRounds: s.healthzCpuUs.map((us) => round(us, 1)),
    fastifyCpuUsRounds: s.fastifyCpuUs.map((us) => round(us, 1)),
    domainToCertMs: s.domainToCertMs.map(Math.round),
    advertiseAgent: a,
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
  const more = { ...(memoryDetails ? { memory: memoryDetails } : {}), ...(domainsJson ? { domains: domainsJson.json } : {}) };
  process.stdout.write(`${JSON.stringify({ ...figures, goals, details: { ...details, ...more } })}\n`);
}
if (opts.check) {
  const missed = misses(verdicts, BENCH_GOALS);
  for (const m of missed) process.stderr.write(`bench --check: MISS ${m}\n`);
  // exitCode, not exit(): stdout (a pipe) may still be flushing the report.
  if (missed.length > 0) process.exitCode = 1;
}

/** `--domains`: only the many-domain phase, then its table (and JSON line); exits. */
async function runDomains(counts: number[]): Promise<never> {
  const lifetimeS = lifetimeFlag;
  const runs: DomainsRun[] = [];
  const failed: Array<{ n: number; error: string }> = [];
  try {
    tmp = await mkdtemp(join(tmpdir(), 'certshare-bench-'));
    buildMs = await build(tmp);
    const plane = await startAuditedControlPlane(tmp);
    cp = plane.cp;
    for (const n of counts) {
      // One N failing (a start-up that never completes) leaves the others' figures standing; a replica that
      // exits ends the bench (failOnUnexpectedExit).
      await domainsPhase(cp, join(tmp, 'domains'), plane.auditLog, n, {
        windowS,
        replicaFlags: DOMAINS_REPLICA_FLAGS,
        ...(lifetimeS ? { lifetimeS } : {}),
        size,
      }).then(
        (run) => runs.push(run),
        (err: unknown) => {
          failed.push({ n, error: (err as Error).message });
          progress(`domains ${n} failed: ${(err as Error).stack ?? String(err)}`);
        },
      );
    }
  } catch (err) {
    await fail(err);
  }
  await cleanup();
  if (runs.length === 0) {
    process.stderr.write('bench failed: no domain count completed\n');
    process.exit(1);
  }
  const { lines, json } = domainsReport(runs, DOMAINS_REPLICA_FLAGS);
  for (const f of failed) lines.push(`FAILED at N = ${f.n}: ${f.error.split('\n')[0]}`);
  const benchSeconds = round((performance.now() - started) / 1000, 0);
  process.stdout.write(`${lines.join('\n')}\nbench ${benchSeconds} s (build ${round(buildMs / 1000, 1)} s)\n`);
  if (opts.json) process.stdout.write(`${JSON.stringify({ ...json, failed, details: { node: `${process.version} ${process.execPath}`, benchSeconds } })}\n`);
  process.exit(0);
}

/** `--federation`: only the federation home's phase, then its table (and JSON line); exits. */
async function runFederation(): Promise<never> {
  let run: FederationRun | undefined;
  try {
    tmp = await mkdtemp(join(tmpdir(), 'certshare-bench-'));
    buildMs = await build(tmp);
    const home = await startAuditedControlPlane(join(tmp, 'home'), 'the federation home');
    cp = home.cp;
    progress('starting the member cluster (etcd + kube-apiserver)');
    memberCp = await startControlPlane();
    run = await federationPhase(cp, home.auditLog, memberCp, join(tmp, 'federation'), {
      groups: federationGroups,
      leaseDurationsS: leaseDurations,
      windowS,
      samples: federationSamples,
      size,
    });
  } catch (err) {
    await fail(err);
  }
  await cleanup();
  const { lines, json } = federationReport(run!, !tiny);
  const benchSeconds = round((performance.now() - started) / 1000, 0);
  if (tiny) lines.push('--tiny: one quick sample per figure, no verdicts; the figures come from a full run.');
  process.stdout.write(`${lines.join('\n')}\nbench ${benchSeconds} s (build ${round(buildMs / 1000, 1)} s)\n`);
  if (opts.json) process.stdout.write(`${JSON.stringify({ ...json, details: { node: `${process.version} ${process.execPath}`, benchSeconds } })}\n`);
  process.exit(0);
}
