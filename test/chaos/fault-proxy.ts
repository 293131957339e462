// A TLS-terminating HTTP proxy between the replicas and kube-apiserver that injects HTTP-level faults:
// connection resets (before forwarding, or after the API server already acted on the request), 5xx and
// 429 answers with a Status body, latency, watches that stall (headers, then silence, then a reset) or
// end early (a clean end of the stream), dropped connections (every open connection cut at once, with
// all the watches it carries; HTTP/2 sessions get a GOAWAY first), and blackouts (every connection cut
// and every request refused, like an unreachable API).
// It speaks HTTP/2 and HTTP/1.1 (ALPN), as kube-apiserver does, so a client that multiplexes its watches
// over one connection is tested as it runs in a cluster. A reset of one request resets its HTTP/2 stream
// only (the compatibility API's socket stands for the stream), as in HTTP/1.1 it is the request's socket.
// The replicas' kubeconfig points here and trusts `caPem`; their bearer token passes through unchanged.
// Per client (its bearer token) the proxy keeps whether its requests for Secrets get through: a replica
// whose reads fail (faults injected here, or the API server's own 429s and 5xx) cannot pick up what its
// Secret holds, and the checker's invariant 2 waits for it to get through again (secretsReachableSince).
import type { IncomingMessage, ServerResponse } from 'node:http';
import {
  constants as h2,
  createSecureServer,
  type Http2SecureServer,
  type Http2ServerRequest,
  type Http2ServerResponse,
  type ServerHttp2Session,
} from 'node:http2';
import { Agent, request } from 'node:https';
import type { Socket } from 'node:net';
import { createControlPlanePki } from '../harness/pki.ts';
import type { Rng } from './rng.ts';

export interface ProxyFaults {
  /** Probability that a request's connection is reset before it is forwarded. */
  resetBefore?: number;
  /** Probability that a request is forwarded and its connection reset instead of the answer. */
  resetAfter?: number;
  /** Probability of a 500/503/504 answer (not forwarded). */
  error5xx?: number;
  /** Probability of a 429 answer with Retry-After: 1 (not forwarded). */
  throttle429?: number;
  /** Latency added before forwarding, uniform in [min, max] ms. */
  latencyMs?: [number, number];
  /** Probability that a watch gets its headers, then silence for [min, max] ms, then a reset. */
  stallWatch?: number;
  stallMs?: [number, number];
  /** Probability that a watch ends cleanly after [min, max] ms. */
  endWatchEarly?: number;
  endAfterMs?: [number, number];
  /** Every request is reset (and open connections were cut when it began). */
  blackout?: boolean;
  /** When set: every open connection is cut once (HTTP/2: GOAWAY, then cut after this many ms), nothing after. */
  dropConnectionsAfterMs?: number;
}

export type ProxyFaultKind =
  | 'resetBefore'
  | 'resetAfter'
  | 'error5xx'
  | 'throttle429'
  | 'latency'
  | 'stallWatch'
  | 'endWatchEarly'
  | 'blackout'
  | 'dropConnection'
  | 'upstreamDown';

type ProxyRequest = IncomingMessage | Http2ServerRequest;
type ProxyResponse = ServerResponse | Http2ServerResponse;

const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'te', 'trailer', 'upgrade', 'host']);

/** Headers to pass on: without hop-by-hop headers, nor HTTP/2 pseudo-headers (":path"...) towards HTTP/1.1. */
/**
 * Resets one request: its HTTP/1.1 connection, or its HTTP/2 stream (RST_STREAM INTERNAL_ERROR; the
 * connection and the other streams on it live on), as a proxy or load balancer in between does.
 */
function resetRequest(msg: ProxyRequest | ProxyResponse): void {
  if ('stream' in msg && msg.stream) msg.stream.close(h2.NGHTTP2_INTERNAL_ERROR);
  else msg.socket?.destroy();
}

function stripHopByHop(headers: IncomingMessage['headers']): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const [k, v] of Object.entries(headers)) if (v !== undefined && !k.startsWith(':') && !HOP_BY_HOP.has(k.toLowerCase())) out[k] = v;
  return out;
}

function statusBody(code: number, reason: string, message: string): string {
  return JSON.stringify({ kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason, code });
}

export class FaultProxy {
  readonly #upstream: URL;
  readonly #upstreamCa: string;
  readonly #rng: Rng;
  #server: Http2SecureServer | undefined;
  readonly #sessions = new Set<ServerHttp2Session>();
  #agent: Agent;
  #faults: ProxyFaults = {};
  readonly #sockets = new Set<Socket>();
  readonly #timers = new Set<NodeJS.Timeout>();
  /** Watches being streamed to a client now. */
  readonly #watches = new Set<{ upstreamRes: IncomingMessage; res: ProxyResponse; req: ProxyRequest }>();
  /** Per bearer token: whether its last request for Secrets failed, and since when they have got through. */
  readonly #secretPaths = new Map<string, { failed: boolean; okSince: number }>();
  /** The same for each client's writes of its Pod's status (the readiness gate's condition). */
  readonly #statusPaths = new Map<string, { failed: boolean; okSince: number }>();
  /** Faults applied, per kind. */
  readonly applied = new Map<ProxyFaultKind, number>();
  requests = 0;
  caPem = '';
  url = '';

  readonly #onRequest: ((method: string, path: string) => void) | undefined;

  /** `onRequest`: told of every request as it arrives (method, and path without the query). */
  constructor(options: { upstream: string; upstreamCaPem: string; rng: Rng; onRequest?: (method: string, path: string) => void }) {
    this.#onRequest = options.onRequest;
    this.#upstream = new URL(options.upstream);
    this.#upstreamCa = options.upstreamCaPem;
    this.#rng = options.rng;
    // Towards kube-apiserver HTTP/1.1: one connection per open watch; many domains mean many watches.
    this.#agent = new Agent({ keepAlive: true, ca: this.#upstreamCa, maxSockets: 4096 });
  }

  async start(): Promise<void> {
    // The harness PKI makes a CA and a 127.0.0.1 serving certificate: a second, independent set here.
    const pki = await createControlPlanePki();
    this.caPem = pki.ca.certPem;
    const server = createSecureServer({ cert: pki.serving.certPem, key: pki.serving.keyPem, allowHTTP1: true }, (req, res) => this.#handle(req, res));
    server.on('secureConnection', (socket: Socket) => {
      this.#sockets.add(socket);
      socket.on('close', () => this.#sockets.delete(socket));
    });
    server.on('session', (session: ServerHttp2Session) => {
      this.#sessions.add(session);
      session.on('close', () => this.#sessions.delete(session));
      session.on('error', () => {});
    });
    server.on('tlsClientError', () => {});
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    this.#server = server;
    this.url = `https://127.0.0.1:${(server.address() as { port: number }).port}`;
  }

  get faults(): ProxyFaults {
    return this.#faults;
  }

  setFaults(faults: ProxyFaults): void {
    this.#faults = faults;
    if (faults.blackout) {
      this.#count('blackout');
      this.cutAll();
    }
    if (faults.dropConnectionsAfterMs !== undefined) this.dropConnections(faults.dropConnectionsAfterMs);
  }

  /** HTTP/2 connections open now (each may carry many requests and watches). */
  get http2Sessions(): number {
    return this.#sessions.size;
  }

  /**
   * Every open connection goes away with whatever it carries: HTTP/2 sessions get a GOAWAY (no new
   * streams) and are cut `graceMs` later with their open watches; HTTP/1.1 connections are cut now.
   * Returns how many connections were open.
   */
  dropConnections(graceMs: number): number {
    for (const session of this.#sessions) {
      this.#count('dropConnection');
      try {
        session.goaway();
      } catch {
        // already closing
      }
      this.#later(graceMs, () => session.destroy());
    }
    let n = this.#sessions.size;
    for (const socket of this.#sockets) {
      if ((socket as Socket & { alpnProtocol?: string | false }).alpnProtocol === 'h2') continue;
      n++;
      this.#count('dropConnection');
      socket.destroy();
    }
    return n;
  }

  clear(): void {
    this.#faults = {};
  }

  /** Cuts every open client connection (watches included). */
  cutAll(): void {
    for (const s of this.#sockets) s.destroy();
  }

  /** Open watches go silent now (events dropped), then are reset after [min, max] ms each. */
  stallOpenWatches(ms: [number, number]): number {
    let n = 0;
    for (const w of [...this.#watches]) {
      if (w.res.writableEnded) continue;
      n++;
      this.#count('stallWatch');
      this.#outcome(w.req, false);
      this.#watches.delete(w);
      w.upstreamRes.unpipe(w.res);
      w.upstreamRes.resume();
      this.#later(this.#rng.between(...ms), () => {
        w.upstreamRes.destroy();
        resetRequest(w.res);
      });
    }
    return n;
  }

  /** Open watches end now, cleanly (as when the API server closes a watch). */
  endOpenWatches(): number {
    let n = 0;
    for (const w of [...this.#watches]) {
      if (w.res.writableEnded) continue;
      n++;
      this.#count('endWatchEarly');
      this.#watches.delete(w);
      w.upstreamRes.unpipe(w.res);
      w.upstreamRes.destroy();
      w.res.end();
    }
    return n;
  }

  async close(): Promise<void> {
    for (const t of this.#timers) clearTimeout(t);
    this.#timers.clear();
    const server = this.#server;
    if (!server) return;
    const closed = new Promise<void>((resolve) => server.close(() => resolve()));
    for (const session of this.#sessions) session.destroy();
    this.cutAll();
    this.#agent.destroy();
    await closed;
  }

  /**
   * From when the client holding `token` has got its requests for Secrets through without a failure since:
   * 0 if none of them ever failed, Infinity while the last one failed (an error answer, a reset, a watch
   * cut or stalled).
   */
  secretsReachableSince(token: string): number {
    return reachableSince(this.#secretPaths.get(token));
  }

  /** As secretsReachableSince, for the client's writes of its Pod's status: its readiness gate. */
  statusReachableSince(token: string): number {
    return reachableSince(this.#statusPaths.get(token));
  }

  /** Records how a request for Secrets, or a write of a Pod's status, went for its client (others are not followed). */
  #outcome(req: ProxyRequest, ok: boolean): void {
    const url = req.url ?? '';
    const paths = /\/secrets(\/|$|\?)/.test(url) ? this.#secretPaths : /\/pods\/[^/]+\/status(\?|$)/.test(url) ? this.#statusPaths : undefined;
    const token = /^Bearer (.+)$/.exec(String(req.headers.authorization ?? ''))?.[1];
    if (!paths || !token) return;
    const path = paths.get(token);
    if (!ok) paths.set(token, { failed: true, okSince: Number.POSITIVE_INFINITY });
    else if (!path) paths.set(token, { failed: false, okSince: 0 });
    else if (path.failed) paths.set(token, { failed: false, okSince: Date.now() });
  }

  #count(kind: ProxyFaultKind): void {
    this.applied.set(kind, (this.applied.get(kind) ?? 0) + 1);
  }

  #later(ms: number, fn: () => void): void {
    const t = setTimeout(() => {
      this.#timers.delete(t);
      fn();
    }, ms);
    this.#timers.add(t);
  }

  #handle(req: ProxyRequest, proxyRes: ProxyResponse): void {
    // The HTTP/2 compatibility response has the same writeHead and flushHeaders at run time (writeHead
    // sends the HEADERS frame at once); the types differ only in their overloads.
    const res = proxyRes as ServerResponse;
    this.requests++;
    const f = this.#faults;
    const rng = this.#rng;
    const url = new URL(req.url ?? '/', 'https://proxy.invalid');
    const isWatch = url.searchParams.get('watch') === 'true' || url.searchParams.get('watch') === '1';
    this.#onRequest?.(req.method ?? 'GET', url.pathname);
    req.socket.setNoDelay(true);
    if (f.blackout) {
      this.#count('blackout');
      this.#outcome(req, false);
      resetRequest(req);
      return;
    }
    if (f.resetBefore && rng.chance(f.resetBefore)) {
      this.#count('resetBefore');
      this.#outcome(req, false);
      resetRequest(req);
      return;
    }
    if (f.error5xx && rng.chance(f.error5xx)) {
      this.#count('error5xx');
      this.#outcome(req, false);
      const code = rng.pick([500, 503, 504]);
      const [reason, message] =
        code === 500
          ? ['InternalError', 'Internal error occurred: chaos']
          : code === 503
            ? ['ServiceUnavailable', 'the server is currently unable to handle the request']
            : ['Timeout', 'Timeout: request did not complete within requested timeout'];
      req.resume();
      res.writeHead(code, { 'Content-Type': 'application/json' }).end(statusBody(code, reason, message));
      return;
    }
    if (f.throttle429 && rng.chance(f.throttle429)) {
      this.#count('throttle429');
      this.#outcome(req, false);
      req.resume();
      res
        .writeHead(429, { 'Content-Type': 'application/json', 'Retry-After': '1' })
        .end(statusBody(429, 'TooManyRequests', 'Too many requests, please try again later.'));
      return;
    }
    const resetAfter = !isWatch && f.resetAfter !== undefined && rng.chance(f.resetAfter);
    const stallMs = isWatch && f.stallWatch && rng.chance(f.stallWatch) ? rng.between(...(f.stallMs ?? [1000, 4000])) : undefined;
    const endMs =
      isWatch && stallMs === undefined && f.endWatchEarly && rng.chance(f.endWatchEarly) ? rng.between(...(f.endAfterMs ?? [200, 2000])) : undefined;
    const latency = f.latencyMs ? rng.between(...f.latencyMs) : 0;
    if (latency > 0) this.#count('latency');
    const forward = (): void => {
      if (req.socket.destroyed) return;
      const upstreamReq = request(
        {
          protocol: 'https:',
          hostname: this.#upstream.hostname,
          port: this.#upstream.port,
          method: req.method,
          path: req.url,
          headers: { ...stripHopByHop(req.headers), host: this.#upstream.host },
          agent: this.#agent,
        },
        (upstreamRes) => {
          if (resetAfter) {
            // The API server has acted on it; the client never learns the outcome.
            this.#count('resetAfter');
            this.#outcome(req, false);
            upstreamRes.resume();
            resetRequest(req);
            return;
          }
          const status = upstreamRes.statusCode ?? 502;
          // The API server's own refusals count as failures too (429 under load, 5xx while it starts).
          this.#outcome(req, stallMs === undefined && status !== 429 && status < 500);
          res.writeHead(status, stripHopByHop(upstreamRes.headers));
          res.flushHeaders();
          if (stallMs !== undefined) {
            this.#count('stallWatch');
            upstreamRes.resume(); // silence: the events are dropped
            this.#later(stallMs, () => {
              upstreamRes.destroy();
              resetRequest(req);
            });
            return;
          }
          upstreamRes.pipe(res);
          upstreamRes.on('error', () => resetRequest(req));
          if (isWatch) {
            const entry = { upstreamRes, res, req };
            this.#watches.add(entry);
            res.on('close', () => {
              this.#watches.delete(entry);
              // Cut, reset or stalled rather than ended: the client lost its view until it watches again.
              if (!res.writableFinished) this.#outcome(req, false);
            });
          }
          if (endMs !== undefined) {
            this.#later(endMs, () => {
              if (res.writableEnded) return;
              this.#count('endWatchEarly');
              upstreamRes.unpipe(res);
              upstreamRes.destroy();
              res.end();
            });
          }
        },
      );
      upstreamReq.on('error', () => {
        // API server down or connection lost: the client sees its connection reset, as without a proxy.
        this.#count('upstreamDown');
        this.#outcome(req, false);
        resetRequest(req);
      });
      req.on('error', () => upstreamReq.destroy());
      res.on('close', () => {
        if (!res.writableFinished) upstreamReq.destroy();
      });
      req.pipe(upstreamReq);
    };
    if (latency > 0) this.#later(latency, forward);
    else forward();
  }
}

/** 0 if no request of the kind ever failed, Infinity while the last one failed, else since when they get through. */
function reachableSince(path: { failed: boolean; okSince: number } | undefined): number {
  if (!path) return 0;
  return path.failed ? Number.POSITIVE_INFINITY : path.okSince;
}
