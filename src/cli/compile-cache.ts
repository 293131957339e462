// Node's compile cache for the production bundle: V8's code for every chunk, made when the image is built
// (and by `npm run build`), read by every start. Compiling the bundle's chunks is the largest share of a
// start that certshare's own code decides (docs/performance.md); with the cache a start reads the code
// instead of compiling it. The cache is "portable" (paths relative to it), so one made in a build
// directory serves dist/ wherever it is copied, and it is per Node build and per account (uid): another
// Node, or the image run as another uid, finds no entry for itself and compiles as before. A read-only root filesystem is fine: Node
// reads the entries and gives up writing new ones without a word.
import { chmod, chown, readdir, stat } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { constants, enableCompileCache, flushCompileCache } from 'node:module';
import { pathToFileURL } from 'node:url';
import { optimizingCompilersAfterStart } from '../http/heap-saving.ts';

/** The cache's directory inside dist/. */
export const COMPILE_CACHE_DIR = 'compile-cache';

/**
 * Turns the cache on for the modules loaded from now on, if `distRoot` has one (the bundle); the sources
 * (src/cli/main.ts run by Node's type stripping) have none and start as they always did.
 */
export function useCompileCache(distRoot: string): void {
  const directory = join(distRoot, COMPILE_CACHE_DIR);
  if (existsSync(directory)) enableCompileCache({ directory, portable: true });
}

/**
 * Fills `distRoot`'s cache for the Node running this: imports every chunk (their top levels only define
 * things) and writes the entries, readable by every account (the image runs as 65532, its build as root;
 * the entries are compiled code of files every account can read already).
 */
export async function fillCompileCache(distRoot: string): Promise<number> {
  const directory = join(distRoot, COMPILE_CACHE_DIR);
  const result = enableCompileCache({ directory, portable: true });
  if (result.status !== constants.compileCacheStatus.ENABLED) {
    throw new Error(`Node's compile cache in ${directory}: ${result.message ?? `status ${result.status}`}`);
  }
  // V8 accepts a cached entry only under the flags it was made with: those `run` starts with (every replica's
  // command; the injector's and the emulator's chunks then compile as without a cache).
  optimizingCompilersAfterStart();
  const chunksDir = join(distRoot, 'chunks');
  const chunks = (await readdir(chunksDir)).filter((f) => f.endsWith('.js')).sort();
  for (const chunk of chunks) await import(pathToFileURL(join(chunksDir, chunk)).href);
  flushCompileCache();
  // This account's entries only (Node names their directory <version>-<arch>-<hash>-<uid>): another
  // account's, e.g. root's from the build stage beside the image's, are not ours to change.
  const own = process.getuid?.();
  if ((await stat(directory)).uid === own) await chmod(directory, 0o755);
  for (const entry of await readdir(directory, { withFileTypes: true })) {
    if (entry.isDirectory() && entry.name.endsWith(`-${own}`)) await readableByAll(join(directory, entry.name));
  }
  return chunks.length;
}

/** Files 0644 and directories 0755 under `dir`, and owned by `owner` (uid and gid) if given. */
export async function readableByAll(dir: string, owner?: number): Promise<void> {
  const fix = async (path: string, mode: number): Promise<void> => {
    if (owner !== undefined) await chown(path, owner, owner);
    await chmod(path, mode);
  };
  await fix(dir, 0o755);
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) await readableByAll(path, owner);
    else await fix(path, 0o644);
  }
}
