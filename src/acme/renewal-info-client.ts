// The CA's side of ACME Renewal Information (RFC 9773): the directory's `renewalInfo` URL, then
// GET <renewalInfo>/<certID>. Node's fetch (undici) verifies the server against Node's CA store, which
// includes NODE_EXTRA_CA_CERTS as read at process start: that is how a private ACME CA is trusted
// (test/acme/renewal-info-client.test.ts proves it in a child process). Every call has a timeout and the
// caller's AbortSignal; every failure is a typed outcome with a CERTSHARE_ code, never a throw, so the
// expiry rule stays in force whatever the CA answers. Only the caller's abort throws (its reason).
import { CertshareError, type ErrorCode, errorMessage } from '../core/errors.ts';
import { isHttpUrl } from '../core/http-url.ts';
import { type AriCertificate, type RenewalInfo, parseRenewalInfo } from '../core/renewal-info.ts';
import { parseRetryAfter } from '../core/retry-after.ts';

export const LETS_ENCRYPT_DIRECTORY = 'https://acme-v02.api.letsencrypt.org/directory';
export const DEFAULT_ARI_TIMEOUT_MS = 30_000;
/** Larger than any directory or renewalInfo answer (Let's Encrypt's directory is under 1 KiB). */
const MAX_BODY_BYTES = 64 * 1024;

/** The outcome labels of `certshare_ari_checks_total`. */
export const ARI_CHECK_OUTCOMES = ['ok', 'not_found', 'unavailable', 'timeout', 'bad_response', 'unsupported'] as const;
export type AriCheckOutcome = (typeof ARI_CHECK_OUTCOMES)[number];

export type AriCheck =
  | { outcome: 'ok'; info: RenewalInfo; retryAfterMs: number | undefined }
  | { outcome: Exclude<AriCheckOutcome, 'ok'>; code: ErrorCode; message: string; retryAfterMs: number | undefined };

const OUTCOME_OF: Partial<Record<ErrorCode, Exclude<AriCheckOutcome, 'ok'>>> = {
  CERTSHARE_ARI_NOT_FOUND: 'not_found',
  CERTSHARE_ARI_UNAVAILABLE: 'unavailable',
  CERTSHARE_ARI_TIMEOUT: 'timeout',
  CERTSHARE_ARI_BAD_RESPONSE: 'bad_response',
  CERTSHARE_ARI_UNSUPPORTED: 'unsupported',
};

export interface RenewalInfoClientOptions {
  /** The ACME directory URL (--acme-directory). */
  directoryUrl: string;
  /** Deadline of one request, headers and body. Default 30 s. */
  timeoutMs?: number;
  /** Wall clock: when an answer was received, HTTP-date Retry-After values. Default Date.now. */
  now?: () => number;
}

type AriHttpCode = 'CERTSHARE_ARI_NOT_FOUND' | 'CERTSHARE_ARI_UNAVAILABLE';

/** An HTTP failure carrying the CA's Retry-After, so the next check can honour it. */
class AriHttpError extends CertshareError<AriHttpCode> {
  readonly retryAfterMs: number | undefined;
  constructor(code: AriHttpCode, message: string, retryAfterMs: number | undefined) {
    super(code, message);
    this.retryAfterMs = retryAfterMs;
  }
}

export class RenewalInfoClient {
  readonly #directoryUrl: string;
  readonly #timeoutMs: number;
  readonly #now: () => number;
  /** The directory's renewalInfo URL once read; asked again after a failure. */
  #renewalInfoUrl: string | undefined;

  constructor(options: RenewalInfoClientOptions) {
    this.#directoryUrl = options.directoryUrl;
    this.#timeoutMs = options.timeoutMs ?? DEFAULT_ARI_TIMEOUT_MS;
    this.#now = options.now ?? Date.now;
  }

  /** The CA's renewal information for `cert`. Throws only the reason of `signal` when it aborts. */
  async check(cert: AriCertificate, signal?: AbortSignal): Promise<AriCheck> {
    try {
      const base = await this.renewalInfoUrl(signal);
      const url = `${base.replace(/\/+$/, '')}/${encodeURIComponent(cert.certId)}`;
      const { body, retryAfterMs } = await this.#get(url, 'renewalInfo', signal, (status) => (status === 404 ? 'CERTSHARE_ARI_NOT_FOUND' : undefined));
      return { outcome: 'ok', info: parseRenewalInfo(body, cert, this.#now()), retryAfterMs };
    } catch (err) {
      if (signal?.aborted) throw signal.reason;
      const code = err instanceof CertshareError ? err.code : 'CERTSHARE_ARI_UNAVAILABLE';
      return {
        outcome: OUTCOME_OF[code] ?? 'unavailable',
        code: OUTCOME_OF[code] ? code : 'CERTSHARE_ARI_UNAVAILABLE',
        message: errorMessage(err),
        retryAfterMs: err instanceof AriHttpError ? err.retryAfterMs : undefined,
      };
    }
  }

  /** The directory's renewalInfo URL, read once; throws a CertshareError (CERTSHARE_ARI_*). */
  async renewalInfoUrl(signal?: AbortSignal): Promise<string> {
    if (this.#renewalInfoUrl !== undefined) return this.#renewalInfoUrl;
    const { body } = await this.#get(this.#directoryUrl, 'ACME directory', signal, () => undefined);
    let directory: unknown;
    try {
      directory = JSON.parse(body);
    } catch {
      throw new CertshareError('CERTSHARE_ARI_BAD_RESPONSE', `ACME directory ${this.#directoryUrl} is not JSON`);
    }
    const renewalInfo = typeof directory === 'object' && directory !== null ? (directory as { renewalInfo?: unknown }).renewalInfo : undefined;
    if (typeof renewalInfo !== 'string' || !isHttpUrl(renewalInfo)) {
      throw new CertshareError('CERTSHARE_ARI_UNSUPPORTED', `ACME directory ${this.#directoryUrl} names no renewalInfo URL: the CA does not offer ARI`);
    }
    this.#renewalInfoUrl = renewalInfo;
    return renewalInfo;
  }

  /** GET with the deadline and the caller's signal over headers and body; a non-200 status throws. */
  async #get(
    url: string,
    what: string,
    signal: AbortSignal | undefined,
    codeFor: (status: number) => AriHttpCode | undefined,
  ): Promise<{ body: string; retryAfterMs: number | undefined }> {
    const deadline = AbortSignal.timeout(this.#timeoutMs);
    const combined = signal ? AbortSignal.any([signal, deadline]) : deadline;
    try {
      const res = await fetch(url, { signal: combined, redirect: 'follow', headers: { accept: 'application/json' } });
      const retryAfterMs = parseRetryAfter(res.headers.get('retry-after') ?? undefined, this.#now());
      if (res.status !== 200) {
        await res.body?.cancel().catch(() => {});
        const code = codeFor(res.status) ?? 'CERTSHARE_ARI_UNAVAILABLE';
        throw new AriHttpError(code, `${what} ${url} answered HTTP ${res.status}`, retryAfterMs);
      }
      return { body: await readCapped(res, `${what} ${url}`), retryAfterMs };
    } catch (err) {
      if (signal?.aborted) throw signal.reason;
      if (deadline.aborted) throw new CertshareError('CERTSHARE_ARI_TIMEOUT', `${what} ${url} took longer than ${this.#timeoutMs} ms`, { cause: err });
      if (err instanceof CertshareError) throw err;
      throw new CertshareError('CERTSHARE_ARI_UNAVAILABLE', `${what} ${url} unreachable: ${causeMessage(err)}`, { cause: err });
    }
  }
}

async function readCapped(res: Response, what: string): Promise<string> {
  const reader = res.body?.getReader();
  if (!reader) return '';
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > MAX_BODY_BYTES) {
      await reader.cancel().catch(() => {});
      throw new CertshareError('CERTSHARE_ARI_BAD_RESPONSE', `${what} answered more than ${MAX_BODY_BYTES} bytes`);
    }
    chunks.push(value);
  }
  return Buffer.concat(chunks).toString('utf8');
}

/** fetch's own message is "fetch failed"; the reason (a refused connection, an unknown CA) is its cause. */
function causeMessage(err: unknown): string {
  const cause = err instanceof Error ? err.cause : undefined;
  return cause === undefined ? errorMessage(err) : `${errorMessage(err)}: ${errorMessage(cause)}`;
}
