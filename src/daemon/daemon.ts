import { EventEmitter } from 'node:events';
import { certificateLoops } from '../core/loop/certificate-loops.ts';
import type { LoopSupervisor } from '../core/loop/loop-supervisor.ts';
import { ManagedDomains } from '../core/loop/managed-domains.ts';
import { systemClock, type Clock } from '../core/ports/clock.ts';
import { HealthState, logHealthChanges } from '../core/loop/health.ts';
import { StartupGrace } from '../core/loop/startup-grace.ts';
import type { LoopObserver } from '../core/ports/observer.ts';
import type { IssuanceRole } from '../core/ports/store.ts';
import type { LocalApi } from '../core/ports/localapi.ts';
import type { Logger } from '../core/ports/logger.ts';
import { dirBackend, type StoreBackend } from '../store/store-backend.ts';
import { CertDirectory } from '../store/cert-directory.ts';
import { loadKubeBackend } from '../kube/kube-mode.ts';
import { secretPairSource } from '../kube/secret-pair-source.ts';
import type { DaemonConfig } from '../config/daemon-config.ts';
import { followServeConfig, type ServeConfigWatcher } from '../localapi/serve-config-watcher.ts';
import type { CertDomainsWatcher } from '../localapi/cert-domains-watcher.ts';
import { tailscaledSource } from '../localapi/tailscaled-source.ts';
import { Metrics } from '../http/daemon-metrics.ts';
import { daemonListener, type DaemonListener } from '../http/daemon-listener.ts';
import { RotationExit } from '../http/rotation-exit.ts';
import { RoutingProofs } from '../http/routing-proof.ts';
import { heapSavingSwitch } from '../http/heap-saving.ts';
import { proxyDelivery, type ProxyDelivery } from '../delivery/proxy-delivery.ts';
import { Projector } from '../delivery/projector.ts';
import type { ReloadOutcome } from '../delivery/reload-command.ts';
import type { AriChecker } from '../acme/ari-checker.ts';
import type { ServedRotation } from '../served/served-rotation.ts';
import { createLogger } from '../logging/pino-logger.ts';
import { partSettings } from './part-settings.ts';

/** What the daemon is given beside its configuration. @forTests */
export interface DaemonDeps {
  /** The daemon's logger; undefined: built from --log-level and --log-format (the run command's). */
  logger?: Logger;
  env: NodeJS.ProcessEnv;
  clock?: Clock;
  /** Replaces the LocalAPI transport (tests). */
  localApi?: LocalApi;
  /** Told the managed domain count on each change; switches V8's heap to save memory (http/heap-saving.ts). */
  heapSaving?: (managedDomains: number) => boolean;
}

/** @forTests */
export interface Daemon {
  readonly address: string;
  readonly logger: Logger;
  /** The certificate loops, one per domain, and their supervisor. */
  readonly manager: LoopSupervisor;
  readonly health: HealthState;
  readonly metrics: Metrics;
  readonly watcher: CertDomainsWatcher;
  readonly role: IssuanceRole;
  /**
   * `filesWritten` {domain, path}: certificate files changed on disk (dir store, --out-dir projection, --haproxy-crt-dir);
   * `attempt` {domain, result, reason}: a CertPair call ended; `problem` {domain, message}: a loop hit a problem;
   * `planned` {domain, at}: a loop's turn ended with its next check planned; `tlsServed` {serial}: --tls serves a renewed pair;
   * `reloading`: a reload of the proxy (command, signal) began; `reloaded` ReloadOutcome: it, or a HAProxy runtime API push,
   * ended; `decided` {domain, decision}: a loop's decision (issuance-policy.ts IssuanceDecision).
   */
  readonly events: EventEmitter;
  /** Graceful stop: leave rotation, drain, stop loops and the server. */
  stop(): Promise<void>;
}

/**
 * Re-emits loop reports on the daemon's EventEmitter: `attempt` {domain, result, reason}, `problem` {domain, message},
 * `planned` {domain, at}: a turn ended and the loop decided when to look next (nothing more to do now),
 * `renewRequest` {domain, id, result...}: a renew request answered; `decided` {domain, decision}: each decision of a
 * turn (issuance-policy.ts), a wait for the budget included.
 */
function eventsObserver(events: EventEmitter): LoopObserver {
  return {
    decided: (domain, decision) => events.emit('decided', { domain, decision }),
    attempt: (domain, result, reason) => events.emit('attempt', { domain, result, reason }),
    planned: (domain, at) => events.emit('planned', { domain, at }),
    problem: (domain, message) => message && events.emit('problem', { domain, message }),
    renewRequest: (domain, outcome) => events.emit('renewRequest', { domain, ...outcome }),
  };
}

export async function startDaemon(config: DaemonConfig, input: DaemonDeps): Promise<Daemon> {
  const deps = { clock: input.clock ?? systemClock, env: input.env };
  // Two phases: every part built with its own settings, none started (buildParts), then started in start-up
  // order (below).
  const parts = await buildParts(config, deps, input);
  const { logger, serveConfig, http, ari, backend, projection, domains, watcher, served } = parts;
  // Start-up order: what can still refuse the configuration (the ServeConfig's first read, the first --tls
  // pair, the listen port) runs before any loop or watcher starts, and a failure there undoes what ran before
  // it: a start-up error leaves nothing listening and nothing running.
  let address: string;
  try {
    await serveConfig?.start();
    // The first pair is a start-up check like the ServeConfig's first read: unusable, nothing starts.
    address = await http.listen();
  } catch (err) {
    serveConfig?.stop();
    await Promise.all([http.stopFollowing(), ari?.stop(), http.close()]);
    await backend.stop?.();
    await projection?.projector.stop();
    throw err;
  }
  logger.info({ address, store: config.store, mode: config.store.kind === 'kube' ? config.mode : undefined }, 'certshare started');
  domains.start();
  await backend.start?.();
  watcher.start();
  served?.start();
  let stopping: Promise<void> | undefined;
  const { manager, health, metrics, events } = parts;
  const stop = (): Promise<void> => (stopping ??= stopDaemon(parts, config.shutdownTimeoutMs));
  return { address, logger, manager, health, metrics, watcher, role: backend.role, events, stop };
}

/** The daemon's parts, each built from its own settings by buildParts (the --tls pair is read as it listens); stopDaemon stops them. */
interface DaemonParts {
  clock: Clock;
  logger: Logger;
  events: EventEmitter;
  metrics: Metrics;
  health: HealthState;
  delivery: ProxyDelivery;
  /** --out-dir in Kubernetes mode: the files the certificates are projected to, and their projector. */
  projection: { files: CertDirectory; projector: Projector } | undefined;
  /** The store: a directory, or Kubernetes mode (its start-up checks run as it is built). */
  backend: StoreBackend;
  watcher: CertDomainsWatcher;
  domains: ManagedDomains;
  served: ServedRotation | undefined;
  ari: AriChecker | undefined;
  manager: LoopSupervisor;
  serveConfig: ServeConfigWatcher | undefined;
  rotationExit: RotationExit;
  /** /healthz and /metrics. */
  http: DaemonListener;
}

/**
 * The first phase: each part's settings worked out from the configuration once (part-settings.ts), then every
 * part built from its own settings and handed the parts it uses; none is started.
 * Kubernetes mode's start-up checks run as its backend is built (everything that can refuse the
 * configuration runs before any loop or watcher starts), and the served check, ARI and Kubernetes mode
 * are loaded only when the configuration turns them on: a replica pays for the code it runs (docs/performance.md).
 */
async function buildParts(
  config: DaemonConfig,
  given: { clock: Clock; env: NodeJS.ProcessEnv },
  input: Pick<DaemonDeps, 'logger' | 'localApi' | 'heapSaving'>,
): Promise<DaemonParts> {
  const settings = partSettings(config);
  const { clock } = given;
  const logger = input.logger ?? createLogger(settings.log.level, undefined, settings.log.format);
  const deps = { ...given, logger };
  const metrics = new Metrics(clock, settings.metrics);
  const health = new HealthState();
  // Keyed by the certificates held: the loops report them to it as to every observer.
  const routingProofs = settings.routingProofs ? new RoutingProofs(clock) : undefined;
  const events = new EventEmitter();
  const delivery = proxyDelivery(settings.delivery, {
    clock,
    logger,
    onStart: () => events.emit('reloading'),
    onFilesWritten: (domain, path) => events.emit('filesWritten', { domain, path }),
    onOutcome: reloadReport(metrics, events),
  });
  const { filesWritten } = delivery;
  // --out-dir (Kubernetes mode): each certificate also written as files there, as the dir store writes them.
  const files = settings.projection ? new CertDirectory(settings.projection, clock) : undefined;
  const projection = files ? { files, projector: new Projector(files, { clock, logger, health, onWritten: filesWritten }) } : undefined;
  // The start of the grace for what every start goes through (tailscaled not listening yet, the first issuance),
  // before the store's start-up checks.
  const startup = new StartupGrace(clock, settings.startupGraceMs);
  // The storage mode: a directory, or Kubernetes (its start-up checks run as it is built).
  const storeDeps = { ...deps, metrics, health, filesWritten, projection, routingProofs };
  const backend =
    settings.store.kind === 'kube'
      ? await loadKubeBackend(storeDeps, settings.store.settings)
      : await dirBackend(settings.store.path, settings.store.podName, storeDeps);
  const { localApi, watcher } = tailscaledSource(settings.tailscaled, { clock, logger, startup, localApi: input.localApi, metrics, health });
  const domains = new ManagedDomains(settings.domains, logger, input.heapSaving ?? heapSavingSwitch());
  // --advertise-services serve-config: the ServeConfig's Services as last read (its watcher reads it first at start-up).
  let serveConfigServices: readonly string[] = [];
  const served = settings.served
    ? (await import('../served/served-rotation.ts')).createServedRotation(settings.served, {
        ...deps,
        health,
        registry: metrics.registry,
        localApi,
        certDomains: watcher,
        domains: () => domains.current,
        serveConfigServices: () => serveConfigServices,
        onServedChange: backend.servedChanged,
        onServiceDomainWait: backend.serviceDomainWait,
      })
    : undefined;
  // What the proxy serves while certshare reloads it proves nothing; a reload certshare ran may have put the proxy
  // right: check what it serves once it ended, not at the next recheck.
  events.on('reloading', () => served?.checker.reloading());
  events.on('reloaded', (outcome: ReloadOutcome) => served?.checker.reloaded(outcome.ok && !outcome.skipped));
  // Leaving rotation and the listener that answers GET /leave-rotation, built as soon as what they are handed
  // (the store, the served rotation) exists.
  const rotationExit = new RotationExit(settings.leave, { clock, logger, backend, served });
  const routes = { ...(routingProofs ? { routingProofs } : {}), ...rotationExit.route() };
  const onTlsServed = (serial: string): boolean => events.emit('tlsServed', { serial });
  const http = daemonListener(settings.http, { ...deps, health, metrics, onTlsServed, secretSource: secretPairSource, ...routes });
  const onServices = (services: string[]): void => {
    serveConfigServices = services;
    served?.advertiser?.notify();
  };
  const serveConfig = followServeConfig(settings.serveConfig, { logger, domains, health, onServices });
  const extraObservers = [eventsObserver(events), ...(routingProofs ? [routingProofs] : []), ...(served ? [served.observer] : []), ...delivery.observers];
  const availability = served?.serviceDomains?.availability ?? watcher;
  // ARI wakes a loop whose renewal window the CA moved (called once the loops exist).
  const wake = (domain: string): void => manager.loop(domain)?.wake();
  const ari = settings.ari
    ? await (await import('../acme/ari-checker.ts')).ariChecker(settings.ari, { ...deps, role: backend.role, metrics, health, wake })
    : undefined;
  const manager = certificateLoops(settings.loops, { ...deps, startup, backend, metrics, health, localApi, availability, ari, extraObservers });
  domains.drive(manager, ari, health);
  logHealthChanges(health, clock, logger);
  return { clock, logger, events, metrics, health, delivery, projection, backend, watcher, domains, served, ari, manager, serveConfig, rotationExit, http };
}

/** A reload of the proxy ended: counted, and emitted as `reloaded`. */
function reloadReport(metrics: Metrics, events: EventEmitter): (o: ReloadOutcome) => void {
  return (o) => {
    metrics.reloads.inc({ method: o.method, result: o.skipped ? 'skipped' : o.ok ? 'success' : 'failure' });
    events.emit('reloaded', o);
  };
}

async function stopDaemon(p: DaemonParts, shutdownTimeoutMs: number): Promise<void> {
  const { clock, logger, manager, backend } = p;
  logger.info({}, 'stopping');
  const stopStart = clock.now();
  // Tailnet clients first: the Services are withdrawn and control given time to move them, within the
  // shutdown bound less what the rest of the stop needs (nothing left to do when a preStop hook asked).
  await p.rotationExit.leaveRotation(shutdownTimeoutMs);
  // No CertPair call starts from here on; those under way end and are stored, and what the store lost is
  // put back, before the role is handed over.
  const issuanceSettled = manager.stopIssuing();
  const remainingMs = shutdownTimeoutMs - (clock.now() - stopStart);
  await backend.beforeStop?.((signal) => issuanceSettled.then(() => manager.verifyStored(signal)), remainingMs);
  p.serveConfig?.stop();
  await Promise.all([manager.stop(), p.watcher.stop(), p.http.stopFollowing(), p.ari?.stop(), p.served?.stop()]);
  await backend.stop?.();
  await p.projection?.projector.stop();
  await p.delivery.stop();
  await p.http.close();
  logger.info({}, 'stopped');
}
