import { createConnection, createServer, type Socket } from 'node:net';

/** A loopback TCP relay spreading connections round-robin over its targets, as a Service does over endpoints; TLS passes through. */
export interface Relay {
  readonly port: number;
  /** Targets for new connections (open ones stay where they are, as after an endpoint change). */
  setTargets(ports: number[]): void;
  close(): Promise<void>;
}

export function startRelay(ports: number[]): Promise<Relay> {
  let targets = [...ports];
  let next = 0;
  const sockets = new Set<Socket>();
  const server = createServer((client) => {
    const port = targets[next++ % Math.max(1, targets.length)];
    if (port === undefined) return client.destroy();
    const upstream = createConnection({ host: '127.0.0.1', port });
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
      s.on('error', () => {
        client.destroy();
        upstream.destroy();
      });
    }
    // A half-close travels on (end() rather than destroy()), so a graceful close by the server stays graceful.
    client.pipe(upstream).pipe(client);
  });
  return new Promise((resolve) =>
    server.listen(0, '127.0.0.1', () =>
      resolve({
        port: (server.address() as { port: number }).port,
        setTargets(ports) {
          targets = [...ports];
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
