import { doubling, jitter } from '../core/issuance/backoff.ts';
import type { Clock } from '../core/ports/clock.ts';
import { partitionDomains } from '../core/certificates/domain.ts';
import { CertshareError, errorMessage } from '../core/errors.ts';
import { formatGoDuration } from '../core/values/duration.ts';
import { isRefusalStatus, LocalApiError } from '../core/ports/localapi.ts';
import type { IpnNotify, LocalApi } from '../core/ports/localapi.ts';
import type { Logger } from '../core/ports/logger.ts';
import type { StartupCondition } from '../core/loop/startup-grace.ts';
import { isNotListening } from './client.ts';
import { parseTailscaledVersion, planWatch, refusedBitsIn, releaseFeatures, type WatchPlan } from './releases.ts';

// Keeps the current set of cert domains by watching tailscaled's IPN bus. The domains are learned when a
// watch connects (InitialStatus on v1.100+, the initial NetMap before, else cert-domains or status), then
// from every resent NetMap (before v1.100) and by re-reading them after every SelfChange (v1.98+).
// The mask follows the release tailscaled reports (see releases.ts); a 400 naming an obsolete bit makes
// it drop that bit, and an answer that cannot change is retried only every `refusedRetryMs`.

/** Consecutive mask switches without a delivered Notify before the normal backoff applies again. */
const MAX_IMMEDIATE_SWITCHES = 4;

interface CertDomainsWatcherOptions {
  localApi: LocalApi;
  clock: Clock;
  logger: Logger;
  /** First reconnect / refetch delay (before jitter). Default 1000 ms. */
  firstRetryMs?: number;
  /** Backoff cap. Default 30 s. */
  maxRetryMs?: number;
  /** Delay before asking again after a refusal (a 4xx other than 408/429, which retrying cannot change). Default 10 min. */
  refusedRetryMs?: number;
  /** Jitter source in [0, 1): a delay is spread ±25% around its doubling base (see core/issuance/backoff.ts). Default Math.random. */
  random?: () => number;
  /** Called on each transition: true at the first Notify of a connection, false when it ends. */
  onConnectionChange?(connected: boolean): void;
  /** Called when a reconnect attempt starts (after the backoff sleep). */
  onReconnect?(): void;
  /** Called for a Notify whose cert domains are malformed (the Notify is ignored). */
  onBadLine?(err: CertshareError): void;
  /** Called with what keeps the domains from being learned (a refusal), and with undefined once it is over. */
  onProblem?(message: string | undefined): void;
  /**
   * tailscaled not listening yet: within the start-up grace, and until it has answered once, a failed watch
   * that found nothing listening logs at info (core/loop/startup-grace.ts). Undefined: it warns at once.
   */
  startup?: StartupCondition;
}

type DomainsListener = (domains: ReadonlySet<string>) => void;

export class CertDomainsWatcher {
  readonly #localApi: LocalApi;
  readonly #clock: Clock;
  readonly #logger: Logger;
  readonly #firstRetryMs: number;
  readonly #maxRetryMs: number;
  readonly #refusedRetryMs: number;
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

  // What tailscaled reported (Tailscale-Version), and the mask bits it refused with a 400 (reset when the version changes).
  #version: string | undefined;
  #refusedBits = 0;
  #problem: string | undefined;

  constructor(options: CertDomainsWatcherOptions) {
    this.#options = options;
    this.#localApi = options.localApi;
    this.#clock = options.clock;
    this.#logger = options.logger;
    this.#firstRetryMs = options.firstRetryMs ?? 1000;
    this.#maxRetryMs = options.maxRetryMs ?? 30_000;
    this.#refusedRetryMs = options.refusedRetryMs ?? 10 * 60_000;
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

  /** The tailscaled version last reported, if any. */
  get tailscaledVersion(): string | undefined {
    return this.#version;
  }

  /** Why the domains cannot be learned now (a refused request), or undefined. */
  get problem(): string | undefined {
    return this.#problem;
  }

  /** The plan for the next watch: its mask follows the last reported version and the refused bits. */
  plan(): WatchPlan {
    return planWatch(parseTailscaledVersion(this.#version), this.#refusedBits);
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
    return untilListed(this, domain, signal);
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
    let switches = 0; // mask changes in a row without a delivered Notify
    for (let attempt = 0; !signal.aborted; attempt++) {
      if (attempt > 0) {
        this.#reconnects++;
        this.#safeCall('onReconnect', () => this.#options.onReconnect?.());
      }
      const plan = this.plan();
      let healthy = false;
      let switchMask = false;
      let delay: number | undefined;
      try {
        for await (const notify of this.#localApi.watchIpnBus(plan.mask, signal)) {
          const first = !healthy;
          if (first) {
            healthy = true;
            this.#options.startup?.cleared();
            failures = 0; // a connection that delivered a Notify resets the backoff
            this.#learnVersion(this.#localApi.tailscaledVersion?.() ?? notify.Version);
            const wanted = this.plan();
            if (wanted.mask !== plan.mask && switches < MAX_IMMEDIATE_SWITCHES) {
              // Known only now (the first answer): this release wants the other mask. Ask again at once.
              this.#logger.info({ mask: plan.mask, next: wanted.mask, reason: wanted.reason }, 'IPN bus: switching the watch mask');
              switchMask = true;
              break;
            }
            switches = 0;
            this.#noCertDomainsEndpoint = !releaseFeatures(parseTailscaledVersion(this.#version)).certDomainsEndpoint;
            this.#setProblem(undefined);
            this.#setConnected(true, this.plan()); // the plan as the reported version explains it (the mask is the same)
          }
          this.#handle(notify, signal, first);
        }
        if (signal.aborted) break;
        if (!switchMask) this.#logger.info({ reconnects: this.#reconnects }, 'IPN bus stream ended; reconnecting');
      } catch (err) {
        if (signal.aborted) break;
        if (this.#refusedMask(err, plan) && switches < MAX_IMMEDIATE_SWITCHES) {
          switchMask = true;
        } else if (isRefusal(err)) {
          delay = this.#refusedRetryMs;
          const message = `${errorMessage(err)}; asking again in ${formatGoDuration(delay)}`;
          this.#logger.error({ err: message, code: errorCode(err), mask: plan.mask, reconnects: this.#reconnects }, 'IPN bus watch refused');
          this.#setProblem(message);
        } else if (isNotListening(err) && this.#options.startup?.level() === 'info') {
          // A native sidecar starts before tailscaled does: nothing listening yet is every Pod's start.
          const address = this.#localApi.address ?? "tailscaled's LocalAPI";
          this.#logger.info({ reconnects: this.#reconnects }, `waiting for tailscaled to listen on ${address} (it starts after certshare)`);
        } else {
          this.#logger.warn({ err: errorMessage(err), code: errorCode(err), reconnects: this.#reconnects }, 'IPN bus watch failed; reconnecting');
        }
        // Any answer (a refusal, an error status) means tailscaled listens: not listening later is trouble.
        if (err instanceof LocalApiError && err.status !== undefined) this.#options.startup?.cleared();
      } finally {
        this.#setConnected(false);
      }
      if (switchMask) {
        switches++;
        continue;
      }
      switches = 0;
      try {
        await this.#clock.sleep(delay ?? this.#backoff(failures++), signal);
      } catch {
        break;
      }
    }
  }

  /** Records the version tailscaled reported; a new version forgets the bits the old one refused. */
  #learnVersion(reported: string | undefined): void {
    if (!reported || reported === this.#version) return;
    if (this.#version !== undefined) this.#logger.info({ from: this.#version, to: reported }, 'tailscaled version changed');
    this.#version = reported;
    this.#refusedBits = 0;
  }

  /** A 400 on the watch that names a bit this release refuses: true when the next plan differs (ask again at once). */
  #refusedMask(err: unknown, plan: WatchPlan): boolean {
    if (!(err instanceof LocalApiError) || err.status !== 400) return false;
    this.#learnVersion(err.tailscaledVersion);
    this.#refusedBits |= refusedBitsIn(err.body) & plan.mask;
    const next = this.plan();
    if (next.mask === plan.mask) return false;
    this.#logger.info(
      { mask: plan.mask, next: next.mask, refused: err.body, tailscaledVersion: this.#version, reason: next.reason },
      'IPN bus: tailscaled refused the watch mask; asking with another',
    );
    return true;
  }

  #handle(notify: IpnNotify, signal: AbortSignal, first: boolean): void {
    if (notify.ErrMessage) this.#logger.warn({ err: notify.ErrMessage }, 'tailscaled reported an error');
    let learned = false;
    if (notify.InitialStatus !== undefined && notify.InitialStatus !== null) {
      const domains = parseDomainList(notify.InitialStatus.CertDomains);
      if (domains) {
        this.#apply(domains, 'initial status');
        learned = true;
      } else {
        this.#badLine('Notify', 'its InitialStatus.CertDomains is not an array of strings');
      }
    }
    if (notify.NetMap !== undefined && notify.NetMap !== null) {
      const dns = (notify.NetMap as { DNS?: unknown }).DNS as { CertDomains?: unknown } | null | undefined;
      const domains = parseDomainList(dns?.CertDomains);
      if (domains) {
        this.#apply(domains, 'netmap');
        learned = true;
      } else {
        this.#badLine('Notify', 'its NetMap.DNS.CertDomains is not an array of strings');
      }
    }
    // At connect the domains must be known now, not at the next change: read them when the first Notify
    // did not carry them. A SelfChange means they may have changed (a NetMap beside it already said how).
    const selfChange = notify.SelfChange !== undefined && notify.SelfChange !== null;
    if (!learned && (first || selfChange)) this.#scheduleFetch(signal);
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
        this.#setProblem(undefined);
      } catch (err) {
        if (signal.aborted) break;
        const refused = isRefusal(err);
        const delay = refused ? this.#refusedRetryMs : this.#backoff(failures++);
        this.#logger.warn(
          { err: errorMessage(err), code: errorCode(err), retryInMs: delay },
          'fetching cert domains failed; keeping the known set and retrying',
        );
        if (refused) this.#setProblem(`${errorMessage(err)}; asking again in ${formatGoDuration(delay)}`);
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
      this.#logger.error({}, 'cannot read the cert domains: no cert-domains endpoint and no status() on this LocalApi');
      return undefined;
    }
    const status = await this.#localApi.status(signal);
    const domains = parseDomainList(status.CertDomains);
    if (!domains) {
      throw new CertshareError('CERTSHARE_LOCALAPI_BAD_RESPONSE', { request: 'GET /localapi/v0/status', failure: 'CertDomains is not an array of strings' });
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
    this.#logger.info({ source, domains: [...next], ...domainsDiff(previous, next) }, 'cert domains changed');
    for (const listener of [...this.#listeners]) {
      this.#safeCall('onChange listener', () => listener(next));
    }
  }

  #setConnected(connected: boolean, plan?: WatchPlan): void {
    if (this.#connected === connected) return;
    this.#connected = connected;
    if (connected) {
      this.#logger.info({ reconnects: this.#reconnects, mask: plan?.mask, tailscaledVersion: this.#version, reason: plan?.reason }, 'IPN bus connected');
    }
    this.#safeCall('onConnectionChange', () => this.#options.onConnectionChange?.(connected));
  }

  #setProblem(message: string | undefined): void {
    if (this.#problem === message) return;
    this.#problem = message;
    this.#safeCall('onProblem', () => this.#options.onProblem?.(message));
  }

  #badLine(what: string, flaw: string): void {
    const err = new CertshareError('CERTSHARE_BUS_BAD_LINE', { what, flaw });
    if (this.#options.onBadLine) this.#safeCall('onBadLine', () => this.#options.onBadLine?.(err));
    else this.#logger.warn({ code: err.code, err: err.message }, 'skipped a malformed IPN bus message');
  }

  /** The project's one backoff rule (src/core/issuance/backoff.ts): doubling to the cap, spread ±25%. */
  #backoff(failures: number): number {
    return Math.round(jitter(doubling(this.#firstRetryMs, failures + 1, this.#maxRetryMs), 0.25, this.#random));
  }

  #safeCall(what: string, fn: () => void): void {
    try {
      fn();
    } catch (err) {
      this.#logger.error({ err: errorMessage(err) }, `${what} threw`);
    }
  }
}

/** CertDomainsWatcher.waitFor: resolves once `domain` is listed (at once if it is); rejects with the signal's reason. */
function untilListed(watcher: Pick<CertDomainsWatcher, 'current' | 'onChange'>, domain: string, signal?: AbortSignal): Promise<void> {
  if (watcher.current().has(domain)) return Promise.resolve();
  if (signal?.aborted) return Promise.reject(signal.reason);
  return new Promise<void>((resolve, reject) => {
    const onAbort = (): void => {
      cleanup();
      reject(signal!.reason);
    };
    const unsubscribe = watcher.onChange((domains) => {
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

function domainsDiff(previous: ReadonlySet<string>, next: ReadonlySet<string>): { added: string[]; removed: string[] } {
  return { added: [...next].filter((d) => !previous.has(d)), removed: [...previous].filter((d) => !next.has(d)) };
}

/** An array of strings, or [] for an absent/null list (Go omits empty lists); undefined when malformed. */
function parseDomainList(value: unknown): string[] | undefined {
  if (value === undefined || value === null) return [];
  if (!Array.isArray(value) || !value.every((d) => typeof d === 'string')) return undefined;
  return value as string[];
}

/** An answer that asking again soon cannot change (see isRefusalStatus). */
function isRefusal(err: unknown): boolean {
  return err instanceof LocalApiError && isRefusalStatus(err.status);
}

function errorCode(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | null | undefined)?.code;
  return typeof code === 'string' ? code : undefined;
}
