// The served check and the Tailscale Service advertisement, wired to the daemon's health, metrics and
// Events: what keeps a replica in rotation by what clients really get from it.
import type { Registry } from 'prom-client';
import { advertises, type SERVE_CONFIG_SERVICES } from '../core/served/advertisement.ts';
import { iso, type Clock } from '../core/ports/clock.ts';
import type { HealthState, ValidityEnd } from '../core/loop/health.ts';
import type { LocalApi } from '../core/ports/localapi.ts';
import type { Logger } from '../core/ports/logger.ts';
import type { LoopObserver } from '../core/ports/observer.ts';
import { describeOutcome } from '../core/served/served-certificate.ts';
import { probeServed } from './served-probe.ts';
import type { Advertiser } from './advertiser.ts';
import { createAdvertiser } from './advertise-rule.ts';
import { AgentPrefs } from './advertise-exchange.ts';
import { ServedChecker, type ServedReport } from './served-checker.ts';
import { ServedMetrics, servedStatus } from './served-metrics.ts';
import { AdvertisementOwner } from './config-file-owner.ts';
import { createServiceDomains, ManagedServices, type ServiceDomains, type ServiceDomainsOptions } from './service-domains.ts';

/** How long certshare waits for the advertise agent to apply a request (its poll, a prefs read and edit) before retrying. */
const AGENT_ANSWER_TIMEOUT_MS = 10_000;

/** The settings the served check and the advertisement use, and only those (DaemonConfig extends them). */
export interface ServedRotationSettings {
  /** --served-check: the proxy's TLS listener, checked for the certificate it serves per domain. */
  servedCheck: { host: string; port: number } | undefined;
  servedCheckIntervalMs: number;
  servedCheckTimeoutMs: number;
  servedStaleAfterMs: number;
  /**
   * --advertise-services: the Tailscale Services (svc:<label>) advertised while served (src/served/advertiser.ts),
   * or SERVE_CONFIG_SERVICES: the ones the --serve-config file lists, as it changes.
   */
  advertiseServices: string[] | typeof SERVE_CONFIG_SERVICES;
  advertiseFailoverMs: number;
  /**
   * --advertise-agent: the exchange directory of certshare advertise-agent (served/advertise-exchange.ts), which
   * edits the prefs in certshare's place; undefined: certshare edits them itself (it must be tailscaled's operator).
   */
  advertiseAgent: string | undefined;
  /**
   * --advertise-bootstrap: advertise a Service before its first certificate while nothing valid exists in the
   * group and the proxy serves nothing valid, so that control grants its domain (served/service-domains.ts).
   */
  advertiseBootstrap: boolean;
  /**
   * --advertise-left-to-file: Services the Pod asked for that the owner of tailscaled's config file advertises
   * (the injector's choice, tailscale-operator.ts configFileTailscaled): said once at start, never advertised.
   */
  advertiseLeftToFile: readonly string[];
}

interface ServedRotationDeps {
  clock: Clock;
  logger: Logger;
  health: HealthState;
  registry: Registry;
  localApi: LocalApi;
  /** The managed domains now (static and from the ServeConfig). */
  domains(): Iterable<string>;
  /** The Services the ServeConfig lists now (--advertise-services serve-config). */
  serveConfigServices?(): readonly string[];
  /** What the proxy serves changed for a domain (Events in Kubernetes). */
  onServedChange?(domain: string, report: ServedReport, description: string): void;
  /** tailscaled's cert domains: a Service's domain is granted by control only to the Service's hosts. */
  certDomains?: ServiceDomainsOptions['certDomains'];
  /** A Service's domain waits for control's grant (text), or no longer (undefined): an Event in Kubernetes. */
  onServiceDomainWait?(domain: string, text: string | undefined): void;
}

export interface ServedRotation {
  readonly observer: LoopObserver;
  readonly checker: ServedChecker;
  readonly advertiser: Advertiser | undefined;
  /** Names the wait for a Service's domain and bootstraps it (with an advertiser and deps.certDomains). */
  readonly serviceDomains: ServiceDomains | undefined;
  start(): void;
  /**
   * Shutdown's first step: withdraw the advertised Services, then give control `failoverMs` (at most) to move
   * clients, running `alongside` (the Kubernetes side of leaving rotation) meanwhile.
   */
  leave(failoverMs: number, signal: AbortSignal, alongside: () => Promise<void>): Promise<void>;
  stop(): Promise<void>;
}

/**
 * undefined without --served-check (validateConfig: --advertise-services needs it). `validityEnd`: where a certificate
 * stops counting for the advertisement (renewal.ts rotationExitTime, derived by the daemon for the readiness gate too).
 */
export function createServedRotation(config: ServedRotationSettings & { validityEnd: ValidityEnd }, deps: ServedRotationDeps): ServedRotation | undefined {
  const target = config.servedCheck;
  if (!target) return undefined;
  const { clock, logger, health } = deps;
  const metrics = new ServedMetrics(deps.registry);
  const end = config.validityEnd;
  let advertiser: Advertiser | undefined;
  const checker = new ServedChecker({
    probe: (domain, signal) => probe(domain, signal),
    clock,
    logger: logger.child({ component: 'served-check' }),
    intervalMs: config.servedCheckIntervalMs,
    staleAfterMs: config.servedStaleAfterMs,
    end,
    onChecked: (domain, outcome) => metrics.checked(domain, outcome),
    onChange: (domain, report) => {
      const description = describeReport(report, `${target.host}:${target.port}`);
      metrics.served(domain, servedStatus(report.outcome, report.verdict, report.replacedNow), report.notAfter, report.stale);
      health.servedInfo(domain, description);
      // A served certificate that clients should not get holds the replica out of rotation (readiness gate,
      // /healthz); "no answer" and "not seen yet" are left to the proxy's own probe.
      health.pending(`served:${domain}`, report.verdict.verdict === 'bad' ? `${domain}: ${report.verdict.why} (${target.host}:${target.port})` : undefined);
      const bad = report.verdict.verdict === 'bad' || report.stale;
      logger[bad ? 'warn' : 'info']({ domain, outcome: report.outcome, serial: report.serial, stale: report.stale }, `served check: ${description}`);
      deps.onServedChange?.(domain, report, description);
      advertiser?.notify();
    },
  });
  const probe = (domain: string, signal: AbortSignal) => probeServed(target, domain, config.servedCheckTimeoutMs, signal);
  const certDomains = deps.certDomains;
  const onChange = (): void => advertiser?.notify();
  const managed = new ManagedServices(config.advertiseServices, deps);
  const advertising = advertises(config);
  const serviceDomains = advertising && certDomains ? createServiceDomains(config, { ...deps, certDomains, managed, probe, onChange }) : undefined;
  // Through the agent, certshare needs no right on tailscaled but the certificates (docs/security.md).
  const agent = advertising && config.advertiseAgent ? new AgentPrefs(config.advertiseAgent, clock, AGENT_ANSWER_TIMEOUT_MS) : undefined;
  advertiser = advertising ? createAdvertiser(config, { ...deps, managed, checker, metrics, serviceDomains, agent }) : undefined;
  health.onChange(onChange);
  const { advertiseServices, advertiseLeftToFile, advertiseAgent } = config;
  const owner = new AdvertisementOwner({ advertiseServices, advertiseLeftToFile, advertiseAgent }, deps);
  return {
    observer: checker,
    checker,
    advertiser,
    serviceDomains,
    start: () => {
      checker.start();
      serviceDomains?.start();
      owner.start(advertiser);
    },
    async leave(failoverMs, signal, alongside) {
      // A config file's owner advertises, and withdraws on its own stop (containerboot's SIGTERM): nothing of certshare's.
      const leftToOwner = await owner.ownedByFile();
      const withdrew = advertiser && !leftToOwner ? await advertiser.withdraw(signal) : false;
      if (withdrew) logger.info({ failoverMs }, 'Tailscale Services withdrawn; waiting for control to move clients');
      await Promise.all([withdrew ? clock.sleep(failoverMs, signal).catch(() => {}) : undefined, alongside()]);
    },
    async stop() {
      await owner.stop();
      await Promise.all([checker.stop(), advertiser?.stop(), serviceDomains?.stop()]);
    },
  };
}

function describeReport(report: ServedReport, where: string): string {
  const leaf = report.serial ? ` (serial ${report.serial}, valid until ${iso(report.notAfter ?? 0)})` : '';
  const noLeaf = report.outcome === 'unknown' || report.outcome === 'handshake_failed';
  const now = noLeaf ? `${describeOutcome(report.outcome)} at ${where}${report.detail ? `: ${report.detail}` : ''}` : describeOutcome(report.outcome);
  const stale = report.stale ? '; still the previous certificate past --served-stale-after' : '';
  return `${now}${noLeaf && leaf ? `; last seen${leaf}` : leaf}${stale}`;
}
