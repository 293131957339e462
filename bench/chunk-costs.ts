// `node bench/chunk-costs.ts [--dist DIR] [--repeat N]`: what each capability loaded on demand costs a
// process once the daemon's own code is loaded (issue 42): a fresh Node per sample, on the image's Node
// flags and dist/'s compile cache, imports `run`'s chunk, then the capability's chunk; the table gives the
// medians of RSS (anonymous / file-backed) and of the import's wall time against `run`'s chunk alone.
// The chunks are the bundle's dynamic imports (scripts/build.ts): a configuration that does not turn a
// capability on never loads its chunk. Build dist/ first (`npm run build`).
import { readdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { type CommandLine, numberFlag, parseScriptArgs } from './lib/command-line.ts';
import { IMAGE_NODE_FLAGS } from './lib/certshare.ts';
import { cleanEnv, memStatus, Proc, type MemStatus } from './lib/proc.ts';
import { median, round } from './lib/stats.ts';

const SCRIPT: CommandLine = {
  name: 'chunk-costs',
  invocation: 'node bench/chunk-costs.ts',
  summary: "What loading each capability's chunk costs a process that runs the daemon: RSS and import time, medians.",
  flags: [
    { name: 'dist', placeholder: 'DIR', default: 'dist', help: 'The bundle to measure (npm run build).' },
    { name: 'repeat', placeholder: 'N', default: '5', help: 'Fresh processes per row (medians).' },
  ],
};

/** Each capability and the entry chunks (dist/chunks/NAME-HASH.js) that loading it imports. */
const CAPABILITIES: Array<[string, string[]]> = [
  ['(run alone: the daemon, standalone)', []],
  ['ARI (--acme-directory, on by default)', ['ari-checker', 'renewal-info-client']],
  ['served check and advertisement (--served-check)', ['served-rotation']],
  ['Kubernetes mode (--store kube)', ['kube-backend']],
  ['federation home (--federation-kubeconfig), over Kubernetes mode', ['kube-backend', 'federation-home']],
  ['the injector (certshare injector)', ['injector-command']],
  ['the emulator (certshare emulator)', ['emulator']],
];

const opts = parseScriptArgs(SCRIPT);
const dist = resolve(String(opts.dist ?? 'dist'));
const repeat = numberFlag(SCRIPT, opts, 'repeat', 5, 'a whole number, at least 1', (n) => Number.isInteger(n) && n >= 1);
const chunkFiles = readdirSync(join(dist, 'chunks'));

function chunk(name: string): string {
  const found = chunkFiles.filter((f) => new RegExp(`^${name}-[A-Z0-9]+\\.js$`).test(f));
  if (found.length !== 1) throw new Error(`chunk-costs: ${found.length} chunks named ${name} in ${dist}/chunks (build dist/ first)`);
  return join(dist, 'chunks', found[0]!);
}

/**
 * One fresh Node: the compile cache as dist/cli/main.js turns it on, and Maglev and TurboFan off while it
 * loads, as `run` starts (src/http/heap-saving.ts); `run`'s chunk, then `extra`; RSS once idle.
 */
async function sample(extra: string[]): Promise<{ mem: MemStatus; importMs: number }> {
  const script = `
import { setFlagsFromString } from 'node:v8';
setFlagsFromString('--no-maglev');
setFlagsFromString('--no-turbofan');
import { enableCompileCache } from 'node:module';
enableCompileCache({ directory: ${JSON.stringify(join(dist, 'compile-cache'))}, portable: true });
await import(${JSON.stringify(chunk('run-command'))});
const t0 = performance.now();
for (const file of ${JSON.stringify(extra)}) await import(file);
const importMs = performance.now() - t0;
setFlagsFromString('--maglev');
setFlagsFromString('--turbofan');
setTimeout(() => process.stdout.write(JSON.stringify({ importMs }) + '\\n'), 1500);
setInterval(() => {}, 60000);`;
  const proc = new Proc('chunk import', [...IMAGE_NODE_FLAGS, '--input-type=module', '-e', script], { env: cleanEnv({}), mustRun: true });
  try {
    const line = await proc.waitForLog((e) => typeof e.importMs === 'number', 30_000, 'chunk import');
    return { mem: await memStatus(proc.pid), importMs: line.importMs as number };
  } finally {
    await proc.stop();
  }
}

const rows: Array<{ name: string; rss: number; anon: number; file: number; ms: number }> = [];
for (const [name, chunks] of CAPABILITIES) {
  const samples: Array<{ mem: MemStatus; importMs: number }> = [];
  for (let i = 0; i < repeat; i++) samples.push(await sample(chunks.map(chunk)));
  rows.push({
    name,
    rss: median(samples.map((s) => s.mem.rss)),
    anon: median(samples.map((s) => s.mem.anon)),
    file: median(samples.map((s) => s.mem.file)),
    ms: median(samples.map((s) => s.importMs)),
  });
}
const base = rows[0]!;
console.log(`| capability | RSS (MB) | over run alone: RSS / anon / file-backed (MB) | import (ms, median of ${repeat}) |`);
console.log('|---|---|---|---|');
for (const r of rows) {
  const signed = (mb: number): string => `${mb >= 0 ? '+' : ''}${round(mb)}`;
  const delta = r === base ? '' : `${signed(r.rss - base.rss)} / ${signed(r.anon - base.anon)} / ${signed(r.file - base.file)}`;
  console.log(`| ${r.name} | ${round(r.rss)} | ${delta} | ${round(r.ms)} |`);
}
process.exit(0);
