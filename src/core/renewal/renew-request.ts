// Renew now: an operator asks once (certshare renew <domain>, or the request annotation on the domain's
// Secret) for exactly one new certificate with a new key. The decision is a rule of the chain
// (issuance-policy.ts renewRequestRule); this module holds what the loop does for it: ask the budget for
// a slot, record a refusal, and the texts. A request is identified by its id (what the operator wrote);
// the writer records the id it answered, with the certificate that serves it (one write), or with the
// refusal, so that asking again while one is pending is one request and a restart does not serve it twice.
import { errorMessage, errorText } from '../errors.ts';
import { RENEW_RESERVE, type IssuanceBudget, type RenewLeft } from '../issuance/issuance-budget.ts';
import type { RenewBudgetAnswer, RenewRefusal } from '../issuance/issuance-policy.ts';
import type { Logger } from '../ports/logger.ts';
import type { LoopObserver, RenewOutcome } from '../ports/observer.ts';
import type { CertStore, RenewAnswer } from '../ports/store.ts';
import { isRenewId } from '../values/untrusted-values.ts';
import { iso } from '../ports/clock.ts';

/**
 * The pending request of a record: the id asked for, unless it is the one answered. An id that is empty,
 * too long or not printable ASCII is no request (a hand edit must not make the writer issue).
 */
export function pendingRenewRequest(requested: string | undefined, answered: string | undefined): string | undefined {
  const id = requested?.trim();
  if (!id || !isRenewId(id)) return undefined;
  return id === answered?.trim() ? undefined : id;
}

/** A new request id: the instant it was asked, and a random part so that two operators never collide. */
export function newRenewRequestId(now: number, random: string): string {
  return `${iso(now)}/${random}`;
}

/** The answer recorded for a certificate that served a request, with what the name limit leaves (certshare renew prints it). */
export function issuedAnswer(id: string, serial: string, left?: RenewLeft): RenewAnswer {
  if (!left) return { id, outcome: `issued ${serial}` };
  const limit = `${left.of.count} per ${left.of.windowMs / 3_600_000} h, ${RENEW_RESERVE} kept for renewals`;
  const next = left.left > 0 ? `${left.left} more renew request(s) possible now` : `no more renew request before ${iso(left.until)}`;
  return { id, outcome: `issued ${serial}; name limit (${limit}): ${next}` };
}

/** What a refusal says, with its code (CERTSHARE_RENEW_RESERVE for the name's reserve, else CERTSHARE_RENEW_REFUSED). */
export function refusalText(domain: string, id: string, reason: RenewRefusal, detail: { until: number; registeredDomain?: string }): string {
  const until = iso(detail.until);
  if (reason === 'name_reserve') return `CERTSHARE_RENEW_RESERVE ${errorText('CERTSHARE_RENEW_RESERVE', { id, domain, reserve: RENEW_RESERVE, until })}`;
  const why =
    reason === 'min_interval'
      ? `a new certificate was obtained less than the minimum interval (--first-retry) ago; ask again after ${until}`
      : `the issuance budget for ${detail.registeredDomain ?? domain} has no free slot; the next frees at ${until}`;
  return `CERTSHARE_RENEW_REFUSED ${errorText('CERTSHARE_RENEW_REFUSED', { id, domain, reason, why })}`;
}

/** Asks the budget for a renew request's slot; a ledger we cannot use is never a free slot. */
export async function askRenewBudget(
  budget: IssuanceBudget | undefined,
  domain: string,
  request: string,
  signal: AbortSignal,
  onUnusable: (err: unknown) => number,
): Promise<RenewBudgetAnswer> {
  if (!budget) return { kind: 'not_needed' };
  try {
    return await budget.requestRenewal(domain, request, signal);
  } catch (err) {
    if (signal.aborted) throw err;
    return { kind: 'unusable', failures: onUnusable(err) };
  }
}

interface RefusalDeps {
  store: CertStore;
  observer: Required<LoopObserver>;
  logger: Logger;
}

/**
 * Records a refusal on the store (the request is answered: the operator asks again later) and reports it.
 * Returns 'recorded', 'conflict' (the record changed since it was read: decide again on a fresh read), or
 * the failure, after which the request is still pending and is decided again.
 */
export async function refuseRenewRequest(
  deps: RefusalDeps,
  domain: string,
  refusal: { id: string; reason: RenewRefusal; message: string },
  signal: AbortSignal,
): Promise<'recorded' | 'conflict' | { failed: unknown }> {
  const { store, observer, logger } = deps;
  try {
    await store.recordRenewAnswer?.(domain, { id: refusal.id, outcome: `refused ${refusal.message}` }, signal);
  } catch (err) {
    if (signal.aborted) throw err;
    if ((err as { code?: string }).code === 'CERTSHARE_STORE_CONFLICT') return 'conflict';
    logger.warn({ err: errorMessage(err) }, 'could not record the refusal of a renew request');
    return { failed: err };
  }
  logger.warn(
    { code: refusal.reason === 'name_reserve' ? 'CERTSHARE_RENEW_RESERVE' : 'CERTSHARE_RENEW_REFUSED', request: refusal.id, reason: refusal.reason },
    refusal.message,
  );
  const outcome: RenewOutcome = { id: refusal.id, result: 'refused', reason: refusal.reason, message: refusal.message };
  observer.renewRequest(domain, outcome);
  return 'recorded';
}

/** One line for /healthz?verbose about the last request answered for a domain. */
export function describeRenewOutcome(outcome: RenewOutcome): string {
  return outcome.result === 'issued'
    ? `renew request ${outcome.id}: served with certificate ${outcome.serial}`
    : `renew request ${outcome.id}: ${outcome.message}`;
}
