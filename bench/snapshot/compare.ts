// `node bench/snapshot/compare.ts [--starts N] [--idle N]`: start-up of the standalone daemon from its V8
// startup snapshot (the image's default entry), beside dist/cli/main.js (what Kubernetes workloads run) and the bare fastify hello
// (the start-up floor). The three start one after another in a rotating order, N times after a warm-up;
// each is asked /healthz every 5 ms and stopped at its first 200 (certificate stored). CPU is every thread's
// time on a CPU until then; pairs are taken among the three started together. The last --idle times also
// keep each process 3 s more and read its idle RSS. Prints a JSON line, then the summary.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildBaseline, FASTIFY_HELLO, startBaseline } from '../lib/baseline.ts';
import { type CommandLine, numberFlag, parseScriptArgs } from '../lib/command-line.ts';
import { buildDist, CertFileWatch, spawnDaemon, spawnImageEntry, startEmulator } from '../lib/certshare.ts';
import { freePort, pollHealthy } from '../lib/http.ts';
import { idleRss, type MemStatus, type Proc, stopAll, threadsCpuMs } from '../lib/proc.ts';
import { median, round } from '../lib/stats.ts';
import { STANDALONE_DOMAIN } from '../standalone.ts';

interface Start {
  cpuMs: number;
  wallMs: number;
  idle?: MemStatus;
}

const SCRIPT: CommandLine = {
  name: 'snapshot-compare',
  invocation: 'node bench/snapshot/compare.ts',
  summary: "Start-up of the standalone daemon from the image's V8 startup snapshot, beside dist/ and the bare fastify hello, in turn.",
  flags: [
    { name: 'starts', placeholder: 'N', default: '10', help: 'Starts of each, after a warm-up.' },
    { name: 'idle', placeholder: 'N', default: '3', help: 'Of them, the last N also read idle RSS 3 s after healthy.' },
  ],
};
const opts = parseScriptArgs(SCRIPT);
const rounds = numberFlag(SCRIPT, opts, 'starts', 10, 'a whole number, at least 1', (n) => Number.isInteger(n) && n >= 1);
const idleRounds = numberFlag(SCRIPT, opts, 'idle', 3, `a whole number from 0 to --starts`, (n) => Number.isInteger(n) && n >= 0 && n <= rounds);
const dir = await mkdtemp(join(tmpdir(), 'certshare-snapshot-'));
try {
  await buildDist();
  const hello = await buildBaseline(join(dir, FASTIFY_HELLO), FASTIFY_HELLO);
  const emulator = await startEmulator(join(dir, 'emulator'), 'snapshot', ['--domain', STANDALONE_DOMAIN]);
  const certDir = join(dir, 'certs');
  const daemonArgs = (port: number): string[] => [
    ...['--localapi', emulator.socket, '--store', `dir:${certDir}`, '--domain', STANDALONE_DOMAIN, '--listen', `127.0.0.1:${port}`],
  ];
  const files = await CertFileWatch.start(certDir, STANDALONE_DOMAIN);
  const first = spawnDaemon('first certificate', daemonArgs(await freePort()));
  await files.next(30_000);
  await first.stop();
  files.close();

  const variants: Record<string, (port: number) => Proc> = {
    snapshot: (port) => spawnImageEntry('snapshot', daemonArgs(port)),
    dist: (port) => spawnDaemon('dist', daemonArgs(port)),
    hello: (port) => startBaseline(hello, port),
  };
  const names = Object.keys(variants);
  const starts: Record<string, Start[]> = Object.fromEntries(names.map((name) => [name, []]));
  // Round 0 is a warm-up (page cache, compile caches), not counted.
  for (let r = 0; r <= rounds; r++) {
    for (const name of names.map((_, i) => names[(r + i) % names.length]!)) {
      const port = await freePort();
      const proc = variants[name]!(port);
      const healthyAt = await pollHealthy(port, 20_000, () => proc.exitInfo === undefined);
      const start: Start = { cpuMs: await threadsCpuMs(proc.pid), wallMs: healthyAt - proc.spawnedAt };
      if (r > rounds - idleRounds) [start.idle] = await idleRss([proc.pid], { idleMs: 3000, spanMs: 1000, everyMs: 500 });
      await proc.stop();
      if (r > 0) starts[name]!.push(start);
    }
  }
  await emulator.proc.stop();

  const paired = (a: string, b: string, figure: (s: Start) => number | undefined, how: 'ratio' | 'diff'): number => {
    const pairs = starts[a]!.map((s, i) => [figure(s), figure(starts[b]![i]!)] as const).filter(([x, y]) => x !== undefined && y !== undefined);
    return median(pairs.map(([x, y]) => (how === 'ratio' ? x! / y! : x! - y!)));
  };
  const summary = {
    rounds,
    idleRounds,
    medians: Object.fromEntries(
      names.map((name) => {
        const s = starts[name]!;
        const idle = s.flatMap((x) => (x.idle ? [x.idle] : []));
        return [
          name,
          {
            cpuMs: round(median(s.map((x) => x.cpuMs))),
            wallMs: round(median(s.map((x) => x.wallMs))),
            idleRss: round(median(idle.map((m) => m.rss))),
            idleAnon: round(median(idle.map((m) => m.anon))),
            idleFile: round(median(idle.map((m) => m.file))),
          },
        ];
      }),
    ),
    pairs: Object.fromEntries(
      [
        ['snapshot', 'dist'],
        ['snapshot', 'hello'],
        ['dist', 'hello'],
      ].map(([a, b]) => [
        `${a}/${b}`,
        {
          cpuRatio: round(
            paired(a!, b!, (s) => s.cpuMs, 'ratio'),
            3,
          ),
          cpuDiffMs: round(paired(a!, b!, (s) => s.cpuMs, 'diff')),
          wallRatio: round(
            paired(a!, b!, (s) => s.wallMs, 'ratio'),
            3,
          ),
          wallDiffMs: round(paired(a!, b!, (s) => s.wallMs, 'diff')),
          idleRssDiffMb: round(paired(a!, b!, (s) => s.idle?.rss, 'diff')),
        },
      ]),
    ),
  };
  process.stdout.write(`${JSON.stringify({ starts, summary })}\n`);
  process.stdout.write(`${JSON.stringify(summary, null, 1)}\n`);
} finally {
  await stopAll();
  await rm(dir, { recursive: true, force: true });
}
