// scripts/check-node.js, the first step of `npm test` and `npm run demo`: when the pinned Node is not
// there it must say what to do, whichever `node` runs it.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { accessSync, constants } from 'node:fs';
import { copyFile, mkdir, readFile, writeFile } from 'node:fs/promises';
import { delimiter, join, resolve } from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { useTempDir } from '../support/standalone.ts';

const REPO = fileURLToPath(new URL('../../', import.meta.url));
const SCRIPT = join(REPO, 'scripts/check-node.js');

/** A copy of the project's package.json and check-node.js in `dir`, with node_modules as `layout` says. */
async function projectCopy(dir: string, layout: 'none' | 'without-node-binary'): Promise<string> {
  await mkdir(join(dir, 'scripts'), { recursive: true });
  await copyFile(join(REPO, 'package.json'), join(dir, 'package.json'));
  await copyFile(SCRIPT, join(dir, 'scripts/check-node.js'));
  // What a skipped preinstall leaves: the package's files, no bin/node.
  if (layout === 'without-node-binary') await mkdir(join(dir, 'node_modules/node'), { recursive: true });
  return join(dir, 'scripts/check-node.js');
}

function run(node: string, script: string, cwd: string): { status: number | null; stderr: string } {
  const res = spawnSync(node, [script], { cwd, encoding: 'utf8', env: { PATH: process.env.PATH ?? '/usr/bin:/bin' }, timeout: 30_000 });
  return { status: res.status, stderr: res.stderr };
}

/** A `node` on PATH outside this project's node_modules/.bin, if it is not the pinned major. */
function otherNode(): string | undefined {
  for (const dir of (process.env.PATH ?? '').split(delimiter)) {
    if (dir === '' || resolve(dir).startsWith(resolve(REPO, 'node_modules'))) continue;
    const candidate = join(dir, 'node');
    try {
      accessSync(candidate, constants.X_OK);
    } catch {
      continue;
    }
    const version = spawnSync(candidate, ['--version'], { encoding: 'utf8' }).stdout.trim();
    return /^v24\./.test(version) ? undefined : candidate;
  }
  return undefined;
}

describe('scripts/check-node.js', () => {
  const dir = useTempDir();

  it('passes silently in this tree, on the pinned Node', () => {
    const res = run(process.execPath, SCRIPT, REPO);
    assert.equal(res.status, 0, res.stderr);
    assert.equal(res.stderr, '');
  });

  it('when the pinned binary is missing (install script skipped), names it and says how to install it', async () => {
    const project = join(dir(), 'no-binary');
    const script = await projectCopy(project, 'without-node-binary');
    const pinned = (JSON.parse(await readFile(join(REPO, 'package.json'), 'utf8')) as { devDependencies: { node: string } }).devDependencies.node;
    const res = run(process.execPath, script, project);
    assert.equal(res.status, 1);
    assert.match(res.stderr, new RegExp(`the pinned Node ${pinned.replaceAll('.', '\\.')} is not installed: node_modules/node/bin/node is missing`));
    assert.match(res.stderr, /"allowScripts": \{ "node": true \}/);
    assert.match(res.stderr, /run: npm rebuild node/);
    assert.match(res.stderr, /rm -rf node_modules && npm ci/);
  });

  it('without node_modules, says to run npm ci', async () => {
    const project = join(dir(), 'fresh');
    const script = await projectCopy(project, 'none');
    const res = run(process.execPath, script, project);
    assert.equal(res.status, 1);
    assert.match(res.stderr, /the dependencies are not installed \(no node_modules\).*\n\s+Run: npm ci/);
  });

  it("speaks on the machine's own older Node too (plain JavaScript, no TypeScript to load)", async (t) => {
    const node = otherNode();
    if (!node) return t.skip('no node other than Node 24 on PATH');
    const project = join(dir(), 'old-node');
    const script = await projectCopy(project, 'without-node-binary');
    const res = run(node, script, project);
    assert.equal(res.status, 1, res.stderr);
    assert.match(res.stderr, /is not installed: node_modules\/node\/bin\/node is missing/);
    // With the binary in place, the same old node is told to go through npm.
    await mkdir(join(project, 'node_modules/node/bin'), { recursive: true });
    await writeFile(join(project, 'node_modules/node/bin/node'), '', { mode: 0o755 });
    const wrong = run(node, script, project);
    assert.equal(wrong.status, 1);
    assert.match(wrong.stderr, /this runs on Node v\d+.*not the pinned Node/);
    assert.match(wrong.stderr, /Run the project through npm/);
  });
});
