// A loopback port of this machine (the test apiserver's) reachable from inside the real tailscaled's network
// namespace, which has only loopback: a unix socket here forwards to the port, and a relay in the namespace
// (this file run as a script, startTcpProxy) forwards a loopback port of its own to that socket.
import { createConnection, createServer, type Server } from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { RealTailscaled } from '../harness/tailscale.ts';
import { startTcpProxy } from './tcp-proxy.ts';

export interface NamespaceRelay {
  /** The port, on 127.0.0.1 inside the namespace, that reaches the target. */
  readonly port: number;
  close(): Promise<void>;
}

const SELF = fileURLToPath(import.meta.url);

/** `port` on this machine's loopback, reachable at the returned port inside `ts`'s namespace. */
export async function relayIntoNamespace(ts: RealTailscaled, port: number, name: string): Promise<NamespaceRelay> {
  const path = join(ts.dir, `${name}.sock`);
  const server: Server = createServer((client) => {
    const upstream = createConnection({ host: '127.0.0.1', port });
    for (const s of [client, upstream])
      s.on('error', () => {
        client.destroy();
        upstream.destroy();
      });
    client.pipe(upstream).pipe(client);
  });
  await new Promise<void>((resolve, reject) => server.once('error', reject).listen(path, resolve));
  const inside = ts.runInNamespace(`relay ${name}`, [process.execPath, SELF, path]);
  let line: string | undefined;
  await inside.waitReady(`relay ${name}`, performance.now(), 30_000, async () => {
    line = inside.lines.find((l) => l.startsWith('{"port"'));
    return line !== undefined;
  });
  return {
    port: (JSON.parse(line!) as { port: number }).port,
    close: async () => {
      await inside.terminate(5000);
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

// Run as a script (inside the namespace): a loopback port forwarding to the unix socket argv[2], until killed.
if (process.argv[1] === SELF) {
  const proxy = await startTcpProxy({ path: process.argv[2]! });
  console.log(JSON.stringify({ port: proxy.port }));
}
