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
  /**
   * A stall: open connections stop forwarding, in both directions, without being closed or losing a
   * byte, and new ones are held likewise, until restore() passes on everything held, in order and in one
   * write per direction (a frozen path that recovers: whatever the server sent meanwhile arrives at once,
   * in one read of the client's).
   */
  hold(): void;
  /** New connections are forwarded again, held ones resume; black-holed ones stay dead (as when a middlebox lost their state). */
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
 * A loopback TCP relay in front of one target (a port, or a unix socket's path), or of the port `target()`
 * picks per connection (none: refused); TLS passes through untouched.
 */
export function startTcpProxy(target: number | { path: string } | (() => number | undefined), targetHost = '127.0.0.1'): Promise<TcpProxy> {
  const sockets = new Set<Socket>();
  let state: 'forward' | 'cut' | 'black-hole' | 'hold' = 'forward';
  /** Client and upstream socket of each connection that forwards (or will again after a hold). */
  const pairs = new Set<[Socket, Socket]>();
  const connect = ([client, upstream]: [Socket, Socket]): void => {
    client.pipe(upstream).pipe(client);
  };
  const release = (from: Socket, to: Socket): void => {
    const held: Buffer | null = from.read(); // everything buffered while held, as one chunk
    if (held) to.write(held);
    from.pipe(to);
  };
  const holdPair = ([client, upstream]: [Socket, Socket]): void => {
    client.unpipe(upstream);
    upstream.unpipe(client);
    client.pause();
    upstream.pause();
  };
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
    const to = typeof target === 'function' ? target() : target;
    if (state === 'cut' || to === undefined) return client.destroy();
    track(client);
    client.on('error', () => client.destroy());
    if (state === 'black-hole') return swallow(client);
    const upstream = createConnection(typeof to === 'number' ? { host: targetHost, port: to } : to);
    track(upstream);
    for (const s of [client, upstream]) {
      s.on('error', () => {
        client.destroy();
        upstream.destroy();
      });
    }
    const pair: [Socket, Socket] = [client, upstream];
    pairs.add(pair);
    client.on('close', () => pairs.delete(pair));
    if (state === 'hold') holdPair(pair);
    else connect(pair);
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
          pairs.clear();
          for (const s of sockets) swallow(s);
        },
        hold() {
          if (state !== 'forward') return;
          state = 'hold';
          for (const pair of pairs) holdPair(pair);
        },
        restore() {
          if (state === 'hold') {
            for (const [client, upstream] of pairs) {
              release(client, upstream);
              release(upstream, client);
            }
          }
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
