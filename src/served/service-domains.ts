// A Tailscale Service's domain as control grants it: only to the Service's hosts. A first certificate for
// `<label>.<tailnet>.ts.net` therefore needs the node to advertise `svc:<label>`, while certshare advertises a
// Service only once its certificate is served. This part names that wait (/healthz, a log line, an Event)
// and, where the platform allows it (--advertise-bootstrap), tells the advertiser when advertising before
// the first certificate costs no client anything (core/served/advertisement.ts bootstrapAllowed).
import { SERVE_CONFIG_SERVICES, bootstrapAllowed, serviceDomain } from '../core/served/advertisement.ts';
import type { DomainAvailability } from '../core/loop/cert-loop.ts';
import type { Clock } from '../core/ports/clock.ts';
import type { HealthState } from '../core/loop/health.ts';
import { errorText } from '../core/errors.ts';
import type { Logger } from '../core/ports/logger.ts';
import type { ServedProbe } from '../core/served/served-certificate.ts';

/** How soon to look again while tailscaled's cert domains are not known yet. */
const SYNC_RECHECK_MS = 1000;

/** The managed domains now (static and from the ServeConfig), and the Services the ServeConfig lists now. */
interface ManagedNow {
  domains(): Iterable<string>;
  serveConfigServices?(): readonly string[];
}

/**
 * The Services advertised now (--advertise-services, or the ServeConfig's as it changes), and the managed
 * domain each is for (core/served/advertisement.ts serviceDomain; '' when none is managed).
 */
export class ManagedServices {
  readonly #advertiseServices: readonly string[] | typeof SERVE_CONFIG_SERVICES;
  readonly #now: ManagedNow;

  constructor(advertiseServices: readonly string[] | typeof SERVE_CONFIG_SERVICES, now: ManagedNow) {
    this.#advertiseServices = advertiseServices;
    this.#now = now;
  }

  servicesNow(): readonly string[] {
    return this.#advertiseServices === SERVE_CONFIG_SERVICES ? (this.#now.serveConfigServices?.() ?? []) : this.#advertiseServices;
  }

  domainOf(service: string): string {
    return serviceDomain(service, this.#now.domains()) ?? '';
  }

  services(): { service: string; domain: string }[] {
    return this.servicesNow().map((service) => ({ service, domain: this.domainOf(service) }));
  }
}

export interface ServiceDomainsOptions {
  /** tailscaled's cert domains (localapi/cert-domains-watcher.ts). */
  certDomains: DomainAvailability & { current(): ReadonlySet<string>; synced: boolean; onChange(listener: () => void): () => void };
  /** The managed Services now, each with its domain ('' when none is managed). */
  services(): ReadonlyArray<{ service: string; domain: string }>;
  /** A certificate valid at `now` is held for the domain. */
  heldValid(domain: string, now: number): boolean;
  /** One handshake with the proxy for the domain (SNI). */
  probe(domain: string, signal: AbortSignal): Promise<ServedProbe>;
  bootstrap: boolean;
  /** While a bootstrap may be due, the proxy is asked again this often (--served-check-interval). */
  probeIntervalMs: number;
  clock: Clock;
  logger: Logger;
  /** The wait's text for a domain, or undefined when it ended (health's problem, an Event). */
  onWait(domain: string, text: string | undefined): void;
  /** Something bootstrap() depends on changed. */
  onChange(): void;
}

/** The parts the served rotation builds its ServiceDomains from. */
interface ServiceDomainsParts {
  certDomains: ServiceDomainsOptions['certDomains'];
  managed: ManagedServices;
  /** A certificate counts as held by the health state's view of it, and a domain's wait is its problem there (/healthz). */
  health: HealthState;
  probe: ServiceDomainsOptions['probe'];
  clock: Clock;
  logger: Logger;
  /** A Service's domain waits for control's grant (text), or no longer (undefined): an Event in Kubernetes. */
  onServiceDomainWait?(domain: string, text: string | undefined): void;
  onChange(): void;
}

/** The served rotation's ServiceDomains: --advertise-bootstrap, probing the proxy each --served-check-interval. */
export function createServiceDomains(settings: { advertiseBootstrap: boolean; servedCheckIntervalMs: number }, parts: ServiceDomainsParts): ServiceDomains {
  const { health, managed } = parts;
  return new ServiceDomains({
    certDomains: parts.certDomains,
    services: () => managed.services(),
    heldValid: (domain, now) => {
      const info = health.infoOf(domain);
      return info !== undefined && now >= info.notBefore && now < info.notAfter;
    },
    probe: parts.probe,
    bootstrap: settings.advertiseBootstrap,
    probeIntervalMs: settings.servedCheckIntervalMs,
    clock: parts.clock,
    logger: parts.logger.child({ component: 'service-domains' }),
    onWait: (domain, text) => {
      health.problem(domain, text);
      parts.onServiceDomainWait?.(domain, text);
    },
    onChange: parts.onChange,
  });
}

export class ServiceDomains {
  readonly #o: ServiceDomainsOptions;
  /**
   * Domains whose certificate loop waits for tailscaled to list them before it issues: a first issuance (no
   * valid certificate in the group's store or at the home: the loop takes one from there first) or a renewal.
   */
  readonly #waitingFor = new Set<string>();
  /** Per domain, whether the proxy's last answer was a leaf valid now for the name. */
  readonly #servedValid = new Map<string, boolean>();
  /** The wait named per domain (logged once per wait). */
  readonly #named = new Map<string, string>();
  readonly #stop = new AbortController();
  #wake = new AbortController();
  #done: Promise<void> | undefined;
  #unsubscribe: (() => void) | undefined;

  constructor(options: ServiceDomainsOptions) {
    this.#o = options;
  }

  /** The loops' view of tailscaled's cert domains, noting which domains wait to be issued. */
  readonly availability: DomainAvailability = {
    waitFor: async (domain, signal) => {
      this.#waitingFor.add(domain);
      this.#wake.abort();
      try {
        await this.#o.certDomains.waitFor(domain, signal);
      } finally {
        this.#waitingFor.delete(domain);
        this.#wake.abort();
      }
    },
  };

  /** Advertise the Service of `domain` to obtain the domain (bootstrapAllowed). */
  bootstrap(domain: string, now: number): boolean {
    if (!domain || this.#o.heldValid(domain, now)) {
      this.#bootstrapping.delete(domain);
      return false;
    }
    // Granted: the advertisement that obtained it stays until the certificate is held (control takes the
    // domain back from a node that stops hosting the Service, and tailscaled checks it before issuing).
    if (this.#o.certDomains.current().has(domain)) return this.#bootstrapping.has(domain);
    const allowed = bootstrapAllowed({
      enabled: this.#o.bootstrap,
      issuing: this.#waitingFor.has(domain),
      heldValid: false,
      servedValidLeaf: this.#servedValid.get(domain),
    });
    if (allowed) this.#bootstrapping.add(domain);
    else this.#bootstrapping.delete(domain);
    return allowed;
  }

  /** Domains advertised to obtain them and not yet held: the advertisement stays through the issuance. */
  readonly #bootstrapping = new Set<string>();

  start(): void {
    this.#unsubscribe = this.#o.certDomains.onChange(() => this.#wake.abort());
    this.#done ??= this.#run();
  }

  async stop(): Promise<void> {
    this.#stop.abort();
    this.#unsubscribe?.();
    await this.#done;
  }

  async #run(): Promise<void> {
    const { clock } = this.#o;
    while (!this.#stop.signal.aborted) {
      const waiting = this.#waiting();
      this.#name(waiting);
      if (this.#o.bootstrap && waiting.length > 0) await this.#probe(waiting);
      this.#o.onChange();
      // tailscaled's first answer may list nothing, which is no change to listen for: look again shortly.
      const unsynced = this.#waitingFor.size > 0 && !this.#o.certDomains.synced;
      const waitMs = Math.min(
        this.#o.bootstrap && waiting.length > 0 ? this.#o.probeIntervalMs : Number.POSITIVE_INFINITY,
        unsynced ? SYNC_RECHECK_MS : Number.POSITIVE_INFINITY,
      );
      await clock.sleep(Math.min(waitMs, 2 ** 31 - 1), AbortSignal.any([this.#stop.signal, this.#wake.signal])).catch(() => {});
      if (this.#wake.signal.aborted) this.#wake = new AbortController();
    }
  }

  /** The managed Services whose loop waits to issue for a domain tailscaled does not list. */
  #waiting(): Array<{ service: string; domain: string }> {
    const { certDomains } = this.#o;
    if (!certDomains.synced) return [];
    const listed = certDomains.current();
    return this.#o.services().filter(({ domain }) => domain !== '' && this.#waitingFor.has(domain) && !listed.has(domain));
  }

  #name(waiting: ReadonlyArray<{ service: string; domain: string }>): void {
    const now = new Map(waiting.map(({ service, domain }) => [domain, this.#text(service, domain)]));
    for (const [domain, text] of now) {
      if (this.#named.get(domain) === text) continue;
      this.#named.set(domain, text);
      this.#o.logger.warn({ code: 'CERTSHARE_SERVICE_DOMAIN_NOT_GRANTED', domain, bootstrap: this.#o.bootstrap }, text);
      this.#o.onWait(domain, text);
    }
    for (const domain of this.#named.keys()) {
      if (now.has(domain)) continue;
      this.#named.delete(domain);
      this.#o.logger.info({ domain }, 'tailscaled lists the Service domain now');
      this.#o.onWait(domain, undefined);
    }
  }

  #text(service: string, domain: string): string {
    const why = this.#o.bootstrap
      ? 'with --advertise-bootstrap it is advertised while nothing valid is served, once control grants the domain it is issued'
      : 'the node must host the Service: approve it as a host with matching tags, or start certshare with --advertise-bootstrap';
    return errorText('CERTSHARE_SERVICE_DOMAIN_NOT_GRANTED', { domain, service, why });
  }

  async #probe(waiting: ReadonlyArray<{ domain: string }>): Promise<void> {
    await Promise.all(
      waiting.map(async ({ domain }) => {
        const probe = await this.#o.probe(domain, this.#stop.signal).catch(() => undefined);
        if (!probe) return;
        const now = this.#o.clock.now();
        const valid = 'leaf' in probe && probe.leaf.coversName && now >= probe.leaf.notBefore && now < probe.leaf.notAfter;
        if (this.#servedValid.get(domain) === valid) return;
        this.#servedValid.set(domain, valid);
        const text = valid
          ? 'the proxy serves a valid certificate for the Service domain: no bootstrap (clients may be getting it)'
          : 'the proxy serves nothing valid for the Service domain: advertising to obtain it costs no client anything';
        this.#o.logger.info({ domain, ...('leaf' in probe ? { serial: probe.leaf.serial } : { detail: probe.detail }) }, text);
      }),
    );
  }
}
