// npm run chaos -- --minutes N [--clusters C] [--domains-per-group D] [--time-scale K] [--seed S] [--json] [--verbose] [--keep]
// Exit code: 0 when every invariant held, 1 on any violation, 2 when the run itself failed.
import { numberFlag, parseScriptArgs, type CommandLine } from '../../bench/lib/command-line.ts';
import { summary } from './report.ts';
import { runChaos } from './runner.ts';

const SCRIPT: CommandLine = {
  name: 'chaos',
  invocation: 'npm run chaos --',
  summary:
    'Runs three certshare replicas (separate processes, --mode auto, kube store) against a real kube-apiserver behind a ' +
    'fault-injecting proxy, kills them and injects faults for N minutes (quiet periods included, the last 30 s quiet), ' +
    'and checks the invariants throughout, per domain; at the end, a certificate stored in the last moments is given ' +
    "twice the run's quiet-period convergence p99 (at most the grace) before every replica must hold it. " +
    'Exit code: 0 when every invariant held, 1 on any violation, 2 when the run itself failed.',
  flags: [
    { name: 'minutes', placeholder: 'N', default: '2', help: 'How long the chaos runs, 1 to 240 minutes.' },
    {
      name: 'clusters',
      placeholder: 'C',
      default: '1',
      help:
        'Member clusters, 1 to 5. With more than 1: a federation home (one more kube-apiserver, manifests/federation) and C members, ' +
        'each with its own kube-apiserver, proxy and two replicas with the --federation-* flags, each with its own chaos; ' +
        'plus outages of the home and partitions of one member from it. The report adds the break-glass issuances (see docs/federation.md).',
    },
    {
      name: 'domains-per-group',
      placeholder: 'D',
      default: '1',
      help:
        "The group's domains (at most 500): every emulator serves them all, each has its own Secret; adds writer kills mid mass renewal, " +
        'garbage hand edits of one Secret and per-domain rate limits to the chaos.',
    },
    {
      name: 'time-scale',
      placeholder: 'K',
      default: '1',
      help:
        "The run's compressed clock K times slower (1 to 20; 1: 20 s certificates, 2 s lease, 2 s grace): " +
        'lifetimes, lease, retries, grace and chaos intervals times K.',
    },
    {
      name: 'double-partition-every',
      placeholder: 'S',
      default: '90',
      help: "With --clusters: the mean time between double partitions of one member from the home, in seconds on the run's clock (0: none).",
    },
    {
      name: 'double-partition-jitter',
      placeholder: 'F',
      default: '0',
      help: 'With --clusters: each phase of a double partition (cut 16 s, back 8 s, cut 22 s) drawn from its length times 1 - F to 1 (F from 0 to 0.5).',
    },
    {
      name: 'last-member-ca-skew',
      placeholder: 'MS',
      default: '0',
      help: "With --clusters: the last member's CA clock this many ms ahead (negative: behind) of its replicas'.",
    },
    { name: 'seed', placeholder: 'S', help: 'The random seed (default: a random one, printed in the report).' },
    { name: 'json', boolean: true, help: 'The last stdout line is the report as one JSON object.' },
    { name: 'verbose', boolean: true, help: 'The event log on stderr too (always in <run dir>/chaos.log).' },
    { name: 'keep', boolean: true, help: 'Keep the run directory (kept anyway when an invariant was violated).' },
  ],
};

const values = parseScriptArgs(SCRIPT);
const minutes = numberFlag(SCRIPT, values, 'minutes', 2, 'minutes from 1 to 240', (n) => n >= 1 && n <= 240);
const clusters = numberFlag(SCRIPT, values, 'clusters', 1, 'a whole number from 1 to 5', (n) => Number.isInteger(n) && n >= 1 && n <= 5);
const domainsPerGroup = numberFlag(SCRIPT, values, 'domains-per-group', 1, 'a whole number from 1 to 500', (n) => Number.isInteger(n) && n >= 1 && n <= 500);
const timeScale = numberFlag(SCRIPT, values, 'time-scale', 1, 'a factor from 1 to 20', (n) => n >= 1 && n <= 20);
const doubleEvery = numberFlag(SCRIPT, values, 'double-partition-every', 90, 'seconds from 0 to 3600', (n) => n >= 0 && n <= 3600);
const jitter = numberFlag(SCRIPT, values, 'double-partition-jitter', 0, 'a fraction from 0 to 0.5', (n) => n >= 0 && n <= 0.5);
const caSkew = numberFlag(SCRIPT, values, 'last-member-ca-skew', 0, 'milliseconds from -10000 to 10000', (n) => Number.isInteger(n) && Math.abs(n) <= 10_000);
const seed = values.seed !== undefined ? Number(values.seed) >>> 0 : (Math.random() * 2 ** 32) >>> 0;
const [json, verbose, keep] = [values.json === true, values.verbose === true, values.keep === true];

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
  const report = await runChaos({
    minutes,
    clusters,
    seed,
    domainsPerGroup,
    timeScale,
    verbose,
    keep,
    homeTuning: { doublePartitionEveryMs: doubleEvery * 1000, doublePartitionJitter: jitter },
    lastMemberCaSkewMs: caSkew,
  });
  console.log(summary(report));
  if (json) console.log(JSON.stringify(report));
  process.exitCode = report.violations === 0 ? 0 : 1;
} catch (err) {
  console.error(`chaos: the run failed: ${(err as Error).stack ?? String(err)}`);
  process.exitCode = 2;
}
// Stdout is synchronous for files and pipes on Linux: nothing is lost by exiting now, and no stray
// handle (a half-closed socket) can keep a finished run alive.
process.exit();
