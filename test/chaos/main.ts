// npm run chaos -- --minutes N [--domains-per-group D] [--time-scale K] [--seed S] [--json] [--verbose] [--keep]
// Exit code: 0 when every invariant held, 1 on any violation, 2 when the run itself failed.
import { parseArgs } from 'node:util';
import { summary } from './report.ts';
import { runChaos } from './runner.ts';

const { values } = parseArgs({
  args: process.argv.slice(2),
  options: {
    minutes: { type: 'string', default: '2' },
    'domains-per-group': { type: 'string', default: '1' },
    'time-scale': { type: 'string', default: '1' },
    seed: { type: 'string' },
    json: { type: 'boolean', default: false },
    verbose: { type: 'boolean', default: false },
    keep: { type: 'boolean', default: false },
    help: { type: 'boolean', short: 'h', default: false },
  },
});

if (values.help) {
  console.log(`Usage: npm run chaos -- [--minutes N] [--domains-per-group D] [--time-scale K] [--seed S] [--json] [--verbose] [--keep]

Runs three certshare replicas (separate processes, --mode auto, kube store) against a real
kube-apiserver behind a fault-injecting proxy, kills them and injects faults for N minutes
(quiet periods included, the last 30 s quiet), and checks the invariants throughout, per domain.
  --domains-per-group D  the group's domains (default 1, at most 500): every emulator serves them all,
             each has its own Secret; adds writer kills mid mass renewal, garbage hand edits of one
             Secret and per-domain rate limits to the chaos
  --time-scale K  the run's compressed clock K times slower (default 1: 20 s certificates, 2 s
             lease, 2 s grace): lifetimes, lease, retries, grace and chaos intervals times K
  --json     the last stdout line is the report as one JSON object
  --verbose  the event log on stderr too (always in <run dir>/chaos.log)
  --keep     keep the run directory (kept anyway when an invariant was violated)`);
  process.exit(0);
}

const minutes = Number(values.minutes);
if (!(minutes >= 1 && minutes <= 240)) {
  console.error('--minutes must be between 1 and 240');
  process.exit(2);
}
const domainsPerGroup = Number(values['domains-per-group']);
if (!(Number.isInteger(domainsPerGroup) && domainsPerGroup >= 1 && domainsPerGroup <= 500)) {
  console.error('--domains-per-group must be a whole number between 1 and 500');
  process.exit(2);
}
const timeScale = Number(values['time-scale']);
if (!(timeScale >= 1 && timeScale <= 20)) {
  console.error('--time-scale must be between 1 and 20');
  process.exit(2);
}
const seed = values.seed !== undefined ? Number(values.seed) >>> 0 : (Math.random() * 2 ** 32) >>> 0;

// Everything below is bounded; this is the last resort if something hangs anyway.
const failSafe = setTimeout(
  () => {
    console.error(`chaos: still running ${minutes} min + 10 min after the start; giving up`);
    process.exit(2);
  },
  (minutes + 10) * 60_000,
);
failSafe.unref();

try {
  const report = await runChaos({ minutes, seed, domainsPerGroup, timeScale, verbose: values.verbose, keep: values.keep });
  console.log(summary(report));
  if (values.json) console.log(JSON.stringify(report));
  process.exitCode = report.violations === 0 ? 0 : 1;
} catch (err) {
  console.error(`chaos: the run failed: ${(err as Error).stack ?? String(err)}`);
  process.exitCode = 2;
}
// Stdout is synchronous for files and pipes on Linux: nothing is lost by exiting now, and no stray
// handle (a half-closed socket) can keep a finished run alive.
process.exit();
