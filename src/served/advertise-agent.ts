// certshare advertise-agent: the one process of the Pod that may edit tailscaled's prefs (its operator), and
// that edits only AdvertiseServices, only for the Services its own flags name. It listens on nothing and reads
// one bounded file, certshare's request (advertise-exchange.ts): a Service is advertised while that request
// names it; a missing, unreadable or malformed request withdraws them all. It withdraws them on SIGTERM too.
import type { Clock } from '../core/ports/clock.ts';
import { errorMessage } from '../core/errors.ts';
import type { Logger } from '../core/ports/logger.ts';
import { Advertiser, type PrefsApi } from './advertiser.ts';
import { type AdvertiseRequest, parseRequest, readExchangeFile, requestPath, writeStatus } from './advertise-exchange.ts';

interface AdvertiseAgentOptions {
  /** tailscaled's prefs (the LocalAPI client, as tailscaled's operator). */
  api: PrefsApi;
  /** The allow list: the only Services ever edited. */
  services: readonly string[];
  /** The exchange directory: certshare's request under request/, this agent's status under status/. */
  dir: string;
  clock: Clock;
  logger: Logger;
  /** How often the request file is read. */
  pollMs: number;
  /** Look at the prefs again this often even when nothing changed (someone else may have edited them). */
  resyncMs: number;
}

/** @forTests */
export interface AdvertiseAgent {
  start(): void;
  /** Withdraws the Services (within `signal`), says so in the status, and stops. */
  stop(signal: AbortSignal): Promise<void>;
}

export function createAdvertiseAgent(o: AdvertiseAgentOptions): AdvertiseAgent {
  const { clock, logger } = o;
  const stopping = new AbortController();
  let request: AdvertiseRequest | undefined;
  let requestText: string | undefined;
  /** The request the decisions of the reconcile under way read: the one its status then names. */
  let applying: AdvertiseRequest | undefined;
  let warned: string | undefined;
  /** Status writes in order: a later one never overtaken by an earlier one. */
  let written: Promise<void> = Promise.resolve();
  const status = (advertised: ReadonlySet<string>, stopped: boolean): Promise<void> => {
    const seq = applying?.seq;
    written = written
      .then(() => writeStatus(o.dir, { seq, advertised: [...advertised], stopped }))
      .catch((err: unknown) => logger.warn({ err: errorMessage(err) }, 'could not write the advertise status'));
    return written;
  };

  const readRequest = async (): Promise<void> => {
    let text: string | undefined;
    let next: AdvertiseRequest | undefined;
    try {
      text = await readExchangeFile(requestPath(o.dir), 'advertise request');
      next = text === undefined ? undefined : parseRequest(text);
      warned = undefined;
    } catch (err) {
      // Garbage withdraws: never advertise on a request that cannot be read.
      const message = errorMessage(err);
      if (warned !== message) logger.warn({ code: 'CERTSHARE_BAD_EXCHANGE', err: message }, 'advertise request refused: withdrawing every Service');
      warned = message;
      text = `refused: ${message}`;
    }
    if (text === requestText) return;
    requestText = text;
    request = next;
    const outside = next?.advertise.filter((s) => !o.services.includes(s)) ?? [];
    if (outside.length > 0) logger.warn({ services: outside, allowed: o.services }, 'advertise request names Services outside --advertise-services: ignored');
    advertiser.notify();
  };

  const advertiser = new Advertiser({
    api: o.api,
    services: () => {
      applying = request;
      return o.services.map((service) => ({ service, domain: '' }));
    },
    decide: ({ service }) =>
      applying?.advertise.includes(service) ? { advertise: true } : { advertise: false, why: applying ? 'certshare does not ask for it' : 'no valid request' },
    nextEdge: () => undefined,
    clock,
    logger,
    resyncMs: o.resyncMs,
    onReconciled: (advertised) => void status(advertised, false),
  });

  let polling: Promise<void> | undefined;
  const poll = async (): Promise<void> => {
    while (!stopping.signal.aborted) {
      await readRequest();
      await clock.sleep(o.pollMs, stopping.signal).catch(() => {});
    }
  };

  return {
    start() {
      polling ??= readRequest().then(() => {
        advertiser.start();
        return poll();
      });
    },
    async stop(signal) {
      stopping.abort();
      await polling;
      await advertiser.withdraw(signal);
      await status(advertiser.advertised, true);
    },
  };
}
