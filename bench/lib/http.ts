import { request } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';

export interface Target {
  /** A unix socket path, or undefined for TCP. */
  socketPath?: string;
  host?: string;
  port?: number;
}

/** One HTTP/1.1 request on a fresh connection (no agent); rejects on network errors and after `timeoutMs`. */
export function httpRequest(target: Target, method: string, path: string, body?: unknown, timeoutMs = 10_000): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const payload = body === undefined ? undefined : JSON.stringify(body);
    const req = request(
      {
        ...(target.socketPath ? { socketPath: target.socketPath } : { host: target.host ?? '127.0.0.1', port: target.port }),
        method,
        path,
        agent: false,
        timeout: timeoutMs,
        headers: { Host: target.socketPath ? 'local-tailscaled.sock' : `127.0.0.1:${target.port}`, ...(payload ? { 'Content-Type': 'application/json' } : {}) },
      },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (text += c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: text }));
        res.on('error', reject);
      },
    );
    req.on('timeout', () => req.destroy(new Error(`${method} ${path} timed out`)));
    req.on('error', reject);
    req.end(payload);
  });
}

/**
 * The pause between two polls of pollHealthy. Not a tight loop: on a 2-vCPU machine a poller that never
 * pauses takes a CPU from the process it times (a daemon's start-up went 319 -> 277 ms, median of 10 each,
 * with this pause; a node:http hello's 137 -> 119). A start is seen at most this much late.
 */
export const POLL_PAUSE_MS = 5;

/**
 * Polls GET /healthz every POLL_PAUSE_MS until it answers 200; resolves with performance.now() at that
 * answer. Connection refused (not listening yet) and 503 are retried.
 */
export async function pollHealthy(port: number, timeoutMs: number, isAlive: () => boolean): Promise<number> {
  const deadline = performance.now() + timeoutMs;
  let last = '';
  while (performance.now() < deadline) {
    if (!isAlive()) throw new Error(`the process exited before /healthz answered 200 (last: ${last})`);
    try {
      const res = await httpRequest({ port }, 'GET', '/healthz', undefined, 2000);
      if (res.status === 200) return performance.now();
      last = `${res.status} ${res.body}`;
    } catch (err) {
      last = (err as Error).message;
    }
    await sleep(POLL_PAUSE_MS);
  }
  throw new Error(`/healthz not 200 within ${timeoutMs} ms (last: ${last})`);
}

export { freePort } from '../../test/support/processes.ts';
