// The Kubernetes API over node:http(s), in place of client-node's undici transport. client-node keeps
// doing what it is good at (kubeconfig and in-cluster credentials, token refresh, exec plugins,
// proxies, typed requests and (de)serialisation); only the bytes travel through Node's own HTTP stack.
// Why: undici (its CommonJS entry, its WebAssembly HTTP parser and its connection pools) costs a kube
// replica ~9 MB of RSS that node:https does not (npm run bench -- --memory). The bundle (scripts/build.ts)
// then leaves undici out entirely.
import type { IncomingHttpHeaders, IncomingMessage } from 'node:http';
import { request as httpRequest } from 'node:http';
import { request as httpsRequest, type RequestOptions } from 'node:https';
import type { KubeConfig } from '@kubernetes/client-node/dist/config.js';
import type { SecurityAuthentication } from '@kubernetes/client-node/dist/gen/auth/auth.js';
import { createConfiguration, type ConfigurationOptions } from '@kubernetes/client-node/dist/gen/configuration.js';
import { ResponseContext, wrapHttpLibrary, type RequestContext } from '@kubernetes/client-node/dist/gen/http/http.js';
import { setHeaderMiddleware } from '@kubernetes/client-node/dist/middleware.js';
import { ServerConfiguration } from '@kubernetes/client-node/dist/gen/servers.js';
import { of } from '@kubernetes/client-node/dist/gen/rxjsStub.js';
import { CertshareError } from '../core/errors.ts';
import { LineSplitter } from '../localapi/line-splitter.ts';

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

/** The API server's base URL from the kubeconfig's current context. */
export function apiServer(config: KubeConfig): string {
  const cluster = config.getCurrentCluster();
  if (!cluster) throw new CertshareError('CERTSHARE_BAD_CONFIG', 'no Kubernetes cluster configured (set KUBECONFIG or run in a Pod)');
  return cluster.server.replace(/\/+$/, '');
}

/** An HTTP status answer as an error carrying `code`, like client-node's ApiException (see apiStatus). */
export class KubeHttpError extends CertshareError {
  readonly statusCode: number;
  readonly body: string;
  constructor(statusCode: number, body: string, what: string) {
    super('CERTSHARE_KUBE_HTTP', `${what}: HTTP ${statusCode} ${body.slice(0, 300)}`);
    this.statusCode = statusCode;
    this.body = body;
  }
}

/** A request that outlived its deadline (ours, or a caller's AbortSignal.timeout), as opposed to one cancelled. */
function timeoutError(method: string, url: URL, timeoutMs: number | undefined, cause: unknown): CertshareError {
  const within = timeoutMs === undefined ? "within the caller's deadline" : `within ${timeoutMs} ms`;
  return new CertshareError('CERTSHARE_KUBE_TIMEOUT', `${method} ${url.pathname}: no answer from the Kubernetes API ${within}`, { cause });
}

const isTimeout = (reason: unknown): boolean => reason instanceof DOMException && reason.name === 'TimeoutError';

function open(url: URL, options: RequestOptions, signal?: AbortSignal): { req: ReturnType<typeof httpsRequest>; response: Promise<IncomingMessage> } {
  const send = url.protocol === 'http:' ? httpRequest : httpsRequest;
  const req = send(url, { ...options, ...(signal ? { signal } : {}) });
  const response = new Promise<IncomingMessage>((resolve, reject) => {
    req.once('response', resolve);
    req.once('error', reject);
  });
  return { req, response };
}

async function readBody(res: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let bytes = 0;
  for await (const chunk of res as AsyncIterable<Buffer>) {
    bytes += chunk.length;
    if (bytes > MAX_RESPONSE_BYTES) {
      res.destroy();
      throw new CertshareError('CERTSHARE_KUBE_RESPONSE_TOO_LARGE', `Kubernetes API answer larger than ${MAX_RESPONSE_BYTES} bytes`);
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
 * client-node's per-request authentication hook, kept to what node:https needs: the request options
 * travel in the context's "dispatcher" slot (client-node's undici hook, unused otherwise) to `send` below.
 */
function kubeconfigAuthentication(config: KubeConfig): SecurityAuthentication {
  return {
    getName: () => 'kubeconfig over node:https',
    async applySecurityAuthentication(context: RequestContext) {
      const options = await requestOptions(config);
      for (const [name, value] of Object.entries(options.headers ?? {})) if (value !== undefined) context.setHeaderParam(name, String(value));
      context.setDispatcher(options as unknown as Parameters<RequestContext['setDispatcher']>[0]);
    },
  };
}

/**
 * Sends client-node's requests over node:https, each under its own deadline (connect, headers and body
 * together, like the context of Tailscale's kubeclient) joined with the caller's signal (see withSignal).
 */
function nodeHttpLibrary(timeoutMs: number) {
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
        const { req, response } = open(url, { ...options, method, headers: { ...context.getHeaders() } }, signal);
        req.end(body);
        const res = await response;
        const data = await readBody(res);
        return new ResponseContext(res.statusCode ?? 0, plainHeaders(res.headers), {
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
 * A generated client-node API class (CoreV1Api, CoordinationV1Api...) talking over node:https, every
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
      httpApi: nodeHttpLibrary(requestTimeoutMs),
      middleware: [setHeaderMiddleware('User-Agent', USER_AGENT)],
    }),
  );
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
 * line, a transport error). Aborting `signal` resolves.
 */
export async function watchOnce(
  config: KubeConfig,
  path: string,
  query: Record<string, string | number | boolean | undefined>,
  onEvent: (event: WatchEvent) => void,
  options: { signal: AbortSignal; inactivityMs: number; headersTimeoutMs?: number },
): Promise<void> {
  const url = new URL(apiServer(config) + path);
  url.searchParams.set('watch', 'true');
  for (const [key, value] of Object.entries(query)) if (value !== undefined) url.searchParams.set(key, String(value));
  const base = await requestOptions(config);
  const { signal, inactivityMs, headersTimeoutMs = DEFAULT_REQUEST_TIMEOUT_MS } = options;
  if (signal.aborted) return;
  const { req, response } = open(url, { ...base, method: 'GET', headers: { ...base.headers, Accept: 'application/json', 'User-Agent': USER_AGENT } }, signal);
  // Until the answer starts, a watch is a request like any other; after that only silence ends it.
  const headersDeadline = setTimeout(() => req.destroy(timeoutError('GET', url, headersTimeoutMs, undefined)), headersTimeoutMs);
  req.setTimeout(inactivityMs, () => req.destroy(new Error(`Kubernetes watch silent for ${inactivityMs} ms`)));
  req.end();
  try {
    const res = await response.finally(() => clearTimeout(headersDeadline));
    if (res.statusCode !== 200) {
      const text = (await readBody(res)).toString('utf8');
      throw new KubeHttpError(res.statusCode ?? 0, text, `watch ${path}`);
    }
    const lines = new LineSplitter(
      MAX_WATCH_LINE_BYTES,
      (max, length) => new CertshareError('CERTSHARE_KUBE_RESPONSE_TOO_LARGE', `Kubernetes watch event longer than ${max} bytes (got at least ${length})`),
    );
    const handle = (line: Buffer) => {
      let event: WatchEvent;
      try {
        event = JSON.parse(line.toString('utf8')) as WatchEvent;
      } catch (err) {
        throw new CertshareError('CERTSHARE_KUBE_HTTP', `watch ${path}: malformed event line (${line.length} bytes)`, { cause: err });
      }
      onEvent(event);
    };
    for await (const chunk of res as AsyncIterable<Buffer>) {
      for (const line of lines.push(chunk)) handle(line);
      if (lines.error) throw lines.error;
    }
    const last = lines.end();
    if (last) handle(last);
  } catch (err) {
    if (signal.aborted) return;
    throw err;
  } finally {
    req.destroy();
  }
}
