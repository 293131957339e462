import { request as httpRequest } from 'node:http';
import { request as httpsRequest } from 'node:https';
import pRetry from 'p-retry';

export type RoutingVerdict = 'routed' | 'unverifiable' | 'not-routed';

interface Probe {
  status: number;
  podIPv4: string | undefined;
}

/** One GET on a fresh connection (no keep-alive), so the Service picks an endpoint anew each time. */
function probe(url: URL, timeoutMs: number, signal: AbortSignal | undefined): Promise<Probe> {
  return new Promise((resolve, reject) => {
    const send = url.protocol === 'https:' ? httpsRequest : httpRequest;
    const req = send(url, { method: 'GET', agent: false, headers: { connection: 'close' }, timeout: timeoutMs, ...(signal ? { signal } : {}) }, (res) => {
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
  /** Fresh connections in the first round; later rounds take 3 x the endpoints seen answering, if more. */
  probesPerRound: number;
  timeoutMs: number;
  /** Pause between rounds. */
  roundDelayMs: number;
  /** Rounds go on this long before the answer is 'not-routed': the Service really does not route here yet. */
  patienceMs: number;
  signal?: AbortSignal;
}

export interface RoutingOutcome {
  verdict: RoutingVerdict;
  rounds: number;
  probes: number;
  /** Distinct Pod addresses that answered: the Service's endpoints, as far as the sample saw them. */
  endpointsSeen: number;
}

/** Enough fresh connections for any sane Service; a round never opens more. */
const MAX_PROBES_PER_ROUND = 64;

/**
 * Does the Service behind `url` route to this Pod? Its health endpoint answers with the answering Pod's
 * address (Pod-IPv4); an answer carrying our own proves the data path, not only the EndpointSlice. A 200 with
 * no header at all comes from a peer that cannot say who it is: counted as routed, for compatibility.
 *
 * Tailscale's rule is replicas x 3 calls one after another. Each fresh connection lands on a random
 * endpoint, so with n endpoints a round of k parallel calls misses this Pod with probability (1 - 1/n)^k:
 * calls in parallel, and k grown to 3 x the endpoints the answers reveal (no read of the EndpointSlice,
 * which certshare's account may not do), make the answer arrive in a few hundred milliseconds at 10
 * replicas, where a sequential sample with a doubling delay took tens of seconds. An unlucky round is not
 * a verdict: rounds go on for `patienceMs`, and only then is the answer 'not-routed'.
 */
export async function checkRouting(url: string, options: RoutingCheckOptions): Promise<RoutingOutcome> {
  const target = new URL(url);
  const seen = new Set<string>();
  let rounds = 0;
  let probes = 0;
  const outcome = (verdict: RoutingVerdict): RoutingOutcome => ({ verdict, rounds, probes, endpointsSeen: seen.size });
  /**
   * One round: `count` calls at once, settled as soon as one answer proves the route (the others are
   * cut: a slow endpoint, e.g. a Pod still starting on a busy node, must not hold the verdict back).
   */
  const round = async (): Promise<RoutingOutcome> => {
    rounds++;
    const count = Math.min(MAX_PROBES_PER_ROUND, Math.max(options.probesPerRound, 3 * seen.size));
    probes += count;
    const cut = new AbortController();
    const signal = options.signal ? AbortSignal.any([options.signal, cut.signal]) : cut.signal;
    const proven = await new Promise<boolean>((resolve) => {
      let pending = count;
      for (let i = 0; i < count; i++) {
        probe(target, options.timeoutMs, signal).then(
          ({ status, podIPv4 }) => {
            if (status === 200 && podIPv4 !== undefined) seen.add(podIPv4);
            if (status === 200 && (podIPv4 === undefined || podIPv4 === options.ownIPv4)) resolve(true);
            if (--pending === 0) resolve(false);
          },
          () => {
            if (--pending === 0) resolve(false);
          },
        );
      }
    });
    cut.abort();
    if (options.signal?.aborted) throw options.signal.reason;
    if (proven) return outcome(options.ownIPv4 !== undefined && seen.has(options.ownIPv4) ? 'routed' : 'unverifiable');
    throw new Error(`${count} calls answered by ${seen.size} other endpoints`);
  };
  try {
    // A fixed pause between rounds, for as long as patience lasts.
    return await pRetry(round, {
      retries: Number.POSITIVE_INFINITY,
      factor: 1,
      minTimeout: options.roundDelayMs,
      maxTimeout: options.roundDelayMs,
      randomize: false,
      maxRetryTime: options.patienceMs,
      ...(options.signal ? { signal: options.signal } : {}),
    });
  } catch (err) {
    if (options.signal?.aborted) throw err;
    return outcome('not-routed');
  }
}
