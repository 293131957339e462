import { request as httpRequest } from 'node:http';
import { request as httpsRequest } from 'node:https';
import pRetry from 'p-retry';

export type RoutingVerdict = 'routed' | 'unverifiable' | 'not-routed';

interface Probe {
  status: number;
  podIPv4: string | undefined;
}

/** One GET on a fresh connection (no keep-alive), so the Service picks an endpoint anew each time. */
function probe(url: URL, timeoutMs: number): Promise<Probe> {
  return new Promise((resolve, reject) => {
    const send = url.protocol === 'https:' ? httpsRequest : httpRequest;
    const req = send(url, { method: 'GET', agent: false, headers: { connection: 'close' }, timeout: timeoutMs }, (res) => {
      res.resume();
      const header = res.headers['pod-ipv4'];
      resolve({ status: res.statusCode ?? 0, podIPv4: Array.isArray(header) ? header[0] : header });
    });
    req.on('timeout', () => req.destroy(new Error(`no answer from ${url.host} within ${timeoutMs} ms`)));
    req.on('error', reject);
    req.end();
  });
}

export interface RoutingCheckOptions {
  ownIPv4: string | undefined;
  /** Tailscale's rule: replicas x 3 calls; certshare's default assumes 3 replicas. */
  attempts: number;
  timeoutMs: number;
  /** Backoff between attempts (p-retry's exponential schedule). */
  minDelayMs: number;
  maxDelayMs: number;
  signal?: AbortSignal;
}

/**
 * Does the Service behind `url` route to this Pod? Tailscale's rule: call its health endpoint up to
 * `attempts` times; a 200 carrying our own IP in Pod-IPv4 proves it. A 200 with no header at all comes
 * from a peer that cannot say who it is: counted as routed, for compatibility.
 */
export async function checkRouting(url: string, options: RoutingCheckOptions): Promise<RoutingVerdict> {
  const target = new URL(url);
  try {
    return await pRetry(
      async () => {
        const answer = await probe(target, options.timeoutMs);
        if (answer.status === 200 && answer.podIPv4 === undefined) return 'unverifiable' as const;
        if (answer.status === 200 && answer.podIPv4 === options.ownIPv4) return 'routed' as const;
        throw new Error(`answered by ${answer.podIPv4 ?? 'unknown'} with ${answer.status}`);
      },
      {
        retries: Math.max(0, options.attempts - 1),
        minTimeout: options.minDelayMs,
        maxTimeout: options.maxDelayMs,
        factor: 2,
        randomize: true,
        ...(options.signal ? { signal: options.signal } : {}),
      },
    );
  } catch (err) {
    if (options.signal?.aborted) throw err;
    return 'not-routed';
  }
}
