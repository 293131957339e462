import { mkdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { Clock } from '../core/clock.ts';
import type { CertStore, Coordination, StoreRead, StoredCert } from '../core/store.ts';
import { safeName, writeFileAtomically, type CertDirectory } from './cert-directory.ts';

/**
 * The standalone store: the certificate directory is both the store and what the proxy reads. A rate
 * limit is kept in `.state/<domain>.json` so that a restart does not retry before the CA allows.
 */
export class DirStore implements CertStore {
  readonly kind = 'dir';
  readonly #dir: CertDirectory;
  readonly #clock: Clock;
  readonly #onWritten: (domain: string, path: string) => void;

  constructor(dir: CertDirectory, clock: Clock, onWritten: (domain: string, path: string) => void) {
    this.#dir = dir;
    this.#clock = clock;
    this.#onWritten = onWritten;
  }

  async load(domain: string): Promise<StoreRead> {
    const [read, coordination] = await Promise.all([this.#dir.read(domain, this.#clock.now()), this.#readState(domain)]);
    return { ...read, coordination };
  }

  async save(domain: string, cert: StoredCert): Promise<void> {
    if (await this.#dir.write(domain, cert.pair)) this.#onWritten(domain, this.#dir.pathOf(domain));
  }

  async recordRateLimit(domain: string, until: number): Promise<void> {
    const name = `${safeName(domain)}.json`;
    const dir = join(this.#dir.root, '.state');
    await mkdir(dir, { recursive: true, mode: 0o700 });
    // Durable: a crash right after must not let a restart call CertPair before the CA allows.
    await writeFileAtomically(dir, name, `${JSON.stringify({ retryNotBefore: new Date(until).toISOString() })}\n`, 0o600);
  }

  async #readState(domain: string): Promise<Coordination> {
    try {
      const state = JSON.parse(await readFile(join(this.#dir.root, '.state', `${safeName(domain)}.json`), 'utf8')) as { retryNotBefore?: string };
      const until = state.retryNotBefore ? Date.parse(state.retryNotBefore) : NaN;
      return Number.isFinite(until) ? { retryNotBefore: until } : {};
    } catch {
      // Missing or garbled state only loses a remembered rate limit; the CA would refuse again anyway.
      return {};
    }
  }
}
