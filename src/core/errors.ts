// Stable error codes for everything a user can see in a log line, a health reason or an exit message.
export type ErrorCode =
  | 'CERTSHARE_BAD_FLAG'
  | 'CERTSHARE_BAD_CONFIG'
  | 'CERTSHARE_BAD_DOMAIN'
  | 'CERTSHARE_CERT_INVALID'
  | 'CERTSHARE_CERT_STALE'
  | 'CERTSHARE_CERT_TOO_SHORT'
  | 'CERTSHARE_LOCALAPI_UNREACHABLE'
  | 'CERTSHARE_LOCALAPI_TIMEOUT'
  | 'CERTSHARE_LOCALAPI_HTTP'
  // A 4xx other than 408/429: an answer that retrying cannot change (a refused watch mask, access denied, no such endpoint).
  | 'CERTSHARE_LOCALAPI_REFUSED'
  | 'CERTSHARE_LOCALAPI_BAD_RESPONSE'
  | 'CERTSHARE_BUS_LINE_TOO_LONG'
  | 'CERTSHARE_BUS_BAD_LINE'
  | 'CERTSHARE_STORE_UNAVAILABLE'
  | 'CERTSHARE_STORE_CONFLICT'
  | 'CERTSHARE_STORE_CORRUPT'
  | 'CERTSHARE_RELOAD_FAILED'
  | 'CERTSHARE_KUBE_HTTP'
  | 'CERTSHARE_KUBE_RESPONSE_TOO_LARGE'
  | 'CERTSHARE_KUBE_TIMEOUT'
  | 'CERTSHARE_BAD_ANNOTATION';

export class CertshareError extends Error {
  readonly code: ErrorCode;
  constructor(code: ErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'CertshareError';
    this.code = code;
  }
}

export function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
