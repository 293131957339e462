// Kubernetes mode, the StoreBackend (src/store/store-backend.ts) the daemon loads on demand: Secrets as the store, the
// writer's role (writer-role.ts), the Pod's Events and readiness gate, joined with the daemon's projection of the files
// when there is one, and handed over at the stop (hand-over.ts). Each part is built in its own file from its own
// settings; this file only joins them.
import type { ShareMode, WatchScope } from '../core/ports/store.ts';
import type { Clock } from '../core/ports/clock.ts';
import type { Logger } from '../core/ports/logger.ts';
import type { HealthState } from '../core/loop/health.ts';
import type { LoopObserver } from '../core/ports/observer.ts';
import type { StoreBackend } from '../store/store-backend.ts';
import type { CertDirectory } from '../store/cert-directory.ts';
import type { KubeMetrics } from './kube-metrics.ts';
import type { RoutingProofSource } from '../core/ports/routing-proof-source.ts';
import type { HomeSettings } from './federation-home.ts';
import { connectKube } from './connection.ts';
import { podReadinessGate, type ReadinessGateSettings } from './readiness-gate.ts';
import { podTerminationProbe } from './pod-terminating.ts';
import { KubeSecretStore } from './secret-store.ts';
import { localWriterRole } from './writer-role.ts';
import { handOver } from './hand-over.ts';
import { KubeLedgerStore } from './ledger-store.ts';
import { podEventRecorder } from './event-recorder.ts';
import { PodEvents } from './pod-events.ts';

/** The settings of Kubernetes mode, and only those (the daemon derives them from its configuration: daemon/part-settings.ts). */
export interface KubeSettings {
  mode: ShareMode;
  group: string | undefined;
  watchScope: WatchScope;
  /** POD_NAME: the Pod whose Events, readiness condition and termination certshare follows; undefined: none. */
  podName: string | undefined;
  leaseDurationMs: number;
  budgetNamespace: string | undefined;
  /** --readiness-gate: the Pod's own condition and its routing check; undefined: none. */
  gate: ReadinessGateSettings | undefined;
  /** --federation-*: the federation home; undefined: none, this cluster alone. */
  federation: HomeSettings | undefined;
}

/** What Kubernetes mode is given beside its settings. */
export interface KubeBackendContext {
  clock: Clock;
  logger: Logger;
  env: NodeJS.ProcessEnv;
  metrics: KubeMetrics;
  health: HealthState;
  /** --routing-check: proofs of routing given and received (http/routing-proof.ts). */
  routingProofs?: RoutingProofSource;
  /**
   * --out-dir: the certificates projected as files too (the daemon's part, delivery/projector.ts): the store reads
   * the earlier copies a replica projected there, and the readiness gate waits for the projection to settle
   * (`idle`: every queued write attempted).
   */
  projection?: { files: CertDirectory; projector: LoopObserver & { idle(): Promise<void> } };
}

/** Kubernetes mode: Secrets as the store, the Pod's own readiness gate, an optional file projection. */
export async function createKubeBackend(ctx: KubeBackendContext, settings: KubeSettings): Promise<StoreBackend> {
  const { clock, logger, metrics } = ctx;
  const connection = await connectKube(ctx.env);
  const { podName, group } = settings;
  const recorder = podName
    ? podEventRecorder({ podName, podUid: ctx.env.POD_UID || undefined }, connection, { clock, logger, onDropped: () => metrics.eventsDropped.inc() })
    : undefined;
  const podEvents = recorder ? new PodEvents((occurrence) => recorder.record(occurrence)) : undefined;
  // Loaded only with a home: every other replica leaves the federation's code out (docs/performance.md). A
  // federated group's pairs count only if they chain to the trust anchors, in the member's Secret too.
  const member = settings.federation
    ? await (await import('./federation-home.ts')).federationMember(settings.federation, group!, { env: ctx.env, clock, logger, metrics, podEvents })
    : undefined;
  const { files, projector } = ctx.projection ?? {};
  // This cluster's Secrets (the group's, or only those it is asked for).
  const store = new KubeSecretStore({
    connection,
    clock,
    logger: logger.child({ component: 'secret-store' }),
    group,
    writer: podName,
    watchScope: settings.watchScope,
    onError: (operation) => metrics.storeErrors.inc({ operation }),
    earlierCopies: files,
    trust: member?.localTrust,
  });
  // A start-up check: in group scope a Role without list/watch on the namespace's Secrets is fatal here.
  await store.start();
  const identity = podName ?? `certshare-${process.pid}`;
  const { elector, localRole } = localWriterRole(settings, connection, identity, { clock, logger, metrics, podEvents });
  const federation = await member?.join({ store, role: localRole, identity, connection });
  // validateConfig: a readiness gate has POD_NAME, a routing check an IPv4 in POD_IPS.
  const gate =
    settings.gate && podName
      ? podReadinessGate(settings.gate, connection, podName, {
          health: ctx.health,
          clock,
          logger,
          proofs: ctx.routingProofs,
          ...(projector ? { settled: () => projector.idle() } : {}),
          ...(podEvents ? { onPatched: (status: 'True' | 'False', reason: string, message: string) => podEvents.readiness(status, reason, message) } : {}),
        })
      : undefined;
  const { mode, watchScope } = settings;
  logger.info({ namespace: connection.namespace, mode, group, watchScope, readinessGate: settings.gate?.conditionType }, 'kubernetes mode');
  return {
    store: federation?.store ?? store,
    ledger: new KubeLedgerStore(federation?.connection ?? connection, group, { budgetNamespace: settings.budgetNamespace }),
    role: federation?.role ?? localRole,
    observers: [...(projector ? [projector] : []), ...(podEvents ? [podEvents.observer] : [])],
    async start() {
      elector?.start();
      federation?.start();
      gate?.start();
    },
    ...(podEvents ? podEventHooks(podEvents) : {}),
    async leaveRotation(signal: AbortSignal) {
      await gate?.leaveRotation(signal);
    },
    ...(podName ? { podTerminating: podTerminationProbe(connection, podName) } : {}),
    beforeStop: (settleIssuance: (signal: AbortSignal) => Promise<void>, remainingMs: number) =>
      handOver({ gate, federation, elector, recorder, logger }, settleIssuance, remainingMs),
    async stop() {
      await gate?.stop();
      await recorder?.stop();
      await store.stop();
      await federation?.close();
      connection.close();
    },
  };
}

/** The served check's changes and a Service domain's wait, as Events about the Pod. */
function podEventHooks(podEvents: PodEvents): Pick<StoreBackend, 'servedChanged' | 'serviceDomainWait'> {
  return {
    servedChanged: (domain, report, description) => podEvents.served(domain, report.outcome, report.verdict.verdict !== 'bad' && !report.stale, description),
    serviceDomainWait: (domain, text) => podEvents.serviceDomainWait(domain, text),
  };
}
