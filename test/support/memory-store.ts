import { CertshareError } from '../../src/core/errors.ts';
import type { CertStore, StoreRead, StoredCert } from '../../src/core/store.ts';

/** An in-memory CertStore whose reads and writes can be made to fail, for core tests. */
export class MemoryStore implements CertStore {
  readonly kind = 'memory';
  content = new Map<string, StoreRead>();
  failReads = false;
  failWrites = false;
  saves = 0;

  async load(domain: string): Promise<StoreRead> {
    if (this.failReads) throw new CertshareError('CERTSHARE_STORE_UNAVAILABLE', 'store down');
    return this.content.get(domain) ?? { state: 'absent' };
  }

  async save(domain: string, cert: StoredCert): Promise<void> {
    if (this.failWrites) throw new CertshareError('CERTSHARE_STORE_UNAVAILABLE', 'store down');
    this.saves++;
    this.content.set(domain, { state: 'valid', cert });
  }

  serial(domain: string): string | undefined {
    const read = this.content.get(domain);
    return read?.state === 'valid' ? read.cert.info.serial : undefined;
  }
}
