import type { V1Secret } from '@kubernetes/client-node/dist/gen/models/V1Secret.js';
import type { Clock } from '../core/clock.ts';
import { CertshareError } from '../core/errors.ts';
import type { Logger } from '../core/logger.ts';
import type { CertStore, Coordination, StoreRead, StoredCert } from '../core/store.ts';
import { apiErrorText, apiStatus, type KubeConnection } from './connection.ts';
import { withSignal } from './https-transport.ts';
import { certSecret, readCertSecret, readCoordination, type SecretMeta } from './secret-codec.ts';
import { SecretWatch } from './secret-watch.ts';

/**
 * One `kubernetes.io/tls` Secret per domain, named after it. Every write is compare-and-swap on the
 * resourceVersion of the last read: a 409 surfaces as CERTSHARE_STORE_CONFLICT and the loop re-reads
 * and decides again. Any failed read is CERTSHARE_STORE_UNAVAILABLE, never "absent". Every call ends
 * when the loop's signal aborts, and within the connection's request timeout otherwise.
 */
export class KubeSecretStore implements CertStore {
  readonly kind = 'kube';
  readonly #conn: KubeConnection;
  readonly #clock: Clock;
  readonly #logger: Logger;
  readonly #meta: SecretMeta;
  /** The last read per domain; null when the Secret was absent. */
  readonly #seen = new Map<string, V1Secret | null>();
  readonly #watches = new Set<SecretWatch>();
  readonly #onError: (operation: 'read' | 'write') => void;

  constructor(options: {
    connection: KubeConnection;
    clock: Clock;
    logger: Logger;
    group?: string | undefined;
    writer?: string | undefined;
    onError?: (operation: 'read' | 'write') => void;
  }) {
    this.#conn = options.connection;
    this.#clock = options.clock;
    this.#logger = options.logger;
    this.#meta = { namespace: options.connection.namespace, group: options.group, writer: options.writer };
    this.#onError = options.onError ?? (() => {});
  }

  async load(domain: string, signal?: AbortSignal): Promise<StoreRead> {
    try {
      const secret = await this.#conn.core.readNamespacedSecret({ name: domain, namespace: this.#conn.namespace }, withSignal(signal));
      this.#seen.set(domain, secret);
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

  save(domain: string, cert: StoredCert, signal?: AbortSignal): Promise<void> {
    // A new certificate ends any intent; a rate limit still in force stays recorded.
    const { retryNotBefore } = this.#lastCoordination(domain);
    return this.#write(domain, { cert, coordination: retryNotBefore !== undefined && retryNotBefore > this.#clock.now() ? { retryNotBefore } : {} }, signal);
  }

  recordIntent(domain: string, holder: string, at: number, signal?: AbortSignal): Promise<void> {
    return this.#write(domain, { coordination: { ...this.#lastCoordination(domain), intent: { holder, at } } }, signal);
  }

  clearIntent(domain: string, signal?: AbortSignal): Promise<void> {
    const { intent: _withdrawn, ...rest } = this.#lastCoordination(domain);
    return this.#write(domain, { coordination: rest }, signal);
  }

  recordRateLimit(domain: string, until: number, signal?: AbortSignal): Promise<void> {
    const { intent: _ended, ...rest } = this.#lastCoordination(domain);
    return this.#write(domain, { coordination: { ...rest, retryNotBefore: until } }, signal);
  }

  watch(domain: string, listener: () => void): () => void {
    const watch = new SecretWatch({ connection: this.#conn, name: domain, clock: this.#clock, logger: this.#logger, onChange: listener });
    this.#watches.add(watch);
    watch.start();
    return () => {
      this.#watches.delete(watch);
      void watch.stop();
    };
  }

  async stop(): Promise<void> {
    await Promise.all([...this.#watches].map((w) => w.stop()));
  }

  #lastCoordination(domain: string): Coordination {
    const seen = this.#seen.get(domain);
    return seen ? readCoordination(seen) : {};
  }

  async #write(domain: string, change: { cert?: StoredCert; coordination: Coordination }, signal: AbortSignal | undefined): Promise<void> {
    const { core, namespace } = this.#conn;
    const seen = this.#seen.get(domain);
    if (seen === undefined) throw new CertshareError('CERTSHARE_STORE_CONFLICT', `Secret ${namespace}/${domain} written before it was read`);
    const body = certSecret(domain, seen ?? undefined, this.#meta, change);
    try {
      const written =
        seen === null
          ? await core.createNamespacedSecret({ namespace, body }, withSignal(signal))
          : await core.replaceNamespacedSecret({ name: domain, namespace, body }, withSignal(signal));
      this.#seen.set(domain, written);
    } catch (err) {
      // Whatever happened, the next write must follow a fresh read.
      this.#seen.delete(domain);
      if (apiStatus(err) === 409 || apiStatus(err) === 404) {
        throw new CertshareError('CERTSHARE_STORE_CONFLICT', `Secret ${namespace}/${domain} changed meanwhile: ${apiErrorText(err)}`, { cause: err });
      }
      this.#onError('write');
      throw new CertshareError('CERTSHARE_STORE_UNAVAILABLE', `cannot write Secret ${namespace}/${domain}: ${apiErrorText(err)}`, { cause: err });
    }
  }
}
