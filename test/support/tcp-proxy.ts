import { createConnection, createServer, type Socket } from 'node:net';

export interface TcpProxy {
  readonly port: number;
  /** A network partition: open connections are dropped and new ones refused until restore(). */
  cut(): void;
  restore(): void;
  close(): Promise<void>;
}

/**
 * A loopback TCP relay in front of one target, or of the port `target()` picks per connection (none:
 * refused); TLS passes through untouched.
 */
export function startTcpProxy(target: number | (() => number | undefined), targetHost = '127.0.0.1'): Promise<TcpProxy> {
  const sockets = new Set<Socket>();
  let partitioned = false;
  const server = createServer((client) => {
    const targetPort = typeof target === 'number' ? target : target();
    if (partitioned || targetPort === undefined) return client.destroy();
    const upstream = createConnection({ host: targetHost, port: targetPort });
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
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
        cut() {
          partitioned = true;
          for (const s of sockets) s.destroy();
        },
        restore() {
          partitioned = false;
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
