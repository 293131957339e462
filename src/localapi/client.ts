import http from 'node:http';
import type { ClientRequest, IncomingMessage, OutgoingHttpHeaders } from 'node:http';
import { CertshareError, errorMessage } from '../core/errors.ts';
import { formatGoDuration } from '../core/values/duration.ts';
import { parseRetryAfter } from '../core/renewal/retry-after.ts';
import { isRefusalStatus, LocalApiError } from '../core/ports/localapi.ts';
import type { CertPair, CertPairOptions, IpnNotify, IpnPrefs, LocalApi, MaskedPrefs } from '../core/ports/localapi.ts';
import type { Logger } from '../core/ports/logger.ts';
import { LineSplitter } from './line-splitter.ts';

// HTTP client for tailscaled's LocalAPI, over its unix socket or a TCP base URL.

/** Tailscale-Cap sent when the caller does not choose one (tailcfg.CapabilityVersion of a recent tailscaled). */
const DEFAULT_CLIENT_VERSION_CAP = 131;
const DEFAULT_CERT_TIMEOUT_MS = 5 * 60_000;
const DEFAULT_REQUEST_TIMEOUT_MS = 30_000;
/**
 * The most a LocalAPI answer may hold, per kind (docs/security.md gives the reasoning): each far above what
 * tailscaled sends and far below the sidecar's memory limit. A larger answer is refused, never read whole.
 * A pair: one private key (RSA 4096: 3.3 KB of PEM) and a chain (a leaf with 100 names and two issuers:
 * some 10 KB). Prefs, the status without peers and the cert domains: a few KB, thousands of routes or
 * names at most. A bus line: a Notify, whose NetMap (before tailscaled 1.104) lists every peer at 1-3 KB
 * each, so some thousands of peers; JSON.parse makes a few times its size in objects.
 * @forTests
 */
export const LOCALAPI_ANSWER_BOUNDS = { certPair: 64 * 1024, json: 1024 * 1024, busLine: 8 * 1024 * 1024 } as const;
const LOCALAPI_HOST = 'local-tailscaled.sock';
const MAX_ERROR_BODY_CHARS = 2048;
const ERROR_BODY_READ_BYTES = 16 * 1024;

/** @forTests */
export interface LocalApiClientOptions {
  /** A unix socket path (`/var/run/tailscale/tailscaled.sock`) or an `http://host:port` base URL. */
  address: string;
  /** Sent as `Tailscale-Cap`. */
  clientVersionCap?: number;
  /** Deadline of one CertPair call, headers and body (issuance can take minutes). Default 5 min. */
  certTimeoutMs?: number;
  /** Deadline of the other calls, and of the IPN bus until its response headers arrive. Default 30 s. */
  requestTimeoutMs?: number;
  /** Longest accepted IPN bus line. Default LOCALAPI_ANSWER_BOUNDS.busLine. */
  maxBusLineBytes?: number;
  /** Called for each IPN bus line that is not a JSON object (the line is skipped). Logged when absent. */
  onBadLine?(err: CertshareError): void;
  logger: Logger;
  /** Wall clock for HTTP-date Retry-After values. Default Date.now. */
  now?: () => number;
}

type LocalApiClient = LocalApi & {
  status(signal: AbortSignal): Promise<Record<string, unknown>>;
  tailscaledVersion(): string | undefined;
};

export function createLocalApiClient(options: LocalApiClientOptions): LocalApiClient {
  return new HttpLocalApi(options);
}

interface Target {
  request: http.RequestOptions;
  basePath: string;
  display: string;
}

interface Exchange {
  res: IncomingMessage;
  /** Translates an error seen while reading the body (the first teardown reason wins). */
  mapError(err: unknown): unknown;
  /** Stops the deadline (the IPN bus has none once streaming). */
  stopTimer(): void;
  dispose(): void;
}

class HttpLocalApi implements LocalApiClient {
  readonly #target: Target;
  readonly #headers: OutgoingHttpHeaders;
  readonly #certTimeoutMs: number;
  readonly #requestTimeoutMs: number;
  readonly #maxBusLineBytes: number;
  readonly #onBadLine: ((err: CertshareError) => void) | undefined;
  readonly #logger: Logger;
  readonly #now: () => number;
  #tailscaledVersion: string | undefined;

  constructor(options: LocalApiClientOptions) {
    this.#target = parseAddress(options.address);
    this.#headers = {
      Host: LOCALAPI_HOST,
      'Tailscale-Cap': String(options.clientVersionCap ?? DEFAULT_CLIENT_VERSION_CAP),
    };
    const auth = this.#target.request.auth;
    if (auth) {
      // tsnet's loopback LocalAPI: basic auth plus this header.
      this.#headers.Authorization = `Basic ${Buffer.from(auth).toString('base64')}`;
      this.#headers['Sec-Tailscale'] = 'localapi';
      delete this.#target.request.auth;
    }
    this.#certTimeoutMs = options.certTimeoutMs ?? DEFAULT_CERT_TIMEOUT_MS;
    this.#requestTimeoutMs = options.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
    this.#maxBusLineBytes = options.maxBusLineBytes ?? LOCALAPI_ANSWER_BOUNDS.busLine;
    this.#onBadLine = options.onBadLine;
    this.#logger = options.logger;
    this.#now = options.now ?? Date.now;
  }

  tailscaledVersion(): string | undefined {
    return this.#tailscaledVersion;
  }

  get address(): string {
    return this.#target.display;
  }

  async certPair(domain: string, options: CertPairOptions): Promise<CertPair> {
    const path = `/localapi/v0/cert/${encodeURIComponent(domain)}?type=pair` + `&min_validity=${formatGoDuration(options.minValidityMs)}`;
    const body = await this.#get(path, options.signal, this.#certTimeoutMs, LOCALAPI_ANSWER_BOUNDS.certPair);
    return splitCertPair(body.toString('utf8'));
  }

  async certDomains(signal: AbortSignal): Promise<string[]> {
    const path = '/localapi/v0/cert-domains';
    const value = parseJson(await this.#get(path, signal, this.#requestTimeoutMs, LOCALAPI_ANSWER_BOUNDS.json), path);
    if (value === null) return [];
    if (!Array.isArray(value) || !value.every((d) => typeof d === 'string')) {
      throw badResponse(`GET ${path}`, 'expected a JSON array of strings');
    }
    return value as string[];
  }

  async status(signal: AbortSignal): Promise<Record<string, unknown>> {
    const path = '/localapi/v0/status?peers=false';
    const value = parseJson(await this.#get(path, signal, this.#requestTimeoutMs, LOCALAPI_ANSWER_BOUNDS.json), path);
    if (value === null || typeof value !== 'object' || Array.isArray(value)) {
      throw badResponse(`GET ${path}`, 'expected a JSON object');
    }
    return value as Record<string, unknown>;
  }

  async prefs(signal: AbortSignal): Promise<IpnPrefs> {
    const path = '/localapi/v0/prefs';
    return parsePrefs(await this.#get(path, signal, this.#requestTimeoutMs, LOCALAPI_ANSWER_BOUNDS.json), `GET ${path}`);
  }

  async editPrefs(masked: MaskedPrefs, signal: AbortSignal): Promise<IpnPrefs> {
    const path = '/localapi/v0/prefs';
    const send = { method: 'PATCH', body: JSON.stringify(masked) } as const;
    const body = await this.#get(path, signal, this.#requestTimeoutMs, LOCALAPI_ANSWER_BOUNDS.json, send);
    return parsePrefs(body, `PATCH ${path}`);
  }

  async reloadConfig(signal: AbortSignal): Promise<boolean> {
    const path = '/localapi/v0/reload-config';
    const body = await this.#get(path, signal, this.#requestTimeoutMs, LOCALAPI_ANSWER_BOUNDS.json, { method: 'POST', body: '' });
    // A reload that failed answers 200 with no body on 1.102 (ipn/localapi reloadConfig returns before writing
    // its apitype.ReloadConfigResponse): only a tailscaled running from a config file has one to fail.
    if (body.length === 0) return true;
    const value = parseJson(body, path, 'POST');
    return value !== null && typeof value === 'object' && (value as { Reloaded?: unknown }).Reloaded === true;
  }

  watchIpnBus(mask: number, signal: AbortSignal): AsyncIterable<IpnNotify> {
    if (!Number.isSafeInteger(mask) || mask < 0) throw new RangeError(`invalid IPN bus mask ${mask}`);
    return { [Symbol.asyncIterator]: () => this.#watch(mask, signal) };
  }

  async *#watch(mask: number, signal: AbortSignal): AsyncGenerator<IpnNotify, void, undefined> {
    const path = `/localapi/v0/watch-ipn-bus?mask=${mask}`;
    const ex = await this.#open(path, signal, this.#requestTimeoutMs);
    try {
      if (ex.res.statusCode !== 200) throw await this.#httpError(ex, path);
      ex.stopTimer();
      const splitter = new LineSplitter(this.#maxBusLineBytes);
      const chunks = ex.res[Symbol.asyncIterator]();
      for (;;) {
        let next: IteratorResult<Buffer>;
        try {
          next = await chunks.next();
        } catch (err) {
          throw ex.mapError(err);
        }
        if (next.done) break;
        for (const line of splitter.push(next.value)) {
          const notify = this.#parseLine(line);
          if (notify) yield notify;
        }
        // CERTSHARE_BUS_LINE_TOO_LONG: `finally` tears the request down before the line is all buffered.
        if (splitter.error) throw splitter.error;
      }
      const last = splitter.end();
      if (last) {
        const notify = this.#parseLine(last);
        if (notify) yield notify;
      }
    } finally {
      ex.dispose();
    }
  }

  #parseLine(line: Buffer): IpnNotify | undefined {
    let value: unknown;
    try {
      value = JSON.parse(line.toString('utf8'));
    } catch {
      // The parser's message quotes the line: keep it out of logs.
      this.#badLine(`line of ${line.length} bytes`, 'not valid JSON');
      return undefined;
    }
    if (value === null || typeof value !== 'object' || Array.isArray(value)) {
      this.#badLine(`line of ${line.length} bytes`, 'not a JSON object');
      return undefined;
    }
    return value as IpnNotify;
  }

  #badLine(what: string, flaw: string): void {
    const err = new CertshareError('CERTSHARE_BUS_BAD_LINE', { what, flaw });
    if (this.#onBadLine) this.#onBadLine(err);
    else this.#logger.warn({ code: err.code, err: err.message }, 'skipped a malformed IPN bus line');
  }

  /**
   * A request (GET unless `send` says otherwise) returning the 200 body, at most `maxBytes` of it; any other
   * status is a LocalApiError. The deadline covers the body.
   */
  async #get(path: string, signal: AbortSignal, timeoutMs: number, maxBytes: number, send?: Send): Promise<Buffer> {
    const ex = await this.#open(path, signal, timeoutMs, send);
    const method = send?.method ?? 'GET';
    try {
      if (ex.res.statusCode !== 200) throw await this.#httpError(ex, path, method);
      const chunks: Buffer[] = [];
      let total = 0;
      try {
        for await (const chunk of ex.res as AsyncIterable<Buffer>) {
          total += chunk.length;
          // Torn down (`finally`) before the rest arrives: nothing past the bound is read.
          if (total > maxBytes) throw badResponse(`${method} ${path}`, `answer larger than ${maxBytes} bytes, the bound for its kind`);
          chunks.push(chunk);
        }
      } catch (err) {
        if (err instanceof LocalApiError) throw err;
        throw ex.mapError(err);
      }
      return Buffer.concat(chunks, total);
    } finally {
      ex.dispose();
    }
  }

  async #httpError(ex: Exchange, path: string, method = 'GET'): Promise<LocalApiError> {
    const status = ex.res.statusCode ?? 0;
    let raw = '';
    try {
      const chunks: Buffer[] = [];
      let total = 0;
      for await (const chunk of ex.res as AsyncIterable<Buffer>) {
        chunks.push(chunk);
        total += chunk.length;
        if (total >= ERROR_BODY_READ_BYTES) break;
      }
      raw = Buffer.concat(chunks, total).toString('utf8');
    } catch (err) {
      const mapped = ex.mapError(err);
      // A caller abort or timeout while reading the error body wins over the HTTP error.
      if (!(mapped instanceof LocalApiError) || mapped.timedOut) throw mapped;
    }
    const body = sanitizeErrorBody(raw);
    const header = ex.res.headers['retry-after'];
    const retryAfterMs = parseRetryAfter(Array.isArray(header) ? header[0] : header, this.#now());
    const tailscaledVersion = versionHeader(ex.res) ?? this.#tailscaledVersion;
    const fields = { status, body, retryAfterMs, ...(tailscaledVersion ? { tailscaledVersion } : {}) };
    const answer = `HTTP ${status}${body ? `: ${body}` : ''}`;
    if (isRefusalStatus(status)) {
      const who = `tailscaled ${tailscaledVersion ?? '(version not reported)'}`;
      return new LocalApiError(
        { request: `${method} ${path}`, failure: `${who} answered ${answer} (${refusalHint(status, path, method)})` },
        {
          code: 'CERTSHARE_LOCALAPI_REFUSED',
          ...fields,
        },
      );
    }
    return new LocalApiError({ request: `${method} ${path}`, failure: answer }, { code: 'CERTSHARE_LOCALAPI_HTTP', ...fields });
  }

  /** Sends a request (GET unless `send` says otherwise) and resolves once the response headers arrived. */
  #open(path: string, signal: AbortSignal, timeoutMs: number, send?: Send): Promise<Exchange> {
    const target = this.#target;
    const method = send?.method ?? 'GET';
    return new Promise<Exchange>((resolve, reject) => {
      if (signal.aborted) {
        reject(signal.reason);
        return;
      }
      let teardown: unknown; // why we destroyed the request ourselves: the caller's reason or our timeout
      let responded = false;
      let settled = false;
      let req: ClientRequest | undefined;

      const mapError = (err: unknown): unknown => {
        if (teardown !== undefined) return teardown;
        if (signal.aborted) return signal.reason;
        return transportError(err, target.display, `${method} ${path}`, responded);
      };
      const destroy = (reason: unknown): void => {
        if (teardown === undefined) teardown = reason;
        req?.destroy();
        if (!settled) {
          settled = true;
          dispose();
          reject(teardown);
        }
      };
      const onAbort = (): void => destroy(signal.reason);
      const timer = setTimeout(
        () =>
          destroy(
            new LocalApiError(
              { request: `${method} ${path}`, failure: `no answer from ${target.display} within ${formatGoDuration(timeoutMs)}` },
              {
                code: 'CERTSHARE_LOCALAPI_TIMEOUT',
                timedOut: true,
              },
            ),
          ),
        timeoutMs,
      );
      const dispose = (): void => {
        clearTimeout(timer);
        signal.removeEventListener('abort', onAbort);
        if (req && !req.destroyed) req.destroy();
      };
      signal.addEventListener('abort', onAbort, { once: true });

      req = http.request({
        ...target.request,
        method,
        path: target.basePath + path,
        headers: send ? { ...this.#headers, 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(send.body) } : this.#headers,
        agent: false,
      });
      req.on('error', (err) => {
        if (settled) return; // after the response, errors surface through the body stream
        settled = true;
        dispose();
        reject(mapError(err));
      });
      req.on('response', (res) => {
        responded = true;
        this.#tailscaledVersion = versionHeader(res) ?? this.#tailscaledVersion;
        res.on('error', () => {}); // surfaced to the reader through iteration; never an unhandled event
        if (settled) {
          res.destroy();
          return;
        }
        settled = true;
        resolve({ res, mapError, stopTimer: () => clearTimeout(timer), dispose });
      });
      req.end(send?.body);
    });
  }
}

function versionHeader(res: IncomingMessage): string | undefined {
  const value = res.headers['tailscale-version'];
  const text = Array.isArray(value) ? value[0] : value;
  return text ? text : undefined;
}

function refusalHint(status: number, path: string, method: string): string {
  if (path.startsWith('/localapi/v0/watch-ipn-bus') && status === 400) {
    return (
      'this tailscaled release refuses the IPN bus subscription mask; ' +
      'certshare picks the mask from the reported version and supports tailscaled 1.96 to 1.104'
    );
  }
  if ((status === 401 || status === 403) && path === '/localapi/v0/prefs' && method !== 'GET') {
    return "tailscaled lets only root and its operator user edit prefs: set tailscaled's operator to certshare's user (docs/tailscale-services.md)";
  }
  if (status === 401 || status === 403) {
    return "tailscaled does not let certshare's user do this: run certshare as root or set TS_PERMIT_CERT_UID to its uid on tailscaled";
  }
  if (status === 404) return 'this tailscaled release has no such LocalAPI endpoint';
  return 'asking again will get the same answer';
}

function parseAddress(address: string): Target {
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(address)) {
    const url = new URL(address);
    if (url.protocol !== 'http:') {
      throw new CertshareError('CERTSHARE_BAD_CONFIG', { source: `LocalAPI address ${address}`, reason: 'must be a socket path or an http:// URL' });
    }
    const request: http.RequestOptions = {
      host: url.hostname.replace(/^\[|\]$/g, ''),
      port: url.port ? Number(url.port) : 80,
    };
    if (url.username || url.password) {
      request.auth = `${decodeURIComponent(url.username)}:${decodeURIComponent(url.password)}`;
    }
    url.username = '';
    url.password = '';
    return { request, basePath: url.pathname.replace(/\/+$/, ''), display: url.origin };
  }
  if (address.length === 0) throw new CertshareError('CERTSHARE_BAD_CONFIG', { source: 'LocalAPI socket path', reason: 'empty' });
  return { request: { socketPath: address }, basePath: '', display: address };
}

/** Nothing listens at the address (yet): no socket file, or a refused connection. */
const NOT_LISTENING = new Set(['ENOENT', 'ECONNREFUSED']);

/**
 * A call that failed because nothing listens at the LocalAPI address, before any answer: what a tailscaled
 * still starting looks like (a connection lost mid-answer, a permission error or a timeout is not).
 */
export function isNotListening(err: unknown): boolean {
  if (!(err instanceof LocalApiError) || err.code !== 'CERTSHARE_LOCALAPI_UNREACHABLE') return false;
  const errno = (err.cause as NodeJS.ErrnoException | undefined)?.code;
  return errno !== undefined && NOT_LISTENING.has(errno);
}

const HINTS: Record<string, string> = {
  ENOENT: ' (no socket there: is tailscaled running and its socket directory shared with this container?)',
  ECONNREFUSED: ' (nothing is listening: tailscaled not running or restarting)',
  EACCES: ' (permission denied on the socket)',
};

function transportError(err: unknown, display: string, request: string, responded: boolean): LocalApiError {
  const code = (err as NodeJS.ErrnoException | undefined)?.code;
  const detail = code ?? errorMessage(err);
  const failure = responded ? `connection to ${display} lost: ${detail}` : `not reachable at ${display}: ${detail}${(code && HINTS[code]) ?? ''}`;
  return new LocalApiError({ request, failure }, { code: 'CERTSHARE_LOCALAPI_UNREACHABLE', cause: err });
}

function badResponse(request: string, failure: string): LocalApiError {
  return new LocalApiError({ request, failure }, { code: 'CERTSHARE_LOCALAPI_BAD_RESPONSE' });
}

function parseJson(body: Buffer, path: string, method = 'GET'): unknown {
  try {
    return JSON.parse(body.toString('utf8'));
  } catch (err) {
    throw badResponse(`${method} ${path}`, `response is not JSON: ${errorMessage(err)}`);
  }
}

/** A request body: the prefs edit sends one, the config reload an empty one. */
interface Send {
  method: 'PATCH' | 'POST';
  body: string;
}

/** An ipn.Prefs object whose AdvertiseServices, when present, is a list of strings. */
function parsePrefs(body: Buffer, request: string): IpnPrefs {
  const [method, path] = request.split(' ') as [string, string];
  const value = parseJson(body, path, method);
  if (value === null || typeof value !== 'object' || Array.isArray(value)) throw badResponse(request, 'expected a JSON object');
  const services = (value as IpnPrefs).AdvertiseServices;
  if (services !== undefined && services !== null && !(Array.isArray(services) && services.every((s) => typeof s === 'string'))) {
    throw badResponse(request, 'AdvertiseServices is not a list of strings');
  }
  return value as IpnPrefs;
}

const CERT_BEGIN = '-----BEGIN CERTIFICATE-----';
/** The request a CertPair body answers, for messages. */
const CERT_PAIR = 'GET /localapi/v0/cert?type=pair';

/**
 * Splits a CertPair body (private key PEM first, then the chain PEM) at the start of the first
 * certificate block. Rejects with CERTSHARE_LOCALAPI_BAD_RESPONSE (a LocalApiError without status) when
 * the key or the certificate is missing, or a private key appears on the certificate side.
 * Error messages never quote the body.
 * @forTests
 */
export function splitCertPair(body: string): CertPair {
  const at = body.indexOf(CERT_BEGIN);
  if (at === -1) throw badResponse(CERT_PAIR, 'response has no certificate');
  const keyPart = body.slice(0, at).trim();
  const certPart = body.slice(at).trim();
  if (certPart.includes('PRIVATE KEY')) {
    throw badResponse(CERT_PAIR, 'response has private key material after the first certificate');
  }
  const keyBlocks = keyPart.split('-----BEGIN ').length - 1;
  if (keyBlocks !== 1 || !/^-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----\r?\n/.test(keyPart) || !/\n-----END [A-Z0-9 ]*PRIVATE KEY-----$/.test(keyPart)) {
    throw badResponse(CERT_PAIR, 'response does not start with exactly one private key PEM block');
  }
  if (!certPart.endsWith('-----END CERTIFICATE-----')) {
    throw badResponse(CERT_PAIR, 'response has an incomplete certificate PEM block');
  }
  return { keyPem: `${keyPart}\n`, certPem: `${certPart}\n` };
}

function sanitizeErrorBody(raw: string): string {
  const text = raw.trim();
  if (text.includes('PRIVATE KEY')) return '[error body withheld: it contained private key material]';
  return text.length > MAX_ERROR_BODY_CHARS ? `${text.slice(0, MAX_ERROR_BODY_CHARS)}…` : text;
}
