import { randomBytes } from 'node:crypto';
import { constants } from 'node:fs';
import { access, lstat, mkdir, open, readFile, readdir, rename, rm, symlink, readlink } from 'node:fs/promises';
import { join } from 'node:path';
import { expiredInfo, validateCertPair } from '../core/certificates/certificate.ts';
import { normalizeDomain } from '../core/certificates/domain.ts';
import { CertshareError, errorMessage } from '../core/errors.ts';
import type { CertPair } from '../core/ports/localapi.ts';
import type { StoreRead } from '../core/ports/store.ts';

const VERSIONS = '.versions';

function samePair(a: CertPair, b: CertPair): boolean {
  return a.certPem === b.certPem && a.keyPem === b.keyPem;
}

function isMissing(err: unknown): boolean {
  return (err as NodeJS.ErrnoException)?.code === 'ENOENT';
}

async function writeFileDurably(path: string, data: string, mode: number): Promise<void> {
  const handle = await open(path, 'wx', mode);
  try {
    await handle.writeFile(data);
    await handle.sync();
  } finally {
    await handle.close();
  }
}

async function syncDir(path: string): Promise<void> {
  const handle = await open(path, 'r');
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}

/**
 * Replaces `dir/name` with `data` so that a crash leaves either the old or the new content, never a part:
 * a temporary file (unique, so concurrent writers do not trip over each other) written and fsynced, renamed
 * over the target, then the directory fsynced so that the rename itself survives a crash.
 */
export async function writeFileAtomically(dir: string, name: string, data: string, mode: number): Promise<void> {
  const tmp = join(dir, `.${name}.${randomBytes(4).toString('hex')}.tmp`);
  try {
    await writeFileDurably(tmp, data, mode);
    await rename(tmp, join(dir, name));
  } catch (err) {
    await rm(tmp, { force: true });
    throw err;
  }
  await syncDir(dir);
}

/** What `link` is: absent, the symlink certshare keeps (and its target), or something else, made by hand. */
async function linkState(link: string): Promise<{ handMade: boolean; previous?: string }> {
  const stat = await lstat(link).catch((err: unknown) => (isMissing(err) ? undefined : Promise.reject(err)));
  if (!stat) return { handMade: false };
  return stat.isSymbolicLink() ? { handMade: false, previous: await readlink(link) } : { handMade: true };
}

/** The domain itself if it is a canonical domain name (see normalizeDomain); anything else never becomes a path. */
export function safeName(domain: string): string {
  let canonical: string | undefined;
  try {
    canonical = normalizeDomain(domain);
  } catch {
    // Reported below with the path-specific message.
  }
  if (canonical !== domain) throw new CertshareError('CERTSHARE_BAD_DOMAIN', { name: domain, rule: 'not in its canonical form, so unsafe as a file name' });
  return domain;
}

/**
 * Certificates on disk as `<root>/<domain>/tls.crt` (0644) and `tls.key` (0600). `<root>/<domain>` is a symlink
 * to a versioned directory, swapped with one rename (the kubelet's AtomicWriter technique), so a reader
 * never sees a half-written file or a key from one version next to a certificate from another.
 */
export class CertDirectory {
  readonly root: string;
  /** The pair this directory last wrote (or found already there) per domain. */
  readonly #written = new Map<string, CertPair>();

  constructor(root: string) {
    this.root = root;
  }

  pathOf(domain: string): string {
    return join(this.root, safeName(domain));
  }

  /** Creates the root if needed and checks it is a writable directory: a start-up check (CERTSHARE_STORE_UNAVAILABLE). */
  async prepare(): Promise<void> {
    try {
      await mkdir(this.root, { recursive: true, mode: 0o755 });
      await access(this.root, constants.W_OK | constants.X_OK);
    } catch (err) {
      throw new CertshareError(
        'CERTSHARE_STORE_UNAVAILABLE',
        { action: 'use', object: `the certificate directory ${this.root}`, cause: errorMessage(err) },
        { cause: err },
      );
    }
  }

  async read(domain: string, now: number): Promise<StoreRead> {
    let certPem: string;
    let keyPem: string;
    const path = this.pathOf(domain);
    try {
      [certPem, keyPem] = await Promise.all([readFile(join(path, 'tls.crt'), 'utf8'), readFile(join(path, 'tls.key'), 'utf8')]);
    } catch (err) {
      if (isMissing(err)) return { state: 'absent' };
      throw new CertshareError('CERTSHARE_STORE_UNAVAILABLE', { action: 'read', object: path, cause: errorMessage(err) }, { cause: err });
    }
    const pair = { certPem, keyPem };
    try {
      return { state: 'valid', cert: { pair, info: validateCertPair(pair, domain, now) } };
    } catch (err) {
      const expired = expiredInfo(pair, domain, now);
      return { state: 'unusable', reason: errorMessage(err), ...(expired ? { expired: { pair, info: expired } } : {}) };
    }
  }

  /**
   * Writes the pair unless the files already hold it; returns whether anything changed. The files are read
   * to compare only when they may already hold it: the first write of a domain since the start (a restart
   * must not rewrite, and make the proxy reload, what is already there) and the pair this directory last
   * wrote (a hand edit since is repaired). A renewal, a pair not written yet, goes straight to the write:
   * on a loaded node those reads queued behind everything else on the renewal's path.
   */
  async write(domain: string, pair: CertPair): Promise<boolean> {
    const link = this.pathOf(domain);
    const last = this.#written.get(domain);
    if (last === undefined || samePair(last, pair)) {
      try {
        const [certPem, keyPem] = await Promise.all([readFile(join(link, 'tls.crt'), 'utf8'), readFile(join(link, 'tls.key'), 'utf8')]);
        if (samePair({ certPem, keyPem }, pair)) {
          this.#written.set(domain, pair);
          return false;
        }
      } catch {
        // Missing or unreadable: write.
      }
    }
    // What the link is now, read while the files are written: it is not needed before the swap.
    const current = linkState(link);
    current.catch(() => {}); // awaited below; a failed write before then must not leave it unhandled
    const versionsDir = join(this.root, VERSIONS, domain);
    await mkdir(versionsDir, { recursive: true, mode: 0o700 });
    const version = `${Date.now()}-${randomBytes(4).toString('hex')}`;
    const versionDir = join(versionsDir, version);
    await mkdir(versionDir, { mode: 0o755 });
    // The two files at once: each is fsynced, so on a busy disk one wait instead of two in a row.
    await Promise.all([writeFileDurably(join(versionDir, 'tls.key'), pair.keyPem, 0o600), writeFileDurably(join(versionDir, 'tls.crt'), pair.certPem, 0o644)]);
    await syncDir(versionDir);

    const { handMade, previous } = await current;
    if (handMade) {
      // A hand-made directory: keep it, out of the way, rather than delete someone's files.
      await rename(link, join(versionsDir, `replaced-${version}`));
    }
    const tmpLink = join(this.root, `.${domain}.${version}.link`);
    await symlink(join(VERSIONS, domain, version), tmpLink);
    await rename(tmpLink, link);
    await syncDir(this.root);
    this.#written.set(domain, pair);
    await this.#prune(versionsDir, version, previous);
    return true;
  }

  /** Keeps the current and the previous version (a reader may still be opening it), removes the rest. */
  async #prune(versionsDir: string, current: string, previousTarget: string | undefined): Promise<void> {
    const keep = new Set([current, previousTarget?.split('/').pop()]);
    for (const entry of await readdir(versionsDir)) {
      if (!keep.has(entry) && !entry.startsWith('replaced-')) await rm(join(versionsDir, entry), { recursive: true, force: true });
    }
  }
}
