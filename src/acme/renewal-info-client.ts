// The CA's side of ACME Renewal Information (RFC 9773): the directory's `renewalInfo` URL, then
// GET <renewalInfo>/<certID>. Over node:http(s), not fetch: fetch loads Node's bundled undici, ~14 MB of
// RSS in every replica for two small GETs a day (npm run bench). node:https verifies the server against
// Node's CA store, which includes NODE_EXTRA_CA_CERTS as read at process start: that is how a private ACME
// CA is trusted (test/integration/renewal-info-client.test.ts proves it in a child process). Every call has a timeout and the
// caller's AbortSignal; every failure is a typed outcome with a CERTSHARE_ code, never a throw, so the
// expiry rule stays in force whatever the CA answers. Only the caller's abort throws (its reason).
import type { IncomingMessage } from 'node:http';
import { CertshareError, type ErrorCode, errorMessage } from '../core/errors.ts';
import { isHttpUrl } from '../core/values/http-url.ts';
import { type AriCertificate, type RenewalInfo, parseRenewalInfo } from '../core/renewal/renewal-info.ts';
import { parseRetryAfter } from '../core/renewal/retry-after.ts';

export const LETS_ENCRYPT_DIRECTORY = 'https://acme-v02.api.letsencrypt.org/directory';
const DEFAULT_ARI_TIMEOUT_MS = 30_000;
/** Larger than any directory or renewalInfo answer (Let's Encrypt's directory is under 1 KiB). */
const MAX_BODY_BYTES = 64 * 1024;
/** Identifies certshare to the CA, as RFC 8555 6.1 asks of ACME clients. */
const USER_AGENT = 'certshare';
/** Redirects followed per GET (a CA's directory may move); more is a broken server. */
const MAX_REDIRECTS = 5;

/** The outcome labels of `certshare_ari_checks_total`. */
export const ARI_CHECK_OUTCOMES = ['ok', 'not_found', 'unavailable', 'timeout', 'bad_response', 'unsupported'] as const;
export type AriCheckOutcome = (typeof ARI_CHECK_OUTCOMES)[number];

/** @forTests */
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

interface RenewalInfoClientOptions {
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
  constructor(code: AriHttpCode, request: string, url: string, status: number, retryAfterMs: number | undefined) {
    super(code, { request, url, failure: `answered HTTP ${status}` });
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
    const { body } = await this.#get(this.#directoryUrl, 'directory', signal, () => undefined);
    let directory: unknown;
    try {
      directory = JSON.parse(body);
    } catch {
      throw new CertshareError('CERTSHARE_ARI_BAD_RESPONSE', { request: 'directory', url: this.#directoryUrl, flaw: 'is not JSON' });
    }
    const renewalInfo = typeof directory === 'object' && directory !== null ? (directory as { renewalInfo?: unknown }).renewalInfo : undefined;
    if (typeof renewalInfo !== 'string' || !isHttpUrl(renewalInfo)) {
      throw new CertshareError('CERTSHARE_ARI_UNSUPPORTED', {
        subject: `ACME directory ${this.#directoryUrl}`,
        lack: 'it names no renewalInfo URL: the CA does not offer ARI',
      });
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
      const res = await httpGet(url, combined);
      const retryAfter = res.headers['retry-after'];
      const retryAfterMs = parseRetryAfter(Array.isArray(retryAfter) ? retryAfter[0] : retryAfter, this.#now());
      if (res.statusCode !== 200) {
        res.destroy();
        const code = codeFor(res.statusCode ?? 0) ?? 'CERTSHARE_ARI_UNAVAILABLE';
        throw new AriHttpError(code, what, url, res.statusCode ?? 0, retryAfterMs);
      }
      return { body: await readCapped(res, what, url), retryAfterMs };
    } catch (err) {
      if (signal?.aborted) throw signal.reason;
      if (deadline.aborted) throw new CertshareError('CERTSHARE_ARI_TIMEOUT', { request: what, url, timeoutMs: this.#timeoutMs }, { cause: err });
      if (err instanceof CertshareError) throw err;
      throw new CertshareError('CERTSHARE_ARI_UNAVAILABLE', { request: what, url, failure: `unreachable: ${errorMessage(err)}` }, { cause: err });
    }
  }
}

/**
 * GET `url` (http: or https:, node:https verifying against Node's CA store), following redirects; resolves
 * with the response, its body unread. `signal` aborts the request and the body's reading.
 */
async function httpGet(url: string, signal: AbortSignal): Promise<IncomingMessage> {
  let target = new URL(url);
  for (let redirects = 0; ; redirects++) {
    const { request } = target.protocol === 'https:' ? await import('node:https') : await import('node:http');
    const res = await new Promise<IncomingMessage>((resolve, reject) => {
      // RFC 8555 6.1: an ACME client MUST send a User-Agent (pebble answers 400 without one; fetch sent "node").
      request(target, { method: 'GET', signal, headers: { accept: 'application/json', 'user-agent': USER_AGENT } }, resolve)
        .on('error', reject)
        .end();
    });
    const location = res.headers.location;
    if (res.statusCode === undefined || res.statusCode < 300 || res.statusCode > 399 || location === undefined) return res;
    res.destroy();
    if (redirects === MAX_REDIRECTS) throw new Error(`more than ${MAX_REDIRECTS} redirects`);
    target = new URL(location, target);
    if (target.protocol !== 'https:' && target.protocol !== 'http:') throw new Error(`redirected to ${target.protocol} URL`);
  }
}

async function readCapped(res: IncomingMessage, what: string, url: string): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of res as AsyncIterable<Buffer>) {
    size += chunk.byteLength;
    if (size > MAX_BODY_BYTES) {
      res.destroy();
      throw new CertshareError('CERTSHARE_ARI_BAD_RESPONSE', { request: what, url, flaw: `answered more than ${MAX_BODY_BYTES} bytes` });
    }
    chunks.push(chunk);
  }
  return Buffer.concat(chunks).toString('utf8');
}
