import type { Clock } from '../core/clock.ts';
import { partitionDomains } from '../core/domain.ts';
import { CertshareError, errorMessage } from '../core/errors.ts';
import { LocalApiError, NotifyMask } from '../core/localapi.ts';
import type { IpnNotify, LocalApi } from '../core/localapi.ts';
import type { Logger } from '../core/logger.ts';

// Keeps the current set of cert domains by watching tailscaled's IPN bus, for both delivery styles:
// older tailscaled resends NetMap on every change; v1.100+ sends it once, then SelfChange messages after
// which the domains are fetched (cert-domains, or status on versions without it).

export const CERT_DOMAINS_WATCH_MASK =
  NotifyMask.InitialState | NotifyMask.InitialNetMap | NotifyMask.NoPrivateKeys | NotifyMask.RateLimit;

export interface CertDomainsWatcherOptions {
  localApi: LocalApi;
  clock: Clock;
  logger: Logger;
  /** First reconnect / refetch delay (before jitter). Default 1000 ms. */
  firstRetryMs?: number;
  /** Backoff cap. Default 30 s. */
  maxRetryMs?: number;
  /** IPN bus mask. Default CERT_DOMAINS_WATCH_MASK. */
  mask?: number;
  /** Jitter source in [0, 1): a delay is base/2 + random()*base/2. Default Math.random. */
  random?: () => number;
  /** Called on each transition: true at the first Notify of a connection, false when it ends. */
  onConnectionChange?(connected: boolean): void;
  /** Called when a reconnect attempt starts (after the backoff sleep). */
  onReconnect?(): void;
  /** Called for a Notify whose cert domains are malformed (the Notify is ignored). */
  onBadLine?(err: CertshareError): void;
}

export type DomainsListener = (domains: ReadonlySet<string>) => void;

export class CertDomainsWatcher {
  readonly #localApi: LocalApi;
  readonly #clock: Clock;
  readonly #logger: Logger;
  readonly #firstRetryMs: number;
  readonly #maxRetryMs: number;
  readonly #mask: number;
  readonly #random: () => number;
  readonly #options: CertDomainsWatcherOptions;

  #domains: ReadonlySet<string> = new Set();
  /** The names last refused (not domain names), so each change is logged once, not every Notify. */
  #refusedKey = '';
  #synced = false;
  #listeners = new Set<DomainsListener>();
  #connected = false;
  #reconnects = 0;
  #abort: AbortController | undefined;
  #loop: Promise<void> | undefined;

  // SelfChange refetches: one at a time; a SelfChange during a fetch asks for one more.
  #refetch = false;
  #fetchActive = false;
  #fetchDone: Promise<void> = Promise.resolve();
  #noCertDomainsEndpoint = false;

  constructor(options: CertDomainsWatcherOptions) {
    this.#options = options;
    this.#localApi = options.localApi;
    this.#clock = options.clock;
    this.#logger = options.logger;
    this.#firstRetryMs = options.firstRetryMs ?? 1000;
    this.#maxRetryMs = options.maxRetryMs ?? 30_000;
    this.#mask = options.mask ?? CERT_DOMAINS_WATCH_MASK;
    this.#random = options.random ?? Math.random;
  }

  /** The cert domains last seen (kept across disconnects). Replaced, never mutated. */
  current(): ReadonlySet<string> {
    return this.#domains;
  }

  /** True once a domain list has been learned from tailscaled at least once. */
  get synced(): boolean {
    return this.#synced;
  }

  get connected(): boolean {
    return this.#connected;
  }

  /** Reconnect attempts so far (not counting the first connection). */
  get reconnects(): number {
    return this.#reconnects;
  }

  /** Calls `listener` with the new set each time it changes. Returns the unsubscribe function. */
  onChange(listener: DomainsListener): () => void {
    this.#listeners.add(listener);
    return () => {
      this.#listeners.delete(listener);
    };
  }

  /** Resolves once `domain` is a cert domain (at once if it already is); rejects with the signal's reason. */
  waitFor(domain: string, signal?: AbortSignal): Promise<void> {
    if (this.#domains.has(domain)) return Promise.resolve();
    if (signal?.aborted) return Promise.reject(signal.reason);
    return new Promise<void>((resolve, reject) => {
      const onAbort = (): void => {
        cleanup();
        reject(signal!.reason);
      };
      const unsubscribe = this.onChange((domains) => {
        if (!domains.has(domain)) return;
        cleanup();
        resolve();
      });
      const cleanup = (): void => {
        unsubscribe();
        signal?.removeEventListener('abort', onAbort);
      };
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  start(): void {
    if (this.#loop) throw new Error('CertDomainsWatcher already started');
    const abort = new AbortController();
    this.#abort = abort;
    this.#loop = this.#run(abort.signal);
  }

  /** Aborts the stream and any fetch; resolves when the loop has exited. The known domains stay. */
  async stop(): Promise<void> {
    const loop = this.#loop;
    if (!loop) return;
    this.#abort?.abort(new DOMException('cert domains watcher stopped', 'AbortError'));
    await loop;
    await this.#fetchDone;
    this.#loop = undefined;
    this.#abort = undefined;
  }

  async #run(signal: AbortSignal): Promise<void> {
    let failures = 0;
    for (let attempt = 0; !signal.aborted; attempt++) {
      if (attempt > 0) {
        this.#reconnects++;
        this.#safeCall('onReconnect', () => this.#options.onReconnect?.());
      }
      let healthy = false;
      try {
        for await (const notify of this.#localApi.watchIpnBus(this.#mask, signal)) {
          if (!healthy) {
            healthy = true;
            failures = 0; // a connection that delivered a Notify resets the backoff
            this.#noCertDomainsEndpoint = false; // tailscaled may have been upgraded meanwhile
            this.#setConnected(true);
          }
          this.#handle(notify, signal);
        }
        if (signal.aborted) break;
        this.#logger.info({ reconnects: this.#reconnects }, 'IPN bus stream ended; reconnecting');
      } catch (err) {
        if (signal.aborted) break;
        this.#logger.warn(
          { err: errorMessage(err), code: errorCode(err), reconnects: this.#reconnects },
          'IPN bus watch failed; reconnecting',
        );
      } finally {
        this.#setConnected(false);
      }
      const delay = this.#backoff(failures++);
      try {
        await this.#clock.sleep(delay, signal);
      } catch {
        break;
      }
    }
  }

  #handle(notify: IpnNotify, signal: AbortSignal): void {
    if (notify.ErrMessage) this.#logger.warn({ err: notify.ErrMessage }, 'tailscaled reported an error');
    if (notify.NetMap !== undefined && notify.NetMap !== null) {
      const dns = (notify.NetMap as { DNS?: unknown }).DNS as { CertDomains?: unknown } | null | undefined;
      const domains = parseDomainList(dns?.CertDomains);
      if (domains) {
        this.#apply(domains, 'netmap');
      } else {
        this.#badLine('IPN bus NetMap.DNS.CertDomains is not an array of strings; Notify ignored');
      }
    }
    if (notify.SelfChange !== undefined && notify.SelfChange !== null) this.#scheduleFetch(signal);
  }

  #scheduleFetch(signal: AbortSignal): void {
    this.#refetch = true;
    if (this.#fetchActive) return;
    this.#fetchActive = true;
    this.#fetchDone = this.#fetchLoop(signal);
  }

  async #fetchLoop(signal: AbortSignal): Promise<void> {
    let failures = 0;
    // The condition check and clearing #fetchActive happen in one synchronous step: no SelfChange is lost.
    while (this.#refetch && !signal.aborted) {
      this.#refetch = false;
      try {
        const fetched = await this.#fetchDomains(signal);
        if (fetched) this.#apply(fetched.domains, fetched.source);
        failures = 0;
      } catch (err) {
        if (signal.aborted) break;
        const delay = this.#backoff(failures++);
        this.#logger.warn(
          { err: errorMessage(err), code: errorCode(err), retryInMs: delay },
          'fetching cert domains after SelfChange failed; keeping the known set and retrying',
        );
        this.#refetch = true;
        try {
          await this.#clock.sleep(delay, signal);
        } catch {
          break;
        }
      }
    }
    this.#fetchActive = false;
  }

  async #fetchDomains(signal: AbortSignal): Promise<{ domains: string[]; source: string } | undefined> {
    if (!this.#noCertDomainsEndpoint) {
      try {
        return { domains: await this.#localApi.certDomains(signal), source: 'cert-domains' };
      } catch (err) {
        if (!(err instanceof LocalApiError) || err.status !== 404) throw err;
        this.#noCertDomainsEndpoint = true;
        this.#logger.info({}, 'tailscaled has no /localapi/v0/cert-domains (older than v1.98); using status');
      }
    }
    if (!this.#localApi.status) {
      this.#logger.error(
        {},
        'cannot refresh cert domains after SelfChange: no cert-domains endpoint and no status() on this LocalApi',
      );
      return undefined;
    }
    const status = await this.#localApi.status(signal);
    const domains = parseDomainList(status['CertDomains']);
    if (!domains) {
      throw new CertshareError('CERTSHARE_LOCALAPI_BAD_RESPONSE', 'status CertDomains is not an array of strings');
    }
    return { domains, source: 'status' };
  }

  #apply(list: string[], source: string): void {
    // tailscaled's names pass the same check as --domain: one that is not a domain name never reaches a
    // file path or a Secret name, and the valid ones carry on.
    const { domains, refused } = partitionDomains(list);
    const refusedKey = refused.map((r) => r.name).join('\n');
    if (refusedKey !== this.#refusedKey) {
      this.#refusedKey = refusedKey;
      for (const { name, reason } of refused) {
        this.#logger.error({ code: 'CERTSHARE_BAD_DOMAIN', name, err: reason, source }, 'tailscaled cert domain refused; the other domains carry on');
      }
    }
    const next = new Set(domains);
    const previous = this.#domains;
    const firstSync = !this.#synced;
    this.#synced = true;
    if (next.size === previous.size && [...next].every((d) => previous.has(d))) {
      if (firstSync) this.#logger.info({ domains: [...next], source }, 'cert domains known');
      return;
    }
    this.#domains = next;
    this.#logger.info(
      {
        source,
        domains: [...next],
        added: [...next].filter((d) => !previous.has(d)),
        removed: [...previous].filter((d) => !next.has(d)),
      },
      'cert domains changed',
    );
    for (const listener of [...this.#listeners]) {
      this.#safeCall('onChange listener', () => listener(next));
    }
  }

  #setConnected(connected: boolean): void {
    if (this.#connected === connected) return;
    this.#connected = connected;
    if (connected) this.#logger.info({ reconnects: this.#reconnects }, 'IPN bus connected');
    this.#safeCall('onConnectionChange', () => this.#options.onConnectionChange?.(connected));
  }

  #badLine(message: string): void {
    const err = new CertshareError('CERTSHARE_BUS_BAD_LINE', message);
    if (this.#options.onBadLine) this.#safeCall('onBadLine', () => this.#options.onBadLine?.(err));
    else this.#logger.warn({ code: err.code, err: err.message }, 'skipped a malformed IPN bus message');
  }

  #backoff(failures: number): number {
    const base = Math.min(this.#maxRetryMs, this.#firstRetryMs * 2 ** Math.min(failures, 30));
    return Math.round(base / 2 + this.#random() * (base / 2));
  }

  #safeCall(what: string, fn: () => void): void {
    try {
      fn();
    } catch (err) {
      this.#logger.error({ err: errorMessage(err) }, `${what} threw`);
    }
  }
}

/** An array of strings, or [] for an absent/null list (Go omits empty lists); undefined when malformed. */
function parseDomainList(value: unknown): string[] | undefined {
  if (value === undefined || value === null) return [];
  if (!Array.isArray(value) || !value.every((d) => typeof d === 'string')) return undefined;
  return value as string[];
}

function errorCode(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | null | undefined)?.code;
  return typeof code === 'string' ? code : undefined;
}
