import type { Clock } from '../core/clock.ts';
import { errorMessage } from '../core/errors.ts';
import type { Logger } from '../core/logger.ts';
import { apiStatus, type KubeConnection } from './connection.ts';
import { watchOnce } from './https-transport.ts';

export interface SecretWatchOptions {
  connection: KubeConnection;
  name: string;
  clock: Clock;
  logger: Logger;
  /** Called after every change of the Secret (and after each relist): the store re-reads it. */
  onChange: () => void;
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
}

/**
 * Follows one Secret by name: list to get a resourceVersion, then watch from it with bookmarks,
 * resuming from the last seen version after a watch ends, relisting on 410 Gone, and restarting with
 * backoff after errors. A single named Secret keeps RBAC to resourceNames and traffic near zero at rest.
 */
export class SecretWatch {
  readonly #o: Required<Omit<SecretWatchOptions, 'initialResourceVersion'>>;
  #resourceVersion: string | undefined;
  #abort = new AbortController();
  #current: AbortController | undefined;
  #done: Promise<void> | undefined;
  /** Consecutive failed watches; any event proves the connection works and resets it. */
  #failures = 0;
  /** Watches started after the first (resumed, relisted or restarted). */
  restarts = 0;
  /** Relists after 410 Gone. */
  relists = 0;

  constructor(options: SecretWatchOptions) {
    const { initialResourceVersion, ...rest } = options;
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
    const { clock, logger } = this.#o;
    while (!this.#abort.signal.aborted) {
      try {
        if (!this.#resourceVersion) await this.#list();
        const outcome = await this.#watchOnce();
        if (outcome === 'gone') {
          this.#resourceVersion = undefined;
          this.relists++;
        }
        this.#failures = 0;
      } catch (err) {
        if (this.#abort.signal.aborted) return;
        this.#failures++;
        const delay = Math.min(this.#o.maxRetryMs, this.#o.firstRetryMs * 2 ** Math.min(this.#failures - 1, 20));
        logger.warn({ secret: this.#o.name, err: errorMessage(err), retryInMs: delay }, 'Secret watch failed');
        // Resuming from the last resourceVersion replays whatever changed meanwhile (or ends in 410 and a relist).
        await clock.sleep(delay * (0.75 + Math.random() / 2), this.#abort.signal).catch(() => {});
      }
      this.restarts++;
    }
  }

  async #list(): Promise<void> {
    const { connection, name } = this.#o;
    const list = await connection.core.listNamespacedSecret({ namespace: connection.namespace, fieldSelector: `metadata.name=${name}` });
    this.#resourceVersion = list.metadata?.resourceVersion;
    this.#o.onChange();
  }

  async #watchOnce(): Promise<'ended' | 'gone'> {
    const { connection, name, watchSeconds } = this.#o;
    const [min, max] = watchSeconds;
    const current = new AbortController();
    this.#current = current;
    if (this.#abort.signal.aborted) current.abort();
    let gone = false;
    try {
      await watchOnce(
        connection.config,
        `/api/v1/namespaces/${encodeURIComponent(connection.namespace)}/secrets`,
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
          this.#failures = 0;
          if (object?.metadata?.resourceVersion) this.#resourceVersion = object.metadata.resourceVersion;
          if (type !== 'BOOKMARK') this.#o.onChange();
        },
        { signal: current.signal, inactivityMs: this.#o.inactivityMs },
      );
    } catch (err) {
      if (apiStatus(err) === 410) return 'gone';
      throw err;
    } finally {
      this.#current = undefined;
    }
    return gone ? 'gone' : 'ended';
  }
}
