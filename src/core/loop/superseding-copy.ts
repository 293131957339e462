// While a writer's CertPair call is under way, the store's watch may bring a copy that makes the call pointless
// (issuance-policy.ts copySupersedesCall): a federation member's break-glass certificate pushed to the home while
// the home's writer waits on a hung call, another writer's renewal. Waiting for the call (up to its timeout)
// would leave an expired certificate in the Secret and the files while a valid one is at hand; the call is
// cancelled instead, and the loop's next turn takes the copy as any other read.
import { errorMessage } from '../errors.ts';
import { copySupersedesCall } from '../issuance/issuance-policy.ts';
import { type Clock, iso } from '../ports/clock.ts';
import type { Logger } from '../ports/logger.ts';
import type { CertStore, StoreRead } from '../ports/store.ts';
import type { HeldValidity, RenewalPolicy } from '../renewal/renewal.ts';

interface SupersedingCopyDeps {
  domain: string;
  store: Pick<CertStore, 'watch'>;
  clock: Clock;
  renewal: Pick<RenewalPolicy, 'renewFraction'>;
  log: Logger;
  /** The store's record, its times bounded as every read of the loop (untrusted-values.ts). */
  read: (signal: AbortSignal) => Promise<StoreRead>;
}

/**
 * Watches the store for the length of one call: aborts `call` at the first read holding a copy that supersedes
 * it, `replaced` being the certificate the call replaces. Returns the unsubscribe, which also ends a read under way. A failed read changes nothing
 * (the call goes on; the loop's next turn reads the store again).
 */
export function watchForSupersedingCopy(deps: SupersedingCopyDeps, replaced: Pick<HeldValidity, 'notAfter'> | undefined, call: AbortController): () => void {
  const { domain, store, clock, renewal, log } = deps;
  if (!store.watch) return () => {};
  const watching = new AbortController();
  const readSignal = AbortSignal.any([call.signal, watching.signal]);
  let reading = false;
  let changedAgain = false;
  const look = async (): Promise<void> => {
    if (reading) {
      changedAgain = true;
      return;
    }
    reading = true;
    try {
      do {
        changedAgain = false;
        const read = await deps.read(readSignal);
        if (readSignal.aborted) return;
        if (read.state !== 'valid' || !copySupersedesCall(read.cert.info, replaced, clock.now(), renewal)) continue;
        const { serial, notAfter } = read.cert.info;
        log.info({ serial, notAfter: iso(notAfter) }, 'a valid certificate reached the store during the CertPair call: cancelling the call, using it');
        call.abort();
      } while (changedAgain && !readSignal.aborted);
    } catch (err) {
      if (!readSignal.aborted) log.debug({ err: errorMessage(err) }, 'store unreadable during the CertPair call; the call goes on');
    } finally {
      reading = false;
    }
  };
  const off = store.watch(domain, () => void look());
  return () => {
    watching.abort();
    off();
  };
}
