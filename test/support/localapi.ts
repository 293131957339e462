import http from 'node:http';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { generateKeyPairSync } from 'node:crypto';
import type { Logger } from '../../src/core/ports/logger.ts';

// Small real HTTP servers speaking the LocalAPI wire format, on a unix socket or on TCP 127.0.0.1.

export type Transport = 'unix' | 'tcp';
export type Handler = (req: IncomingMessage, res: ServerResponse) => void;

export interface RecordedRequest {
  method: string;
  url: string;
  headers: http.IncomingHttpHeaders;
}

export interface TestServer {
  /** What createLocalApiClient takes: the socket path or the http:// base URL. */
  address: string;
  requests: RecordedRequest[];
  /** Resolves with the next request to arrive (or an already arrived one not yet taken). */
  nextRequest(): Promise<{ req: IncomingMessage; res: ServerResponse }>;
  close(): Promise<void>;
}

export async function startServer(handler: Handler, transport: Transport): Promise<TestServer> {
  const requests: RecordedRequest[] = [];
  const arrivals = new AsyncQueue<{ req: IncomingMessage; res: ServerResponse }>();
  const server = http.createServer((req, res) => {
    requests.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers });
    arrivals.push({ req, res });
    handler(req, res);
  });
  let dir: string | undefined;
  let address: string;
  if (transport === 'unix') {
    dir = await mkdtemp(join(tmpdir(), 'certshare-la-'));
    address = join(dir, 'tailscaled.sock');
    await listen(server, address);
  } else {
    await listen(server, 0, '127.0.0.1');
    address = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  }
  return {
    address,
    requests,
    nextRequest: () => arrivals.shift(),
    async close() {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      if (dir) await rm(dir, { recursive: true, force: true });
    },
  };
}

function listen(server: http.Server, ...args: [string] | [number, string]): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(...(args as [number, string]), () => {
      server.off('error', reject);
      resolve();
    });
  });
}

/** A FIFO whose shift() waits for the next push. */
export class AsyncQueue<T> {
  #items: T[] = [];
  #waiters: ((item: T) => void)[] = [];
  push(item: T): void {
    const waiter = this.#waiters.shift();
    if (waiter) waiter(item);
    else this.#items.push(item);
  }
  shift(): Promise<T> {
    if (this.#items.length > 0) return Promise.resolve(this.#items.shift()!);
    return new Promise((resolve) => this.#waiters.push(resolve));
  }
  get length(): number {
    return this.#items.length;
  }
}

/** One open watch-ipn-bus response, driven by the test. */
export class BusConnection {
  readonly req: IncomingMessage;
  readonly res: ServerResponse;
  /** Resolves when the client side went away (or the test ended the response). */
  readonly closed: Promise<void>;
  constructor(req: IncomingMessage, res: ServerResponse, version = '1.100.0-test') {
    this.req = req;
    this.res = res;
    this.closed = new Promise((resolve) => res.once('close', () => resolve()));
    res.writeHead(200, { 'Content-Type': 'application/json', 'Tailscale-Version': version });
    res.flushHeaders();
  }
  send(notify: object): void {
    this.res.write(`${JSON.stringify(notify)}\n`);
  }
  sendRaw(text: string | Buffer): void {
    this.res.write(text);
  }
  /** Clean end (final chunk). */
  end(): void {
    this.res.end();
  }
  /** Abrupt drop, as when tailscaled exits. */
  drop(): void {
    this.req.socket.destroy();
  }
}

/**
 * A tailscaled stand-in for the watcher: watch-ipn-bus connections are queued for the test to drive;
 * cert-domains and status answer from the fields below.
 */
export class FakeBus {
  readonly connections = new AsyncQueue<BusConnection>();
  readonly all: BusConnection[] = [];
  /** Answer of /localapi/v0/cert-domains: a list, null (Go's nil slice), or an HTTP status with a body. */
  certDomains: string[] | null | { status: number; body: string } = [];
  /** Tailscale-Version of every answer. */
  version = '1.100.0-test';
  /** Refuses a watch (the answer) or accepts it (undefined). */
  refuseWatch: ((mask: number) => { status: number; body: string } | undefined) | undefined;
  /** The mask of every watch request, in order, refused or not. */
  readonly watchMasks: number[] = [];
  statusCertDomains: string[] | undefined = [];
  certDomainsCalls = 0;
  statusCalls = 0;
  readonly fetches = new AsyncQueue<string>();
  server!: TestServer;

  static async start(transport: Transport = 'unix'): Promise<FakeBus> {
    const bus = new FakeBus();
    bus.server = await startServer((req, res) => bus.#handle(req, res), transport);
    return bus;
  }

  #handle(req: IncomingMessage, res: ServerResponse): void {
    const url = new URL(req.url ?? '/', 'http://x');
    res.setHeader('Tailscale-Version', this.version);
    if (url.pathname === '/localapi/v0/watch-ipn-bus') {
      const mask = Number(url.searchParams.get('mask'));
      this.watchMasks.push(mask);
      const refusal = this.refuseWatch?.(mask);
      if (refusal) {
        sendText(res, refusal.status, `${refusal.body}\n`);
        return;
      }
      const conn = new BusConnection(req, res, this.version);
      this.all.push(conn);
      this.connections.push(conn);
      return;
    }
    if (url.pathname === '/localapi/v0/cert-domains') {
      this.certDomainsCalls++;
      const answer = this.certDomains;
      if (answer === null || Array.isArray(answer)) sendJson(res, 200, answer);
      else sendText(res, answer.status, answer.body);
      this.fetches.push('cert-domains');
      return;
    }
    if (url.pathname === '/localapi/v0/status') {
      this.statusCalls++;
      sendJson(res, 200, { Version: '1.96.0', BackendState: 'Running', CertDomains: this.statusCertDomains });
      this.fetches.push('status');
      return;
    }
    sendText(res, 404, '404 page not found');
  }

  close(): Promise<void> {
    return this.server.close();
  }
}

export function sendJson(res: ServerResponse, status: number, value: unknown): void {
  res.writeHead(status, { 'Content-Type': 'application/json' });
  res.end(JSON.stringify(value));
}

export function sendText(res: ServerResponse, status: number, body: string, headers: http.OutgoingHttpHeaders = {}): void {
  res.writeHead(status, { 'Content-Type': 'text/plain; charset=utf-8', ...headers });
  res.end(body);
}

/** A real EC private key PEM and a structurally valid (not parseable) certificate chain PEM. */
export function samplePems(): { keyPem: string; leafPem: string; chainPem: string } {
  const { privateKey } = generateKeyPairSync('ec', { namedCurve: 'P-256' });
  const keyPem = privateKey.export({ type: 'sec1', format: 'pem' }).toString();
  const block = (label: string, fill: string): string =>
    `-----BEGIN ${label}-----\n${Buffer.from(fill.repeat(48))
      .toString('base64')
      .match(/.{1,64}/g)!
      .join('\n')}\n-----END ${label}-----\n`;
  const leafPem = block('CERTIFICATE', 'leaf');
  const chainPem = leafPem + block('CERTIFICATE', 'intermediate');
  return { keyPem, leafPem, chainPem };
}

/** Records what a Logger receives, for assertions. */
export function recordingLogger(): {
  logger: Logger;
  lines: { level: string; obj: object; msg: string | undefined }[];
} {
  const lines: { level: string; obj: object; msg: string | undefined }[] = [];
  const make = (): Logger => ({
    debug: (obj, msg) => lines.push({ level: 'debug', obj, msg }),
    info: (obj, msg) => lines.push({ level: 'info', obj, msg }),
    warn: (obj, msg) => lines.push({ level: 'warn', obj, msg }),
    error: (obj, msg) => lines.push({ level: 'error', obj, msg }),
    child: () => make(),
  });
  return { logger: make(), lines };
}
