// `node dist/cli/fill-compile-cache.js [UID]`: fills dist/compile-cache for the Node that runs it
// (compile-cache.ts). Node keeps one cache per account (its directory name ends in the uid), so the
// image's final stage, which builds as root, names the account the image runs as (65532): the entries are
// then made by a child running as that account, and handed back to root, readable by all, so that the
// running daemon can read them but not change them. `npm run build` fills for the account building.
import { spawnSync } from 'node:child_process';
import { chown, mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { COMPILE_CACHE_DIR, fillCompileCache, readableByAll } from './compile-cache.ts';

const distRoot = join(import.meta.dirname, '..');
const uid = process.argv[2] === undefined ? undefined : Number(process.argv[2]);
if (uid !== undefined && !(Number.isInteger(uid) && uid >= 0)) throw new Error(`fill-compile-cache: not a uid: ${process.argv[2]}`);

if (uid !== undefined && uid !== process.getuid?.() && process.getuid?.() === 0) {
  const directory = join(distRoot, COMPILE_CACHE_DIR);
  await mkdir(directory, { recursive: true });
  await chown(directory, uid, uid);
  const child = spawnSync(process.execPath, [...process.execArgv, import.meta.filename], { uid, gid: uid, stdio: 'inherit', timeout: 120_000 });
  if (child.status !== 0) throw new Error(`fill-compile-cache as uid ${uid}: exited ${child.status ?? child.signal}`);
  await readableByAll(directory, 0);
} else {
  const chunks = await fillCompileCache(distRoot);
  process.stdout.write(`compile cache filled for Node ${process.version}, uid ${process.getuid?.()}: ${chunks} chunks\n`);
}
// A chunk's top level may leave a handle (a timer of a package's) that would keep this process alive.
process.exit(0);
