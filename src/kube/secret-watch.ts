import { doubling, jitter } from '../core/issuance/backoff.ts';
import type { Clock } from '../core/ports/clock.ts';
import { errorMessage } from '../core/errors.ts';
import type { Logger } from '../core/ports/logger.ts';
import { apiStatus, type KubeConnection } from './connection.ts';
import { watchOnce, withSignal } from './transport/https-transport.ts';
import { slimSecret, type WatchedSecret } from './secret-codec.ts';

interface SecretWatchOptions {
  connection: KubeConnection;
  /** One Secret by name (a field selector the apiserver authorizes against resourceNames)... */
  name?: string;
  /** ...or every Secret of the namespace this label selector matches (needs list and watch on secrets). */
  labelSelector?: string;
  clock: Clock;
  logger: Logger;
  /** Called after every change of a followed Secret (and after each relist). */
  onChange?: () => void;
  /**
   * The followed Secrets as a (re)list returned them: the whole set, so a Secret missing here is absent.
   * Called before onChange.
   */
  onList?: (secrets: WatchedSecret[]) => void;
  /** One change as the watch delivered it (DELETED also when a Secret stops matching the selector); before onChange. */
  onEvent?: (type: 'ADDED' | 'MODIFIED' | 'DELETED', secret: WatchedSecret) => void;
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
  /** Secrets per list page (a group of hundreds of domains is listed in pages). */
  pageSize?: number;
  /**
   * Another kind of object than a Secret of the connection's namespace (the injector's caBundle targets):
   * its collection path and how to list it. Default: the namespace's Secrets.
   */
  collection?: ObjectCollection;
}

/** A list request's selector and page. */
type ListQuery = ({ fieldSelector: string } | { labelSelector: string }) & { limit: number; _continue?: string };

export interface ObjectCollection {
  path: string;
  list(query: ListQuery, signal: AbortSignal): Promise<{ metadata?: { resourceVersion?: string; _continue?: string }; items?: unknown[] }>;
}

type Callbacks = 'onChange' | 'onList' | 'onEvent';

/**
 * Follows one Secret by name, or the Secrets a label selector matches: list (in pages) to get a
 * resourceVersion and the current set, then watch from it with bookmarks, resuming from the last seen
 * version after a watch ends, relisting on 410 Gone, and restarting with backoff after errors. A single
 * named Secret keeps RBAC to resourceNames and traffic near zero at rest; a selector serves a whole group
 * with one watch.
 *
 * A watch that ends before delivering any event (an ERROR answer, a proxy closing streams at once) is a
 * failure like an error: reopening it at once would hammer the API server in a tight loop. Only a watch
 * that delivered an event, or stayed open longer than the backoff cap (the server's own timeout on a
 * cluster too quiet for bookmarks), proves the path works and resets the backoff.
 *
 * `synced`: what the watch delivered is the current state (short of the delivery delay). True after a
 * list and while the watches that follow it resume without a failure; false after a failed watch, 410
 * Gone or a stop, until a list or a resumed watch's first event (which replays everything missed since
 * the last resourceVersion) proves the stream whole again.
 */
export class SecretWatch {
  readonly #o: Required<Omit<SecretWatchOptions, 'initialResourceVersion' | 'name' | 'labelSelector' | 'collection' | Callbacks>> &
    Pick<SecretWatchOptions, Callbacks>;
  readonly #selector: { fieldSelector: string } | { labelSelector: string };
  readonly #collection: ObjectCollection;
  /** What logs call the followed Secrets. */
  readonly #what: string;
  #resourceVersion: string | undefined;
  #abort = new AbortController();
  #current: AbortController | undefined;
  #done: Promise<void> | undefined;
  /** Consecutive failed or eventless watches; any event proves the connection works and resets it. */
  #failures = 0;
  #synced = false;
  readonly #firstList = Promise.withResolvers<boolean>();
  /** Watches started after the first (resumed, relisted or restarted). */
  restarts = 0;
  /** Relists after 410 Gone. */
  relists = 0;

  constructor(options: SecretWatchOptions) {
    const { initialResourceVersion, name, labelSelector, collection, ...rest } = options;
    if ((name === undefined) === (labelSelector === undefined)) throw new TypeError('SecretWatch follows either a name or a labelSelector');
    const { connection } = options;
    this.#collection = collection ?? {
      path: `/api/v1/namespaces/${encodeURIComponent(connection.namespace)}/secrets`,
      list: (query, signal) => connection.core.listNamespacedSecret({ namespace: connection.namespace, ...query }, withSignal(signal)),
    };
    this.#o = { firstRetryMs: 500, maxRetryMs: 5000, watchSeconds: [1800, 3600], inactivityMs: 900_000, pageSize: 250, ...rest };
    this.#selector = name !== undefined ? { fieldSelector: `metadata.name=${name}` } : { labelSelector: labelSelector! };
    this.#what = name ?? `secrets with ${labelSelector}`;
    this.#resourceVersion = initialResourceVersion;
  }

  /** Whether what the watch delivered is the current state (see the class comment). */
  get synced(): boolean {
    return this.#synced;
  }

  /** Settles once the first list succeeded (true), or failed or was stopped (false); never rejects. */
  get firstList(): Promise<boolean> {
    return this.#firstList.promise;
  }

  /**
   * The first list, awaited (start-up checks: a 403 here means the Role does not allow this watch);
   * start() then watches from it. Rejects with the API's error.
   */
  async prime(): Promise<void> {
    await this.#list();
  }

  start(): void {
    this.#done ??= this.#run();
  }

  async stop(): Promise<void> {
    this.#abort.abort();
    this.#current?.abort();
    this.#lost();
    this.#firstList.resolve(false);
    await this.#done;
  }

  /** What was delivered may be behind from now on, until a list or a resumed watch's first event. */
  #lost(): void {
    this.#synced = false;
  }

  async #run(): Promise<void> {
    const { clock, logger, firstRetryMs, maxRetryMs } = this.#o;
    while (!this.#abort.signal.aborted) {
      let failure: string | undefined;
      try {
        if (!this.#resourceVersion) await this.#list();
        const startedAt = clock.now();
        const outcome = await this.#watchOnce();
        if (outcome.gone) {
          this.#resourceVersion = undefined;
          this.#lost();
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
        this.#lost();
        const delay = jitter(doubling(firstRetryMs, this.#failures, maxRetryMs));
        logger.warn({ secret: this.#what, err: failure, failures: this.#failures, retryInMs: Math.round(delay) }, 'Secret watch failed');
        // Resuming from the last resourceVersion replays whatever changed meanwhile (or ends in 410 and a relist).
        await clock.sleep(delay, this.#abort.signal).catch(() => {});
      }
      this.restarts++;
    }
  }

  async #list(): Promise<void> {
    const { pageSize } = this.#o;
    const secrets: WatchedSecret[] = [];
    let resourceVersion: string | undefined;
    let next: string | undefined;
    try {
      do {
        const page = await this.#collection.list({ ...this.#selector, limit: pageSize, ...(next ? { _continue: next } : {}) }, this.#abort.signal);
        for (const item of page.items ?? []) {
          const secret = slimSecret(item);
          if (secret) secrets.push(secret);
        }
        // Every page of one list is served from the same snapshot: its version is where the watch starts.
        resourceVersion = page.metadata?.resourceVersion;
        next = page.metadata?._continue || undefined;
      } while (next);
    } catch (err) {
      this.#firstList.resolve(false);
      throw err;
    }
    this.#resourceVersion = resourceVersion;
    this.#synced = true;
    this.#o.onList?.(secrets);
    this.#firstList.resolve(true);
    this.#o.onChange?.();
  }

  /** One watch until it ends: whether it ended in 410 Gone, and how many events (bookmarks too) it delivered. */
  async #watchOnce(): Promise<{ gone: boolean; events: number }> {
    const { connection, watchSeconds } = this.#o;
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
          ...this.#selector,
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
          this.#synced = true;
          if (object?.metadata?.resourceVersion) this.#resourceVersion = object.metadata.resourceVersion;
          if (type === 'BOOKMARK') return;
          const secret = slimSecret(object);
          if (secret) this.#o.onEvent?.(type, secret);
          this.#o.onChange?.();
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
