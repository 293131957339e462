// A pair valid only later (its CA's clock ahead of ours, docs/design.md): stored at once beside the served one, so
// that a successor waits for it rather than order the same renewal again; how late one another writer stored may
// start and still be waited for.
import { isCurrentlyValid } from '../certificates/certificate.ts';
import type { CertStore, StoreRead, StoredCert } from '../ports/store.ts';
import { rotationExitTime, type RenewalPolicy } from '../renewal/renewal.ts';
import { held, type HeldCertificate } from './held-certificate.ts';

/**
 * The latest start of a stored pair valid only later that a loop waits for instead of renewing (untrusted-values.ts
 * boundPending): the readiness exit of the newest pair valid now that it holds or `read` offers (renewal.ts
 * rotationExitTime), so what it serves stays in rotation until the pair takes over; with none, the retry cap from
 * now, the longest any recorded wait holds a writer. A pair valid now holds nothing back: it is served at once. Not
 * the safety point: a pair whose writer renewed late in the window, or broke glass (past that point), with a CA
 * clock ahead starts past it, and a successor that did not believe it ordered the window's renewal again (or served
 * nothing once its copy ran out). Undefined for the loop's own pair (it obtained it: its own to wait for).
 */
export function latestPendingStart(
  read: StoreRead,
  loop: Pick<HeldCertificate, 'best' | 'pending'>,
  now: number,
  p: { renewal: Pick<RenewalPolicy, 'renewFraction'>; readinessLeadMs?: number | undefined; retryCapMs: number },
): number | undefined {
  if (read.pending !== undefined && read.pending.info.serial === loop.pending?.info.serial) return undefined;
  let latest: StoredCert | undefined;
  for (const c of [loop.best, read.state === 'valid' ? read.cert : undefined, read.lastValid])
    if (c && isCurrentlyValid(c.info, now) && (!latest || c.info.notAfter > latest.info.notAfter)) latest = c;
  if (!latest) return now + p.retryCapMs;
  return Math.max(now, rotationExitTime(held(latest), p.renewal, p.readinessLeadMs ?? Number.POSITIVE_INFINITY));
}

/** `pending` (the loop's pair valid only later) if the store can keep one and `read` does not hold it. */
export function unstoredPending(pending: StoredCert | undefined, read: StoreRead, store: Pick<CertStore, 'savePending'>): StoredCert | undefined {
  if (!pending || !store.savePending || read.pending?.info.serial === pending.info.serial) return undefined;
  return pending;
}
