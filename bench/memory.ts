// `--memory`: where the daemon's memory goes.
//  1. Import costs: a fresh Node per step, each importing everything of the steps before it, so a step's
//     delta is what it adds on top of the previous ones (in the order the daemon loads them).
//  2. Running daemons (standalone, kube writer and reader) with a small probe preloaded (a separate
//     instance, never the measured one): V8 heap spaces, code, external memory, and the JS loaded per
//     package (files and bytes of source). Under --expose-gc the probe collects garbage first.
//  3. V8 flags on the standalone daemon: idle RSS, RSS after a burst of /healthz load, throughput.
//  4. Build variants of a kube reader: the bundle (dist/, what ships) against tsc's module-per-file output.
// Steps 1 and 4 run tsc's output (modules/ in the bench's temp dir), so that packages and our code show separately.
import { mkdir, readFile, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import type { ControlPlane } from '../test/harness/control-plane.ts';
import { exampleNamespace } from '../test/support/kube.ts';
import { bundleMain, buildModules, CertFileWatch, REPO, spawnDaemon, startEmulator } from './lib/certshare.ts';
import { freePort } from './lib/http.ts';
import { pinProcess, runLoad } from './lib/load.ts';
import { idleRss, memStatus, Proc, type MemStatus } from './lib/proc.ts';
import { type BenchSize, settle, variantsOf } from './lib/size.ts';
import { progress, round } from './lib/stats.ts';
import { startReplica } from './kube.ts';
import { STANDALONE_DOMAIN } from './standalone.ts';

const CN = '@kubernetes/client-node/dist';

/** Cumulative import steps, in the order the daemon pays for them; our code from tsc's output in `modules`. */
const importChain = (modules: string): Array<[string, string]> => [
  ['bare node', ''],
  ['+ pino (logger)', `const { pino } = await import('pino'); globalThis.s1 = pino({ level: 'info' });`],
  [
    '+ prom-client (Registry + default metrics)',
    `const pc = await import('prom-client'); const r = new pc.Registry(); pc.collectDefaultMetrics({ register: r }); globalThis.s2 = r;`,
  ],
  [
    '+ fastify (2 routes, listening)',
    `const F = (await import('fastify')).default; const app = F({ logger: false }); ` +
      `app.get('/healthz', async () => 'ok'); app.get('/metrics', async () => ''); ` +
      `await app.listen({ host: '127.0.0.1', port: 0 }); globalThis.s3 = app;`,
  ],
  [
    '+ certshare standalone code (daemon.js graph)',
    `await import(${JSON.stringify(`${modules}/daemon/daemon.js`)}); await import(${JSON.stringify(`${modules}/cli/run-command.js`)});`,
  ],
  ['+ undici (client-node transport)', `await import('undici');`],
  ['+ client-node models (ObjectSerializer)', `await import('${CN}/gen/models/ObjectSerializer.js');`],
  ['+ client-node CoreV1Api', `await import('${CN}/gen/apis/CoreV1Api.js');`],
  ['+ client-node gen/index.js (all API groups)', `await import('${CN}/gen/index.js');`],
  [
    '+ client-node config.js, watch.js (KubeConfig, auth, Watch)',
    `await import('${CN}/config.js'); await import('${CN}/watch.js'); await import('${CN}/middleware.js'); ` +
      `await import('${CN}/patch.js'); await import('${CN}/types.js');`,
  ],
  ['+ certshare kube code (kube/kube-backend.js graph)', `await import(${JSON.stringify(`${modules}/kube/kube-backend.js`)});`],
];

export interface ChainStep {
  step: string;
  mem: MemStatus;
  heapUsedMB: number;
  externalMB: number;
}

async function chainStep(code: string, size: BenchSize): Promise<Omit<ChainStep, 'step'>> {
  const script = `${code}
await new Promise((r) => setTimeout(r, ${settle(size, 1000)})); globalThis.gc(); globalThis.gc(); await new Promise((r) => setTimeout(r, ${settle(size, 500)}));
const mu = process.memoryUsage();
process.stdout.write(JSON.stringify({ heapUsedMB: mu.heapUsed / 1048576, externalMB: mu.external / 1048576 }) + '\\n');
await new Promise((r) => setTimeout(r, 60000));`;
  const proc = new Proc('import step', ['--expose-gc', '--input-type=module', '-e', script], { cwd: REPO, mustRun: true });
  const line = await proc.waitForLog((e) => typeof e.heapUsedMB === 'number', 30_000, 'import step result');
  const mem = await memStatus(proc.pid);
  await proc.stop();
  return { mem, heapUsedMB: line.heapUsedMB as number, externalMB: line.externalMB as number };
}

// --- the probe preloaded into separate daemon instances --------------------------------------------
const PROBE =
  `
import { registerHooks } from 'node:module';
import { getHeapStatistics, getHeapSpaceStatistics, getHeapCodeStatistics } from 'node:v8';
import { readFileSync, writeFileSync } from 'node:fs';
const loaded = new Set();
registerHooks({ load(url, context, next) { loaded.add(url); return next(url, context); } });
process.on('SIGUSR2', () => {
  globalThis.gc?.();
  writeFileSync(process.env.BENCH_MEMPROBE_OUT, JSON.stringify({ mu: process.memoryUsage(), heap: getHeapStatistics(), ` +
  `spaces: getHeapSpaceStatistics(), code: getHeapCodeStatistics(), modules: [...loaded] }));
});`;
export const PROBE_ARGS = ['--import', `data:text/javascript,${encodeURIComponent(PROBE)}`];

interface ProbeDump {
  mu: NodeJS.MemoryUsage;
  heap: { total_heap_size: number; used_heap_size: number; malloced_memory: number; external_memory: number };
  spaces: Array<{ space_name: string; space_size: number; space_used_size: number }>;
  code: { code_and_metadata_size: number; bytecode_and_metadata_size: number; external_script_source_size: number };
  modules: string[];
}

export interface DaemonMemory {
  name: string;
  mem: MemStatus;
  heapTotalMB: number;
  heapUsedMB: number;
  spaces: Record<string, number>;
  bytecodeMB: number;
  codeMB: number;
  externalMB: number;
  mallocedMB: number;
  /** Loaded JS per package: files and MB of source. */
  packages: Array<{ pkg: string; files: number; sourceMB: number }>;
}

export async function dumpProbe(proc: Proc, out: string, name: string): Promise<DaemonMemory> {
  const mem = await memStatus(proc.pid);
  process.kill(proc.pid, 'SIGUSR2');
  let dump: ProbeDump | undefined;
  for (let i = 0; i < 50 && !dump; i++) {
    await sleep(100);
    // Absent until the probe writes it, and read half-written while it does: tried again either way.
    dump = await readFile(out, 'utf8').then(
      (t) => {
        try {
          return JSON.parse(t) as ProbeDump;
        } catch {
          return undefined;
        }
      },
      () => undefined,
    );
  }
  if (!dump) throw new Error(`${name}: the memory probe wrote nothing`);
  const MB = 1048576;
  const byPkg = new Map<string, { files: number; bytes: number }>();
  for (const url of dump.modules) {
    if (!url.startsWith('file:')) continue;
    const path = fileURLToPath(url);
    const nm = path.lastIndexOf('/node_modules/');
    let pkg: string;
    if (nm >= 0) {
      const parts = path.slice(nm + 14).split('/');
      pkg = parts[0]!.startsWith('@') ? `${parts[0]}/${parts[1]}` : parts[0]!;
    } else pkg = 'certshare';
    const size = await stat(path).then(
      (s) => s.size,
      () => 0,
    );
    const entry = byPkg.get(pkg) ?? { files: 0, bytes: 0 };
    entry.files++;
    entry.bytes += size;
    byPkg.set(pkg, entry);
  }
  return {
    name,
    mem,
    heapTotalMB: dump.mu.heapTotal / MB,
    heapUsedMB: dump.mu.heapUsed / MB,
    spaces: Object.fromEntries(dump.spaces.map((s) => [s.space_name, s.space_size / MB])),
    bytecodeMB: dump.code.bytecode_and_metadata_size / MB,
    codeMB: dump.code.code_and_metadata_size / MB,
    externalMB: dump.mu.external / MB,
    mallocedMB: dump.heap.malloced_memory / MB,
    packages: [...byPkg].map(([pkg, e]) => ({ pkg, files: e.files, sourceMB: e.bytes / MB })).sort((a, b) => b.sourceMB - a.sourceMB),
  };
}

export interface FlagVariant {
  flags: string;
  idle: MemStatus;
  afterLoad: MemStatus;
  rps: number;
}

export interface MemoryReport {
  chain: ChainStep[];
  daemons: DaemonMemory[];
  flags: FlagVariant[];
  /** Idle RSS of a kube reader under V8 flags and builds. */
  kubeFlags: Array<{ flags: string; idle: MemStatus }>;
  /** Seconds of /healthz load on each V8-flags variant. */
  loadSeconds: number;
}

/** Kube reader variants: build (bundle or modules) and V8 flags. */
const KUBE_VARIANTS: Array<{ build: 'bundle' | 'modules'; flags: string; env?: Record<string, string> }> = [
  { build: 'bundle', flags: '' },
  { build: 'modules', flags: '' },
  { build: 'bundle', flags: '', env: { MALLOC_ARENA_MAX: '2' } },
  { build: 'bundle', flags: '--max-semi-space-size=1' },
];

export async function memoryPhase(dir: string, cp: ControlPlane | undefined, size: BenchSize): Promise<MemoryReport> {
  await mkdir(dir, { recursive: true });
  progress('memory: tsc -p tsconfig.build.json (module-per-file, for comparison)');
  const modulesMain = await buildModules(join(dir, 'modules'));
  // Each step imports everything of the steps before it.
  const chainSteps = importChain(join(dir, 'modules'));
  const steps = chainSteps.map(([step], i) => ({
    step,
    code: chainSteps
      .slice(0, i + 1)
      .map(([, add]) => add)
      .join('\n'),
  }));
  const measured = variantsOf(size, steps);
  progress(`memory: import costs (${measured.length * size.importRuns} fresh processes)`);
  const chain: ChainStep[] = [];
  for (const { step, code } of measured) {
    // The young generation's size after a burst of loading varies by a few MB: the median of the runs (3 at full size).
    const runs: Array<Omit<ChainStep, 'step'>> = [];
    for (let i = 0; i < size.importRuns; i++) runs.push(await chainStep(code, size));
    runs.sort((a, b) => a.mem.rss - b.mem.rss);
    chain.push({ step, ...runs[Math.floor(runs.length / 2)]! });
  }

  progress('memory: probed daemons (standalone; kube writer and reader)');
  const daemons: DaemonMemory[] = [];
  const kubeFlags: MemoryReport['kubeFlags'] = [];
  const emulator = await startEmulator(join(dir, 'emulator'), 'memory', ['--domain', STANDALONE_DOMAIN]);
  const certDir = join(dir, 'certs');
  const files = await CertFileWatch.start(certDir, STANDALONE_DOMAIN);
  const base = ['--localapi', emulator.socket, '--store', `dir:${certDir}`, '--domain', STANDALONE_DOMAIN];
  {
    const out = join(dir, 'probe-standalone.json');
    const d = spawnDaemon('probed standalone', [...base, '--listen', `127.0.0.1:${await freePort()}`], { BENCH_MEMPROBE_OUT: out }, PROBE_ARGS);
    await files.next(30_000);
    await sleep(settle(size, 3000));
    daemons.push(await dumpProbe(d, out, 'standalone'));
    await d.stop();
  }
  if (cp) {
    const ns = await exampleNamespace(cp, 'bench');
    const kubeconfig = await cp.kubeconfigFor(ns, 'certshare');
    const outs = { w: join(dir, 'probe-writer.json'), r: join(dir, 'probe-reader.json') };
    const writer = await startReplica(ns, kubeconfig, join(dir, 'kube'), 'proxy-0', 'rw', { nodeArgs: PROBE_ARGS, env: { BENCH_MEMPROBE_OUT: outs.w } });
    const reader = await startReplica(ns, kubeconfig, join(dir, 'kube'), 'proxy-1', 'ro', { nodeArgs: PROBE_ARGS, env: { BENCH_MEMPROBE_OUT: outs.r } });
    try {
      await Promise.all([writer.files.next(60_000, 0), reader.files.next(60_000, 0)]);
      await sleep(settle(size, 3000));
      daemons.push(await dumpProbe(writer.daemon, outs.w, 'kube writer'));
      daemons.push(await dumpProbe(reader.daemon, outs.r, 'kube reader'));
      await reader.stop();
      progress('memory: builds and V8 flags on a kube reader');
      for (const variant of variantsOf(size, KUBE_VARIANTS)) {
        const r = await startReplica(ns, kubeconfig, join(dir, 'kube'), `proxy-${kubeFlags.length + 2}`, 'ro', {
          nodeArgs: variant.flags ? variant.flags.split(' ') : [],
          main: variant.build === 'bundle' ? bundleMain() : modulesMain,
          env: variant.env ?? {},
        });
        try {
          await r.files.next(60_000, 0);
          await sleep(settle(size, 5000));
          const [idle] = await idleRss([r.daemon.pid], size.idle);
          kubeFlags.push({
            flags: `${variant.build}${variant.flags ? ` ${variant.flags}` : ''}${
              variant.env
                ? ` ${Object.entries(variant.env)
                    .map(([k, v]) => `${k}=${v}`)
                    .join(' ')}`
                : ''
            }`,
            idle: idle!,
          });
        } finally {
          await r.stop();
        }
      }
    } finally {
      await Promise.all([writer.stop(), reader.stop()]);
    }
  }

  progress('memory: V8 flags on the standalone daemon');
  const flags: FlagVariant[] = [];
  for (const variant of variantsOf(size, ['', '--max-semi-space-size=1', '--max-semi-space-size=1 --max-old-space-size=64', '--lite-mode', '--jitless'])) {
    const port = await freePort();
    const nodeArgs = variant ? variant.split(' ') : [];
    const d = spawnDaemon(`standalone ${variant}`, [...base, '--listen', `127.0.0.1:${port}`], {}, nodeArgs);
    await d.waitForLog((e) => e.healthy === true, 20_000, 'healthy');
    const idleOptions = { idleMs: settle(size, 3000), spanMs: Math.min(1000, size.idle.spanMs), everyMs: size.idle.everyMs };
    const [idle] = await idleRss([d.pid], idleOptions);
    pinProcess(d.pid, 0);
    const load = await runLoad(`http://127.0.0.1:${port}/healthz`, size.memoryLoadSeconds, 10);
    const [afterLoad] = await idleRss([d.pid], idleOptions);
    flags.push({ flags: variant || '(none)', idle: idle!, afterLoad: afterLoad!, rps: load.rps });
    await d.stop();
  }
  files.close();
  await emulator.proc.stop();
  return { chain, daemons, flags, kubeFlags, loadSeconds: size.memoryLoadSeconds };
}

export function printMemoryReport(r: MemoryReport): void {
  const lines: string[] = ['', 'Where the memory goes', '', 'Import costs (fresh Node per row, each importing all rows above; after gc; MB):'];
  lines.push(
    `  ${'step'.padEnd(52)} ${'RSS'.padStart(6)} ${'delta'.padStart(6)} ${'anon'.padStart(6)} ${'file'.padStart(6)} ${'heap'.padStart(6)} ${'ext'.padStart(5)}`,
  );
  let prev: number | undefined;
  for (const s of r.chain) {
    const delta = prev === undefined ? '' : `+${round(s.mem.rss - prev)}`;
    lines.push(
      `  ${s.step.padEnd(52)} ${String(round(s.mem.rss)).padStart(6)} ${delta.padStart(6)} ${String(round(s.mem.anon)).padStart(6)} ` +
        `${String(round(s.mem.file)).padStart(6)} ${String(round(s.heapUsedMB)).padStart(6)} ${String(round(s.externalMB)).padStart(5)}`,
    );
    prev = s.mem.rss;
  }
  for (const d of r.daemons) {
    lines.push(
      '',
      `Running daemon, ${d.name} (probe instance, idle after its first certificate): ` +
        `RSS ${round(d.mem.rss)} MB = anon ${round(d.mem.anon)} + file-backed ${round(d.mem.file)}`,
    );
    lines.push(
      `  V8 heap ${round(d.heapTotalMB)} MB reserved / ${round(d.heapUsedMB)} used (${Object.entries(d.spaces)
        .filter(([, v]) => v >= 0.1)
        .map(([k, v]) => `${k.replace('_space', '')} ${round(v)}`)
        .join(
          ', ',
        )}); bytecode+metadata ${round(d.bytecodeMB)}, machine code ${round(d.codeMB)}; external ${round(d.externalMB)}; V8 malloc ${round(d.mallocedMB)}`,
    );
    lines.push(
      `  JS loaded: ${d.packages
        .slice(0, 8)
        .map((p) => `${p.pkg} ${p.files} files ${round(p.sourceMB, 2)} MB`)
        .join('; ')}`,
    );
  }
  lines.push('', `V8 flags, standalone daemon (MB; req/s over ${r.loadSeconds} s of /healthz load):`);
  for (const f of r.flags)
    lines.push(
      `  ${f.flags.padEnd(50)} idle ${round(f.idle.rss)} (anon ${round(f.idle.anon)})  ` +
        `after load ${round(f.afterLoad.rss)} (anon ${round(f.afterLoad.anon)})  ${Math.round(f.rps)} req/s`,
    );
  if (r.kubeFlags.length > 0) {
    lines.push('', 'Kube reader by build and V8 flags (idle after its first certificate, MB):');
    for (const f of r.kubeFlags) lines.push(`  ${f.flags.padEnd(50)} idle ${round(f.idle.rss)} (anon ${round(f.idle.anon)})`);
  }
  process.stdout.write(`${lines.join('\n')}\n`);
}
