// Serving a renewed TLS pair: a listener's certificate followed from its source (--tls, the injector's
// --metrics-tls). The first pair is a start-up check (unreadable or mismatched: nothing starts); each
// renewed pair is served from the next handshake on, and one that is unusable is logged while the served
// pair stays. A pair renewed before the listener exists (while the rest starts) is served once it does.
import { errorMessage } from '../core/errors.ts';
import { pairSource } from './pair-source.ts';
import type { PairSourceOptions, ServingPair, TlsChoice } from './serving-pair.ts';

interface FollowedPairOptions extends Omit<PairSourceOptions, 'onPair'> {
  /** What the listener serves, for the log line of a renewal (e.g. `/metrics`). */
  what: string;
  /** A renewed pair is served, with its serial. */
  onServed?(serial: string): void;
}

export interface FollowedPair {
  /** The first pair, read and checked at start. */
  readonly first: ServingPair;
  /** The listener's way to serve a pair (validating it; tls-server.ts setPair, serving-pair.ts servePair): renewals go there from now on. */
  serveOn(setPair: (pair: ServingPair) => string): void;
  stop(): Promise<void>;
}

export async function followPair(choice: TlsChoice, options: FollowedPairOptions): Promise<FollowedPair> {
  const { logger, what, onServed } = options;
  let setPair: ((pair: ServingPair) => string) | undefined;
  let early: ServingPair | undefined;
  const serve = (pair: ServingPair): void => {
    if (!setPair) {
      early = pair;
      return;
    }
    try {
      const serial = setPair(pair);
      logger.info({ serial }, `serving a new TLS certificate on ${what}`);
      onServed?.(serial);
    } catch (err) {
      logger.error({ code: 'CERTSHARE_CERT_INVALID', err: errorMessage(err) }, `--${options.flag ?? 'tls'} pair unusable; keeping the one served`);
    }
  };
  const source = await pairSource(choice, { ...options, onPair: serve });
  const first = await source.start().catch(async (err: unknown) => {
    await source.stop();
    throw err;
  });
  return {
    first,
    serveOn(listener) {
      setPair = listener;
      const renewed = early;
      early = undefined;
      if (renewed) serve(renewed);
    },
    stop: () => source.stop(),
  };
}
