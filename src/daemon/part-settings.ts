// What each part of the daemon is told of the configuration, worked out once before any part is built: a part
// is handed its own settings and nothing else, and what several parts share (when a certificate leaves
// rotation, for the readiness gate, the served check's advertisement and the federation home) is derived
// here, once. The types are each part's own (declared beside it); this file only picks and derives.
import type { DaemonConfig } from '../config/daemon-config.ts';
import type { ValidityEnd } from '../core/loop/health.ts';
import type { RenewalSettings } from '../core/loop/certificate-loops.ts';
import { rotationExitTime, type RenewalPolicy } from '../core/renewal/renewal.ts';
import type { DeliverySettings } from '../delivery/proxy-delivery.ts';
import type { AriSettings } from '../acme/ari-checker.ts';
import type { ServedRotationSettings } from '../served/served-rotation.ts';
import type { KubeSettings } from '../kube/kube-backend.ts';
import type { ServeConfigSettings } from '../localapi/serve-config-watcher.ts';
import type { HttpSettings } from '../http/daemon-listener.ts';
import type { LeaveSettings } from '../http/rotation-exit.ts';
import type { LogFormat } from '../logging/log-format.ts';

/** The daemon's parts and the settings each is built with. */
interface PartSettings {
  /** --log-level and --log-format: the daemon's logger (logging/pino-logger.ts). */
  log: { level: string; format: LogFormat };
  /** Expected start-up states log at info this long (core/loop/startup-grace.ts). */
  startupGraceMs: number;
  /** The metrics' renewal points (http/daemon-metrics.ts). */
  metrics: RenewalPolicy;
  delivery: DeliverySettings;
  /** --out-dir in Kubernetes mode: the certificates projected as files too (delivery/projector.ts); undefined: none. */
  projection: string | undefined;
  /** Where certificates are kept: a directory (POD_NAME names its writer), or Kubernetes with its own settings. */
  store: { kind: 'dir'; path: string; podName: string | undefined } | { kind: 'kube'; settings: KubeSettings };
  tailscaled: { localapi: string; certTimeoutMs: number };
  domains: string[];
  /** --served-check and the advertisement; undefined without --served-check. */
  served: (ServedRotationSettings & { validityEnd: ValidityEnd }) | undefined;
  /** ARI; undefined with --acme-directory none. */
  ari: (AriSettings & { acmeDirectory: string }) | undefined;
  loops: RenewalSettings;
  serveConfig: ServeConfigSettings;
  /** --routing-check: the proofs of routing given and received are kept (http/routing-proof.ts). */
  routingProofs: boolean;
  /** /healthz and /metrics: where they listen, and over HTTPS with `tls`. */
  http: HttpSettings;
  /** Leaving rotation: by the stop, or GET /leave-rotation with `token` (undefined: no such route). */
  leave: LeaveSettings;
}

export function partSettings(config: DaemonConfig): PartSettings {
  const { renewal, readinessLeadMs } = config;
  // When a certificate leaves rotation: the readiness lead before its notAfter (renewal.ts rotationExitTime).
  const validityEnd: ValidityEnd = (held) => rotationExitTime(held, renewal, readinessLeadMs);
  const { acmeDirectory, ariIntervalMs, servedCheck } = config;
  return {
    log: { level: config.logLevel, format: config.logFormat },
    startupGraceMs: config.startupGraceMs,
    metrics: renewal,
    delivery: pick(config, ['reloadCommand', 'reloadTimeoutMs', 'reloadSignal', 'reloadPidFile', 'haproxyCrtDir', 'haproxySocket']),
    projection: config.store.kind === 'kube' ? config.outDir : undefined,
    store: config.store.kind === 'kube' ? { kind: 'kube', settings: kubeSettings(config, validityEnd) } : { ...config.store, podName: config.podName },
    tailscaled: { localapi: config.localapi, certTimeoutMs: config.certTimeoutMs },
    domains: config.domains,
    served: servedCheck ? { ...servedSettings(config), validityEnd } : undefined,
    ari: acmeDirectory ? { acmeDirectory, ariIntervalMs } : undefined,
    loops: pick(config, ['renewal', 'backoff', 'certTimeoutMs', 'issuanceConcurrency', 'issuanceBudget', 'nameLimit', 'readinessLeadMs']),
    serveConfig: { serveConfig: config.serveConfig, advertiseServices: config.advertiseServices },
    routingProofs: config.routingChecks.length > 0,
    http: { listen: config.listen, pod: config.pod, tls: config.tls },
    leave: { token: config.leaveToken, failoverMs: config.advertiseFailoverMs, drainDelayMs: config.drainDelayMs },
  };
}

/** Kubernetes mode's settings: the store, the writer's Lease, the readiness gate and the federation home. */
function kubeSettings(config: DaemonConfig, validityEnd: ValidityEnd): KubeSettings {
  const { mode, group, watchScope, podName, leaseDurationMs, budgetNamespace, renewal, readinessLeadMs, federation } = config;
  const gate = config.readinessGate
    ? {
        conditionType: config.readinessGate,
        routingChecks: config.routingChecks,
        routingAttempts: config.routingAttempts,
        ownIPv4: config.pod.ipv4,
        validityEnd,
      }
    : undefined;
  const home = federation ? { ...federation, renewal, readinessLeadMs, certTimeoutMs: config.certTimeoutMs } : undefined;
  return { mode, group, watchScope, podName, leaseDurationMs, budgetNamespace, gate, federation: home };
}

function servedSettings(config: DaemonConfig): ServedRotationSettings {
  return pick(config, [
    'servedCheck',
    'servedCheckIntervalMs',
    'servedCheckTimeoutMs',
    'servedStaleAfterMs',
    'advertiseServices',
    'advertiseFailoverMs',
    'advertiseAgent',
    'advertiseBootstrap',
    'advertiseLeftToFile',
  ]);
}

/** The named settings of the configuration, and no other. */
function pick<K extends keyof DaemonConfig>(config: DaemonConfig, keys: readonly K[]): Pick<DaemonConfig, K> {
  return Object.fromEntries(keys.map((key) => [key, config[key]])) as Pick<DaemonConfig, K>;
}
