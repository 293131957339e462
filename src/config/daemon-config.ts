// What the daemon runs with, whatever door it came in by (flags and environment: src/config/run-options.ts,
// which also holds the one validation of it). A module of its own so that the daemon and its storage
// backends depend on the configuration, not on the CLI.
import type { RenewalSettings } from '../core/loop/certificate-loops.ts';
import type { AriSettings } from '../acme/ari-checker.ts';
import type { PodAddresses } from '../core/values/pod-addresses.ts';
import type { FederationSettings } from '../core/federation/home-settings.ts';
import type { DeliverySettings } from '../delivery/proxy-delivery.ts';
import type { ServedRotationSettings } from '../served/served-rotation.ts';
import type { LogFormat } from '../logging/log-format.ts';
import type { ShareMode, WatchScope } from '../core/ports/store.ts';
import type { TlsChoice } from '../tls/serving-pair.ts';

export { SERVE_CONFIG_SERVICES, advertises } from '../core/served/advertisement.ts';
export type { ShareMode, WatchScope } from '../core/ports/store.ts';
export type { TlsChoice } from '../tls/serving-pair.ts';

export type StoreChoice = { kind: 'dir'; path: string } | { kind: 'kube' };

/** The daemon's whole configuration: the parts' own settings (each declared beside its part) and the rest. */
export interface DaemonConfig extends DeliverySettings, ServedRotationSettings, RenewalSettings, AriSettings {
  localapi: string;
  domains: string[];
  serveConfig: string | undefined;
  store: StoreChoice;
  /** --listen, parsed: where /healthz and /metrics listen. */
  listen: { host: string; port: number };
  /** /healthz and /metrics over HTTPS with this pair, reloaded on change; plain HTTP when undefined. */
  tls: TlsChoice | undefined;
  /** The platform's namespace holding one shared ledger per registered domain; undefined: a ledger per group. */
  budgetNamespace?: string | undefined;
  /** --federation-*: the federation home (docs/federation.md); undefined: none, this cluster alone. */
  federation?: FederationSettings | undefined;
  logLevel: string;
  logFormat: LogFormat;
  /** Expected start-up states (tailscaled not listening, the first issuance running) log at info this long (core/loop/startup-grace.ts). */
  startupGraceMs: number;
  /** Kubernetes mode. */
  mode: ShareMode;
  group: string | undefined;
  watchScope: WatchScope;
  outDir: string | undefined;
  readinessGate: string | undefined;
  /** The gate turns False this long before a certificate expires (bounded by its lifetime; renewal.ts rotationExitTime). */
  readinessLeadMs: number;
  routingChecks: string[];
  /** --leave-token: GET /leave-rotation with this token leaves rotation (a preStop hook); undefined: no such route. */
  leaveToken: string | undefined;
  routingAttempts: number;
  drainDelayMs: number;
  leaseDurationMs: number;
  shutdownTimeoutMs: number;
  /** POD_NAME (downward API metadata.name). */
  podName: string | undefined;
  /** POD_IPS / POD_IP, parsed once. */
  pod: PodAddresses;
}
