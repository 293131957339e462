// Putting a certificate back into the store without issuing: after a hand edit or a deletion (a loop's
// restore), and a stopping writer's last look before it hands the role over (verifyStored).
import { doubling } from '../issuance/backoff.ts';
import type { Clock } from '../ports/clock.ts';
import { CertshareError, errorMessage, isRefusal } from '../errors.ts';
import { mayRestore, storeHolds, type StoreView } from '../issuance/issuance-policy.ts';
import type { IssuanceSlots } from '../issuance/issuance-slots.ts';
import type { Logger } from '../ports/logger.ts';
import type { CertStore, StoreRead, StoredCert } from '../ports/store.ts';

export interface StoreRestoreDeps {
  domain: string;
  store: CertStore;
  issuanceSlots?: IssuanceSlots | undefined;
  clock: Clock;
  log: Logger;
  /** Whether this replica may issue now (issuance-policy.ts mayRestore); undefined: it may. */
  issues?: () => boolean;
}

/** Stored, a conflict (the record changed since it was read), or the failure (logged). */
type RestoreResult = 'stored' | 'conflict' | { failed: unknown };

/** A store read, or the failure streak of a read that failed. */
export type LoadResult = StoreRead | { state: 'unreadable'; failures: number };

export function isConflict(err: unknown): boolean {
  return err instanceof CertshareError && err.code === 'CERTSHARE_STORE_CONFLICT';
}

/** What the rules read of a store read. */
export function storeView(read: LoadResult): StoreView {
  if (read.state === 'unreadable' || read.state === 'absent') return read.state === 'absent' ? { state: 'absent' } : read;
  const record = read.record ? { record: read.record } : {};
  return read.state === 'valid' ? { state: 'valid', notAfter: read.cert.info.notAfter, ...record } : { state: 'unusable', ...record };
}

/**
 * Puts `cert` back into the store, `was` the state it found there. `pending`: a pair valid only later, stored beside
 * the served one (CertStore.savePending); `slotHeld`: the caller holds an issuance slot already (its CertPair call's).
 */
export async function restoreToStore(
  deps: StoreRestoreDeps,
  cert: StoredCert,
  was: StoreView['state'] | 'obtained',
  signal: AbortSignal,
  options: { pending?: boolean; slotHeld?: boolean } = {},
): Promise<RestoreResult> {
  // A write like an issuance's: it takes one of the process's issuance slots (issuance-slots.ts).
  const release = options.slotHeld ? undefined : await deps.issuanceSlots?.acquire(signal);
  try {
    if (options.pending) await deps.store.savePending?.(deps.domain, cert, signal);
    else await deps.store.save(deps.domain, cert, signal);
    deps.log.info(
      { serial: cert.info.serial, was },
      options.pending ? 'stored the certificate valid only later beside the served one' : 'restored certificate to the store',
    );
    return 'stored';
  } catch (err) {
    if (signal.aborted) throw err;
    if (isConflict(err)) return 'conflict';
    deps.log.warn(
      { err: errorMessage(err), serial: cert.info.serial },
      options.pending ? 'could not store the certificate valid only later' : 'could not restore certificate to the store',
    );
    return { failed: err };
  } finally {
    release?.();
  }
}

/**
 * A stopping writer's last look before it hands the role over: reads the store itself (not the watched
 * copy, which may lag) and puts back the certificate `holding()` returns (what the loop holds while it may
 * write) if the store does not hold it (a hand edit, a deletion, or our own save that failed). The
 * successor may never have seen that certificate and would issue the domain again. Failed reads and
 * writes are tried again (100 ms doubling to 2 s) until `signal` ends it: the shutdown budget, not one
 * answer of a flaky API server, decides. A refusal (401, 403) ends it at once: no answer within the budget
 * would differ, and the Pod's stop should not wait the whole grace period on a Role that lacks a verb.
 */
export async function verifyStored(deps: StoreRestoreDeps, holding: () => StoredCert | undefined, signal: AbortSignal): Promise<void> {
  let lastError: unknown;
  for (let attempt = 1; !signal.aborted; attempt++) {
    const best = holding();
    if (!best) return;
    try {
      const read = await deps.store.load(deps.domain, signal, { fresh: true });
      const view = storeView(read);
      if (storeHolds(view, best.info) || !mayRestore(view, best.info, deps.issues?.() ?? true)) return;
      const restored = await restoreToStore(deps, best, read.state, signal);
      if (restored === 'stored') return;
      // A conflict: the record changed since our read; a failure: logged by restoreToStore. Read again.
      if (restored !== 'conflict') lastError = restored.failed;
    } catch (err) {
      lastError = err;
    }
    if (isRefusal(lastError)) break;
    await deps.clock.sleep(doubling(100, attempt, 2000), signal).catch(() => {});
  }
  deps.log.warn({ err: lastError === undefined ? undefined : errorMessage(lastError) }, 'could not verify the stored certificate before handing over');
}
