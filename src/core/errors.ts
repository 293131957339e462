// Stable error codes for everything a user can see in a log line, a health reason or an exit message,
// each declared once with what it means (fastify's lib/errors.js does the same). test/unit/errors.test.ts
// keeps the table honest: every code declared is used, every code used is declared.
export const ERROR_CODES = {
  CERTSHARE_BAD_FLAG: 'a flag or environment value is malformed or breaks a rule of the configuration (exit 2)',
  CERTSHARE_BAD_CONFIG: 'a configuration source is unusable: a ServeConfig, a kubeconfig, a store directory, a missing object',
  CERTSHARE_BAD_DOMAIN: 'a name is not a fully qualified domain name and never becomes a file, Secret or request path',
  CERTSHARE_BAD_ANNOTATION: "an injected Pod's certshare.io/* annotation is invalid (the admission is refused)",
  CERTSHARE_CERT_INVALID: 'a certificate pair failed validation (parse, key match, SAN, validity, chain) and was not used',
  CERTSHARE_CERT_STALE: 'tailscaled returned a certificate that is no newer than the one held',
  CERTSHARE_CERT_TOO_SHORT: 'a freshly issued certificate is already due for renewal by the rule (issuer backdates, shortens or is skewed)',
  CERTSHARE_LOCALAPI_UNREACHABLE: "tailscaled's LocalAPI socket or address cannot be reached",
  CERTSHARE_LOCALAPI_TIMEOUT: 'a LocalAPI call took longer than its timeout',
  CERTSHARE_LOCALAPI_HTTP: 'the LocalAPI answered with a server error (5xx) or a rate limit',
  CERTSHARE_LOCALAPI_REFUSED: 'a 4xx other than 408/429: an answer that retrying cannot change (refused mask, access denied, no endpoint)',
  CERTSHARE_LOCALAPI_BAD_RESPONSE: 'the LocalAPI answered with something that is not what the protocol says',
  CERTSHARE_BUS_LINE_TOO_LONG: 'an IPN bus line exceeded the line bound; the stream is reopened',
  CERTSHARE_BUS_BAD_LINE: 'an IPN bus line was not valid Notify JSON and was skipped',
  CERTSHARE_STORE_UNAVAILABLE: 'the store could not be read or written (API outage, 403): never taken as "no certificate"',
  CERTSHARE_STORE_CONFLICT: "a compare-and-swap write lost to another writer's change; the state is read again",
  CERTSHARE_STORE_CORRUPT: 'a stored object is damaged, emptied or edited by hand; it is restored without issuing',
  CERTSHARE_RELOAD_FAILED: 'the reload command failed or timed out (logged and counted, never fatal)',
  CERTSHARE_KUBE_HTTP: 'the Kubernetes API answered with an error status',
  CERTSHARE_KUBE_RESPONSE_TOO_LARGE: 'a Kubernetes API response or watch line exceeded its bound',
  CERTSHARE_KUBE_TIMEOUT: 'a Kubernetes API call took longer than its deadline',
  CERTSHARE_ARI_UNSUPPORTED: 'ACME Renewal Information cannot be asked: the directory names no renewalInfo, or the certificate has no Authority Key Identifier',
  CERTSHARE_ARI_NOT_FOUND: "the CA's renewalInfo endpoint knows no such certificate (404): not issued by this CA, or a wrong --acme-directory",
  CERTSHARE_ARI_UNAVAILABLE: 'the ACME directory or the renewalInfo endpoint could not be reached or answered an error status',
  CERTSHARE_ARI_TIMEOUT: 'an ACME directory or renewalInfo request took longer than its timeout',
  CERTSHARE_ARI_BAD_RESPONSE:
    'an ACME directory or renewalInfo answer is not what RFC 9773 says (malformed JSON, a missing field, an inverted window, a window after expiry)',
  CERTSHARE_FATAL: 'an unexpected error ended the process (exit 1); the message says what',
} as const;

export type ErrorCode = keyof typeof ERROR_CODES;

export class CertshareError extends Error {
  readonly code: ErrorCode;
  /**
   * The server refused the caller (401, 403): asking again cannot succeed until someone changes the
   * credentials or the RBAC. Loops still retry on their backoff (a Role may be fixed); a deadline-bound
   * step such as the verification at stop gives up at once rather than spend the shutdown budget.
   */
  readonly refused: boolean;
  constructor(code: ErrorCode, message: string, options?: { cause?: unknown; refused?: boolean }) {
    super(message, options);
    this.name = 'CertshareError';
    this.code = code;
    this.refused = options?.refused ?? false;
  }
}

/** True when `err` is a refusal of the caller (CertshareError.refused). */
export function isRefusal(err: unknown): boolean {
  return err instanceof CertshareError && err.refused;
}

export function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
