// Does the Service route to this Pod yet? Rounds of fresh connections to its health URL, each answer's
// Pod-IPv4 header (set by http/http-server.ts) naming the endpoint that answered. Plain HTTP: no Kubernetes API.
import { type LookupAddress, type LookupAllOptions, type LookupOneOptions, lookup as dnsLookup } from 'node:dns';
import { request as httpRequest } from 'node:http';
import { request as httpsRequest } from 'node:https';
import type { LookupFunction } from 'node:net';
import pRetry from 'p-retry';
import { systemClock, type Clock } from '../core/ports/clock.ts';
import { ROUTING_PROOF_HEADER, type RoutingProofSource } from '../core/ports/routing-proof-source.ts';

export type RoutingVerdict = 'routed' | 'unverifiable' | 'not-routed';

interface Probe {
  status: number;
  podIPv4: string | undefined;
}

/**
 * A lookup that asks the resolver once and answers every later call from that answer. Node resolves a name
 * per connection through getaddrinfo on libuv's 4 threads; a Service's short name takes a search-list
 * query or more each time, and a check opens dozens of connections a second: on the real cluster at load,
 * 3-replica checks saw no answer at all from 36 calls in 800 ms. A Service's address does not change
 * during one check. A failed lookup is not kept: the next call asks again.
 * @forTests
 */
export function lookupOnce(resolve: typeof dnsLookup = dnsLookup): LookupFunction {
  let kept: LookupAddress[] | undefined;
  return (hostname, options, callback) => {
    const answer = (addresses: LookupAddress[]): void => {
      if (options.all) callback(null, addresses);
      else callback(null, addresses[0]!.address, addresses[0]!.family);
    };
    if (kept) return process.nextTick(answer, kept);
    resolve(hostname, { ...(options as LookupOneOptions), all: true } as LookupAllOptions, (err, addresses) => {
      if (err || addresses.length === 0) return callback(err ?? new Error(`${hostname}: no address`), '', 0);
      kept = addresses;
      answer(addresses);
    });
  };
}

/** One GET on a fresh connection (no keep-alive), so the Service picks an endpoint anew each time. */
function probe(url: URL, lookup: LookupFunction, proof: string | undefined, timeoutMs: number, signal: AbortSignal | undefined): Promise<Probe> {
  return new Promise((resolve, reject) => {
    const send = url.protocol === 'https:' ? httpsRequest : httpRequest;
    const headers: Record<string, string> = { connection: 'close' };
    if (proof !== undefined) headers[ROUTING_PROOF_HEADER] = proof;
    const req = send(url, { method: 'GET', agent: false, lookup, headers, timeout: timeoutMs, ...(signal ? { signal } : {}) }, (res) => {
      res.resume();
      const header = res.headers['pod-ipv4'];
      resolve({ status: res.statusCode ?? 0, podIPv4: Array.isArray(header) ? header[0] : header });
    });
    req.on('timeout', () => req.destroy(new Error(`no answer from ${url.host} within ${timeoutMs} ms`)));
    req.on('error', reject);
    req.end();
  });
}

interface RoutingCheckOptions {
  ownIPv4: string | undefined;
  /** Fresh connections in the first round; later rounds take 3 x the endpoints seen answering, if more. */
  probesPerRound: number;
  timeoutMs: number;
  /** Pause between rounds. */
  roundDelayMs: number;
  /** Rounds go on this long before the answer is 'not-routed': the Service really does not route here yet. */
  patienceMs: number;
  /** Signs this Pod's calls and hears of the group's calls that reached it (http/routing-proof.ts). */
  proofs?: RoutingProofSource;
  signal?: AbortSignal;
  /** Times the pauses and the patience (a call's timeout is the network's: always the system's); the system's by default. */
  clock?: Clock;
  /** Told as each call opens (false) and once it has ended, its answer counted (true). */
  onCall?: (ended: boolean) => void;
}

interface RoutingOutcome {
  verdict: RoutingVerdict;
  rounds: number;
  probes: number;
  /** Distinct Pod addresses that answered: the Service's endpoints, as far as the sample saw them. */
  endpointsSeen: number;
  /**
   * What proved the route: this Pod's answer to one of its calls, or a call of the group (another replica's,
   * or its own whose answer is still on the way) received by this Pod.
   */
  provenBy?: 'answer' | 'call received';
}

/** Calls open at once, across overlapping rounds: enough for any sane Service, light on a busy node. */
const MAX_IN_FLIGHT = 64;
/**
 * Rounds whose every call ended (answered, refused or timed out) before 'not-routed', however long they took: a
 * node stalled past the patience is no unlucky round's verdict, and a call still open is no miss.
 */
const MIN_ROUNDS = 3;

/**
 * Does the Service behind `url` route to this Pod? Its health endpoint answers with the answering Pod's
 * address (Pod-IPv4); an answer carrying our own proves the data path, not only the EndpointSlice. A 200 with
 * no header at all comes from a peer that cannot say who it is: counted as routed, for compatibility.
 *
 * Tailscale's rule is replicas x 3 calls one after another. Each fresh connection lands on a random endpoint,
 * so with n endpoints k calls all miss this Pod with probability (1 - 1/n)^k. Here a round of k calls starts
 * every `roundDelayMs`, k grown to 3 x the endpoints the answers reveal (no read of the EndpointSlice, which
 * certshare's account may not do); rounds overlap (a call still open, e.g. to a Pod starting on a busy node,
 * holds no round back, at most MAX_IN_FLIGHT open at once), and the first answer from this Pod settles it. An
 * unlucky round is not a verdict: rounds go on for `patienceMs`, and until the calls of MIN_ROUNDS of them
 * have all ended, before the answer is 'not-routed'. With `proofs`, a call of another replica of the group
 * that reaches this Pod through the Service settles it too (http/routing-proof.ts), and this Pod's calls prove
 * the route to the Pods they reach. How fast that makes Ready: docs/performance.md (the end-to-end tier,
 * phase 8).
 */
export async function checkRouting(url: string, options: RoutingCheckOptions): Promise<RoutingOutcome> {
  const clock = options.clock ?? systemClock;
  const target = new URL(url);
  const lookup = lookupOnce();
  const seen = new Set<string>();
  let rounds = 0;
  let probes = 0;
  let inFlight = 0;
  let roundsEnded = 0;
  let provenBy: RoutingOutcome['provenBy'];
  const outcome = (verdict: RoutingVerdict): RoutingOutcome => ({ verdict, rounds, probes, endpointsSeen: seen.size, ...(provenBy ? { provenBy } : {}) });
  // Settled by the first answer that proves the route, whichever round sent it; the calls still open are cut then.
  const cut = new AbortController();
  const signal = options.signal ? AbortSignal.any([options.signal, cut.signal]) : cut.signal;
  let prove!: (verdict: RoutingVerdict) => void;
  const proven = new Promise<RoutingVerdict>((resolve) => (prove = resolve));
  let settled = false;
  // The first verdict stands; what proved it is recorded only for a route proven ('unverifiable' has no proof).
  const settle = (verdict: RoutingVerdict, by?: RoutingOutcome['provenBy']): void => {
    if (settled) return;
    settled = true;
    provenBy = by;
    prove(verdict);
  };
  const unlisten = options.proofs?.onProof(url, () => settle('routed', 'call received'));
  const round = async (): Promise<RoutingOutcome> => {
    const count = Math.min(MAX_IN_FLIGHT - inFlight, Math.max(options.probesPerRound, 3 * seen.size));
    // A round that can open no call (MAX_IN_FLIGHT open) is a pause, not a round.
    if (count > 0) rounds++;
    probes += count;
    let open = count;
    for (let i = 0; i < count; i++) {
      inFlight++;
      options.onCall?.(false);
      probe(target, lookup, options.proofs?.sign(url), options.timeoutMs, signal)
        .then(({ status, podIPv4 }) => {
          if (status !== 200) return;
          if (podIPv4 === undefined) settle('unverifiable');
          else seen.add(podIPv4);
          if (podIPv4 !== undefined && podIPv4 === options.ownIPv4) settle('routed', 'answer');
        })
        .catch(() => {})
        .finally(() => {
          inFlight--;
          if (--open === 0) roundsEnded++;
          options.onCall?.(true);
        });
    }
    const paused = new AbortController();
    const pause = clock.sleep(options.roundDelayMs, paused.signal).then(
      () => undefined,
      () => undefined,
    );
    const verdict = await Promise.race([proven, pause]);
    paused.abort();
    if (options.signal?.aborted) throw options.signal.reason;
    if (verdict) return outcome(verdict);
    throw new Error(`${probes} calls answered by ${seen.size} other endpoints`);
  };
  const started = clock.now();
  try {
    // The next round as soon as this one's pause is over, for as long as patience lasts, and until MIN_ROUNDS ended.
    return await pRetry(round, {
      retries: Number.POSITIVE_INFINITY,
      minTimeout: 0,
      maxTimeout: 0,
      shouldRetry: () => roundsEnded < MIN_ROUNDS || clock.now() - started < options.patienceMs,
      ...(options.signal ? { signal: options.signal } : {}),
    });
  } catch (err) {
    if (options.signal?.aborted) throw err;
    return outcome('not-routed');
  } finally {
    unlisten?.();
    cut.abort();
  }
}
