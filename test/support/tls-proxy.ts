// A stand-in for the proxy next to certshare: a TLS listener on loopback whose certificate the test sets
// (what a proxy that loaded some file would serve), or a plain TCP/HTTP listener that is no TLS at all.
import { createServer as createNetServer, type Server as NetServer, type Socket } from 'node:net';
import { createSecureContext, createServer, type SecureContext, type Server } from 'node:tls';
import type { CertPair } from '../../src/core/ports/localapi.ts';

export interface TestProxy {
  readonly port: number;
  /** Serve this pair from the next handshake on. */
  serve(pair: CertPair): void;
  close(): Promise<void>;
}

/** On loopback, or on the unix socket `path` (port 0 then): what tailscaled's ServeConfig forwards to as `unix:<path>`. */
export async function startTlsProxy(pair: CertPair, path?: string): Promise<TestProxy> {
  let context: SecureContext = createSecureContext({ cert: pair.certPem, key: pair.keyPem });
  const sockets = new Set<Socket>();
  const server: Server = createServer({ SNICallback: (_name, cb) => cb(null, context) }, (socket) => socket.end());
  server.on('connection', (socket: Socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
  });
  server.on('tlsClientError', () => {});
  const proxy = await listening(
    server,
    (p) => {
      context = createSecureContext({ cert: p.certPem, key: p.keyPem });
    },
    path,
  );
  return { ...proxy, close: () => closing(proxy, sockets) };
}

/** Closes the listener and every connection still open (a client that never finished would hold close() for ever). */
async function closing(proxy: TestProxy, sockets: Set<Socket>): Promise<void> {
  for (const s of sockets) s.destroy();
  await proxy.close();
}

/** A listener that answers in plain text ("not TLS"), or accepts and never says anything (`hang`). */
export async function startNotTlsProxy(behaviour: 'http' | 'hang'): Promise<TestProxy> {
  const sockets = new Set<Socket>();
  const server = createNetServer((socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    socket.on('error', () => {});
    if (behaviour === 'http') socket.end('HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n');
  });
  const proxy = await listening(server, () => {});
  return { port: proxy.port, serve: () => {}, close: () => closing(proxy, sockets) };
}

async function listening(server: Server | NetServer, serve: (pair: CertPair) => void, path?: string): Promise<TestProxy> {
  await new Promise<void>((resolve) => (path === undefined ? server.listen(0, '127.0.0.1', resolve) : server.listen(path, resolve)));
  const address = server.address();
  const port = typeof address === 'object' && address ? address.port : 0;
  return { port, serve, close: () => new Promise((resolve) => server.close(() => resolve())) };
}
