import { CertshareError, errorMessage } from '../errors.ts';
import { LocalApiError } from '../ports/localapi.ts';

/** How an issuance failure is treated: each kind has its own retry schedule. */
export type FailureKind =
  | 'rate_limited' // ACME said too many certificates: wait Retry-After, or back off conservatively
  | 'invalid_domain' // tailscaled does not (yet) serve this name: no point asking again soon
  | 'transient' // no answer (socket, timeout, reset): retry soon, the CA was probably never reached
  | 'rejected' // an answer arrived but the pair failed validation
  | 'too_short' // a renewal returned a certificate that is due again too soon: asking again at once would issue again
  | 'error'; // any other error answer

export interface ClassifiedFailure {
  kind: FailureKind;
  retryAfterMs?: number;
  message: string;
}

const ACME_RATE_LIMIT = /rateLimited|too many certificates|rate limit/i;

/**
 * What a failed CertPair call was, for its retry schedule. A CertPair call fails with a LocalApiError (the
 * call) or a CertshareError of the loop's own checks (CERT_INVALID, CERT_STALE); a too-short certificate is
 * not a failure of the call (the loop classifies it itself).
 */
export function classifyIssuanceFailure(err: unknown): ClassifiedFailure {
  if (err instanceof LocalApiError) {
    const message = err.body ? `${err.message}: ${err.body}` : err.message;
    if (err.status === 429 || ACME_RATE_LIMIT.test(err.body)) {
      return err.retryAfterMs !== undefined ? { kind: 'rate_limited', retryAfterMs: err.retryAfterMs, message } : { kind: 'rate_limited', message };
    }
    switch (err.code) {
      // A 200 whose body was not a usable pair has no error status: a rejection, not a transport failure.
      case 'CERTSHARE_LOCALAPI_BAD_RESPONSE':
        return { kind: 'rejected', message };
      case 'CERTSHARE_LOCALAPI_UNREACHABLE':
      case 'CERTSHARE_LOCALAPI_TIMEOUT':
        return { kind: 'transient', message };
    }
    if (/invalid domain/i.test(err.body)) return { kind: 'invalid_domain', message };
    if (err.status === 502 || err.status === 503 || err.status === 504) return { kind: 'transient', message };
    return { kind: 'error', message };
  }
  if (err instanceof CertshareError && (err.code === 'CERTSHARE_CERT_INVALID' || err.code === 'CERTSHARE_CERT_STALE')) {
    return { kind: 'rejected', message: err.message };
  }
  return { kind: 'error', message: errorMessage(err) };
}
