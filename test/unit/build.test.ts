// The production bundle (scripts/build.ts) imports node:http through its CommonJS exports: the ES facade of
// node:http would load Node's bundled undici (WebSocket, fetch's engine), ~2.4 MB of RSS and tens of ms of
// start-up in every process for a client nothing uses (issue 19).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { buildDist } from '../../scripts/build.ts';

describe('the production bundle and node:http', () => {
  let dir: string;
  let chunks: string[];
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'certshare-build-'));
    await buildDist(join(dir, 'dist'));
    chunks = (await readdir(join(dir, 'dist/chunks'))).map((f) => join(dir, 'dist/chunks', f));
  });
  after(() => rm(dir, { recursive: true, force: true }));

  it('has no ES import of node:http in any chunk (ours or a package’s)', async () => {
    for (const file of [join(dir, 'dist/cli/main.js'), ...chunks]) {
      assert.doesNotMatch(await readFile(file, 'utf8'), /\bfrom\s*["'](node:)?http["']/, file);
    }
  });

  it('loads every chunk (kube backend and injector included) without Node’s bundled undici', () => {
    const script = `for (const f of ${JSON.stringify(chunks)}) await import(f);
process.stdout.write(String(process.moduleLoadList.includes('NativeModule internal/deps/undici/undici')));
process.exit(0);`;
    const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 60_000 });
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.stdout, 'false');
  });
});
