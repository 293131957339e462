// `npm run e2e [-- --json]`: the end-to-end tier alone (test/cluster/e2e/example.test.ts, then test/cluster/e2e/proxies.test.ts,
// each on a real single-node cluster of its own; root). With --json the last line of the output is one JSON
// object of their figures, the proxies' under `proxies`, the Tailscale Service advertisement's at the top (the
// group of 10 replicas, which `npm test` leaves out, under `rollout10`).
import { spawn } from 'node:child_process';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseScriptArgs } from '../../../bench/lib/command-line.ts';

const values = parseScriptArgs({
  name: 'e2e',
  invocation: 'npm run e2e --',
  summary: 'Runs the end-to-end tier (test/cluster/e2e/) on a real single-node cluster; needs root.',
  flags: [{ name: 'json', boolean: true, help: 'The last stdout line is one JSON object of its figures.' }],
});
const dir = await mkdtemp(join(tmpdir(), 'certshare-e2e-'));
const figuresFile = join(dir, 'figures.json');
const proxiesFile = join(dir, 'proxies.json');
const advertiseFile = join(dir, 'advertise.json');
// One file at a time: one cluster per machine.
const files = ['./example.test.ts', './proxies.test.ts'].map((f) => new URL(f, import.meta.url).pathname);
const test = spawn(process.execPath, ['--test', '--test-concurrency=1', '--test-timeout=3600000', ...files], {
  stdio: ['ignore', values.json ? 'pipe' : 'inherit', 'inherit'],
  env: {
    ...process.env,
    CERTSHARE_E2E_FIGURES: figuresFile,
    CERTSHARE_E2E_PROXIES_FIGURES: proxiesFile,
    CERTSHARE_E2E_ADVERTISE_FIGURES: advertiseFile,
    CERTSHARE_E2E_LARGE_GROUP: '1',
  },
});
// With --json the test runner's report goes to stderr, so that the figures are the last stdout line.
test.stdout?.pipe(process.stderr);
const code = await new Promise<number>((resolve) => test.on('close', (c) => resolve(c ?? 1)));
const figures = await readFile(figuresFile, 'utf8').catch(() => '{}');
const proxies = await readFile(proxiesFile, 'utf8').catch(() => '{}');
const advertise = await readFile(advertiseFile, 'utf8').catch(() => '{}');
await rm(dir, { recursive: true, force: true });
if (values.json) console.log(JSON.stringify({ passed: code === 0, ...JSON.parse(figures), ...JSON.parse(advertise), proxies: JSON.parse(proxies) }));
process.exit(code);
