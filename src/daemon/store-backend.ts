// The contract between the daemon and a storage mode (the directory store in src/daemon/daemon.ts, Kubernetes
// in src/daemon/kube-backend.ts, loaded on demand): a module of its own so that neither imports the other.
import type { Clock } from '../core/ports/clock.ts';
import type { HealthState } from '../core/loop/health.ts';
import type { LocalApi } from '../core/ports/localapi.ts';
import type { Logger } from '../core/ports/logger.ts';
import type { LoopObserver } from '../core/ports/observer.ts';
import type { LedgerStore } from '../core/issuance/issuance-budget.ts';
import type { CertStore, IssuanceRole } from '../core/ports/store.ts';
import type { Metrics } from '../http/daemon-metrics.ts';
import type { RoutingProofSource } from '../http/routing-proof.ts';

export interface DaemonDeps {
  logger: Logger;
  env: NodeJS.ProcessEnv;
  clock?: Clock;
  /** Replaces the LocalAPI transport (tests). */
  localApi?: LocalApi;
  /** Told the managed domain count on each change; switches V8's heap to save memory (http/heap-saving.ts). */
  heapSaving?: (managedDomains: number) => boolean;
}

/** What a storage mode adds to the daemon: the store, who may issue, extra observers, and its own shutdown. */
export interface StoreBackend {
  store: CertStore;
  /** Where the issuance budget's ledger lives (a group object; `.state/` standalone). */
  ledger: LedgerStore;
  role: IssuanceRole;
  observers: LoopObserver[];
  /** Runs once the certificate loops exist (e.g. to start the readiness gate). */
  start?(): Promise<void>;
  /**
   * First step of a graceful stop: leave rotation. `settleIssuance` (LoopSupervisor.stopIssuing) settles once no
   * CertPair call is under way any more, its certificate is stored and every certificate held is verified
   * in the store (no new call starts): a backend that hands the writer role over waits for it first,
   * within its shutdown budget (the signal); `remainingMs` is what is left of --shutdown-timeout.
   */
  beforeStop?(settleIssuance: (signal: AbortSignal) => Promise<void>, remainingMs: number): Promise<void>;
  /** Take the Pod out of rotation now (the readiness condition False), before the stop; idempotent. */
  leaveRotation?(signal: AbortSignal): Promise<void>;
  /** Whether the Pod is being deleted (its deletionTimestamp); none: no Pod to ask, so GET /leave-rotation never acts. */
  podTerminating?(signal: AbortSignal): Promise<boolean>;
  /** What the proxy serves for a domain changed (the served check): an Event about the Pod in Kubernetes. */
  servedChanged?(domain: string, report: { outcome: string; verdict: { verdict: string }; stale: boolean }, description: string): void;
  /** A Tailscale Service's domain waits for control's grant (the text), or no longer (undefined): an Event. */
  serviceDomainWait?(domain: string, text: string | undefined): void;
  stop?(): Promise<void>;
}

/** What every storage mode is given beside its own settings. */
export interface BackendContext {
  deps: Required<Omit<DaemonDeps, 'localApi' | 'heapSaving'>>;
  metrics: Metrics;
  health: HealthState;
  /** --routing-check: proofs of routing given and received (routing-proof.ts). */
  routingProofs?: RoutingProofSource;
  /** Certificate files changed on disk: logs, then runs the reload command if one is configured. */
  filesWritten(domain: string, path: string): void;
}
