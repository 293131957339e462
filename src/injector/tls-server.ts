// The webhook's HTTPS listener, whose certificate changes in-process per handshake (src/server/tls-pair.ts).
import type { IncomingMessage, ServerResponse } from 'node:http';
import { createServer, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import { errorMessage } from '../core/errors.ts';
import { checkedPair, servePair, type ServingPair } from '../server/tls-pair.ts';

export type { ServingPair } from '../server/tls-pair.ts';

export type JsonHandler = (body: unknown) => unknown;

/**
 * Bounds against a flood: the webhook sits behind `failurePolicy: Fail`, and any Pod of the cluster can
 * reach its port. A body fits the largest Pod etcd stores (1.5 MiB) in its AdmissionReview envelope; a
 * larger Content-Length is refused before a byte of the body is read. At most MAX_IN_FLIGHT requests are
 * read or handled at once (so at most 16 x 2 MiB buffered); past it, 503 with Retry-After (the apiserver's
 * client tries again). Connections past MAX_CONNECTIONS are dropped at accept; a request must arrive
 * whole within REQUEST_TIMEOUT_MS (the apiserver gives a webhook at most 30 s, ours 5 s).
 */
export const MAX_BODY_BYTES = 2 * 1024 * 1024;
export const MAX_IN_FLIGHT = 16;
export const MAX_CONNECTIONS = 256;
const REQUEST_TIMEOUT_MS = 10_000;

export interface TlsServer {
  readonly port: number;
  /** Serial (upper-case hex) of the leaf new handshakes get; undefined before the first pair. */
  readonly serial: string | undefined;
  /** Validates the pair (it parses, the key matches), then serves it to every new handshake. Throws and keeps the old one otherwise. */
  setPair(pair: ServingPair): void;
  /**
   * Graceful stop, for after the endpoint was taken out of rotation: for `drainMs` every response says
   * `Connection: close`, so clients leave their kept-alive connections themselves; then the listener
   * closes, idle connections end, requests in flight get up to `graceMs` to finish.
   */
  close(options?: { drainMs?: number; graceMs?: number }): Promise<void>;
}

function readJson(req: IncomingMessage): Promise<unknown> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let bytes = 0;
    req.on('data', (chunk: Buffer) => {
      bytes += chunk.length;
      if (bytes > MAX_BODY_BYTES) {
        reject(Object.assign(new Error(`request body larger than ${MAX_BODY_BYTES} bytes`), { status: 413 }));
        req.destroy();
        return;
      }
      chunks.push(chunk);
    });
    req.on('end', () => {
      try {
        resolve(JSON.parse(Buffer.concat(chunks).toString('utf8')));
      } catch {
        reject(Object.assign(new Error('request body is not JSON'), { status: 400 }));
      }
    });
    req.on('error', reject);
  });
}

function send(res: ServerResponse, status: number, body: unknown, keepAlive: boolean, headers: Record<string, string> = {}): void {
  const text = JSON.stringify(body);
  if (!keepAlive) res.shouldKeepAlive = false;
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), ...headers });
  res.end(text);
}

/**
 * Serves POST routes taking and returning JSON, and GET /healthz (200 once a certificate is loaded).
 * Without a pair yet, handshakes fail until the first setPair().
 */
export async function startTlsServer(options: { host: string; port: number; pair?: ServingPair; routes: Record<string, JsonHandler> }): Promise<TlsServer> {
  let serial: string | undefined;
  let draining = false;
  let inFlight = 0;
  const reply = (res: ServerResponse, status: number, body: unknown) => send(res, status, body, !draining);
  const initial = options.pair ? checkedPair(options.pair) : undefined;
  serial = initial?.serial;
  const server: Server = createServer({ minVersion: 'TLSv1.2', ...initial?.options }, (req, res) => {
    const path = (req.url ?? '/').split('?')[0]!;
    if (req.method === 'GET' && path === '/healthz') {
      reply(res, serial ? 200 : 503, { serving: serial !== undefined });
      return;
    }
    const handler = options.routes[path];
    if (handler === undefined || req.method !== 'POST') {
      reply(res, 404, { error: `certshare injector serves POST ${Object.keys(options.routes).join(', ')} and GET /healthz` });
      return;
    }
    // Refused unread, and the connection closed: its body may still be on the way.
    const declared = Number(req.headers['content-length'] ?? 0);
    if (!(declared <= MAX_BODY_BYTES)) {
      send(res, 413, { error: `request body larger than ${MAX_BODY_BYTES} bytes` }, false);
      return;
    }
    if (inFlight >= MAX_IN_FLIGHT) {
      send(res, 503, { error: `more than ${MAX_IN_FLIGHT} requests at once` }, false, { 'retry-after': '1' });
      return;
    }
    inFlight++;
    res.once('close', () => inFlight--);
    readJson(req).then(
      (body) => {
        let answer: unknown;
        try {
          answer = handler(body);
        } catch (err) {
          reply(res, 500, { error: errorMessage(err) });
          return;
        }
        reply(res, 200, answer);
      },
      (err: unknown) => reply(res, (err as { status?: number }).status ?? 400, { error: errorMessage(err) }),
    );
  });
  server.maxConnections = MAX_CONNECTIONS;
  // The apiserver keeps connections to webhooks alive; a bound on idle ones frees sockets of gone callers.
  server.keepAliveTimeout = 60_000;
  server.headersTimeout = 10_000;
  server.requestTimeout = REQUEST_TIMEOUT_MS;
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port, options.host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  return {
    port: (server.address() as AddressInfo).port,
    get serial() {
      return serial;
    },
    setPair(pair) {
      serial = servePair(server, pair);
    },
    async close({ drainMs = 0, graceMs = 5000 } = {}) {
      draining = true;
      // Closing a kept-alive connection the moment a client sends on it loses that request (Go's client,
      // the apiserver's, does not retry a POST it wrote): let clients close them after a response instead.
      if (drainMs > 0) await new Promise((resolve) => setTimeout(resolve, drainMs));
      return new Promise<void>((resolve) => {
        const bound = setTimeout(() => server.closeAllConnections(), graceMs);
        server.close(() => {
          clearTimeout(bound);
          resolve();
        });
        // Idle kept-alive connections end now (a client retries a request on a connection closed while idle);
        // a connection with a request in flight ends after its response.
        server.closeIdleConnections();
      });
    },
  };
}
