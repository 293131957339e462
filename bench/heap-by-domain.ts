// `node bench/heap-by-domain.ts [--domains A,B] [--watch-scope secret|group] [--node-flags='V8 FLAGS'] [--settle S] [--json] [--skip-build]`:
// where a replica's per-domain memory goes.
// For each N: a kube group of N domains (writer + one reader, --out-dir) on the real test control plane,
// both on the production bundle; once every certificate is on the reader's disk, a V8 heap snapshot of
// each (--heapsnapshot-signal) summed by constructor. Prints, per role, RSS and the heap's growth per
// domain from the smallest N to the largest, by constructor (what to shrink), and what lies outside the
// JS heap (RSS growth minus heap growth: sockets, TLS, malloc).
import { mkdir, readdir, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { startControlPlane, type ControlPlane } from '../test/harness/control-plane.ts';
import { exampleNamespace } from '../test/support/kube.ts';
import { generatedDomains } from '../src/emulator/options.ts';
import { buildDist, CertTreeWatch, startEmulator, type EmulatorProc } from './lib/certshare.ts';
import { memStatus, stopAll, type MemStatus, type Proc } from './lib/proc.ts';
import { type CommandLine, exitWithUsageError, numberFlag, parseScriptArgs } from './lib/command-line.ts';
import { heapByConstructor } from './lib/heap.ts';
import { progress, round } from './lib/stats.ts';
import { grantDomains } from './domains.ts';
import { spawnKubeDaemon } from './kube.ts';
import { dumpProbe, PROBE_ARGS, type DaemonMemory } from './memory.ts';

interface Sample {
  n: number;
  role: string;
  mem: MemStatus;
  v8: DaemonMemory;
  heap: Map<string, number>;
}

async function snapshotOf(proc: Proc, dir: string): Promise<Map<string, number>> {
  const before = new Set(await readdir(dir));
  process.kill(proc.pid, 'SIGTTIN');
  for (let i = 0; i < 600; i++) {
    await sleep(200);
    const file = (await readdir(dir)).find((f) => f.endsWith('.heapsnapshot') && !before.has(f));
    if (!file) continue;
    // Written in one go; wait until it parses.
    try {
      const parsed = JSON.parse(await readFile(join(dir, file), 'utf8'));
      await rm(join(dir, file));
      return heapByConstructor(parsed);
    } catch {
      // still being written
    }
  }
  throw new Error(`${proc.name}: no heap snapshot`);
}

async function measure(cp: ControlPlane, dir: string, n: number): Promise<Sample[]> {
  const domains = generatedDomains(n);
  const ns = await exampleNamespace(cp, 'heap');
  const group = values['watch-scope'] === 'group';
  await grantDomains(cp, ns, domains, group);
  const kubeconfig = await cp.kubeconfigFor(ns, 'certshare');
  const snapDir = join(dir, `snap-${n}`);
  await mkdir(snapDir, { recursive: true });
  const procs: Proc[] = [];
  const emulators: EmulatorProc[] = [];
  try {
    const names = ['proxy-0', 'proxy-1'];
    const outDirs = names.map((name) => join(dir, `n${n}`, name, 'certs'));
    for (const name of names) emulators.push(await startEmulator(join(dir, `n${n}`, name), name, ['--domain-count', String(n)]));
    const tree = await CertTreeWatch.start(outDirs[1]!, domains);
    names.forEach((name, i) => {
      procs.push(
        spawnKubeDaemon(ns, kubeconfig, name, i === 0 ? 'rw' : 'ro', emulators[i]!.socket, outDirs[i]!, {
          // All N domains share one registered domain: the default issuance budget would queue all but 50 (as in bench/main.ts).
          flags: ['--log-level', 'warn', '--issuance-budget', '0', ...(group ? ['--watch-scope', 'group'] : [])],
          env: { CERTSHARE_DOMAIN: domains.join(','), BENCH_MEMPROBE_OUT: join(snapDir, `probe-${name}.json`) },
          nodeArgs: [...String(values['node-flags']).split(' ').filter(Boolean), ...PROBE_ARGS, '--heapsnapshot-signal=SIGTTIN', `--diagnostic-dir=${snapDir}`],
        }),
      );
    });
    await tree.until(
      () => domains.every((d) => tree.changes.get(d)!.length > 0),
      60_000 + 500 * n,
      () => 'not every certificate',
    );
    tree.close();
    await sleep(settleS * 1000);
    const samples: Sample[] = [];
    for (const [i, proc] of procs.entries()) {
      const mem = await memStatus(proc.pid);
      const v8 = await dumpProbe(proc, join(snapDir, `probe-${names[i]}.json`), names[i]!);
      samples.push({ n, role: i === 0 ? 'writer' : 'reader', mem, v8, heap: await snapshotOf(proc, snapDir) });
    }
    return samples;
  } finally {
    await Promise.all(procs.map((p) => p.stop()));
    await Promise.all(emulators.map((e) => e.proc.stop()));
  }
}

const SCRIPT: CommandLine = {
  name: 'heap-by-domain',
  invocation: 'node bench/heap-by-domain.ts',
  summary:
    "Where a replica's per-domain memory goes: per N, a kube group of N domains (writer + one reader) on the test control plane, " +
    'a V8 heap snapshot of each summed by constructor; prints the growth per domain from the smallest N to the largest.',
  flags: [
    { name: 'domains', placeholder: 'N,N', default: '1,500', help: 'Domain counts, comma separated.' },
    { name: 'json', boolean: true, help: 'The last stdout line is one JSON object with the growth per role.' },
    { name: 'skip-build', boolean: true, help: 'Run the dist/ already there instead of building it.' },
    { name: 'node-flags', placeholder: "'V8 FLAGS'", default: '', help: 'Node/V8 flags for both replicas.' },
    { name: 'settle', placeholder: 'S', default: '5', help: 'Seconds between the last certificate on disk and the snapshots.' },
    { name: 'watch-scope', placeholder: 'SCOPE', default: 'secret', help: "The replicas' --watch-scope (secret or group)." },
  ],
};
const values = parseScriptArgs(SCRIPT);
const counts = String(values.domains).split(',').map(Number);
if (!counts.every((n) => Number.isInteger(n) && n >= 1)) exitWithUsageError(SCRIPT, '--domains wants whole numbers, comma separated');
const settleS = numberFlag(SCRIPT, values, 'settle', 5, 'seconds, at least 0', (n) => n >= 0);
const dir = join(tmpdir(), `certshare-heap-${process.pid}`);
let cp: ControlPlane | undefined;
try {
  if (!values['skip-build']) await buildDist();
  cp = await startControlPlane();
  const samples: Sample[] = [];
  for (const n of counts) {
    progress(`heap: ${n} domains`);
    samples.push(...(await measure(cp, dir, n)));
  }
  const out: Record<string, unknown> = {};
  for (const role of ['writer', 'reader']) {
    const [lo, hi] = [samples.find((s) => s.role === role && s.n === counts[0]), samples.find((s) => s.role === role && s.n === counts.at(-1))];
    if (!lo || !hi || hi.n === lo.n) continue;
    const dn = hi.n - lo.n;
    const total = (m: Map<string, number>): number => [...m.values()].reduce((a, b) => a + b, 0);
    const heapKB = (total(hi.heap) - total(lo.heap)) / 1024 / dn;
    const rssKB = ((hi.mem.rss - lo.mem.rss) * 1024) / dn;
    const keys = new Set([...lo.heap.keys(), ...hi.heap.keys()]);
    const growth = [...keys]
      .map((k) => [k, ((hi.heap.get(k) ?? 0) - (lo.heap.get(k) ?? 0)) / dn] as const)
      .sort((a, b) => b[1] - a[1])
      .slice(0, 25);
    process.stdout.write(
      `\n${role}: RSS ${round(lo.mem.rss)} MB at ${lo.n} -> ${round(hi.mem.rss)} MB at ${hi.n} domains: ${round(rssKB, 1)} KB/domain ` +
        `(anon ${round(((hi.mem.anon - lo.mem.anon) * 1024) / dn, 1)}); JS heap (live objects) ${round(heapKB, 1)} KB/domain; ` +
        `outside it ${round(rssKB - heapKB, 1)} KB/domain\n`,
    );
    const perDomain = (f: (s: Sample) => number): number => round(((f(hi) - f(lo)) * 1024) / dn, 1);
    process.stdout.write(
      `  V8 heap reserved ${perDomain((s) => s.v8.heapTotalMB)} KB/domain, used ${perDomain((s) => s.v8.heapUsedMB)}, ` +
        `external ${perDomain((s) => s.v8.externalMB)}, V8 malloc ${perDomain((s) => s.v8.mallocedMB)}; ` +
        `spaces (KB/domain): ${Object.keys(hi.v8.spaces)
          .map((k) => `${k.replace('_space', '')} ${perDomain((s) => s.v8.spaces[k] ?? 0)}`)
          .join(', ')}\n`,
    );
    for (const [k, b] of growth) process.stdout.write(`  ${String(Math.round(b)).padStart(7)} B/domain  ${k}\n`);
    out[role] = { rssKBPerDomain: round(rssKB, 1), heapKBPerDomain: round(heapKB, 1), top: growth.map(([k, b]) => [k, Math.round(b)]) };
  }
  if (values.json) process.stdout.write(`${JSON.stringify(out)}\n`);
} finally {
  await stopAll().catch(() => {});
  await cp?.stop().catch(() => {});
  await rm(dir, { recursive: true, force: true });
}
