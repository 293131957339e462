import { randomBytes } from 'node:crypto';
import { constants } from 'node:fs';
import { access, chmod, lstat, mkdir, readFile, readdir, rename, rm, symlink, readlink } from 'node:fs/promises';
import { join } from 'node:path';
import { syncDir, writeFileDurably } from './atomic-file.ts';
import { expiredInfo, validateCertPair } from '../core/certificates/certificate.ts';
import { normalizeDomain } from '../core/certificates/domain.ts';
import { CertshareError, errorMessage } from '../core/errors.ts';
import { type Clock, systemClock } from '../core/ports/clock.ts';
import type { CertPair } from '../core/ports/localapi.ts';
import type { StoreRead } from '../core/ports/store.ts';

const VERSIONS = '.versions';

/**
 * How long a version directory is kept after it stopped being current: a reader that resolved the link just
 * before a swap (nginx between its opening of the certificate and of the key) still finds both files, however
 * many renewals follow. docs/proxies.md has what it covers and what it costs.
 * @forTests
 */
export const SUPERSEDED_GRACE_MS = 60_000;
/** At most this many superseded versions of a domain are kept, the latest first: a flood of renewals cannot fill the disk. @forTests */
export const SUPERSEDED_KEPT_MAX = 32;

/** Where a writer of certificate files says whether the proxy's files are current (HealthState.pending). */
export interface FilesHealth {
  pending(source: string, reason: string | undefined): void;
}

/**
 * Holds health at unhealthy while a domain's files could not be written (`err`), or releases it: the proxy keeps
 * serving the files before, which run out while the daemon holds a newer pair, so the Pod must leave rotation.
 */
export function reportFilesWrite(health: FilesHealth, domain: string, err?: unknown): void {
  const reason = err === undefined ? undefined : `${domain}: could not write its certificate files (${errorMessage(err)}); the proxy keeps those before`;
  health.pending(`files:${domain}`, reason);
}

function samePair(a: CertPair, b: CertPair): boolean {
  return a.certPem === b.certPem && a.keyPem === b.keyPem;
}

function isMissing(err: unknown): boolean {
  return (err as NodeJS.ErrnoException)?.code === 'ENOENT';
}

/** What `link` is: absent, the symlink certshare keeps (and its target), or something else, made by hand. */
async function linkState(link: string): Promise<{ handMade: boolean; previous?: string }> {
  const stat = await lstat(link).catch((err: unknown) => (isMissing(err) ? undefined : Promise.reject(err)));
  if (!stat) return { handMade: false };
  return stat.isSymbolicLink() ? { handMade: false, previous: await readlink(link) } : { handMade: true };
}

/**
 * Makes `path` a directory this process may write in, whatever was done to it since: something else there (a
 * hand-made file, a link to elsewhere) is moved out of the way to `aside` and kept, a directory whose owner's
 * rights were taken away (by the proxy's own user, certshare's uid) gets them back. Otherwise every later write
 * of the domain would fail there, after a restart too (the volume outlives the container).
 */
async function ownDirectory(path: string, aside: string): Promise<void> {
  const stat = await lstat(path).catch((err: unknown) => (isMissing(err) ? undefined : Promise.reject(err)));
  if (stat?.isDirectory()) {
    if ((stat.mode & 0o700) !== 0o700) await chmod(path, 0o700);
    return;
  }
  if (stat) await rename(path, aside);
  await mkdir(path, { recursive: true, mode: 0o700 });
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
  readonly #clock: Clock;
  /** The pair this directory last wrote (or found already there) per domain. */
  readonly #written = new Map<string, CertPair>();
  /**
   * Per domain, when each version directory other than the current one stopped being current, as this
   * process measured it: at the swap away from it, or, for a version a previous process left, when this
   * one first saw it (nothing says when that process swapped away from it: it gets the whole grace).
   */
  readonly #superseded = new Map<string, Map<string, number>>();

  constructor(root: string, clock: Clock = systemClock) {
    this.root = root;
    this.#clock = clock;
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
    const version = `${this.#clock.now()}-${randomBytes(4).toString('hex')}`;
    // Names no domain can take (a leading dot) for what is moved out of the way.
    await ownDirectory(join(this.root, VERSIONS), join(this.root, `.replaced-versions-${version}`));
    const versionsDir = join(this.root, VERSIONS, domain);
    await ownDirectory(versionsDir, join(this.root, VERSIONS, `.replaced-${domain}-${version}`));
    const versionDir = join(versionsDir, version);
    await mkdir(versionDir, { mode: 0o755 });
    try {
      // The two files at once: each is fsynced, so on a busy disk one wait instead of two in a row.
      await Promise.all([
        writeFileDurably(join(versionDir, 'tls.key'), pair.keyPem, 0o600),
        writeFileDurably(join(versionDir, 'tls.crt'), pair.certPem, 0o644),
      ]);
      await syncDir(versionDir);
    } catch (err) {
      // A disk full or read-only midway: the link still names the version before; no half version stays.
      await rm(versionDir, { recursive: true, force: true }).catch(() => {});
      throw err;
    }

    const { handMade, previous } = await current;
    const tmpLink = join(this.root, `.${domain}.${version}.link`);
    try {
      if (handMade) {
        // A hand-made directory: keep it, out of the way, rather than delete someone's files.
        await rename(link, join(versionsDir, `replaced-${version}`));
      }
      await symlink(join(VERSIONS, domain, version), tmpLink);
      await rename(tmpLink, link);
    } catch (err) {
      // No swap (a volume full or read-only at the link): the new version is no reader's, and would stay for good.
      await Promise.all([rm(tmpLink, { force: true }), rm(versionDir, { recursive: true, force: true })]).catch(() => {});
      throw err;
    }
    await syncDir(this.root);
    this.#written.set(domain, pair);
    await this.#prune(domain, versionsDir, version, previous);
    return true;
  }

  /**
   * Removes the superseded versions no reader can still be opening: those superseded longer than the grace
   * ago, and beyond the latest SUPERSEDED_KEPT_MAX. The version the swap just left always stays. The link
   * alone says which version is current: a version kept is never served again unless the link names it.
   * Best effort: a failure leaves versions for the next renewal to remove, and the swap stands.
   */
  async #prune(domain: string, versionsDir: string, current: string, previousTarget: string | undefined): Promise<void> {
    const now = this.#clock.now();
    const previous = previousTarget?.split('/').pop();
    const entries = await readdir(versionsDir).catch(() => undefined);
    if (!entries) return;
    const seen = this.#superseded.get(domain);
    const superseded: Array<[string, number]> = [];
    for (const entry of entries) {
      if (entry !== current && !entry.startsWith('replaced-')) superseded.push([entry, entry === previous ? now : (seen?.get(entry) ?? now)]);
    }
    // The latest superseded first; the one the swap just left before any other superseded at the same time.
    superseded.sort(([a, at], [b, bt]) => bt - at || Number(b === previous) - Number(a === previous));
    const kept = new Map(superseded.filter(([entry, at], i) => entry === previous || (i < SUPERSEDED_KEPT_MAX && now - at < SUPERSEDED_GRACE_MS)));
    this.#superseded.set(domain, kept);
    for (const [entry] of superseded) {
      if (kept.has(entry)) continue;
      await rm(join(versionsDir, entry), { recursive: true, force: true }).catch(() => {});
    }
  }
}
