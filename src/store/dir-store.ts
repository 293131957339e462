import { mkdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { Clock } from '../core/clock.ts';
import type { CertStore, StoreRead, StoredCert } from '../core/store.ts';
import { safeName, writeFileAtomically, type CertDirectory } from './cert-directory.ts';

/**
 * The standalone store: the certificate directory is both the store and what the proxy reads. A rate
 * limit and when the current pair was obtained are kept in `.state/<domain>.json`, so that a restart
 * neither retries before the CA allows nor measures the renewal window differently (renewal.ts).
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
    const [read, state] = await Promise.all([this.#dir.read(domain, this.#clock.now()), this.#readState(domain)]);
    // When the pair on disk was obtained, trusted only for the serial it was written with (a pair put
    // there by hand starts from its notBefore, which renews earlier, never later).
    if (read.state === 'valid' && state.obtained?.serial === read.cert.info.serial) read.cert.obtainedAt = state.obtained.at;
    return { ...read, coordination: state.retryNotBefore === undefined ? {} : { retryNotBefore: state.retryNotBefore } };
  }

  async save(domain: string, cert: StoredCert): Promise<void> {
    if (cert.obtainedAt !== undefined) {
      // Before the files: a crash in between leaves a record for another serial, which is ignored.
      await this.#writeState(domain, { ...(await this.#readState(domain)), obtained: { serial: cert.info.serial, at: cert.obtainedAt } });
    }
    if (await this.#dir.write(domain, cert.pair)) this.#onWritten(domain, this.#dir.pathOf(domain));
  }

  async recordRateLimit(domain: string, until: number): Promise<void> {
    await this.#writeState(domain, { ...(await this.#readState(domain)), retryNotBefore: until });
  }

  /** `.state/<domain>.json`, durable: a crash right after must not let a restart call CertPair early. */
  async #writeState(domain: string, state: DomainState): Promise<void> {
    const name = `${safeName(domain)}.json`; // before anything is written: a refused name writes nothing
    const dir = join(this.#dir.root, '.state');
    await mkdir(dir, { recursive: true, mode: 0o700 });
    const json: Record<string, unknown> = {};
    if (state.retryNotBefore !== undefined) json.retryNotBefore = new Date(state.retryNotBefore).toISOString();
    if (state.obtained) json.obtained = { serial: state.obtained.serial, at: new Date(state.obtained.at).toISOString() };
    await writeFileAtomically(dir, name, `${JSON.stringify(json)}\n`, 0o600);
  }

  async #readState(domain: string): Promise<DomainState> {
    const path = join(this.#dir.root, '.state', `${safeName(domain)}.json`);
    let raw: { retryNotBefore?: unknown; obtained?: { serial?: unknown; at?: unknown } };
    try {
      raw = JSON.parse(await readFile(path, 'utf8'));
    } catch {
      // Missing or garbled state only loses a remembered rate limit (the CA would refuse again anyway) and
      // when the pair was obtained (the renewal rule then measures from notBefore).
      return {};
    }
    const state: DomainState = {};
    const until = typeof raw?.retryNotBefore === 'string' ? Date.parse(raw.retryNotBefore) : Number.NaN;
    if (Number.isFinite(until)) state.retryNotBefore = until;
    const at = typeof raw?.obtained?.at === 'string' ? Date.parse(raw.obtained.at) : Number.NaN;
    if (typeof raw?.obtained?.serial === 'string' && Number.isFinite(at)) state.obtained = { serial: raw.obtained.serial, at };
    return state;
  }
}

/** What `.state/<domain>.json` remembers across restarts. */
interface DomainState {
  retryNotBefore?: number;
  obtained?: { serial: string; at: number };
}
