import { CertshareError } from '../../src/core/errors.ts';
import type { CertStore, Coordination, SaveOptions, StoreRead, StoredCert } from '../../src/core/ports/store.ts';

/** An in-memory CertStore whose reads and writes can be made to fail, for core tests. */
const storeDown = (how: true | 'refused'): CertshareError =>
  how === 'refused'
    ? new CertshareError('CERTSHARE_STORE_UNAVAILABLE', { action: 'use', object: 'the memory store', cause: '403 Forbidden' }, { refused: true })
    : new CertshareError('CERTSHARE_STORE_UNAVAILABLE', { action: 'use', object: 'the memory store', cause: 'down' });

export class MemoryStore implements CertStore {
  readonly kind = 'memory';
  content = new Map<string, StoreRead>();
  /** Reads (writes) fail as an outage would, or as a 403 would ('refused': CertshareError.refused). */
  failReads: boolean | 'refused' = false;
  failWrites: boolean | 'refused' = false;
  failIntents = false;
  saves = 0;
  coordination = new Map<string, Coordination>();
  intents: Array<{ domain: string; holder: string }> = [];
  readonly #listeners = new Set<{ domain: string; listener: () => void }>();

  /** Pairs stored for later (CertStore.savePending), beside the served one. */
  pending = new Map<string, StoredCert>();

  async load(domain: string): Promise<StoreRead> {
    if (this.failReads) throw storeDown(this.failReads);
    const pending = this.pending.get(domain);
    return { ...(this.content.get(domain) ?? { state: 'absent' }), coordination: { ...this.coordination.get(domain) }, ...(pending ? { pending } : {}) };
  }

  /** The serials each save named as replaced because the CA asked for it now (SaveOptions.replacedNow). */
  replacedNow: string[] = [];

  async save(domain: string, cert: StoredCert, _signal?: AbortSignal, options?: SaveOptions): Promise<void> {
    if (this.failWrites) throw storeDown(this.failWrites);
    this.saves++;
    if (options?.replacedNow) this.replacedNow.push(options.replacedNow);
    this.content.set(domain, { state: 'valid', cert });
    // As the Secret's codec: a pending pair that ends no later than the one saved goes.
    if ((this.pending.get(domain)?.info.notAfter ?? Infinity) <= cert.info.notAfter) this.pending.delete(domain);
    const { retryNotBefore } = this.coordination.get(domain) ?? {};
    this.coordination.set(domain, retryNotBefore === undefined ? {} : { retryNotBefore });
  }

  async savePending(domain: string, cert: StoredCert): Promise<void> {
    if (this.failWrites) throw storeDown(this.failWrites);
    this.pending.set(domain, cert);
  }

  async recordIntent(domain: string, holder: string, at: number): Promise<void> {
    if (this.failIntents) throw new CertshareError('CERTSHARE_STORE_UNAVAILABLE', { action: 'use', object: 'the memory store', cause: 'down' });
    this.intents.push({ domain, holder });
    this.coordination.set(domain, { ...this.coordination.get(domain), intent: { holder, at } });
  }

  async clearIntent(domain: string): Promise<void> {
    const { intent: _withdrawn, ...rest } = this.coordination.get(domain) ?? {};
    this.coordination.set(domain, rest);
  }

  async recordRateLimit(domain: string, until: number): Promise<void> {
    this.coordination.set(domain, { ...this.coordination.get(domain), retryNotBefore: until });
  }

  watch(domain: string, listener: () => void): () => void {
    const entry = { domain, listener };
    this.#listeners.add(entry);
    return () => this.#listeners.delete(entry);
  }

  /** Tells the watchers of `domain` that its record changed (as a Secret's watch event would). */
  changed(domain: string): void {
    for (const entry of this.#listeners) if (entry.domain === domain) entry.listener();
  }

  /** How many watches of `domain` are open. */
  watchers(domain: string): number {
    return [...this.#listeners].filter((entry) => entry.domain === domain).length;
  }

  serial(domain: string): string | undefined {
    const read = this.content.get(domain);
    return read?.state === 'valid' ? read.cert.info.serial : undefined;
  }
}
