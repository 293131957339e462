// The webhook's HTTPS listener, whose certificate changes in-process per handshake (src/tls/serving-pair.ts).
import type { IncomingMessage, ServerResponse } from 'node:http';
import { createServer, type Server } from 'node:https';
import type { AddressInfo, Socket } from 'node:net';
import { systemClock, type Clock } from '../core/ports/clock.ts';
import { CertshareError, errorMessage } from '../core/errors.ts';
import { checkedPair, servePair, type ServingPair } from '../tls/serving-pair.ts';
import { dateHeaderWithoutIcu } from '../http/date-header.ts';

export type { ServingPair } from '../tls/serving-pair.ts';

type JsonHandler = (body: unknown) => unknown;

/**
 * Bounds against a flood: the webhook sits behind `failurePolicy: Fail`, and any Pod of the cluster can
 * reach its port unless a NetworkPolicy fences it. A body fits the largest Pod etcd stores (1.5 MiB) in its
 * AdmissionReview envelope; a larger Content-Length, or none, is refused before a byte of the body is read.
 * At most MAX_IN_FLIGHT requests and MAX_BUFFERED_BYTES of declared bodies are read or handled at once,
 * MAX_IN_FLIGHT_PER_PEER and MAX_BUFFERED_BYTES_PER_PEER of them from one address; past any, 503 with
 * Retry-After (the apiserver's client tries again; its Pod reviews are kilobytes, so a byte budget leaves it
 * room where a count would not). Each body is read into one buffer of its declared size (no copies). A body
 * must arrive whole within BODY_TIMEOUT_MS of its headers (the apiserver sends at once: a slow body holds a
 * slot two seconds, not ten). Connections: at most MAX_CONNECTIONS_PER_PEER from one address (more are
 * dropped at accept, before any TLS work), and past MAX_CONNECTIONS in all the oldest connection of the
 * address holding most is dropped, not the new one: a flood from a few Pods cannot crowd the apiserver out
 * (measured: test/apiserver/injector/flood.test.ts). Many addresses at once can; the NetworkPolicy is the fence then.
 * @forTests
 */
export const MAX_BODY_BYTES = 2 * 1024 * 1024;
/** @forTests */
export const MAX_IN_FLIGHT = 32;
/** @forTests */
export const MAX_IN_FLIGHT_PER_PEER = 8;
/** @forTests */
export const MAX_BUFFERED_BYTES = 16 * 1024 * 1024;
/** @forTests */
export const MAX_BUFFERED_BYTES_PER_PEER = MAX_BODY_BYTES;
/** @forTests */
export const MAX_CONNECTIONS = 256;
/** @forTests */
export const MAX_CONNECTIONS_PER_PEER = 64;
/** @forTests */
export const BODY_TIMEOUT_MS = 2_000;
/** The whole request, headers included (Node's requestTimeout and headersTimeout). @forTests */
export const REQUEST_TIMEOUT_MS = 10_000;

/** Open connections by remote address, oldest first, with the fairness rules above. */
class ConnectionTable {
  readonly #byPeer = new Map<string, Set<Socket>>();
  #total = 0;

  /** Admits `socket`, or destroys it (its address holds its share), dropping the greediest address's oldest to make room. */
  admit(socket: Socket): void {
    const peer = socket.remoteAddress ?? '?';
    const own = this.#byPeer.get(peer) ?? new Set<Socket>();
    if (own.size >= MAX_CONNECTIONS_PER_PEER) {
      socket.destroy();
      return;
    }
    if (this.#total >= MAX_CONNECTIONS) {
      let greediest: Set<Socket> | undefined;
      for (const sockets of this.#byPeer.values()) if (!greediest || sockets.size > greediest.size) greediest = sockets;
      if (!greediest || greediest.size <= own.size + 1) {
        socket.destroy();
        return;
      }
      greediest.values().next().value?.destroy();
    }
    own.add(socket);
    this.#byPeer.set(peer, own);
    this.#total++;
    socket.once('close', () => {
      own.delete(socket);
      this.#total--;
      if (own.size === 0 && this.#byPeer.get(peer) === own) this.#byPeer.delete(peer);
    });
  }
}

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

/** The body of `declared` bytes (its Content-Length), parsed as JSON, within BODY_TIMEOUT_MS of the clock. */
function readJson(req: IncomingMessage, declared: number, clock: Clock): Promise<unknown> {
  return new Promise((resolve, reject) => {
    const body = Buffer.allocUnsafe(declared);
    let bytes = 0;
    const received = new AbortController();
    const clearSlow = () => received.abort();
    // The 408 goes out with Connection: close (the caller's send); destroying the socket here would lose it.
    clock.sleep(BODY_TIMEOUT_MS, received.signal).then(
      () => reject(Object.assign(new Error(`request body not received within ${BODY_TIMEOUT_MS} ms`), { status: 408, close: true })),
      () => {},
    );
    req.once('close', clearSlow);
    req.on('data', (chunk: Buffer) => {
      // Node's parser stops at Content-Length; the check keeps the copy in bounds whatever happens.
      if (bytes + chunk.length > declared) {
        reject(Object.assign(new Error('request body longer than its Content-Length'), { status: 400 }));
        req.destroy();
        return;
      }
      chunk.copy(body, bytes);
      bytes += chunk.length;
    });
    req.on('end', () => {
      clearSlow();
      try {
        resolve(JSON.parse(body.toString('utf8', 0, bytes)));
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

/** What is being read or handled, in all and per caller address: the bounds a flood meets. */
class InFlight {
  readonly #all = { requests: 0, bytes: 0 };
  readonly #byPeer = new Map<string, { requests: number; bytes: number }>();

  /** Admits a request declaring `declared` bytes from `peer`: its release, for when its response is done, or the bound it is over. */
  admit(peer: string, declared: number): { release: () => void } | { over: string } {
    const all = this.#all;
    const own = this.#byPeer.get(peer) ?? { requests: 0, bytes: 0 };
    const over =
      all.requests >= MAX_IN_FLIGHT || all.bytes + declared > MAX_BUFFERED_BYTES
        ? `${MAX_IN_FLIGHT} requests or ${MAX_BUFFERED_BYTES} bytes at once`
        : own.requests >= MAX_IN_FLIGHT_PER_PEER || own.bytes + declared > MAX_BUFFERED_BYTES_PER_PEER
          ? `${MAX_IN_FLIGHT_PER_PEER} requests or ${MAX_BUFFERED_BYTES_PER_PEER} bytes at once from ${peer}`
          : undefined;
    if (over) return { over };
    for (const tally of [all, own]) {
      tally.requests++;
      tally.bytes += declared;
    }
    this.#byPeer.set(peer, own);
    return {
      release: () => {
        for (const tally of [all, own]) {
          tally.requests--;
          tally.bytes -= declared;
        }
        if (own.requests === 0 && this.#byPeer.get(peer) === own) this.#byPeer.delete(peer);
      },
    };
  }
}

/**
 * Serves POST routes taking and returning JSON, and GET /healthz (200 once a certificate is loaded).
 * Without a pair yet, handshakes fail until the first setPair().
 */
export async function startTlsServer(options: {
  host: string;
  port: number;
  pair?: ServingPair;
  routes: Record<string, JsonHandler>;
  /** Times the body (BODY_TIMEOUT_MS); the system's by default. */
  clock?: Clock;
}): Promise<TlsServer> {
  const clock = options.clock ?? systemClock;
  let serial: string | undefined;
  let draining = false;
  const inFlight = new InFlight();
  const connections = new ConnectionTable();
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
    const declared = admitBody(req, res, inFlight);
    if (declared === undefined) return;
    readJson(req, declared, clock).then(
      (body) => {
        const answer = answerOf(handler, body);
        reply(res, answer.status, answer.body);
      },
      (err: unknown) => {
        const { status = 400, close = false } = err as { status?: number; close?: boolean };
        send(res, status, { error: errorMessage(err) }, !draining && !close);
      },
    );
  });
  dateHeaderWithoutIcu(server);
  server.on('connection', (socket: Socket) => connections.admit(socket));
  // The apiserver keeps connections to webhooks alive; a bound on idle ones frees sockets of gone callers.
  server.keepAliveTimeout = 60_000;
  server.headersTimeout = REQUEST_TIMEOUT_MS;
  server.requestTimeout = REQUEST_TIMEOUT_MS;
  await listen(server, options.port, options.host);
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
      return closeServer(server, graceMs);
    },
  };
}

/** Stops listening; requests in flight get up to `graceMs` to finish. */
function closeServer(server: Server, graceMs: number): Promise<void> {
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
}

/**
 * The Content-Length of a POST admitted to be read, or undefined once it was refused unread with the
 * connection closed (its body may still be on the way). An admitted request holds its share until its response is done.
 */
function admitBody(req: IncomingMessage, res: ServerResponse, inFlight: InFlight): number | undefined {
  const length = req.headers['content-length'];
  const declared = Number(length);
  if (length === undefined) {
    send(res, 411, { error: 'Content-Length required' }, false);
    return undefined;
  }
  if (!(declared <= MAX_BODY_BYTES)) {
    send(res, 413, { error: `request body larger than ${MAX_BODY_BYTES} bytes` }, false);
    return undefined;
  }
  const admitted = inFlight.admit(req.socket.remoteAddress ?? '?', declared);
  if ('over' in admitted) {
    send(res, 503, { error: `more than ${admitted.over}` }, false, { 'retry-after': '1' });
    return undefined;
  }
  res.once('close', admitted.release);
  return declared;
}

/** The handler's answer: a request it cannot answer is the caller's fault (400); anything else is the handler's (500). */
function answerOf(handler: JsonHandler, body: unknown): { status: number; body: unknown } {
  try {
    return { status: 200, body: handler(body) };
  } catch (err) {
    const status = err instanceof CertshareError && err.code === 'CERTSHARE_BAD_REQUEST' ? 400 : 500;
    return { status, body: { error: errorMessage(err) } };
  }
}

function listen(server: Server, port: number, host: string): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
}
