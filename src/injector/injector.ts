// The injector: the mutating admission webhook that adds certshare to Pods, serving TLS from its own CA
// (rotated with overlap by src/injector/controller.ts) and reloading it without restarts; its start. Its flags and
// configuration: src/config/injector-options.ts. `certshare injector` runs it (src/cli/injector-command.ts).
import { EventEmitter } from 'node:events';
import { CustomObjectsApi } from '../kube/transport/client-node.ts';
import { emptyRotationState } from '../core/injector-ca/ca-rotation.ts';
import { systemClock, type Clock } from '../core/ports/clock.ts';
import { CertshareError, errorMessage } from '../core/errors.ts';
import type { Logger } from '../core/ports/logger.ts';
import { connectKube, type KubeConnection } from '../kube/connection.ts';
import { LeaseElector } from '../kube/lease-elector.ts';
import { makeApi } from '../kube/transport/https-transport.ts';
import type { TlsChoice } from '../config/daemon-config.ts';
import type { InjectorConfig } from '../config/injector-options.ts';
import type { InjectionDefaults } from '../config/injection-defaults.ts';
import { followPair, type FollowedPair } from '../tls/followed-pair.ts';
import { secretPairSource } from '../kube/secret-pair-source.ts';
import { InjectorController } from './controller.ts';
import { InjectorMetrics, admissionResult, startMetricsServer } from './injector-metrics.ts';
import { admissionReviewResponse, checkInjectionDefaults, checkSidecarFlags, sidecarForm } from './mutate.ts';
import { serviceDnsNames, type LeafNames } from './pki.ts';
import { checkSidecarFormBounds, keepSidecarForm, publishSidecarForm } from './sidecar-form.ts';
import { startTlsServer, type TlsServer } from './tls-server.ts';

/**
 * The injection's check of the injector's defaults, before anything starts: --sidecar-flags as an admission
 * reads them, then the injection of a Pod that asks for certshare and sets nothing else. Defaults that would
 * refuse every such Pod (an out-dir over the CA bundle's directory, a flag the daemon refuses) are
 * CERTSHARE_BAD_FLAG (exit 2) instead of a webhook that refuses every Pod.
 * @forTests
 */
export function checkDefaults(defaults: InjectionDefaults): void {
  try {
    checkSidecarFlags(defaults.sidecarFlags ?? '');
  } catch (err) {
    // The admission's message names the flag as an annotation would: the rule is what follows.
    throw new CertshareError('CERTSHARE_BAD_FLAG', { flag: '--sidecar-flags', rule: errorMessage(err).replace('--sidecar-flags: ', '') });
  }
  try {
    checkInjectionDefaults(defaults);
  } catch (err) {
    throw new CertshareError('CERTSHARE_BAD_FLAG', {
      flag: "the injector's defaults (--default-*, --sidecar-*)",
      rule: `would refuse every Pod that asks for certshare: ${errorMessage(err)}`,
    });
  }
}

/** @forTests */
export interface Injector {
  server: TlsServer;
  controller: InjectorController;
  elector: LeaseElector;
  metrics: InjectorMetrics;
  metricsPort: number;
  /**
   * `metricsTlsServed` ({ serial }): a renewed --metrics-tls pair is served from the next handshake on;
   * `sidecarFormPublished`: the writer wrote the sidecar's form again.
   */
  events: EventEmitter;
  stop(): Promise<void>;
}

/** --metrics-tls: the pair /metrics serves, followed as it is renewed (`metricsTlsServed` {serial} on `events`). */
function followMetricsTls(tls: TlsChoice, deps: { logger: Logger; env: NodeJS.ProcessEnv; clock: Clock }, events: EventEmitter): Promise<FollowedPair> {
  return followPair(tls, {
    secretSource: secretPairSource,
    logger: deps.logger,
    clock: deps.clock,
    env: deps.env,
    flag: 'metrics-tls',
    what: '/metrics',
    onServed: (serial) => events.emit('metricsTlsServed', { serial }),
  });
}

export async function startInjector(
  config: InjectorConfig,
  deps: { logger: Logger; env: NodeJS.ProcessEnv; clock?: Clock; defaultMetrics?: boolean },
): Promise<Injector> {
  checkDefaults(config.defaults);
  // Before the webhook answers: the policy holding hand-written certshare containers to this form reads it.
  const form = sidecarForm(config.defaults);
  checkSidecarFormBounds(form);
  const clock = deps.clock ?? systemClock;
  const events = new EventEmitter();
  const metricsPairs = config.metricsTls ? await followMetricsTls(config.metricsTls, { ...deps, clock }, events) : undefined;
  const connection = await connectKube(deps.env, { requestTimeoutMs: config.kubeTimeoutMs });
  try {
    await publishSidecarForm(connection, connection.namespace, form, AbortSignal.timeout(config.kubeTimeoutMs));
  } catch (err) {
    connection.close();
    throw err;
  }
  const namespace = config.serviceNamespace ?? connection.namespace;
  const names: LeafNames = { dnsNames: [...serviceDnsNames(config.service, namespace), ...config.extraDnsNames], ipAddresses: config.extraIps };
  let controller: InjectorController | undefined;
  const metrics = new InjectorMetrics(() => controller?.state ?? emptyRotationState([]), {
    defaultMetrics: deps.defaultMetrics ?? true,
    writer: () => elector.canIssue(),
  });
  const elector = injectorElector(config, connection, { clock, logger: deps.logger, metrics });
  const server = await startWebhook(config, metrics);
  controller = new InjectorController({
    connection,
    custom: makeApi(connection.config, CustomObjectsApi),
    clock,
    logger: deps.logger,
    writer: elector,
    policy: config.policy,
    targets: config.targets,
    caSecret: config.caSecret,
    tlsSecret: config.tlsSecret,
    names,
    serve: (pair) => server.setPair(pair),
    resyncMs: config.resyncMs,
    onOutOfBounds: (where, value) => metrics.outOfBounds(where, value),
  });
  controller.on('action', (action) => metrics.step(action));
  controller.on('failed', (kind) => metrics.failure(kind));
  const metricsListener = await startMetricsServer(metrics, config.metricsListen.host, config.metricsListen.port, metricsPairs?.first);
  metricsPairs?.serveOn((pair) => metricsListener.setPair(pair));
  elector.start();
  controller.start();
  const formKept = keepForm(config, connection, form, elector, { clock, logger: deps.logger }, events);
  deps.logger.info(
    {
      identity: config.identity,
      lease: config.lease,
      port: server.port,
      metricsPort: metricsListener.port,
      targets: config.targets.map((t) => `${t.kind}/${t.name}`),
      names: names.dnsNames,
    },
    'injector started',
  );
  const running = controller;
  return {
    server,
    controller: running,
    elector,
    metrics,
    metricsPort: metricsListener.port,
    events,
    async stop() {
      await Promise.all([running.stop(), formKept.stop()]);
      // Released (best effort, within the kube timeout): another replica writes at once, not after the Lease expires.
      await elector.stop(AbortSignal.timeout(config.kubeTimeoutMs));
      connection.close();
      await Promise.all([server.close({ drainMs: config.drainDelayMs }), metricsListener.close(), metricsPairs?.stop()]);
    },
  };
}

/** The writer keeps the sidecar's form (keepSidecarForm); `sidecarFormPublished` on `events` after each write. */
function keepForm(
  config: InjectorConfig,
  connection: KubeConnection,
  form: Record<string, string>,
  writer: LeaseElector,
  deps: { clock: Clock; logger: Logger },
  events: EventEmitter,
): { stop(): Promise<void> } {
  const { resyncMs, kubeTimeoutMs: timeoutMs } = config;
  const published = () => events.emit('sidecarFormPublished');
  return keepSidecarForm({ connection, namespace: connection.namespace, form, writer, ...deps, resyncMs, timeoutMs, published });
}

/** Who writes the CAs, the leaf and the caBundles: the holder of --lease; a duration read back out of its bound is counted. */
function injectorElector(config: InjectorConfig, connection: KubeConnection, deps: { clock: Clock; logger: Logger; metrics: InjectorMetrics }): LeaseElector {
  const lease = { name: config.lease, identity: config.identity, leaseDurationMs: config.leaseDurationMs };
  return new LeaseElector(lease, {
    connection,
    clock: deps.clock,
    logger: deps.logger.child({ component: 'lease' }),
    onOutOfBounds: (where, value) => deps.metrics.outOfBounds(where, value),
  });
}

/** The webhook's listener: POST /mutate answers each AdmissionReview, counted by result. */
function startWebhook(config: InjectorConfig, metrics: InjectorMetrics): Promise<TlsServer> {
  return startTlsServer({
    host: config.listen.host,
    port: config.listen.port,
    routes: {
      '/mutate': (body) => {
        try {
          const answer = admissionReviewResponse(body, config.defaults);
          metrics.admission(admissionResult(answer));
          return answer;
        } catch (err) {
          metrics.admission('invalid');
          throw err;
        }
      },
    },
  });
}
