// The Kubernetes API over node:http2 (node:http(s) where HTTP/2 is not offered), in place of client-node's
// undici transport. client-node keeps doing what it is good at (kubeconfig and in-cluster credentials,
// token refresh, exec plugins, proxies, typed requests and (de)serialisation); only the bytes travel
// through Node's own HTTP stack.
// Why (measured against client-node 2.0.1's undici with HTTP/2 on the scale bench: README.md here): undici
// costs a reader 8-9 MB of RSS at one domain and 11-17 MB at 500 that Node's own stack does not, and the
// bundle (scripts/build.ts) then leaves undici out entirely; client-node as shipped opens a connection per
// request (202 on a 500-domain writer), and undici fails a stream the server refused unprocessed where we
// send it again. HTTP/2 carries every request and watch of a connection over one TCP connection per API
// server (h2-session-pool.ts), as client-go does, where HTTP/1.1 needs a socket per concurrent watch.
import { createHash } from 'node:crypto';
import type { IncomingHttpHeaders, OutgoingHttpHeaders } from 'node:http';
import { request as httpRequest } from 'node:http';
import { constants as h2, type ClientHttp2Stream, type IncomingHttpHeaders as H2IncomingHeaders } from 'node:http2';
import { request as httpsRequest, type RequestOptions } from 'node:https';
import { PassThrough } from 'node:stream';
import { setTimeout as delay } from 'node:timers/promises';
import {
  type KubeConfig,
  type SecurityAuthentication,
  createConfiguration,
  type ConfigurationOptions,
  ResponseContext,
  wrapHttpLibrary,
  type RequestContext,
  setHeaderMiddleware,
  ServerConfiguration,
  of,
} from './client-node.ts';
import { doubling, jitter } from '../../core/issuance/backoff.ts';
import { CertshareError } from '../../core/errors.ts';
import { LineSplitter } from '../../localapi/line-splitter.ts';
import {
  abortError,
  DEFAULT_LIVENESS,
  H2SessionPool,
  refusedBeforeProcessing,
  type H2Session,
  type SessionLiveness,
  type TlsIdentity,
} from './h2-session-pool.ts';

/** A Secret, a Lease or a Pod status is a few KB; anything near this is not an answer we asked for. */
const MAX_RESPONSE_BYTES = 16 * 1024 * 1024;
const USER_AGENT = 'certshare';

/**
 * The default bound of one API request, from opening the connection to the last byte of the answer (a
 * watch: to its response headers). A Secret, a Lease or a status patch answers in milliseconds; an API
 * server that has not answered in 10 s is not going to, and every loop above retries on its own pace.
 */
export const DEFAULT_REQUEST_TIMEOUT_MS = 10_000;

/**
 * Credentials and connection settings for one request, from the kubeconfig: the Authorization header
 * (client-node refreshes file, exec and OIDC tokens here), TLS material, and the agent (one per cluster,
 * cached by client-node; a proxy agent when the kubeconfig names a proxy).
 */
async function requestOptions(config: KubeConfig): Promise<RequestOptions> {
  const options: RequestOptions = {};
  await config.applyToHTTPSOptions(options);
  return options;
}

/** The API server's base URL from the kubeconfig's current context. @forTests */
export function apiServer(config: KubeConfig): string {
  const cluster = config.getCurrentCluster();
  if (!cluster)
    throw new CertshareError('CERTSHARE_BAD_CONFIG', { source: 'Kubernetes credentials', reason: 'no cluster configured (set KUBECONFIG or run in a Pod)' });
  return cluster.server.replace(/\/+$/, '');
}

/** An HTTP status answer as an error carrying `code`, like client-node's ApiException (see apiStatus). */
class KubeHttpError extends CertshareError<'CERTSHARE_KUBE_HTTP'> {
  readonly statusCode: number;
  readonly body: string;
  constructor(statusCode: number, body: string, what: string) {
    super('CERTSHARE_KUBE_HTTP', { what, status: statusCode, body: body.slice(0, 300) });
    this.statusCode = statusCode;
    this.body = body;
  }
}

/** A request that outlived its deadline (ours, or a caller's AbortSignal.timeout), as opposed to one cancelled. */
function timeoutError(method: string, url: URL, timeoutMs: number | undefined, cause: unknown): CertshareError {
  const within = timeoutMs === undefined ? "the caller's deadline" : `${timeoutMs} ms`;
  return new CertshareError('CERTSHARE_KUBE_TIMEOUT', { request: `${method} ${url.pathname}`, within }, { cause });
}

const isTimeout = (reason: unknown): boolean => reason instanceof DOMException && reason.name === 'TimeoutError';

/** A deadline (ours, a caller's AbortSignal.timeout, a watch's headers bound), as opposed to a cancellation. */
const isDeadline = (reason: unknown): boolean => isTimeout(reason) || (reason instanceof CertshareError && reason.code === 'CERTSHARE_KUBE_TIMEOUT');

/** One request's answer, whichever protocol carried it: status and headers, then the body as it arrives. */
interface Answer {
  status: number;
  headers: Record<string, string>;
  body: AsyncIterable<Buffer>;
  /** The HTTP/2 session carrying it (absent over HTTP/1.1). */
  session?: H2Session;
  /** Ends the exchange (an HTTP/2 stream is reset, its session stays). */
  close(): void;
}

interface Outgoing {
  method: string;
  headers: OutgoingHttpHeaders;
  body?: string | Buffer;
}

function exchangeHttp1(url: URL, out: Outgoing, options: RequestOptions, signal: AbortSignal): Promise<Answer> {
  const send = url.protocol === 'http:' ? httpRequest : httpsRequest;
  const req = send(url, { ...options, method: out.method, headers: out.headers, signal });
  const answer = new Promise<Answer>((resolve, reject) => {
    req.once('response', (res) =>
      resolve({ status: res.statusCode ?? 0, headers: plainHeaders(res.headers), body: res as AsyncIterable<Buffer>, close: () => req.destroy() }),
    );
    req.once('error', reject);
  });
  req.end(out.body);
  return answer;
}

/** Header names HTTP/2 forbids (RFC 9113 8.2.2) or sets itself. */
const CONNECTION_HEADERS = new Set(['host', 'connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'upgrade']);

function h2Headers(url: URL, out: Outgoing, options: RequestOptions): OutgoingHttpHeaders {
  const headers: OutgoingHttpHeaders = { ':method': out.method, ':path': url.pathname + url.search };
  for (const [name, value] of Object.entries(out.headers)) {
    const lower = name.toLowerCase();
    if (value !== undefined && !CONNECTION_HEADERS.has(lower)) headers[lower] = value;
  }
  // client-node gives basic-auth users as `auth` (node:https turns it into the header itself).
  if (options.auth && headers.authorization === undefined) headers.authorization = `Basic ${Buffer.from(options.auth).toString('base64')}`;
  return headers;
}

/**
 * The response headers of `stream`, and its body: a stream read from the moment the headers arrive (a
 * short answer's data and end follow at once, and Node may close the stream before an await resumes).
 */
function responseOf(stream: ClientHttp2Stream, signal: AbortSignal): Promise<{ headers: H2IncomingHeaders; body: PassThrough }> {
  return new Promise((resolve, reject) => {
    const done = (): void => {
      signal.removeEventListener('abort', onAbort);
      stream.removeListener('response', onResponse);
      stream.removeListener('error', onError);
      stream.removeListener('close', onClose);
    };
    const onAbort = (): void => {
      done();
      if (!stream.closed) stream.close(h2.NGHTTP2_CANCEL);
      reject(abortError(signal));
    };
    const onResponse = (headers: H2IncomingHeaders): void => {
      done();
      const body = new PassThrough();
      // An error after the reader stopped reading (a request's answer is complete) has nobody to tell.
      body.on('error', () => {});
      stream.on('error', (err) => body.destroy(err));
      stream.on('close', () => {
        if (!stream.readableEnded)
          body.destroy(new CertshareError('CERTSHARE_KUBE_CONNECTION_LOST', { channel: 'stream', when: `mid-answer (HTTP/2 code ${stream.rstCode})` }));
      });
      stream.pipe(body);
      resolve({ headers, body });
    };
    const onError = (err: unknown): void => {
      done();
      reject(err);
    };
    const onClose = (): void => {
      done();
      reject(new CertshareError('CERTSHARE_KUBE_CONNECTION_LOST', { channel: 'stream', when: `before an answer (HTTP/2 code ${stream.rstCode})` }));
    };
    stream.once('response', onResponse);
    stream.once('error', onError);
    stream.once('close', onClose);
    if (signal.aborted) onAbort();
    else signal.addEventListener('abort', onAbort, { once: true });
  });
}

/**
 * Attempts of a stream the server refused unprocessed, and the wait before the third (doubling after).
 * Go's HTTP/2 transport, client-go's, sends such a request up to 7 times, the second at once (x/net
 * http2 RoundTripOpt); we do too, waiting from 100 ms instead of its 1 s, within the request's deadline. An
 * apiserver sending GOAWAY (--goaway-chance) refuses every stream above its last one: under load a request
 * can land on two such sessions in a row, and a single retry failed it (seen in a CI rehearsal).
 */
const REFUSED_ATTEMPTS = 7;
const REFUSED_FIRST_WAIT_MS = 100;

/** The wait before attempt `attempt` (≥ 2) of a refused stream: none for the second, then doubling (jittered). @forTests */
export function refusedRetryWaitMs(attempt: number): number {
  return attempt <= 2 ? 0 : Math.round(jitter(doubling(REFUSED_FIRST_WAIT_MS, attempt - 2, 60_000), 0.1));
}

/**
 * One exchange on a pooled HTTP/2 session. A stream the server refused unprocessed (REFUSED_STREAM, or
 * a session that had just received GOAWAY) is sent again on another session, up to REFUSED_ATTEMPTS in
 * all. A deadline that passes without a byte from the connection makes the session suspect (see
 * H2Session.suspect).
 */
async function exchangeHttp2(pool: H2SessionPool, url: URL, out: Outgoing, options: RequestOptions, signal: AbortSignal): Promise<Answer | 'http1'> {
  const longLived = url.searchParams.get('watch') === 'true';
  for (let attempt = 1; ; attempt++) {
    const session = await pool.acquire(signal, longLived);
    if (session === 'http1') return 'http1';
    const readBefore = session.bytesRead;
    let stream: ClientHttp2Stream | undefined;
    try {
      stream = session.request(h2Headers(url, out, options), out.body === undefined, longLived);
      if (out.body !== undefined) stream.end(out.body);
      const { headers, body } = await responseOf(stream, signal);
      const open = stream;
      const onAbort = (): void => {
        if (!open.closed) open.close(h2.NGHTTP2_CANCEL);
        body.destroy(abortError(signal));
      };
      signal.addEventListener('abort', onAbort, { once: true });
      const plain: Record<string, string> = {};
      for (const [name, value] of Object.entries(headers))
        if (!name.startsWith(':') && value !== undefined) plain[name] = Array.isArray(value) ? value.join(', ') : String(value);
      return {
        status: Number(headers[':status'] ?? 0),
        headers: plain,
        body,
        session,
        close: () => {
          signal.removeEventListener('abort', onAbort);
          if (!open.closed) open.close(h2.NGHTTP2_CANCEL);
        },
      };
    } catch (err) {
      if (attempt < REFUSED_ATTEMPTS && !signal.aborted && refusedBeforeProcessing(err, stream)) {
        const waitMs = refusedRetryWaitMs(attempt + 1);
        if (waitMs > 0) await delay(waitMs, undefined, { signal }).catch(() => Promise.reject(abortError(signal)));
        continue;
      }
      if (signal.aborted && isDeadline(signal.reason) && session.bytesRead === readBefore) session.suspect();
      throw err;
    }
  }
}

/**
 * The session pools of one KubeConfig (one connection: connectKube, or a test's own), by origin and TLS
 * identity. Per KubeConfig rather than per process so that replicas in one process (tests) keep their
 * own connections and closing one leaves the others.
 */
const pools = new WeakMap<KubeConfig, Map<string, H2SessionPool>>();
const livenessOf = new WeakMap<KubeConfig, SessionLiveness>();

function identityKey(origin: string, tls: TlsIdentity): string {
  const hash = createHash('sha256');
  for (const part of [tls.ca, tls.cert, tls.key, tls.pfx, tls.passphrase, tls.rejectUnauthorized, tls.servername]) {
    const values = Array.isArray(part) ? part : [part];
    for (const value of values)
      hash.update(value === undefined ? '-' : typeof value === 'object' && !Buffer.isBuffer(value) ? JSON.stringify(value) : String(value)).update('\0');
  }
  return `${origin} ${hash.digest('hex')}`;
}

/** The HTTP/2 pool for this request, or none: plain http (no TLS, no ALPN) and proxies stay on HTTP/1.1. */
function poolFor(config: KubeConfig, url: URL, options: RequestOptions): H2SessionPool | undefined {
  if (url.protocol !== 'https:' || config.getCurrentCluster()?.proxyUrl) return undefined;
  const tls: TlsIdentity = {};
  for (const name of ['ca', 'cert', 'key', 'pfx', 'passphrase', 'rejectUnauthorized', 'servername'] as const) {
    if (options[name] !== undefined) (tls as Record<string, unknown>)[name] = options[name];
  }
  const key = identityKey(url.origin, tls);
  let byKey = pools.get(config);
  if (!byKey) {
    byKey = new Map();
    pools.set(config, byKey);
  }
  let pool = byKey.get(key);
  if (!pool) {
    // A new identity for an origin (a rotated client certificate): the old sessions close once idle.
    for (const [other, old] of byKey) {
      if (other.startsWith(`${url.origin} `)) {
        old.close();
        byKey.delete(other);
      }
    }
    pool = new H2SessionPool(url.origin, tls, livenessOf.get(config) ?? DEFAULT_LIVENESS);
    byKey.set(key, pool);
  }
  return pool;
}

async function exchange(config: KubeConfig, url: URL, out: Outgoing, options: RequestOptions, signal: AbortSignal): Promise<Answer> {
  const pool = poolFor(config, url, options);
  const answer = pool ? await exchangeHttp2(pool, url, out, options, signal) : 'http1';
  return answer === 'http1' ? exchangeHttp1(url, out, options, signal) : answer;
}

/** Closes the API connections of `config` (the process may then exit); later calls open new ones. */
export function closeKubeSessions(config: KubeConfig): void {
  for (const pool of pools.get(config)?.values() ?? []) pool.close();
  pools.delete(config);
}

/** Liveness settings for the sessions `config` opens from now on (tests scale them down). @forTests */
export function setKubeSessionLiveness(config: KubeConfig, liveness: Partial<SessionLiveness>): void {
  livenessOf.set(config, { ...DEFAULT_LIVENESS, ...liveness });
}

/** What the connections of `config` look like: connections opened, HTTP/2 sessions open, origins on HTTP/1.1. @forTests */
export function kubeSessionStats(config: KubeConfig): { connects: number; sessions: number; http1Only: number } {
  const stats = { connects: 0, sessions: 0, http1Only: 0 };
  for (const pool of pools.get(config)?.values() ?? []) {
    stats.connects += pool.connects;
    stats.sessions += pool.sessions;
    if (pool.http1Only) stats.http1Only++;
  }
  return stats;
}

async function readBody(answer: Answer): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let bytes = 0;
  for await (const chunk of answer.body) {
    bytes += chunk.length;
    if (bytes > MAX_RESPONSE_BYTES) {
      answer.close();
      throw new CertshareError('CERTSHARE_KUBE_RESPONSE_TOO_LARGE', { what: 'answer', max: MAX_RESPONSE_BYTES, length: bytes });
    }
    chunks.push(chunk);
  }
  return Buffer.concat(chunks, bytes);
}

function plainHeaders(headers: IncomingHttpHeaders): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) if (value !== undefined) out[name] = Array.isArray(value) ? value.join(', ') : value;
  return out;
}

/**
 * client-node's per-request authentication hook, kept to what our transport needs: the request options
 * travel in the context's "dispatcher" slot (client-node's undici hook, unused otherwise) to `send` below.
 */
function kubeconfigAuthentication(config: KubeConfig): SecurityAuthentication {
  return {
    getName: () => 'kubeconfig over node:http2',
    async applySecurityAuthentication(context: RequestContext) {
      const options = await requestOptions(config);
      for (const [name, value] of Object.entries(options.headers ?? {})) if (value !== undefined) context.setHeaderParam(name, String(value));
      context.setDispatcher(options as unknown as Parameters<RequestContext['setDispatcher']>[0]);
    },
  };
}

/**
 * Sends client-node's requests, each under its own deadline (connect, headers and body together, like
 * the context of Tailscale's kubeclient) joined with the caller's signal (see withSignal).
 */
function nodeHttpLibrary(config: KubeConfig, timeoutMs: number) {
  return wrapHttpLibrary({
    async send(context: RequestContext): Promise<ResponseContext> {
      const options = (context.getDispatcher() ?? {}) as unknown as RequestOptions;
      const body = context.getBody() as string | Buffer | undefined;
      const url = new URL(context.getUrl());
      const method = context.getHttpMethod();
      const cancelled = context.getSignal();
      const deadline = AbortSignal.timeout(timeoutMs);
      const signal = cancelled ? AbortSignal.any([cancelled, deadline]) : deadline;
      try {
        const answer = await exchange(config, url, { method, headers: { ...context.getHeaders() }, ...(body === undefined ? {} : { body }) }, options, signal);
        let data: Buffer;
        try {
          data = await readBody(answer);
        } finally {
          answer.close();
        }
        return new ResponseContext(answer.status, answer.headers, {
          text: async () => data.toString('utf8'),
          binary: async () => data,
          stream: () => null,
        });
      } catch (err) {
        if (deadline.aborted && !cancelled?.aborted) throw timeoutError(method, url, timeoutMs, err);
        if (cancelled?.aborted && isTimeout(cancelled.reason)) throw timeoutError(method, url, undefined, err);
        throw err;
      }
    },
  });
}

/**
 * A generated client-node API class (CoreV1Api, CoordinationV1Api...) talking over HTTP/2 (or HTTP/1.1), every
 * request bounded by `requestTimeoutMs`.
 */
export function makeApi<T>(
  config: KubeConfig,
  api: new (configuration: ReturnType<typeof createConfiguration>) => T,
  requestTimeoutMs = DEFAULT_REQUEST_TIMEOUT_MS,
): T {
  return new api(
    createConfiguration({
      baseServer: new ServerConfiguration(apiServer(config), {}),
      authMethods: { default: kubeconfigAuthentication(config) },
      httpApi: nodeHttpLibrary(config, requestTimeoutMs),
      middleware: [setHeaderMiddleware('User-Agent', USER_AGENT)],
    }),
  );
}

/** What GET /readyz says of an API server (apiReadiness). */
export type ApiReadiness = 'ready' | 'not_ready' | 'refused';

/**
 * Whether the API server says it is ready (GET /readyz answered 200): its informers synced and its
 * bootstrap roles in place, so its authorizer answers for its policy. `refused`: 401 or 403 (a server
 * whose policy is not loaded yet, or one that shows /readyz to nobody but its admins). Any other
 * answer, or none within `timeoutMs`, is "not ready".
 */
export async function apiReadiness(config: KubeConfig, timeoutMs = DEFAULT_REQUEST_TIMEOUT_MS): Promise<ApiReadiness> {
  const signal = AbortSignal.timeout(timeoutMs);
  try {
    const options = await requestOptions(config);
    const url = new URL(`${apiServer(config)}/readyz`);
    const answer = await exchange(
      config,
      url,
      { method: 'GET', headers: { ...(options.headers as OutgoingHttpHeaders), 'User-Agent': USER_AGENT } },
      options,
      signal,
    );
    try {
      await readBody(answer);
    } finally {
      answer.close();
    }
    if (answer.status === 200) return 'ready';
    return answer.status === 401 || answer.status === 403 ? 'refused' : 'not_ready';
  } catch {
    return 'not_ready';
  }
}

/**
 * Per-call options for a generated API method that cancel the request when `signal` aborts (the
 * transport adds its deadline either way); `options` (e.g. setHeaderOptions) are kept.
 */
export function withSignal(signal: AbortSignal | undefined, options?: ConfigurationOptions): ConfigurationOptions | undefined {
  if (!signal) return options;
  const cancel = {
    pre: (context: RequestContext) => {
      context.setSignal(signal);
      return of(context);
    },
    post: (response: ResponseContext) => of(response),
  };
  return { ...options, middleware: [...(options?.middleware ?? []), cancel], middlewareMergeStrategy: 'append' };
}

/** @forTests */
export interface WatchEvent {
  type: 'ADDED' | 'MODIFIED' | 'DELETED' | 'BOOKMARK' | 'ERROR';
  object: { metadata?: { resourceVersion?: string }; code?: number; [key: string]: unknown };
}

/** A watch answer's line is one object; a Secret is at most ~1 MiB (etcd's limit), so this bounds it. */
const MAX_WATCH_LINE_BYTES = 4 * 1024 * 1024;

/**
 * One watch request: GET `path` with `watch=true` and `query`, calling `onEvent` per JSON line until the
 * server ends the stream (resolves) or it fails (rejects: HTTP status as KubeHttpError, no response
 * headers within `headersTimeoutMs` (CERTSHARE_KUBE_TIMEOUT), no byte for `inactivityMs`, a malformed
 * line, a transport error; over HTTP/2 the silence bound is at least the server's own timeoutSeconds plus a
 * minute). Aborting `signal` resolves. Over HTTP/2 the watch also ends (resolves, as
 * when the server ends it) once its session got GOAWAY, so the caller resumes on a fresh session; a
 * dead connection is found by the session's PINGs, for all its watches at once.
 */
export async function watchOnce(
  config: KubeConfig,
  path: string,
  query: Record<string, string | number | boolean | undefined>,
  onEvent: (event: WatchEvent) => void,
  options: { signal: AbortSignal; inactivityMs: number; headersTimeoutMs?: number },
): Promise<void> {
  const url = watchUrl(config, path, query);
  const base = await requestOptions(config);
  const { signal, inactivityMs, headersTimeoutMs = DEFAULT_REQUEST_TIMEOUT_MS } = options;
  if (signal.aborted) return;
  // Ends this one exchange: the caller's signal, the headers deadline or the inactivity bound.
  const cut = new AbortController();
  let failure: Error | undefined;
  const fail = (err: Error): void => {
    failure ??= err;
    cut.abort(err);
  };
  const onAbort = (): void => cut.abort(signal.reason);
  signal.addEventListener('abort', onAbort, { once: true });
  // Until the answer starts, a watch is a request like any other; after that only silence ends it.
  const headersDeadline = setTimeout(() => fail(timeoutError('GET', url, headersTimeoutMs, undefined)), headersTimeoutMs);
  let silence: NodeJS.Timeout | undefined;
  let answer: Answer | undefined;
  let goaway = false;
  let offGoaway: (() => void) | undefined;
  try {
    answer = await exchange(
      config,
      url,
      { method: 'GET', headers: { ...(base.headers as OutgoingHttpHeaders), Accept: 'application/json', 'User-Agent': USER_AGENT } },
      base,
      cut.signal,
    );
    clearTimeout(headersDeadline);
    if (answer.status !== 200) {
      const text = (await readBody(answer)).toString('utf8');
      throw new KubeHttpError(answer.status, text, `watch ${path}`);
    }
    const current = answer;
    offGoaway = current.session?.onGoaway(() => {
      goaway = true;
      current.close();
    });
    const silenceMs = watchSilenceMs(current, inactivityMs, query);
    silence = setTimeout(() => fail(new Error(`Kubernetes watch silent for ${silenceMs} ms`)), silenceMs);
    const lines = new LineSplitter(
      MAX_WATCH_LINE_BYTES,
      (max, length) => new CertshareError('CERTSHARE_KUBE_RESPONSE_TOO_LARGE', { what: 'watch event', max, length }),
    );
    const handle = (line: Buffer) => onEvent(watchEventOf(line, path));
    for await (const chunk of current.body) {
      silence.refresh();
      for (const line of lines.push(chunk)) handle(line);
      if (lines.error) throw lines.error;
    }
    if (goaway) return;
    const last = lines.end();
    if (last) handle(last);
  } catch (err) {
    if (signal.aborted || goaway) return;
    throw failure ?? err;
  } finally {
    clearTimeout(headersDeadline);
    clearTimeout(silence);
    signal.removeEventListener('abort', onAbort);
    offGoaway?.();
    answer?.close();
  }
}

function watchUrl(config: KubeConfig, path: string, query: Record<string, string | number | boolean | undefined>): URL {
  const url = new URL(apiServer(config) + path);
  url.searchParams.set('watch', 'true');
  for (const [key, value] of Object.entries(query)) if (value !== undefined) url.searchParams.set(key, String(value));
  return url;
}

/**
 * How long a watch may be silent. Over HTTP/2 the session's PINGs find a dead connection; silence there is a
 * quiet cluster (bookmarks are not guaranteed), so only a stream the server failed to end at its own timeout
 * is cut. Over HTTP/1.1 silence is the only sign of a dead connection.
 */
function watchSilenceMs(answer: Answer, inactivityMs: number, query: Record<string, string | number | boolean | undefined>): number {
  const serverEndsAtMs = typeof query.timeoutSeconds === 'number' ? (query.timeoutSeconds + 60) * 1000 : 0;
  return answer.session ? Math.max(inactivityMs, serverEndsAtMs) : inactivityMs;
}

function watchEventOf(line: Buffer, path: string): WatchEvent {
  try {
    return JSON.parse(line.toString('utf8')) as WatchEvent;
  } catch (err) {
    throw new CertshareError('CERTSHARE_KUBE_BAD_RESPONSE', { path, bytes: line.length }, { cause: err });
  }
}
