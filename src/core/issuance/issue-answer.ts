// What a CertPair call asks for (its min_validity), and the acceptance of its answer without I/O: what the
// pair tailscaled returned means for the loop that asked (issuance-policy.ts judgeAnswer on the parsed pair).
// A pair that is unusable as asked throws its CertshareError, which the loop handles as a failed call.
import { checkValidAt, inspectCertPair, type CertInfo } from '../certificates/certificate.ts';
import { CertshareError } from '../errors.ts';
import { held } from '../loop/held-certificate.ts';
import { ariVerdictOf, forcesNewOrder, judgeAnswer, type IssuanceSnapshot, type IssueReason } from './issuance-policy.ts';
import type { Logger } from '../ports/logger.ts';
import { ariMinValidityMs, describeAriAnswer } from '../renewal/renewal-info.ts';
import type { CertPair } from '../ports/localapi.ts';
import { minValidityFor, usableLifetime, type RenewalPolicy } from '../renewal/renewal.ts';
import type { StoredCert } from '../ports/store.ts';

/** What a CertPair call asked for, and why. */
export interface Asked {
  minValidityMs: number;
  minIssueIntervalMs: number;
  reason: IssueReason;
  /** The renew request the call answers, if any (its id). */
  serving?: string | undefined;
}

export type AcceptedAnswer =
  /** The certificate held, returned again (tailscaled's cache) and not due: nothing new. */
  | { kind: 'unchanged' }
  /** A newer certificate, usable now or from its notBefore; `tooShort` when it is due again (almost) at once. */
  | { kind: 'new'; cert: StoredCert; usableAt: 'now' | 'not_before'; tooShort: string | undefined }
  /** A new certificate that expires before the one held: a failure, unless it is too short (then a backoff). */
  | { kind: 'older'; info: CertInfo; tooShort: string | undefined };

/** What the answer `pair` to a call for `domain` is worth at `now`, against the certificate held before it. */
export function acceptAnswer(
  pair: CertPair,
  domain: string,
  previous: StoredCert | undefined,
  now: number,
  renewal: Pick<RenewalPolicy, 'renewFraction'>,
  asked: { minValidityMs: number; minIssueIntervalMs: number; reason?: IssueReason },
): AcceptedAnswer {
  const info = inspectCertPair(pair, domain);
  // Valid now, except a new pair whose validity merely starts later (the issuer's clock is ahead).
  if (info.serial === previous?.info.serial || now >= info.notBefore || info.notBefore >= info.notAfter) checkValidAt(info, now);
  const verdict = judgeAnswer(info, previous && { ...held(previous), serial: previous.info.serial }, now, renewal, asked);
  switch (verdict.kind) {
    case 'due_again':
      throw new CertshareError('CERTSHARE_CERT_STALE', { returned: 'the certificate due for renewal', detail: `serial ${info.serial}` });
    case 'unchanged':
      // A replacement an operator asked for got the certificate held back (tailscaled orders anew only for
      // one with less validity left than asked, and a certificate this young has more than any min_validity
      // a fresh one allows). Not done: a failed call, so the pending request is tried after the backoff,
      // never at once. (The CA's request is settled by the call whatever it gave: one order per certificate.)
      if (asked.reason === 'operator_requested') throw new CertshareError('CERTSHARE_CERT_STALE', { returned: 'the certificate held', detail: asked.reason });
      return { kind: 'unchanged' };
    case 'older':
      return { kind: 'older', info, tooShort: verdict.tooShort };
    default:
      return { kind: 'new', cert: { pair, info, obtainedAt: Math.max(info.notBefore, now) }, usableAt: verdict.usableAt, tooShort: verdict.tooShort };
  }
}

/**
 * The min_validity of a CertPair call: the expiry rule's (renewal.ts minValidityFor), or for a renewal the
 * CA or an operator asked for, one that makes tailscaled order anew even for a certificate with most of its
 * life left (renewal-info.ts ariMinValidityMs), capped by what a fresh certificate from this issuer has. A
 * forced renewal is logged with who asked.
 */
export function minValidityOf(
  previous: StoredCert | undefined,
  reason: IssueReason,
  ctx: { now: number; renewal: RenewalPolicy; freshValidityMs: number | undefined; ari: () => IssuanceSnapshot['ari']; log: Logger },
): number {
  const { now, renewal, freshValidityMs, log } = ctx;
  if (!previous || !forcesNewOrder(reason)) return minValidityFor(previous && held(previous), now, renewal, freshValidityMs);
  if (reason === 'operator_requested') {
    log.info({ serial: previous.info.serial }, 'an operator asked for this certificate to be replaced (renew request); renewing');
  } else {
    const ari = ariVerdictOf({ now, ari: ctx.ari() });
    log.info(
      { reason, serial: previous.info.serial, ...(ari.kind === 'silent' ? {} : { ari: describeAriAnswer(ari.answer) }) },
      'the CA asked for this certificate to be replaced (ACME Renewal Information); renewing',
    );
  }
  return ariMinValidityMs(previous.info, now, freshValidityMs ?? usableLifetime(held(previous)));
}
