import { CertshareError } from '../../src/core/errors.ts';
import type { LedgerEntry, LedgerPart, LedgerSnapshot, LedgerStore } from '../../src/core/issuance/issuance-budget.ts';

/** The ledger a group object holds: shared by every writer process, compare-and-swap on a version. */
export class MemoryLedger implements LedgerStore {
  readonly kind = 'memory';
  entries: LedgerEntry[] = [];
  /** The parts other accounts write, in a ledger shared by a cluster's groups: read, never written. */
  others: LedgerPart[] | undefined;
  version = 0;
  failReads = false;
  reads = 0;
  async read(): Promise<LedgerSnapshot> {
    this.reads++;
    await Promise.resolve(); // a real read yields: lets concurrent writers interleave
    if (this.failReads) throw new CertshareError('CERTSHARE_STORE_UNAVAILABLE', { action: 'read', object: 'the memory ledger', cause: '403 Forbidden' });
    const version = this.version === 0 ? undefined : String(this.version);
    return { entries: structuredClone(this.entries), version, ...(this.others ? { others: structuredClone(this.others) } : {}) };
  }
  async write(entries: LedgerEntry[], previous: LedgerSnapshot): Promise<void> {
    await Promise.resolve();
    if ((previous.version ?? '0') !== String(this.version))
      throw new CertshareError('CERTSHARE_STORE_CONFLICT', { object: 'the memory ledger', detail: 'its version is not the one read' });
    this.entries = structuredClone(entries);
    this.version++;
  }
}
