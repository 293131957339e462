// The image's V8 startup snapshot of the standalone daemon (docs/performance.md): where its files sit in dist/,
// and how the blob is built. A blob runs only on the Node that built it (another refuses it at start, exit 14,
// before any of certshare's code), so it is built where it will run: by `npm run build` for the Node building,
// and again by the image's final stage for the Node it ships (dist/cli/build-snapshot.js).
import { spawnSync } from 'node:child_process';
import { rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { CertshareError } from '../core/errors.ts';
import { SNAPSHOT_BLOB, SNAPSHOT_SCRIPT } from '../config/snapshot-files.ts';

const fail = (blob: string, failure: string): CertshareError => new CertshareError('CERTSHARE_SNAPSHOT_UNUSABLE', { blob, failure });

/**
 * Builds dist/'s blob with this Node, then starts it once (`run --help`, handed to dist/cli/main.js) so that a
 * blob this Node cannot start, or a dist/ it cannot hand over to, fails here and never reaches a user.
 * withoutCodeCache: Node's code cache for its built-ins is most of a default blob, and a started process's
 * anonymous memory grows by about its blob's size: that costs more than the compiling it saves.
 */
export async function buildSnapshotBlob(distRoot: string): Promise<string> {
  const blob = join(distRoot, SNAPSHOT_BLOB);
  const config = join(distRoot, 'snapshot/build-config.json');
  await writeFile(config, `${JSON.stringify({ builder: join(distRoot, SNAPSHOT_SCRIPT), withoutCodeCache: true })}\n`);
  try {
    const built = spawnSync(process.execPath, ['--snapshot-blob', blob, '--build-snapshot-config', config], { encoding: 'utf8', timeout: 120_000 });
    const exit = built.status ?? built.signal;
    if (exit !== 0) throw fail(blob, `Node ${process.version} could not build it (exited ${exit}): ${built.stderr.slice(-2000)}`);
  } finally {
    await rm(config, { force: true });
  }
  const started = spawnSync(process.execPath, ['--snapshot-blob', blob, 'run', '--help'], { encoding: 'utf8', timeout: 60_000 });
  if (started.status !== 0 || !started.stdout.startsWith('Usage: certshare run')) {
    await rm(blob, { force: true });
    throw fail(blob, `Node ${process.version} could not start it (run --help exited ${started.status ?? started.signal}): ${started.stderr.slice(-2000)}`);
  }
  return blob;
}
