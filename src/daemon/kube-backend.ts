// Kubernetes mode, the StoreBackend (src/daemon/store-backend.ts) the daemon loads on demand: Secrets as the store, a
// Lease for the writer, the Pod's Events and readiness gate, an optional projection of the files.
import { readFile } from 'node:fs/promises';
import { CertshareError, errorMessage } from '../core/errors.ts';
import { defaultTrustAnchors, trustAnchors, type TrustAnchors } from '../core/certificates/trust.ts';
import { rotationExitTime } from '../core/renewal/renewal.ts';
import { staticRole, type IssuanceRole, type ShareMode, type WatchScope } from '../core/ports/store.ts';
import type { FederationSettings } from '../core/federation/home-settings.ts';
import type { RenewalPolicy } from '../core/renewal/renewal.ts';
import type { BackendContext, StoreBackend } from './store-backend.ts';
import { CertDirectory } from '../store/cert-directory.ts';
import type { Federation } from '../kube/federation-home.ts';
import { Projector } from '../delivery/projector.ts';
import { connectKube, type KubeConnection } from '../kube/connection.ts';
import { ReadinessGate } from '../kube/readiness-gate.ts';
import { podTerminationProbe } from '../kube/pod-terminating.ts';
import { readinessRouting } from '../kube/readiness-routing.ts';
import { KubeSecretStore, type StoreTrust } from '../kube/secret-store.ts';
import { LeaseElector, leaseIdentity } from '../kube/lease-elector.ts';
import { KubeLedgerStore } from '../kube/ledger-store.ts';
import { EventRecorder } from '../kube/event-recorder.ts';
import { PodEvents } from '../kube/pod-events.ts';

/** What the shutdown bound keeps back, after leaving rotation and the drain delay, for stopping the rest. */
const STOP_RESERVE_MS = 1000;

/** The settings of Kubernetes mode, and only those (the daemon picks them out of its configuration: daemon.ts kubeSettings). */
export interface KubeSettings {
  mode: ShareMode;
  group: string | undefined;
  watchScope: WatchScope;
  /** POD_NAME: the Pod whose Events, readiness condition and termination certshare follows; undefined: none. */
  podName: string | undefined;
  /** --out-dir: the certificates projected as files too. */
  outDir: string | undefined;
  leaseDurationMs: number;
  budgetNamespace: string | undefined;
  /** When a certificate leaves rotation (renewal.ts rotationExitTime), for the readiness gate and the federation home. */
  renewal: RenewalPolicy;
  readinessLeadMs: number;
  /** --readiness-gate: the Pod's own condition and its routing check; undefined: none. */
  gate: GateSettings | undefined;
  federation: FederationSettings | undefined;
}

/** --readiness-gate with --routing-check and --routing-attempts; `ownIPv4` from POD_IPS. */
interface GateSettings {
  conditionType: string;
  routingChecks: string[];
  routingAttempts: number;
  ownIPv4: string | undefined;
}

/** The backend's context and its own settings. */
type KubeContext = BackendContext & { settings: KubeSettings };

/** Kubernetes mode: Secrets as the store, the Pod's own readiness gate, an optional file projection. */
export async function createKubeBackend(backend: BackendContext, settings: KubeSettings): Promise<StoreBackend> {
  const ctx: KubeContext = { ...backend, settings };
  const { deps, metrics } = ctx;
  const { logger, env } = deps;
  const connection = await connectKube(env);
  const podName = settings.podName;
  const files = settings.outDir ? new CertDirectory(settings.outDir) : undefined;
  // A federated group's pairs count only if they chain to the trust anchors, in the member's Secret too.
  const anchors = settings.federation ? await federationAnchors(settings.federation.trustAnchors) : undefined;
  const recorder = podName ? eventRecorder(ctx, connection, podName) : undefined;
  const podEvents = recorder ? new PodEvents((occurrence) => recorder.record(occurrence)) : undefined;
  const trust = (where: 'home' | 'local'): StoreTrust | undefined =>
    anchors && {
      anchors,
      onUntrusted: (domain, serial) => {
        metrics.untrusted.inc({ domain, store: where });
        podEvents?.untrusted(domain, serial, where);
      },
    };
  const store = localSecretStore(ctx, connection, files, trust('local'));
  // A start-up check: in group scope a Role without list/watch on the namespace's Secrets is fatal here.
  await store.start();
  const identity = podName ?? `certshare-${process.pid}`;
  const elector = settings.mode === 'auto' ? leaseElector(ctx, connection, identity, podEvents) : undefined;
  if (!elector) metrics.writer.set(settings.mode === 'rw' ? 1 : 0);
  const localRole = elector ?? staticRole(identity, settings.mode === 'rw');
  const federation = settings.federation ? await federate(ctx, store, localRole, identity, podEvents, trust('home')) : undefined;
  const role = federation?.role ?? localRole;
  const projector = files ? new Projector(files, logger, ctx.filesWritten) : undefined;
  // validateConfig: a readiness gate has POD_NAME, a routing check an IPv4 in POD_IPS.
  const gate = settings.gate && podName ? readinessGate(ctx, settings.gate, connection, podName, projector, podEvents) : undefined;
  logger.info(
    {
      namespace: connection.namespace,
      mode: settings.mode,
      group: settings.group,
      watchScope: settings.watchScope,
      readinessGate: settings.gate?.conditionType,
    },
    'kubernetes mode',
  );

  return {
    store: federation?.store ?? store,
    ledger: new KubeLedgerStore(federation?.connection ?? connection, settings.group, { budgetNamespace: settings.budgetNamespace }),
    role,
    observers: [...(projector ? [projector] : []), ...(podEvents ? [podEvents.observer] : [])],
    async start() {
      elector?.start();
      federation?.start();
      gate?.start();
    },
    ...(podEvents
      ? {
          servedChanged: (domain: string, report: { outcome: string; verdict: { verdict: string }; stale: boolean }, description: string) =>
            podEvents.served(domain, report.outcome, report.verdict.verdict !== 'bad' && !report.stale, description),
          serviceDomainWait: (domain: string, text: string | undefined) => podEvents.serviceDomainWait(domain, text),
        }
      : {}),
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
      await projector?.idle();
    },
  };
}

/** The KubeSecretStore of this cluster's Secrets (the group's, or only those it is asked for). */
function localSecretStore(ctx: KubeContext, connection: KubeConnection, files: CertDirectory | undefined, trust: StoreTrust | undefined): KubeSecretStore {
  const { settings, deps, metrics } = ctx;
  return new KubeSecretStore({
    connection,
    clock: deps.clock,
    logger: deps.logger.child({ component: 'secret-store' }),
    group: settings.group,
    writer: settings.podName,
    watchScope: settings.watchScope,
    onError: (operation) => metrics.storeErrors.inc({ operation }),
    earlierCopies: files,
    trust,
  });
}

/** The parts the backend's beforeStop takes out of rotation, settles and stops, each when it is there. */
interface HandOverParts {
  gate: ReadinessGate | undefined;
  federation: Federated | undefined;
  elector: LeaseElector | undefined;
  recorder: EventRecorder | undefined;
  logger: BackendContext['deps']['logger'];
}

async function handOver(parts: HandOverParts, settleIssuance: (signal: AbortSignal) => Promise<void>, remainingMs: number): Promise<void> {
  const { gate, federation, elector, recorder, logger } = parts;
  // Out of rotation first; then hand the writer role over, so a successor renews at once. Both are
  // best effort against an API server that may not answer: together they get --shutdown-timeout less
  // a reserve, so the process still exits within it. No drain wait here: as a native sidecar certshare
  // gets SIGTERM only after the proxy has exited (measured on the real cluster: tailscaled's SIGTERM at
  // .270, certshare's at .340); the drain is the proxy's preStop sleep, which the injector gives it.
  const budgetMs = Math.max(0, remainingMs - STOP_RESERVE_MS);
  const budget = AbortSignal.timeout(Math.round(budgetMs));
  await gate?.leaveRotation(budget);
  // A certificate being issued is stored, and one the store lost is put back, before the role goes:
  // else the successor issues the domain again.
  const settled = settleIssuance(budget).catch((err: unknown) => logger.warn({ err: errorMessage(err) }, 'could not settle issuance before handing over'));
  await Promise.race([settled, new Promise((resolve) => budget.addEventListener('abort', resolve, { once: true }))]);
  await federation?.stop(budget);
  await elector?.stop(budget);
  // What the shutdown recorded (NotReady, LostWriter) is sent within what is left of the budget.
  await recorder?.stop(budget);
}

/**
 * Events about the Pod, when certshare knows which (POD_NAME; POD_UID, downward API metadata.uid, lets
 * `kubectl describe pod` find them: it selects Events by the Pod's uid).
 */
function eventRecorder(ctx: KubeContext, connection: KubeConnection, podName: string): EventRecorder {
  const { clock, logger, env } = ctx.deps;
  return new EventRecorder({
    connection,
    regarding: { name: podName, uid: env.POD_UID || undefined },
    instance: podName,
    clock,
    logger: logger.child({ component: 'events' }),
    onDropped: () => ctx.metrics.eventsDropped.inc(),
  });
}

/** --mode auto: the writer elected with the group's Lease. */
function leaseElector(ctx: KubeContext, connection: KubeConnection, identity: string, podEvents: PodEvents | undefined): LeaseElector {
  const { settings, metrics } = ctx;
  return new LeaseElector({
    connection,
    name: `certshare-${settings.group!}`, // validateConfig: --mode auto has a group
    identity: leaseIdentity(identity),
    clock: ctx.deps.clock,
    logger: ctx.deps.logger.child({ component: 'lease' }),
    leaseDurationMs: settings.leaseDurationMs,
    onLeadershipChange: (leader) => {
      metrics.writer.set(leader ? 1 : 0);
      podEvents?.writer(leader);
    },
  });
}

/** --readiness-gate: the Pod's own condition, with the routing check of --routing-check when given. */
function readinessGate(
  ctx: KubeContext,
  gate: GateSettings,
  connection: KubeConnection,
  podName: string,
  projector: Projector | undefined,
  podEvents: PodEvents | undefined,
): ReadinessGate {
  const { settings } = ctx;
  const { clock, logger } = ctx.deps;
  const urls = gate.routingChecks;
  return new ReadinessGate({
    connection,
    podName,
    conditionType: gate.conditionType,
    health: ctx.health,
    validityEnd: (held) => rotationExitTime(held, settings.renewal, settings.readinessLeadMs),
    ...(projector ? { settled: () => projector.idle() } : {}),
    clock,
    logger: logger.child({ component: 'readiness-gate' }),
    ...(podEvents ? { onPatched: (status: 'True' | 'False', reason: string, message: string) => podEvents.readiness(status, reason, message) } : {}),
    ...(urls.length > 0
      ? { routing: readinessRouting({ urls, ownIPv4: gate.ownIPv4, attempts: gate.routingAttempts, proofs: ctx.routingProofs, logger }) }
      : {}),
  });
}

/**
 * --federation-trust-anchors: the file's CA certificates (the pin), else Node's CA store. An unreadable file
 * or one without a certificate is CERTSHARE_BAD_CONFIG, at start.
 */
async function federationAnchors(file: string | undefined): Promise<TrustAnchors> {
  if (file === undefined) return defaultTrustAnchors();
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    throw new CertshareError(
      'CERTSHARE_BAD_CONFIG',
      { source: '--federation-trust-anchors', reason: `cannot read ${file}: ${errorMessage(err)}` },
      { cause: err },
    );
  }
  return trustAnchors([text], file);
}

/** A federation home's pieces (federation.ts) and how the backend stops them. */
interface Federated {
  store: Federation['store'];
  role: Federation['role'];
  connection: KubeConnection;
  start(): void;
  stop(signal: AbortSignal): Promise<void>;
  close(): Promise<void>;
}

/**
 * --federation-kubeconfig: a second connection, to the home, with the same store and Lease code as the
 * local ones. Its start-up check refuses an unknown group, missing rights or garbage (CERTSHARE_HOME_UNUSABLE).
 */
async function federate(
  ctx: KubeContext,
  local: KubeSecretStore,
  localRole: IssuanceRole,
  identity: string,
  podEvents: PodEvents | undefined,
  trust: StoreTrust | undefined,
): Promise<Federated> {
  const { settings, metrics } = ctx;
  const { clock, logger, env } = ctx.deps;
  const f = settings.federation!;
  const group = settings.group!; // validateConfig: a home needs a group
  // Loaded only with a home: every other replica leaves the federation's code out (docs/performance.md).
  const { Federation, checkHome } = await import('../kube/federation-home.ts');
  const connection = await connectKube(env, { kubeconfig: f.kubeconfig, namespace: f.namespace });
  const log = logger.child({ component: 'federation', cluster: f.cluster });
  try {
    await checkHome(connection, group, log, { clock });
  } catch (err) {
    connection.close();
    throw err;
  }
  const homeStore = new KubeSecretStore({
    connection,
    clock,
    logger: log.child({ component: 'home-secret-store' }),
    group,
    writer: `${f.cluster}/${identity}`,
    onError: (operation) => metrics.storeErrors.inc({ operation: `home_${operation}` }),
    trust,
  });
  const federation = new Federation({
    home: { connection, store: homeStore },
    local: { store: local, role: localRole },
    group,
    identity: leaseIdentity(`${f.cluster}/${identity}`),
    clock,
    logger: log,
    leaseDurationMs: f.leaseDurationMs,
    renewal: settings.renewal,
    readinessLeadMs: settings.readinessLeadMs,
    onBreakGlass: (domain, serial) => {
      metrics.breakGlass.inc({ domain });
      podEvents?.breakGlass(domain, serial);
    },
    onHomeWriterChange: (leader) => {
      metrics.homeWriter.set(leader ? 1 : 0);
      podEvents?.writer(leader, 'home');
    },
  });
  log.info({ home: connection.namespace }, 'federation home configured');
  return {
    store: federation.store,
    role: federation.role,
    connection,
    start: () => federation.start(),
    stop: (signal) => federation.stop(signal),
    async close() {
      await federation.stop();
      await homeStore.stop();
      connection.close();
    },
  };
}
