import { doubling, jitter } from '../core/backoff.ts';
import type { Clock } from '../core/clock.ts';
import { errorMessage } from '../core/errors.ts';
import type { Logger } from '../core/logger.ts';
import { apiStatus, type KubeConnection } from './connection.ts';
import { watchOnce, withSignal } from './https-transport.ts';

export interface SecretWatchOptions {
  connection: KubeConnection;
  name: string;
  clock: Clock;
  logger: Logger;
  /** Called after every change of the Secret (and after each relist): the store re-reads it. */
  onChange: () => void;
  /** Backoff between watches that failed or ended without an event: doubling, jittered, up to maxRetryMs. */
  firstRetryMs?: number;
  maxRetryMs?: number;
  /** Server-side watch lifetime range in seconds; each watch picks one at random (spreads reconnects). */
  watchSeconds?: [number, number];
  /**
   * No byte for this long means a dead connection. Bookmarks are not guaranteed on a quiet cluster (the
   * bench saw none in 90 s), so this is long: at most 4 reconnects an hour at rest. A reader whose
   * certificate is due re-reads on its own anyway.
   */
  inactivityMs?: number;
  /** Resume from this version instead of listing first (tests use a stale one to provoke 410 Gone). */
  initialResourceVersion?: string;
  /**
   * Another kind of object than a Secret of the connection's namespace (the injector's caBundle targets):
   * its collection path and how to list it by field selector. Default: the namespace's Secrets.
   */
  collection?: ObjectCollection;
}

export interface ObjectCollection {
  path: string;
  list(fieldSelector: string, signal: AbortSignal): Promise<{ metadata?: { resourceVersion?: string } }>;
}

/**
 * Follows one Secret by name: list to get a resourceVersion, then watch from it with bookmarks,
 * resuming from the last seen version after a watch ends, relisting on 410 Gone, and restarting with
 * backoff after errors. A single named Secret keeps RBAC to resourceNames and traffic near zero at rest.
 *
 * A watch that ends before delivering any event (an ERROR answer, a proxy closing streams at once) is a
 * failure like an error: reopening it at once would hammer the API server in a tight loop. Only a watch
 * that delivered an event, or stayed open longer than the backoff cap (the server's own timeout on a
 * cluster too quiet for bookmarks), proves the path works and resets the backoff.
 */
export class SecretWatch {
  readonly #o: Required<Omit<SecretWatchOptions, 'initialResourceVersion' | 'collection'>>;
  readonly #collection: ObjectCollection;
  #resourceVersion: string | undefined;
  #abort = new AbortController();
  #current: AbortController | undefined;
  #done: Promise<void> | undefined;
  /** Consecutive failed or eventless watches; any event proves the connection works and resets it. */
  #failures = 0;
  /** Watches started after the first (resumed, relisted or restarted). */
  restarts = 0;
  /** Relists after 410 Gone. */
  relists = 0;

  constructor(options: SecretWatchOptions) {
    const { initialResourceVersion, collection, ...rest } = options;
    const { connection } = options;
    this.#collection = collection ?? {
      path: `/api/v1/namespaces/${encodeURIComponent(connection.namespace)}/secrets`,
      list: (fieldSelector, signal) => connection.core.listNamespacedSecret({ namespace: connection.namespace, fieldSelector }, withSignal(signal)),
    };
    this.#o = { firstRetryMs: 500, maxRetryMs: 5000, watchSeconds: [1800, 3600], inactivityMs: 900_000, ...rest };
    this.#resourceVersion = initialResourceVersion;
  }

  start(): void {
    this.#done ??= this.#run();
  }

  async stop(): Promise<void> {
    this.#abort.abort();
    this.#current?.abort();
    await this.#done;
  }

  async #run(): Promise<void> {
    const { clock, logger, firstRetryMs, maxRetryMs, name } = this.#o;
    while (!this.#abort.signal.aborted) {
      let failure: string | undefined;
      try {
        if (!this.#resourceVersion) await this.#list();
        const startedAt = clock.now();
        const outcome = await this.#watchOnce();
        if (outcome.gone) {
          this.#resourceVersion = undefined;
          this.relists++;
        }
        if (outcome.events === 0 && clock.now() - startedAt < maxRetryMs && !this.#abort.signal.aborted) {
          this.#failures++;
          failure = outcome.gone ? 'ended with 410 Gone before any event' : 'ended before any event';
        }
      } catch (err) {
        if (this.#abort.signal.aborted) return;
        this.#failures++;
        failure = errorMessage(err);
      }
      if (failure !== undefined) {
        const delay = jitter(doubling(firstRetryMs, this.#failures, maxRetryMs));
        logger.warn({ secret: name, err: failure, failures: this.#failures, retryInMs: Math.round(delay) }, 'Secret watch failed');
        // Resuming from the last resourceVersion replays whatever changed meanwhile (or ends in 410 and a relist).
        await clock.sleep(delay, this.#abort.signal).catch(() => {});
      }
      this.restarts++;
    }
  }

  async #list(): Promise<void> {
    const list = await this.#collection.list(`metadata.name=${this.#o.name}`, this.#abort.signal);
    this.#resourceVersion = list.metadata?.resourceVersion;
    this.#o.onChange();
  }

  /** One watch until it ends: whether it ended in 410 Gone, and how many events (bookmarks too) it delivered. */
  async #watchOnce(): Promise<{ gone: boolean; events: number }> {
    const { connection, name, watchSeconds } = this.#o;
    const [min, max] = watchSeconds;
    const current = new AbortController();
    this.#current = current;
    if (this.#abort.signal.aborted) current.abort();
    let gone = false;
    let events = 0;
    try {
      await watchOnce(
        connection.config,
        this.#collection.path,
        {
          fieldSelector: `metadata.name=${name}`,
          allowWatchBookmarks: true,
          resourceVersion: this.#resourceVersion,
          timeoutSeconds: Math.round(min + Math.random() * (max - min)),
        },
        ({ type, object }) => {
          if (type === 'ERROR') {
            // The server ends the stream after an ERROR; 410 Gone means our version is too old: relist.
            if (object?.code === 410) gone = true;
            return;
          }
          events++;
          this.#failures = 0;
          if (object?.metadata?.resourceVersion) this.#resourceVersion = object.metadata.resourceVersion;
          if (type !== 'BOOKMARK') this.#o.onChange();
        },
        { signal: current.signal, inactivityMs: this.#o.inactivityMs, headersTimeoutMs: connection.requestTimeoutMs },
      );
    } catch (err) {
      if (apiStatus(err) === 410) return { gone: true, events };
      throw err;
    } finally {
      this.#current = undefined;
    }
    return { gone, events };
  }
}
