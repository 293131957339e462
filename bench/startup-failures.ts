// `node bench/startup-failures.ts [--bin PATH] [--cap S] [--repeat N]`: how long `certshare run` takes to
// exit on each kind of start-up failure (test/support/startup-failures.ts), the median of N runs each,
// and whether it left its port listening. PATH defaults to this checkout's bin/certshare.js.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { portInUse, runStartupCase, STARTUP_FAILURES } from '../test/support/startup-failures.ts';
import { type CommandLine, numberFlag, parseScriptArgs } from './lib/command-line.ts';
import { median } from './lib/stats.ts';

const SCRIPT: CommandLine = {
  name: 'startup-failures',
  invocation: 'node bench/startup-failures.ts',
  summary: 'How long `certshare run` takes to exit on each kind of start-up failure, and whether it left its port listening.',
  flags: [
    { name: 'bin', placeholder: 'PATH', default: fileURLToPath(new URL('../bin/certshare.js', import.meta.url)), help: 'The certshare to run.' },
    { name: 'cap', placeholder: 'S', default: '10', help: 'Seconds after which a process still running is killed (and counted as stuck).' },
    { name: 'repeat', placeholder: 'N', default: '3', help: 'Runs per failure (the median is reported).' },
  ],
};
const opts = parseScriptArgs(SCRIPT);
const capS = numberFlag(SCRIPT, opts, 'cap', 10, 'seconds, more than 0', (n) => n > 0);
const repeat = numberFlag(SCRIPT, opts, 'repeat', 3, 'a whole number, at least 1', (n) => Number.isInteger(n) && n >= 1);
const capMs = capS * 1000;

console.log(`| start-up failure | exit code | time to exit (median of ${repeat}) | port free after |`);
console.log('|---|---|---|---|');
for (const c of STARTUP_FAILURES) {
  const times: number[] = [];
  let last: Awaited<ReturnType<typeof runStartupCase>> | undefined;
  let portFree = true;
  for (let i = 0; i < repeat; i++) {
    const dir = await mkdtemp(join(tmpdir(), 'certshare-startup-'));
    try {
      // Measure whether the port is free before the kill at the cap: that is what a stuck process holds.
      last = await runStartupCase([process.execPath, String(opts.bin), 'run'], c, dir, capMs);
      times.push(last.ms);
      if (!last.killed && (await portInUse(last.port))) portFree = false;
      if (last.killed && /certshare started/.test(last.stdout)) portFree = false;
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }
  const exit = last!.killed ? `none (running at ${capS} s)` : String(last!.code);
  const time = last!.killed ? `> ${capS} s` : `${Math.round(median(times))} ms`;
  console.log(`| ${c.name} | ${exit} (want ${c.exitCode}) | ${time} | ${portFree ? 'yes' : 'no (listening)'} |`);
}
