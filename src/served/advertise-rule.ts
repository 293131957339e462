// The rule certshare advertises a Tailscale Service by, and the advertiser that follows it: a Service is
// advertised while its domain's certificate is held and the proxy is seen serving it, or while its domain is
// bootstrapped (served/service-domains.ts). The served rotation hands it the parts the rule reads.
import { advertiseDecision, type AdvertiseDecision, type SERVE_CONFIG_SERVICES } from '../core/served/advertisement.ts';
import type { Clock } from '../core/ports/clock.ts';
import type { HealthState, ValidityEnd } from '../core/loop/health.ts';
import type { LocalApi } from '../core/ports/localapi.ts';
import type { Logger } from '../core/ports/logger.ts';
import { Advertiser, type PrefsApi } from './advertiser.ts';
import type { AgentPrefs } from './advertise-exchange.ts';
import type { ServedChecker } from './served-checker.ts';
import type { ServedMetrics } from './served-metrics.ts';
import type { ManagedServices, ServiceDomains } from './service-domains.ts';

/** The settings the advertiser is built with (the served rotation's). */
interface AdvertiserSettings {
  advertiseServices: readonly string[] | typeof SERVE_CONFIG_SERVICES;
  /** How often the advertiser resyncs the prefs (--served-check-interval). */
  servedCheckIntervalMs: number;
  /** Where a certificate stops counting for the advertisement (renewal.ts rotationExitTime). */
  validityEnd: ValidityEnd;
}

/** The parts the advertiser is built from. */
interface AdvertiserParts extends Omit<AdvertiseRuleInputs, 'end'> {
  localApi: LocalApi;
  clock: Clock;
  logger: Logger;
  metrics: ServedMetrics;
}

/** undefined: nothing to advertise, or no way to edit the prefs (no --advertise-agent and a LocalAPI client without prefs). */
export function createAdvertiser(settings: AdvertiserSettings, parts: AdvertiserParts): Advertiser | undefined {
  const { localApi, agent, clock, logger, metrics, managed } = parts;
  const api: PrefsApi | undefined =
    agent ?? (localApi.prefs && localApi.editPrefs ? { prefs: localApi.prefs.bind(localApi), editPrefs: localApi.editPrefs.bind(localApi) } : undefined);
  if (!api) {
    logger.warn({ services: settings.advertiseServices }, 'this LocalAPI client cannot edit prefs: Tailscale Services are not advertised');
    return undefined;
  }
  const rule = new AdvertiseRule({ ...parts, end: settings.validityEnd });
  return new Advertiser({
    api,
    services: () => managed.services(),
    decide: (entry, now, withdrawsOnly) => rule.decide(entry, now, withdrawsOnly),
    nextEdge: (now) => rule.nextEdge(now),
    clock,
    logger: logger.child({ component: 'advertise' }),
    resyncMs: settings.servedCheckIntervalMs,
    onAdvertised: (service, advertised) => metrics.advertised(service, advertised),
    onError: (code) => metrics.advertiseErrors.inc({ code }),
  });
}

interface AdvertiseRuleInputs {
  managed: ManagedServices;
  health: HealthState;
  checker: ServedChecker;
  end: ValidityEnd;
  serviceDomains: ServiceDomains | undefined;
  /** --advertise-agent: its word that tailscaled runs from a config file (it then only withdraws, so ask only that). */
  agent: AgentPrefs | undefined;
}

/**
 * Whether certshare may advertise a Service now (core/served/advertisement.ts advertiseDecision): a valid certificate
 * held for its domain and the proxy seen serving it, or a bootstrap of its domain (served/service-domains.ts).
 */
class AdvertiseRule {
  readonly #o: AdvertiseRuleInputs;

  constructor(options: AdvertiseRuleInputs) {
    this.#o = options;
  }

  decide({ domain }: { domain: string }, now: number, withdrawsOnly: boolean): AdvertiseDecision {
    const { health, checker, end, serviceDomains, agent } = this.#o;
    return advertiseDecision({
      held: domain ? health.infoOf(domain) : undefined,
      served: checker.verdict(domain, now),
      now,
      end,
      terminating: false,
      bootstrap: serviceDomains?.bootstrap(domain, now) ?? false,
      fromFile: withdrawsOnly || (agent?.fromFile() ?? false),
    });
  }

  /** The next instant at which a decision may change by time alone: a certificate or a served verdict reaching its end. */
  nextEdge(now: number): number | undefined {
    const { managed, health, checker, end } = this.#o;
    let next: number | undefined;
    for (const service of managed.servicesNow()) {
      const domain = managed.domainOf(service);
      const info = health.infoOf(domain);
      for (const at of [info ? end(info) : undefined, checker.verdictEdge(domain, now)]) {
        if (at !== undefined && at > now && (next === undefined || at < next)) next = at;
      }
    }
    return next;
  }
}
