// Where the emulator listens: a unix socket path (like tailscaled) or a TCP host:port (tsnet-style hosts, tests).
import { connect } from 'node:net';
import { lstat, unlink } from 'node:fs/promises';
import type { Server } from 'node:http';
import { errorMessage } from '../core/errors.ts';
import { parseHostPort } from '../core/values/listen-address.ts';

type ListenTarget = { kind: 'unix'; path: string } | { kind: 'tcp'; host: string; port: number };

/** A value containing ':' and no '/' is TCP host:port ("[::1]:0", "127.0.0.1:8080", ":0"); anything else is a socket path. */
export function parseListen(value: string): ListenTarget {
  if (value === '') throw new Error('listen address is empty');
  if (value.includes(':') && !value.includes('/')) {
    let hostPort: { host: string; port: number };
    try {
      hostPort = parseHostPort(value, '127.0.0.1');
    } catch (err) {
      throw new Error(`${errorMessage(err)}, or a socket path`);
    }
    return { kind: 'tcp', ...hostPort };
  }
  return { kind: 'unix', path: value };
}

function isLive(path: string): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(path);
    socket.once('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('error', () => resolve(false));
  });
}

/** Removes a stale socket file left by a crashed process; refuses to steal a live one or remove a non-socket. */
async function clearStaleSocket(path: string): Promise<void> {
  let st: Awaited<ReturnType<typeof lstat>>;
  try {
    st = await lstat(path);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
    throw err;
  }
  if (!st.isSocket()) throw new Error(`${path} exists and is not a socket; refusing to replace it`);
  if (await isLive(path)) throw new Error(`${path}: address already in use (something is listening there)`);
  await unlink(path);
}

interface Bound {
  address: string;
  socketPath: string | undefined;
  port: number | undefined;
}

export async function listenOn(server: Server, target: ListenTarget): Promise<Bound> {
  if (target.kind === 'unix') await clearStaleSocket(target.path);
  await new Promise<void>((resolve, reject) => {
    const onError = (err: Error): void => reject(err);
    server.once('error', onError);
    const done = (): void => {
      server.off('error', onError);
      resolve();
    };
    if (target.kind === 'unix') server.listen(target.path, done);
    else server.listen(target.port, target.host, done);
  });
  if (target.kind === 'unix') return { address: target.path, socketPath: target.path, port: undefined };
  const addr = server.address();
  const port = typeof addr === 'object' && addr ? addr.port : target.port;
  const host = target.host === '0.0.0.0' ? '127.0.0.1' : target.host === '::' ? '::1' : target.host;
  return { address: `http://${host.includes(':') ? `[${host}]` : host}:${port}`, socketPath: undefined, port };
}
