// The test tiers are the folders of test/ that test/README.md lists as tiers: each names the one real
// dependency its tests may use, so what a tier needs shows in the tree and `npm run test:<tier>` runs
// exactly that. A test file that starts a real dependency outside its tier (a kube-apiserver in
// test/unit, say) fails here, naming the tier it belongs in.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { glob, readFile } from 'node:fs/promises';
import { describe, it } from 'node:test';

const REPO = new URL('../../', import.meta.url).pathname;

/** A real dependency, how a test file starts it, and the tiers allowed to. */
const DEPENDENCIES: Array<{ what: string; marker: RegExp; tiers: string[] }> = [
  {
    what: 'the real kube-apiserver',
    marker: /\b(useControlPlane|startControlPlane|useFederation|startFederation)\(/,
    tiers: ['apiserver', 'tailscaled', 'cluster'],
  },
  { what: 'the real tailscaled', marker: /\b(useRealTailscaled|startRealTailscaled)\(/, tiers: ['tailscaled'] },
  { what: 'the real single-node cluster or its images', marker: /\b(startE2eCluster|buildClusterImages)\(/, tiers: ['cluster'] },
  { what: 'the chaos run', marker: /\brunChaos\(|'main\.ts'/, tiers: ['chaos'] },
  { what: 'the bench', marker: /'--tiny'|bench\/main\.ts/, tiers: ['bench'] },
  { what: 'the image replayed on the host', marker: /\breplayDockerfile\(/, tiers: ['repo'] },
  { what: 'helm or kubectl (built from Go modules)', marker: /\b(helm|renderChart|kustomize)\(/, tiers: ['repo', 'apiserver', 'cluster'] },
  { what: 'nginx or HAProxy', marker: /\b(startNginx|startHaproxy|startProxy)\(/, tiers: ['proxies'] },
];

/** test/unit is pure: no process, socket, emulator or promtool (those are test/integration's). */
const NOT_PURE = /node:child_process|\bcreateServer\(|\.listen\(|\bstartEmulator\(|\bemulatorIn\(|\bstartTlsServer\(|\bpromtool|\bfetch\(/;

const TIERS = ['unit', 'integration', 'apiserver', 'tailscaled', 'cluster', 'chaos', 'bench', 'repo', 'proxies'];

async function testFiles(): Promise<string[]> {
  const files: string[] = [];
  for await (const file of glob('test/**/*.test.ts', { cwd: REPO })) files.push(file);
  return files.sort();
}

const tierOf = (file: string): string => file.split('/')[1]!;

describe('test tiers', () => {
  it('puts every test file in a tier folder', async () => {
    for (const file of await testFiles()) assert.ok(TIERS.includes(tierOf(file)), `${file} is in no tier (test/<tier>/: ${TIERS.join(', ')})`);
  });

  it('lets each real dependency be used only in its tiers', async () => {
    for (const file of await testFiles()) {
      if (file === 'test/repo/tiers.test.ts') continue; // its markers are written here
      const source = await readFile(`${REPO}${file}`, 'utf8');
      for (const { what, marker, tiers } of DEPENDENCIES) {
        if (marker.test(source)) assert.ok(tiers.includes(tierOf(file)), `${file} uses ${what}: it belongs in test/${tiers.join(' or test/')}`);
      }
    }
  });

  it('keeps test/unit pure', async () => {
    for (const file of await testFiles()) {
      if (tierOf(file) !== 'unit') continue;
      const found = NOT_PURE.exec(readFileSync(`${REPO}${file}`, 'utf8'));
      assert.equal(found, null, `${file} uses ${found?.[0]}: a process, socket or server belongs in test/integration`);
    }
  });

  it('has an npm script per tier, and test:fast runs the unit and integration folders', async () => {
    const { scripts } = JSON.parse(await readFile(`${REPO}package.json`, 'utf8')) as { scripts: Record<string, string> };
    for (const tier of TIERS) assert.match(scripts[`test:${tier}`] ?? '', new RegExp(`"test/${tier}/\\*\\*/\\*\\.test\\.ts"`), `test:${tier}`);
    const fast = await readFile(`${REPO}scripts/test-fast.ts`, 'utf8');
    assert.match(fast, /'test\/unit\/\*\*\/\*\.test\.ts', 'test\/integration\/\*\*\/\*\.test\.ts'/);
    assert.doesNotMatch(fast, /readFileSync|RegExp/, 'test:fast picks files by folder, not by their source');
    assert.match(scripts.test!, /"test\/\*\*\/\*\.test\.ts"/, 'npm test runs every tier');
  });

  it('documents every tier in test/README.md', async () => {
    const readme = await readFile(`${REPO}test/README.md`, 'utf8');
    for (const tier of TIERS) assert.match(readme, new RegExp(`npm run test:${tier}\\b`), tier);
  });
});
