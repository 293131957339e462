// What the daemon runs with, whatever door it came in by (flags and environment: src/cli/run-options.ts,
// which also holds the one validation of it). A module of its own so that the daemon and its storage
// backends depend on the configuration, not on the CLI.
import type { BackoffPolicy } from '../core/backoff.ts';
import type { BudgetLimit } from '../core/issuance-budget.ts';
import type { PodAddresses } from '../core/pod-addresses.ts';
import type { RenewalPolicy } from '../core/renewal.ts';
import type { ReloadSpec } from '../delivery/reload-command.ts';

export type StoreChoice = { kind: 'dir'; path: string } | { kind: 'kube' };
export type ShareMode = 'rw' | 'ro' | 'auto';

export interface DaemonConfig {
  localapi: string;
  domains: string[];
  serveConfig: string | undefined;
  store: StoreChoice;
  listen: string;
  reloadCommand: ReloadSpec | undefined;
  reloadTimeoutMs: number;
  renewal: RenewalPolicy;
  backoff: BackoffPolicy;
  certTimeoutMs: number;
  /** First issuances per registered domain per window (Let's Encrypt's 50 per 7 days); undefined: no budget. */
  issuanceBudget: BudgetLimit | undefined;
  logLevel: string;
  /** Kubernetes mode. */
  mode: ShareMode;
  group: string | undefined;
  outDir: string | undefined;
  readinessGate: string | undefined;
  routingChecks: string[];
  routingAttempts: number;
  drainDelayMs: number;
  leaseDurationMs: number;
  shutdownTimeoutMs: number;
  /** POD_NAME (downward API metadata.name). */
  podName: string | undefined;
  /** POD_IPS / POD_IP, parsed once. */
  pod: PodAddresses;
}
