// bin/certshare.js picks dist/ or the sources; a dist/ older than the sources never runs silently.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { copyFile, mkdir, utimes, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { useTempDir } from '../support/standalone.ts';

const run = promisify(execFile);
const LAUNCHER = fileURLToPath(new URL('../../bin/certshare.js', import.meta.url));

describe('bin/certshare.js', () => {
  const dir = useTempDir();

  /** A checkout-shaped tree whose entry points print which one ran. */
  async function layout(name: string, parts: { dist?: number; src?: number }): Promise<string> {
    const root = join(dir(), name);
    await mkdir(join(root, 'bin'), { recursive: true });
    await copyFile(LAUNCHER, join(root, 'bin/certshare.js'));
    for (const [kind, file] of [
      ['dist', 'dist/cli/main.js'],
      ['src', 'src/cli/main.ts'],
    ] as const) {
      const mtime = parts[kind];
      if (mtime === undefined) continue;
      await mkdir(join(root, file, '..'), { recursive: true });
      await writeFile(join(root, file), `console.log('${kind}');\n`);
      await utimes(join(root, file), mtime, mtime);
    }
    return root;
  }

  const launch = (root: string) => run(process.execPath, [join(root, 'bin/certshare.js')]);

  it('runs a dist/ at least as new as the sources, quietly', async () => {
    const { stdout, stderr } = await launch(await layout('fresh', { src: 1_000, dist: 2_000 }));
    assert.equal(stdout, 'dist\n');
    assert.equal(stderr, '');
  });

  it('runs the sources over a stale dist/ and says so', async () => {
    const { stdout, stderr } = await launch(await layout('stale', { src: 3_000, dist: 2_000 }));
    assert.equal(stdout, 'src\n');
    assert.match(stderr, /dist\/ is older than src\/.*npm run build/);
  });

  it('runs dist/ where there are no sources (the image), and the sources where there is no dist/', async () => {
    assert.equal((await launch(await layout('image', { dist: 2_000 }))).stdout, 'dist\n');
    assert.equal((await launch(await layout('checkout', { src: 2_000 }))).stdout, 'src\n');
  });
});
