// Durable and atomic file writes: certshare's stores and delivery, and the advertise agent's status. A module of
// its own, without node:crypto, because the agent's bundle holds it and node:crypto alone would be a good part of
// the agent's memory (measured in docs/performance.md, the advertise agent).
import { open, rename, rm } from 'node:fs/promises';
import { join } from 'node:path';

/** `data` into a new file `path` (never an existing one, nor through a link there), fsynced before it returns. */
export async function writeFileDurably(path: string, data: string, mode: number): Promise<void> {
  const handle = await open(path, 'wx', mode);
  try {
    await handle.writeFile(data);
    await handle.sync();
  } finally {
    await handle.close();
  }
}

/** fsync of a directory: the renames and creations in it survive a crash. */
export async function syncDir(path: string): Promise<void> {
  const handle = await open(path, 'r');
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}

let written = 0;

/**
 * Replaces `dir/name` with `data` so that a crash leaves either the old or the new content, never a part:
 * a temporary file (unique, so concurrent writers do not trip over each other) written and fsynced, renamed
 * over the target, then the directory fsynced so that the rename itself survives a crash. The temporary name
 * need only be unique, not secret: it is created exclusively (writeFileDurably), so a file or link someone put
 * at that name fails the write instead of receiving it.
 */
export async function writeFileAtomically(dir: string, name: string, data: string, mode: number): Promise<void> {
  const unique = `${process.pid.toString(36)}${(++written).toString(36)}${Math.random().toString(36).slice(2, 8)}`;
  const tmp = join(dir, `.${name}.${unique}.tmp`);
  try {
    await writeFileDurably(tmp, data, mode);
    await rename(tmp, join(dir, name));
  } catch (err) {
    await rm(tmp, { force: true });
    throw err;
  }
  await syncDir(dir);
}
