// `node bench/startup-failures.ts [--bin PATH] [--cap S] [--repeat N]`: how long `certshare run` takes to
// exit on each kind of start-up failure (test/support/startup-failures.ts), the median of N runs each,
// and whether it left its port listening. PATH defaults to this checkout's bin/certshare.js.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { portInUse, runStartupCase, STARTUP_FAILURES } from '../test/support/startup-failures.ts';
import { median } from './lib/stats.ts';

const { values: opts } = parseArgs({
  options: {
    bin: { type: 'string', default: fileURLToPath(new URL('../bin/certshare.js', import.meta.url)) },
    cap: { type: 'string', default: '10' },
    repeat: { type: 'string', default: '3' },
  },
  strict: true,
});
const capMs = Number(opts.cap) * 1000;

console.log(`| start-up failure | exit code | time to exit (median of ${opts.repeat}) | port free after |`);
console.log('|---|---|---|---|');
for (const c of STARTUP_FAILURES) {
  const times: number[] = [];
  let last: Awaited<ReturnType<typeof runStartupCase>> | undefined;
  let portFree = true;
  for (let i = 0; i < Number(opts.repeat); i++) {
    const dir = await mkdtemp(join(tmpdir(), 'certshare-startup-'));
    try {
      // Measure whether the port is free before the kill at the cap: that is what a stuck process holds.
      last = await runStartupCase([process.execPath, opts.bin, 'run'], c, dir, capMs);
      times.push(last.ms);
      if (!last.killed && (await portInUse(last.port))) portFree = false;
      if (last.killed && /certshare started/.test(last.stdout)) portFree = false;
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }
  const exit = last!.killed ? `none (running at ${opts.cap} s)` : String(last!.code);
  const time = last!.killed ? `> ${opts.cap} s` : `${Math.round(median(times))} ms`;
  console.log(`| ${c.name} | ${exit} (want ${c.exitCode}) | ${time} | ${portFree ? 'yes' : 'no (listening)'} |`);
}
