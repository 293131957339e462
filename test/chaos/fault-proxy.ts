// A TLS-terminating HTTP proxy between the replicas and kube-apiserver that injects HTTP-level faults:
// connection resets (before forwarding, or after the API server already acted on the request), 5xx and
// 429 answers with a Status body, latency, watches that stall (headers, then silence, then a reset) or
// end early (a clean end of the stream), and blackouts (every connection cut, like an unreachable API).
// The replicas' kubeconfig points here and trusts `caPem`; their bearer token passes through unchanged.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { Agent, createServer, request, type Server } from 'node:https';
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
  | 'upstreamDown';

const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'te', 'trailer', 'upgrade', 'host']);

function stripHopByHop(headers: IncomingMessage['headers']): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const [k, v] of Object.entries(headers)) if (v !== undefined && !HOP_BY_HOP.has(k.toLowerCase())) out[k] = v;
  return out;
}

function statusBody(code: number, reason: string, message: string): string {
  return JSON.stringify({ kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason, code });
}

export class FaultProxy {
  readonly #upstream: URL;
  readonly #upstreamCa: string;
  readonly #rng: Rng;
  #server: Server | undefined;
  #agent: Agent;
  #faults: ProxyFaults = {};
  readonly #sockets = new Set<Socket>();
  readonly #timers = new Set<NodeJS.Timeout>();
  /** Watches being streamed to a client now. */
  readonly #watches = new Set<{ upstreamRes: IncomingMessage; res: ServerResponse }>();
  /** Faults applied, per kind. */
  readonly applied = new Map<ProxyFaultKind, number>();
  requests = 0;
  caPem = '';
  url = '';

  constructor(options: { upstream: string; upstreamCaPem: string; rng: Rng }) {
    this.#upstream = new URL(options.upstream);
    this.#upstreamCa = options.upstreamCaPem;
    this.#rng = options.rng;
    this.#agent = new Agent({ keepAlive: true, ca: this.#upstreamCa, maxSockets: 256 });
  }

  async start(): Promise<void> {
    // The harness PKI makes a CA and a 127.0.0.1 serving certificate: a second, independent set here.
    const pki = await createControlPlanePki();
    this.caPem = pki.ca.certPem;
    const server = createServer({ cert: pki.serving.certPem, key: pki.serving.keyPem, keepAliveTimeout: 5000 }, (req, res) => this.#handle(req, res));
    server.on('secureConnection', (socket: Socket) => {
      this.#sockets.add(socket);
      socket.on('close', () => this.#sockets.delete(socket));
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
      this.#watches.delete(w);
      w.upstreamRes.unpipe(w.res);
      w.upstreamRes.resume();
      this.#later(this.#rng.between(...ms), () => {
        w.upstreamRes.destroy();
        w.res.socket?.destroy();
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
    this.cutAll();
    this.#agent.destroy();
    await closed;
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

  #handle(req: IncomingMessage, res: ServerResponse): void {
    this.requests++;
    const f = this.#faults;
    const rng = this.#rng;
    const url = new URL(req.url ?? '/', 'https://proxy.invalid');
    const isWatch = url.searchParams.get('watch') === 'true' || url.searchParams.get('watch') === '1';
    req.socket.setNoDelay(true);
    if (f.blackout) {
      this.#count('blackout');
      req.socket.destroy();
      return;
    }
    if (f.resetBefore && rng.chance(f.resetBefore)) {
      this.#count('resetBefore');
      req.socket.destroy();
      return;
    }
    if (f.error5xx && rng.chance(f.error5xx)) {
      this.#count('error5xx');
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
            upstreamRes.resume();
            req.socket.destroy();
            return;
          }
          res.writeHead(upstreamRes.statusCode ?? 502, stripHopByHop(upstreamRes.headers));
          res.flushHeaders();
          if (stallMs !== undefined) {
            this.#count('stallWatch');
            upstreamRes.resume(); // silence: the events are dropped
            this.#later(stallMs, () => {
              upstreamRes.destroy();
              req.socket.destroy();
            });
            return;
          }
          upstreamRes.pipe(res);
          upstreamRes.on('error', () => req.socket.destroy());
          if (isWatch) {
            const entry = { upstreamRes, res };
            this.#watches.add(entry);
            res.on('close', () => this.#watches.delete(entry));
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
        req.socket.destroy();
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
