// The readiness gate's routing check (readiness-gate.ts `routing`): every --routing-check URL in turn must
// route to this Pod (routing-check.ts), with the timings the gate uses and the detail its condition
// message gives.
import type { Logger } from '../core/ports/logger.ts';
import { checkRouting, type RoutingVerdict } from './routing-check.ts';
import type { RoutingProofSource } from '../core/ports/routing-proof-source.ts';

/**
 * How long one call may stay open. A call proves the route when it arrives, not when its answer does
 * (http/routing-proof.ts): one still open after half a second went to an endpoint that is gone (a SYN nobody
 * answers, the Pod deleted and kube-proxy not yet synced) or busy starting, and only holds a slot of the
 * 64 a check keeps open. At 10 replicas most calls of a mass restart are such.
 */
const ROUTING_CALL_TIMEOUT_MS = 500;
/** The pause between two waves of calls. */
const ROUTING_WAVE_DELAY_MS = 200;
/** Waves go on this long without proof before the condition says NotRouted. */
const ROUTING_PATIENCE_MS = 30_000;

interface ReadinessRoutingOptions {
  urls: readonly string[];
  /** This Pod's IPv4 address: an answer from it proves the route. */
  ownIPv4: string | undefined;
  /** --routing-attempts: fresh connections in the first wave. */
  attempts: number;
  proofs?: RoutingProofSource | undefined;
  logger: Logger;
}

type ReadinessRouting = (signal: AbortSignal) => Promise<{ verdict: RoutingVerdict; detail: string }>;

/** The gate's routing check over every URL; the first that does not route decides. */
export function readinessRouting(options: ReadinessRoutingOptions): ReadinessRouting {
  return async (signal) => {
    const details: string[] = [];
    for (const url of options.urls) {
      const { verdict, rounds, probes, endpointsSeen, provenBy } = await checkRouting(url, {
        ownIPv4: options.ownIPv4,
        probesPerRound: options.attempts,
        timeoutMs: ROUTING_CALL_TIMEOUT_MS,
        roundDelayMs: ROUTING_WAVE_DELAY_MS,
        patienceMs: ROUTING_PATIENCE_MS,
        ...(options.proofs ? { proofs: options.proofs } : {}),
        signal,
      });
      options.logger.info({ url, verdict, rounds, probes, endpointsSeen, provenBy }, 'routing check');
      const proof = provenBy === undefined ? '' : `, proven by ${provenBy === 'answer' ? 'its own answer' : 'a call received'}`;
      details.push(`${rounds} rounds, ${probes} calls, ${endpointsSeen} endpoints seen${proof}`);
      if (verdict === 'not-routed') return { verdict, detail: details.join('; ') };
    }
    return { verdict: 'routed', detail: details.join('; ') };
  };
}
