import type { Clock } from '../core/clock.ts';
import type { CertStore, StoreRead, StoredCert } from '../core/store.ts';
import type { CertDirectory } from './cert-directory.ts';

/** The standalone store: the certificate directory is both the store and what the proxy reads. */
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

  load(domain: string): Promise<StoreRead> {
    return this.#dir.read(domain, this.#clock.now());
  }

  async save(domain: string, cert: StoredCert): Promise<void> {
    if (await this.#dir.write(domain, cert.pair)) this.#onWritten(domain, this.#dir.pathOf(domain));
  }
}
