// The advertise agent's cost per replica (docs/performance.md, the advertise agent): every Pod that advertises
// Tailscale Services runs it beside certshare. Against the LocalAPI emulator, the agent started as the injector
// writes its container (advertiseAgentContainer: its command, Node flags and variables, on the bench's dist/):
// the CPU time of its start (every thread, until it says it started), its CPU time at rest (a file read every
// poll) per hour, its idle RSS after that rest and after N request cycles (certshare's side of the exchange,
// AgentPrefs: a request written, its status awaited). Its floors, started in turn with it: a bare
// `node -e` and one that loads only node:http and node:fs, each as the agent would be run without its flags.
//
// `node bench/advertise-agent.ts --pairs N --variants 'A;B;...'` compares variants started in turn (pairs:
// each variant's start beside the first's, in a rotating order): `agent` (the injector's command), `main`
// (`dist/cli/main.js advertise-agent` with the image's flags, as before the agent's own script), `before` (the same
// from another commit's dist/, --before DIR), `node` and `node-http-fs` (the floors); words after the name are more
// Node flags, or NAME=VALUE variables.
import { mkdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { mkdtemp } from 'node:fs/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import { systemClock } from '../src/core/ports/clock.ts';
import { AgentPrefs } from '../src/served/advertise-exchange.ts';
import { REQUEST_DIR, STATUS_DIR } from '../src/served/advertise-paths.ts';
import { injectedAgent } from '../test/support/injected-agent.ts';
import { memoryOf } from '../test/support/proc-memory.ts';
import { type CommandLine, numberFlag, parseScriptArgs } from './lib/command-line.ts';
import { buildDist, bundleMain, IMAGE_NODE_FLAGS, startEmulator } from './lib/certshare.ts';
import { idleRss, type MemStatus, Proc, stopAll, threadsCpuMs, cleanEnv } from './lib/proc.ts';
import { FULL_SIZE, type BenchSize, TINY_SIZE } from './lib/size.ts';
import { median, progress, round } from './lib/stats.ts';

const SERVICE = 'svc:web';
/** The floors: a bare Node, and one that loads the two built-ins the agent's work needs. */
const FLOORS: Record<string, string> = {
  node: '',
  'node-http-fs': "require('node:http'); require('node:fs');",
};
/** What a floor says once its script ran, as the agent says it started: its start is measured the same way. */
const FLOOR_STARTED = 'floor started';

/** One start of a variant: CPU and wall time until it said it started, idle RSS, CPU at rest. */
export interface AgentStart {
  /** Every thread's CPU time until "advertise agent started" (a floor: until its script ran), in ms. */
  startCpuMs: number;
  startWallMs: number;
  /** Idle RSS after its time at rest (restSeconds), before the request cycles. */
  idleStart: MemStatus;
  /** After the request cycles (a floor: the same as idleStart, read again). */
  idleAfter: MemStatus;
  /** VmHWM at the end (MB): the most it was resident at once, what its memory limit must leave room for. */
  peakMB: number;
  /** CPU time at rest, per hour (ms). */
  restCpuMsPerHour: number;
  /** Each request cycle, written to answered (ms). */
  cyclesMs: number[];
}

export interface AgentOptions {
  size: BenchSize;
  /** Request cycles between the two idle readings. */
  cycles: number;
  /** Seconds at rest over which its CPU time is read. */
  restSeconds: number;
}

/** A variant's command line and variables; `agent: false` for a floor (no exchange, no log to wait for). */
interface Launch {
  args: string[];
  env: Record<string, string>;
  agent: boolean;
}

/** The agent as the injector writes its container (test/support/injected-agent.ts), on the bench's dist/ and Node. */
function agentAsInjected(socket: string, exchange: string): Launch {
  return { ...injectedAgent(dirname(dirname(bundleMain())), { services: SERVICE, socket, exchange }), agent: true };
}

/** `node bench/advertise-agent.ts`'s variants: a name, then more Node flags and NAME=VALUE variables. */
function variantLaunch(spec: string, socket: string, exchange: string, before?: string): Launch {
  const [name, ...words] = spec.trim().split(/\s+/);
  const flags = words.filter((w) => w.startsWith('--'));
  const env = Object.fromEntries(words.filter((w) => !w.startsWith('--')).map((w) => [w.slice(0, w.indexOf('=')), w.slice(w.indexOf('=') + 1)]));
  if (name === 'agent') {
    const injected = agentAsInjected(socket, exchange);
    return { ...injected, args: [...flags, ...injected.args], env: { ...injected.env, ...env } };
  }
  if (name === 'main' || name === 'before') {
    if (name === 'before' && !before) throw new Error('the variant before needs --before DIR');
    const main = name === 'main' ? bundleMain() : join(before!, 'cli/main.js');
    const args = [...IMAGE_NODE_FLAGS, ...flags, main, 'advertise-agent'];
    return { args: [...args, '--localapi', socket, '--advertise-services', SERVICE, '--exchange', exchange], env, agent: true };
  }
  const floor = FLOORS[name!];
  if (floor === undefined) throw new Error(`unknown variant ${name}: agent, main, before, ${Object.keys(FLOORS).join(', ')}`);
  // Said with a write to fd 1: process.stdout (a stream on a pipe) alone costs a bare Node 2.1 MB.
  const said = `require('node:fs').writeSync(1, '{"msg":"${FLOOR_STARTED}"}\\n');`;
  return { args: [...flags, '-e', `${floor} ${said} setInterval(() => {}, 1 << 30);`], env, agent: false };
}

async function cpuPerHour(pid: number, seconds: number): Promise<number> {
  const before = await threadsCpuMs(pid);
  const at = performance.now();
  await sleep(seconds * 1000);
  return ((await threadsCpuMs(pid)) - before) * (3_600_000 / (performance.now() - at));
}

/** Starts `launch`, measures it (AgentStart), stops it; the agent must stop cleanly (it withdraws first). */
export async function measureStart(name: string, launch: Launch, exchange: string, o: AgentOptions): Promise<AgentStart> {
  await rm(exchange, { recursive: true, force: true });
  await mkdir(join(exchange, REQUEST_DIR), { recursive: true });
  await mkdir(join(exchange, STATUS_DIR));
  const proc = new Proc(name, launch.args, { env: cleanEnv(launch.env), mustRun: true });
  try {
    let startWallMs = 0;
    const started = proc.onLine((_line, at) => (startWallMs ||= at - proc.spawnedAt));
    await proc.waitForLog((e) => e.msg === (launch.agent ? 'advertise agent started' : FLOOR_STARTED), 20_000, 'its start');
    const startCpuMs = await threadsCpuMs(proc.pid);
    started();
    // At rest first, then its RSS: what it pays for as long as it runs. Read within seconds of its start, a Node
    // that ran hot code since may not have paged in V8's optimizing compiler yet (docs/performance.md, the agent).
    const restCpuMsPerHour = await cpuPerHour(proc.pid, o.restSeconds);
    const [idleStart] = await idleRss([proc.pid], o.size.idle);
    const cyclesMs: number[] = [];
    if (launch.agent) {
      const prefs = new AgentPrefs(exchange, systemClock, 10_000);
      for (let i = 1; i <= o.cycles; i++) {
        const at = performance.now();
        await prefs.editPrefs({ AdvertiseServicesSet: true, AdvertiseServices: i % 2 === 1 ? [SERVICE] : [] }, AbortSignal.timeout(15_000));
        cyclesMs.push(performance.now() - at);
      }
    }
    const [idleAfter] = await idleRss([proc.pid], o.size.idle);
    const peakMB = (await memoryOf(proc.pid)).peak / 2 ** 20;
    return { startCpuMs, startWallMs, idleStart: idleStart!, idleAfter: idleAfter!, peakMB, restCpuMsPerHour, cyclesMs };
  } finally {
    await proc.stop();
  }
}

export interface AgentPhaseResults {
  agent: AgentStart[];
  node: AgentStart[];
  httpFs: AgentStart[];
  cycles: number;
  restSeconds: number;
}

/** The bench's phase: the injected agent and its two floors, started in turn `runs` times. */
export async function agentPhase(dir: string, o: AgentOptions & { runs: number }): Promise<AgentPhaseResults> {
  const emulator = await startEmulator(join(dir, 'emulator'), 'agent', []);
  const exchange = join(dir, 'exchange');
  const results: AgentPhaseResults = { agent: [], node: [], httpFs: [], cycles: o.cycles, restSeconds: o.restSeconds };
  progress(`advertise agent: ${o.runs} starts, each beside a bare node and one with node:http and node:fs; ${o.cycles} request cycles each`);
  for (let i = 0; i < o.runs; i++) {
    const order: Array<['agent' | 'node' | 'httpFs', Launch]> = [
      ['agent', agentAsInjected(emulator.socket, exchange)],
      ['node', variantLaunch('node', emulator.socket, exchange)],
      ['httpFs', variantLaunch('node-http-fs', emulator.socket, exchange)],
    ];
    for (let k = 0; k < order.length; k++) {
      const [key, launch] = order[(i + k) % order.length]!;
      results[key].push(await measureStart(`advertise agent bench: ${key}`, launch, exchange, o));
    }
  }
  await emulator.proc.stop();
  return results;
}

const SCRIPT: CommandLine = {
  name: 'advertise-agent-bench',
  invocation: 'node bench/advertise-agent.ts',
  summary: 'The advertise agent against the LocalAPI emulator: variants started in turn, their start-up CPU, idle RSS and CPU at rest.',
  flags: [
    { name: 'pairs', placeholder: 'N', default: '5', help: 'Starts of each variant, after a warm-up start of each.' },
    { name: 'variants', placeholder: "'A;B'", default: 'agent;main', help: 'Variants, separated by ";" (the first is the one the others pair with).' },
    { name: 'cycles', placeholder: 'N', default: '20', help: 'Request cycles between the two idle readings.' },
    { name: 'rest', placeholder: 'S', default: '20', help: 'Seconds at rest over which CPU time is read.' },
    { name: 'before', placeholder: 'DIR', help: "Another commit's dist/ (node scripts/build.ts DIR there), for the variant before." },
    { name: 'tiny', boolean: true, help: 'Short idle waits (a smoke run).' },
  ],
};

if (import.meta.main) {
  const opts = parseScriptArgs(SCRIPT);
  const pairs = numberFlag(SCRIPT, opts, 'pairs', 5, 'a whole number, at least 1', (n) => Number.isInteger(n) && n >= 1);
  const cycles = numberFlag(SCRIPT, opts, 'cycles', 20, 'a whole number', (n) => Number.isInteger(n) && n >= 0);
  const restSeconds = numberFlag(SCRIPT, opts, 'rest', 20, 'seconds, more than 0', (n) => n > 0);
  const specs = String(opts.variants)
    .split(';')
    .map((s) => s.trim())
    .filter(Boolean);
  const before = opts.before === undefined ? undefined : String(opts.before);
  const o: AgentOptions = { size: opts.tiny ? TINY_SIZE : FULL_SIZE, cycles, restSeconds };
  const dir = await mkdtemp(join(tmpdir(), 'certshare-agent-bench-'));
  try {
    await buildDist();
    const emulator = await startEmulator(join(dir, 'emulator'), 'agent', []);
    const exchange = join(dir, 'exchange');
    const starts: AgentStart[][] = specs.map(() => []);
    // Round 0 warms the page cache up, not counted.
    for (let r = 0; r <= pairs; r++) {
      for (let k = 0; k < specs.length; k++) {
        const v = (r + k) % specs.length;
        const start = await measureStart(specs[v]!, variantLaunch(specs[v]!, emulator.socket, exchange, before), exchange, o);
        if (r > 0) starts[v]!.push(start);
      }
      if (r > 0) progress(`pair ${r} of ${pairs} done`);
    }
    const summary = specs.map((spec, v) => {
      const s = starts[v]!;
      const vsFirst = (f: (a: AgentStart) => number) => round(median(s.map((a, i) => f(a) - f(starts[0]![i]!))), 2);
      return {
        variant: spec,
        startCpuMs: round(median(s.map((a) => a.startCpuMs))),
        startWallMs: round(median(s.map((a) => a.startWallMs))),
        idleStartMB: round(median(s.map((a) => a.idleStart.rss))),
        idleAfterMB: round(median(s.map((a) => a.idleAfter.rss))),
        anonAfterMB: round(median(s.map((a) => a.idleAfter.anon))),
        fileAfterMB: round(median(s.map((a) => a.idleAfter.file))),
        peakMB: round(median(s.map((a) => a.peakMB))),
        restCpuMsPerHour: round(median(s.map((a) => a.restCpuMsPerHour)), 0),
        cycleMs: round(median(s.flatMap((a) => a.cyclesMs))),
        pairedVsFirst: { startCpuMs: vsFirst((a) => a.startCpuMs), idleAfterMB: vsFirst((a) => a.idleAfter.rss) },
        idleAfterAllMB: s.map((a) => round(a.idleAfter.rss)),
      };
    });
    process.stdout.write(`${JSON.stringify({ pairs, cycles, restSeconds, summary })}\n`);
    for (const s of summary) process.stdout.write(`${JSON.stringify(s)}\n`);
    await emulator.proc.stop();
  } finally {
    await stopAll().catch(() => {});
    await rm(dir, { recursive: true, force: true });
  }
}
