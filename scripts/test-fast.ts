// `npm run test:fast`: every test file that needs neither the real kube-apiserver nor the real
// tailscaled nor the chaos run, for the edit-test loop. A file is slow when it starts one of those
// (the markers below), so a new test file lands in the right tier by itself; `npm test` runs all.
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { glob } from 'node:fs/promises';

// The real-cluster tier (startE2eCluster) and its image builds are slow too, and so is the image replayed on
// the host (replayDockerfile: npm ci and the bundle, 8 s alone, 12 to 19 s beside the other files; the
// Dockerfile's static rules, dockerfile-rules.test.ts, stay fast).
// The real proxies (test/proxies: Debian's nginx and HAProxy, downloaded once by its install.sh) too.
// The chart tests run helm and kubectl, built from Go modules (test/chart/helm.ts: helm, renderChart, kustomize).
// The chaos test runs test/chaos/main.ts (which starts a control plane) in a child process; so does the
// tiny bench (bench/main.ts --tiny, every bench phase).
const SLOW_CALLS = [
  'useControlPlane',
  'startControlPlane',
  'useRealTailscaled',
  'startRealTailscaled',
  'runChaos',
  'startE2eCluster',
  'buildClusterImages',
  'replayDockerfile',
  'helm',
  'renderChart',
  'kustomize',
  'startHaproxy',
  'startNginx',
];
const SLOW_MARKERS = new RegExp(`\\b(${SLOW_CALLS.join('|')})\\(|'main\\.ts'|'--tiny'`);

const files: string[] = [];
for await (const file of glob('test/**/*.test.ts')) if (!SLOW_MARKERS.test(readFileSync(file, 'utf8'))) files.push(file);
files.sort();
// Property tests that read CERTSHARE_PROPERTY_RUNS run 50 cases each here (about 7 s less); `npm test`
// keeps their full counts (150, 300 and 100 in issuance-properties, renewal-info-properties, issuance-budget).
const env = { CERTSHARE_PROPERTY_RUNS: '50', ...process.env };
// Four files at once on two CPUs: the slowest ones mostly wait on real seconds (certificates that live
// seconds) with the CPU idle; at two, the run took about 60 s, at four about 46 s.
const result = spawnSync(process.execPath, ['--test', '--test-concurrency=4', ...files, ...process.argv.slice(2)], { stdio: 'inherit', env });
process.exit(result.status ?? 1);
