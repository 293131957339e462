// Keeps tailscaled's AdvertiseServices in step with what this replica can serve: a Tailscale Service is
// advertised only while a valid certificate for its domain is held and the proxy was seen serving it, and
// withdrawn on shutdown first of all. Edits are read-modify-write of the masked prefs, touching only the
// Services certshare was told to manage (core/served/advertisement.ts mergeAdvertised). Under a config file
// (withdrawOnly) it never adds: it removes a refused Service from the file's list and reloads the file to put it back.
import { mergeAdvertised, type AdvertiseDecision } from '../core/served/advertisement.ts';
import { doubling } from '../core/issuance/backoff.ts';
import type { Clock } from '../core/ports/clock.ts';
import { CertshareError, errorMessage, errorText } from '../core/errors.ts';
import type { IpnPrefs, MaskedPrefs } from '../core/ports/localapi.ts';
import { LocalApiError } from '../core/ports/localapi.ts';
import type { Logger } from '../core/ports/logger.ts';
import { isNotListening } from '../localapi/client.ts';

/** tailscaled's prefs through the LocalAPI (src/localapi/client.ts). @forTests */
export interface PrefsApi {
  prefs(signal: AbortSignal): Promise<IpnPrefs>;
  editPrefs(masked: MaskedPrefs, signal: AbortSignal): Promise<IpnPrefs>;
}

/** Retries of a failed read or edit: doubling from the first up to the last. */
const FIRST_RETRY_MS = 1000;
const MAX_RETRY_MS = 5 * 60_000;

interface AdvertiserOptions {
  api: PrefsApi;
  /**
   * The managed Services and the certificate domain each is served under now ('' when none is managed). The
   * list may change (a ServeConfig's Services): a Service listed once stays managed, withdrawn while unlisted.
   */
  services(): ReadonlyArray<{ service: string; domain: string }>;
  /**
   * Whether a listed Service may be advertised at `now`, shutting down aside (the Advertiser's own): in certshare
   * from its certificate and the served check (core/served/advertisement.ts advertiseDecision), in the advertise agent
   * from certshare's request (advertise-agent.ts). `withdrawsOnly`: a config file owns the list (withdrawOnly).
   */
  decide(entry: { service: string; domain: string }, now: number, withdrawsOnly: boolean): AdvertiseDecision;
  /** The next instant at which the decision may change by time alone (a certificate reaching its end), or undefined. */
  nextEdge(now: number): number | undefined;
  clock: Clock;
  logger: Logger;
  /** Look at the prefs again this often even when nothing changed here (someone else may have edited them). */
  resyncMs: number;
  /** A Service's advertisement as tailscaled's prefs say after a read or an edit. */
  onAdvertised?(service: string, advertised: boolean): void;
  /** A failed read or edit, by code. */
  onError?(code: string): void;
  /** A read (and edit) done: the managed Services the prefs advertise now. */
  onReconciled?(advertised: ReadonlySet<string>): void;
}

export class Advertiser {
  readonly #o: AdvertiserOptions;
  /** Every Service services() listed so far: only these are ever edited. */
  readonly #managed = new Set<string>();
  readonly #stop = new AbortController();
  #wake = new AbortController();
  #terminating = false;
  /** Advertising stopped for good: tailscaled has no prefs endpoint. */
  #disabled = false;
  #advertised = new Set<string>();
  /** Serialises reads and edits: the loop's and withdraw()'s. */
  #chain: Promise<unknown> = Promise.resolve();
  #done: Promise<void> | undefined;
  #warnedCode: string | undefined;
  /** Set by withdrawOnly: tailscaled's config file owns the list; this puts the file's list back (reload-config). */
  #putBack: ((signal: AbortSignal) => Promise<unknown>) | undefined;
  /** Under a config file: the managed Services this replica removed from the file's list since the last put-back. */
  readonly #withheld = new Set<string>();

  constructor(options: AdvertiserOptions) {
    this.#o = options;
    this.#listed();
  }

  /** The Services listed now, each added to the managed ones. */
  #listed(): ReadonlyArray<{ service: string; domain: string }> {
    const listed = this.#o.services();
    for (const { service } of listed) this.#managed.add(service);
    return listed;
  }

  /** The managed Services the prefs advertised after the last read or edit. */
  get advertised(): ReadonlySet<string> {
    return this.#advertised;
  }

  start(): void {
    this.#done ??= this.#run();
  }

  /**
   * Before start(): tailscaled runs from a config file whose AdvertiseServices wins at every reload. Never add a
   * Service then: remove a managed one the decision refuses from what the prefs hold (the owner's reload that puts it
   * back is undone at the next read), and once every Service removed is wanted again and none advertised is
   * refused, call `putBack` (reload-config: exactly the file's list again).
   */
  withdrawOnly(putBack: (signal: AbortSignal) => Promise<unknown>): void {
    this.#putBack = putBack;
  }

  /** A config file owns the list (withdrawOnly): the decision only ever withdraws. */
  get withdrawsOnly(): boolean {
    return this.#putBack !== undefined;
  }

  /** Something the decision depends on changed: decide again now. */
  notify(): void {
    this.#wake.abort();
  }

  /**
   * Shutdown's first step: withdraw every managed Service, retried until `signal` aborts. Resolves true when
   * one was advertised before (the caller then gives control time to move clients), false otherwise.
   */
  async withdraw(signal: AbortSignal): Promise<boolean> {
    // A second call (the preStop hook's leave, then SIGTERM's stop) finds the work done.
    this.#withdrawal ??= this.#withdraw(signal);
    return this.#withdrawal;
  }

  #withdrawal: Promise<boolean> | undefined;

  async #withdraw(signal: AbortSignal): Promise<boolean> {
    this.#terminating = true;
    this.#stop.abort();
    await this.#done;
    const wasAdvertised = this.#advertised.size > 0;
    for (let failures = 0; !this.#disabled && !signal.aborted; failures++) {
      try {
        // tailscaled's word counts too: an edit it applied whose answer the stop cut off advertised the Service.
        const removed = await this.#reconcile(signal);
        return wasAdvertised || removed;
      } catch (err) {
        this.#failed(err);
        // tailscaled is gone (a Pod's containers stopping before certshare): nobody left to edit, nobody
        // advertising through it; its next start is certshare's to correct at once.
        if (isNotListening(err)) return false;
        await this.#o.clock.sleep(doubling(200, failures + 1, 2000), signal).catch(() => {});
      }
    }
    return wasAdvertised;
  }

  async stop(): Promise<void> {
    this.#stop.abort();
    await this.#done;
  }

  async #run(): Promise<void> {
    const { clock } = this.#o;
    let failures = 0;
    while (!this.#stop.signal.aborted && !this.#disabled) {
      let waitMs: number;
      try {
        await this.#reconcile(this.#stop.signal);
        failures = 0;
        const now = clock.now();
        const edge = this.#o.nextEdge(now);
        waitMs = Math.min(this.#o.resyncMs, edge === undefined ? Number.POSITIVE_INFINITY : Math.max(0, edge - now));
      } catch (err) {
        if (this.#stop.signal.aborted) break;
        failures++;
        this.#failed(err);
        if (this.#disabled) break;
        waitMs = doubling(FIRST_RETRY_MS, failures, MAX_RETRY_MS);
      }
      await clock.sleep(waitMs, AbortSignal.any([this.#stop.signal, this.#wake.signal])).catch(() => {});
      if (this.#wake.signal.aborted) this.#wake = new AbortController();
    }
  }

  /** Resolves true when it withdrew a managed Service the prefs advertised. */
  #reconcile(signal: AbortSignal): Promise<boolean> {
    const next = this.#chain.then(() => this.#reconcileNow(signal));
    this.#chain = next.catch(() => {});
    return next;
  }

  async #reconcileNow(signal: AbortSignal): Promise<boolean> {
    const { api, clock, logger } = this.#o;
    // Read first: the decision may depend on what the read says (the agent's word that a config file owns the list).
    const current = (await api.prefs(signal)).AdvertiseServices ?? [];
    const wanted = new Set<string>();
    const now = clock.now();
    const why: Record<string, string> = {};
    for (const entry of this.#listed()) {
      const { service } = entry;
      const decision: AdvertiseDecision = this.#terminating ? { advertise: false, why: 'shutting down' } : this.#o.decide(entry, now, this.withdrawsOnly);
      if (decision.advertise) wanted.add(service);
      else why[service] = decision.why;
    }
    if (this.#putBack) return this.#withholdNow(this.#putBack, current, wanted, why, signal);
    const merged = mergeAdvertised(current, this.#managed, wanted);
    let after = current;
    if (merged) {
      after = (await api.editPrefs({ AdvertiseServicesSet: true, AdvertiseServices: merged }, signal)).AdvertiseServices ?? [];
      logger.info({ advertised: [...wanted].sort(), withdrawn: why, advertiseServices: after }, 'Tailscale Services advertisement updated');
    }
    this.#record(new Set(after.filter((s) => this.#managed.has(s))));
    this.#o.onReconciled?.(this.#advertised);
    this.#warnedCode = undefined;
    return current.some((s) => this.#managed.has(s) && !wanted.has(s));
  }

  /** withdrawOnly's reconcile: the prefs' list only ever loses managed Services, or is the file's again. */
  async #withholdNow(
    putBack: (signal: AbortSignal) => Promise<unknown>,
    read: readonly string[],
    wanted: ReadonlySet<string>,
    why: Record<string, string>,
    signal: AbortSignal,
  ): Promise<boolean> {
    const { api, logger } = this.#o;
    const refused = (list: readonly string[]) => list.filter((s) => this.#managed.has(s) && !wanted.has(s));
    let current = read;
    if (this.#withheld.size > 0 && refused(current).length === 0 && [...this.#withheld].every((s) => wanted.has(s))) {
      await putBack(signal);
      this.#withheld.clear();
      current = (await api.prefs(signal)).AdvertiseServices ?? [];
      logger.info({ advertiseServices: current }, "Tailscale Services: the config file's list put back");
    }
    this.#sayUnwatched(current);
    const out = refused(current);
    let after = current;
    if (out.length > 0) {
      const kept = current.filter((s) => !out.includes(s));
      after = (await api.editPrefs({ AdvertiseServicesSet: true, AdvertiseServices: kept }, signal)).AdvertiseServices ?? [];
      for (const s of out) this.#withheld.add(s);
      logger.info({ withdrawn: why, advertiseServices: after }, "Tailscale Services withdrawn from the config file's list");
    }
    this.#record(new Set(after.filter((s) => this.#managed.has(s))));
    this.#o.onReconciled?.(this.#advertised);
    this.#warnedCode = undefined;
    return out.length > 0;
  }

  /** The Services of the config file's list last said to be outside the managed ones ('' for none). */
  #unwatchedSaid = '';

  /**
   * Under a config file: says once per change which Services of the file's list are not managed here (an HA Ingress
   * of Tailscale's operator names its Service after the Ingress's host, not after certshare's flags): certshare never
   * withdraws those, whatever certificate this replica serves.
   */
  #sayUnwatched(read: readonly string[]): void {
    // Said, not acted on: the list is the file's, bounded before it reaches the log.
    const unwatched = [...new Set(read.filter((s) => !this.#managed.has(s)))]
      .sort()
      .slice(0, 16)
      .map((s) => s.slice(0, 64));
    const key = unwatched.join(' ');
    if (key === this.#unwatchedSaid) return;
    this.#unwatchedSaid = key;
    if (unwatched.length === 0) return;
    const managed = [...this.#managed].sort().join(' ') || 'none';
    const code = 'CERTSHARE_ADVERTISE_UNWATCHED';
    this.#o.logger.warn({ code, services: unwatched, managed: [...this.#managed].sort() }, errorText(code, { services: key, managed }));
  }

  #record(advertised: Set<string>): void {
    for (const service of this.#managed) {
      const is = advertised.has(service);
      if (is !== this.#advertised.has(service) || !this.#reported.has(service)) this.#o.onAdvertised?.(service, is);
      this.#reported.add(service);
    }
    this.#advertised = advertised;
  }

  /** The managed Services whose advertisement was reported once (onAdvertised). */
  readonly #reported = new Set<string>();

  /** One warning per kind of failure in a row; no prefs endpoint at all ends advertising with one. */
  #failed(err: unknown): void {
    const code = err instanceof CertshareError ? err.code : 'CERTSHARE_LOCALAPI_UNREACHABLE';
    this.#o.onError?.(code);
    if (this.#putBack && err instanceof LocalApiError && err.status === 400 && err.body.includes('config file is locked')) {
      // tailscaled --config without "Locked": false refuses every prefs edit: the file's owner alone decides.
      this.#disabled = true;
      this.#o.logger.warn({ code, err: errorMessage(err) }, "tailscaled's config file is locked: Tailscale Services are left to its owner, never withdrawn");
      return;
    }
    if (err instanceof LocalApiError && err.status === 404) {
      this.#disabled = true;
      this.#o.logger.warn({ code, err: errorMessage(err) }, 'this tailscaled has no prefs endpoint: Tailscale Services are not advertised');
      return;
    }
    if (this.#warnedCode === code) return;
    this.#warnedCode = code;
    this.#o.logger.warn({ code, err: errorMessage(err) }, 'could not update the Tailscale Services advertisement; retrying');
  }
}
