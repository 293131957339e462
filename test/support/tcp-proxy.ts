import { createConnection, createServer, type Socket } from 'node:net';

export interface TcpProxy {
  readonly port: number;
  /** Connections accepted so far (how many a client opened), and those still open. */
  readonly accepted: number;
  readonly open: number;
  /** A network partition: open connections are dropped and new ones refused until restore(). */
  cut(): void;
  /**
   * A black hole (packets dropped, nothing answered): open connections stop forwarding without being
   * closed, and new ones are accepted and then held, until restore(). Only a timeout gets a client out.
   */
  blackHole(): void;
  /** New connections are forwarded again; black-holed ones stay dead (as when a middlebox lost their state). */
  restore(): void;
  close(): Promise<void>;
}

/** Reads and discards whatever a socket receives: the far end hears nothing back. */
function swallow(socket: Socket): void {
  socket.unpipe();
  socket.removeAllListeners('data');
  socket.on('data', () => {});
  socket.resume();
}

/**
 * A loopback TCP relay in front of one target, or of the port `target()` picks per connection (none:
 * refused); TLS passes through untouched.
 */
export function startTcpProxy(target: number | (() => number | undefined), targetHost = '127.0.0.1'): Promise<TcpProxy> {
  const sockets = new Set<Socket>();
  let state: 'forward' | 'cut' | 'black-hole' = 'forward';
  let accepted = 0;
  const clients = new Set<Socket>();
  const track = (s: Socket): void => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  };
  const server = createServer((client) => {
    accepted++;
    clients.add(client);
    client.on('close', () => clients.delete(client));
    const targetPort = typeof target === 'number' ? target : target();
    if (state === 'cut' || targetPort === undefined) return client.destroy();
    track(client);
    client.on('error', () => client.destroy());
    if (state === 'black-hole') return swallow(client);
    const upstream = createConnection({ host: targetHost, port: targetPort });
    track(upstream);
    for (const s of [client, upstream]) {
      s.on('error', () => {
        client.destroy();
        upstream.destroy();
      });
    }
    client.pipe(upstream).pipe(client);
  });
  return new Promise((resolve) =>
    server.listen(0, '127.0.0.1', () =>
      resolve({
        port: (server.address() as { port: number }).port,
        get accepted() {
          return accepted;
        },
        get open() {
          return clients.size;
        },
        cut() {
          state = 'cut';
          for (const s of sockets) s.destroy();
        },
        blackHole() {
          state = 'black-hole';
          for (const s of sockets) swallow(s);
        },
        restore() {
          state = 'forward';
        },
        close: () =>
          new Promise<void>((done) => {
            for (const s of sockets) s.destroy();
            server.close(() => done());
          }),
      }),
    ),
  );
}
