import type { Clock } from '../core/clock.ts';
import { CertshareError } from '../core/errors.ts';
import type { Logger } from '../core/logger.ts';
import type { CertStore, StoreRead, StoredCert } from '../core/store.ts';
import { apiErrorText, apiStatus, type KubeConnection } from './connection.ts';
import { certSecret, readCertSecret } from './secret-codec.ts';
import { SecretWatch } from './secret-watch.ts';

/**
 * One `kubernetes.io/tls` Secret per domain, named after it. Writes are compare-and-swap on the
 * resourceVersion of the last read: a 409 surfaces as CERTSHARE_STORE_CONFLICT and the loop re-reads
 * and decides again. Any failed read is CERTSHARE_STORE_UNAVAILABLE, never "absent".
 */
export class KubeSecretStore implements CertStore {
  readonly kind = 'kube';
  readonly #conn: KubeConnection;
  readonly #clock: Clock;
  readonly #logger: Logger;
  readonly #group: string | undefined;
  readonly #writer: string | undefined;
  /** resourceVersion of the last read per domain; null when the Secret was absent. */
  readonly #seen = new Map<string, string | null>();
  readonly #watches = new Map<string, SecretWatch>();
  readonly #onError: (operation: 'read' | 'write') => void;

  constructor(options: { connection: KubeConnection; clock: Clock; logger: Logger; group?: string; writer?: string; onError?: (operation: 'read' | 'write') => void }) {
    this.#conn = options.connection;
    this.#clock = options.clock;
    this.#logger = options.logger;
    this.#group = options.group;
    this.#writer = options.writer;
    this.#onError = options.onError ?? (() => {});
  }

  async load(domain: string): Promise<StoreRead> {
    try {
      const secret = await this.#conn.core.readNamespacedSecret({ name: domain, namespace: this.#conn.namespace });
      this.#seen.set(domain, secret.metadata?.resourceVersion ?? null);
      return readCertSecret(secret, domain, this.#clock.now());
    } catch (err) {
      if (apiStatus(err) === 404) {
        this.#seen.set(domain, null);
        return { state: 'absent' };
      }
      this.#onError('read');
      throw new CertshareError('CERTSHARE_STORE_UNAVAILABLE', `cannot read Secret ${this.#conn.namespace}/${domain}: ${apiErrorText(err)}`, { cause: err });
    }
  }

  async save(domain: string, cert: StoredCert): Promise<void> {
    const { core, namespace } = this.#conn;
    const seen = this.#seen.get(domain);
    const meta = { namespace, group: this.#group, writer: this.#writer };
    try {
      if (seen === undefined) throw new CertshareError('CERTSHARE_STORE_CONFLICT', 'write before read');
      const written = seen === null
        ? await core.createNamespacedSecret({ namespace, body: certSecret(domain, cert, meta) })
        : await core.replaceNamespacedSecret({ name: domain, namespace, body: certSecret(domain, cert, { ...meta, resourceVersion: seen }) });
      this.#seen.set(domain, written.metadata?.resourceVersion ?? null);
    } catch (err) {
      if (err instanceof CertshareError) throw err;
      if (apiStatus(err) === 409 || apiStatus(err) === 404) {
        this.#seen.delete(domain);
        throw new CertshareError('CERTSHARE_STORE_CONFLICT', `Secret ${namespace}/${domain} changed meanwhile: ${apiErrorText(err)}`, { cause: err });
      }
      this.#onError('write');
      throw new CertshareError('CERTSHARE_STORE_UNAVAILABLE', `cannot write Secret ${namespace}/${domain}: ${apiErrorText(err)}`, { cause: err });
    }
  }

  watch(domain: string, listener: () => void): () => void {
    const watch = new SecretWatch({ connection: this.#conn, name: domain, clock: this.#clock, logger: this.#logger, onChange: listener });
    this.#watches.set(domain, watch);
    watch.start();
    return () => {
      this.#watches.delete(domain);
      void watch.stop();
    };
  }

  async stop(): Promise<void> {
    await Promise.all([...this.#watches.values()].map((w) => w.stop()));
  }
}
