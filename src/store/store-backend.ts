// The contract between the daemon and a storage mode, and the directory mode (Kubernetes mode: src/kube/kube-backend.ts,
// loaded on demand): a module of its own, below both, so that the daemon and each mode depend on it, not on each other.
import type { Clock } from '../core/ports/clock.ts';
import type { LoopObserver } from '../core/ports/observer.ts';
import type { LedgerStore } from '../core/issuance/issuance-budget.ts';
import { staticRole, type CertStore, type IssuanceRole } from '../core/ports/store.ts';
import { CertDirectory, type FilesHealth } from './cert-directory.ts';
import { DirStore } from './dir-store.ts';
import { DirLedgerStore } from './dir-ledger.ts';

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

/** --store dir: the certificate directory as the store and its `.state/` ledger; this process always writes. */
export async function dirBackend(
  path: string,
  podName: string | undefined,
  deps: { clock: Clock; health: FilesHealth; filesWritten: (domain: string, path: string) => void },
): Promise<StoreBackend> {
  const directory = new CertDirectory(path, deps.clock);
  await directory.prepare();
  const store = new DirStore(directory, deps.clock, deps.filesWritten, deps.health);
  return { store, ledger: new DirLedgerStore(path), role: staticRole(podName ?? 'standalone', true), observers: [] };
}
