// certshare advertise-agent: the one process of the Pod that may edit tailscaled's prefs (its operator), and
// that edits only AdvertiseServices, only for the Services its own flags name. It listens on nothing and reads
// one bounded file, certshare's request (advertise-exchange.ts): a Service is advertised while that request
// names it; a missing, unreadable or malformed request withdraws them all. It withdraws them on SIGTERM too.
// Under a config file (configFile) it only withdraws from the file's list and puts the list back (Advertiser
// withdrawOnly), as certshare does with the right itself; no request yet leaves the file's word.
import { watch } from 'node:fs';
import { join } from 'node:path';
import type { Clock } from '../core/ports/clock.ts';
import { errorMessage } from '../core/errors.ts';
import type { Logger } from '../core/ports/logger.ts';
import type { AdvertiseDecision } from '../core/served/advertisement.ts';
import { Advertiser, type PrefsApi } from './advertiser.ts';
import { type AdvertiseRequest, parseRequest, readExchangeFile, requestPath, writeStatus } from './advertise-exchange.ts';
import { REQUEST_DIR } from './advertise-paths.ts';

interface AdvertiseAgentOptions {
  /** tailscaled's prefs (the LocalAPI client, as tailscaled's operator). */
  api: PrefsApi;
  /** The allow list: the only Services ever edited. */
  services: readonly string[];
  /** The exchange directory: certshare's request under request/, this agent's status under status/. */
  dir: string;
  clock: Clock;
  logger: Logger;
  /** How often the request file is read, unless `watchRequests` follows its directory. */
  pollMs: number;
  /**
   * Follows the request's directory (watchDirectory): `onChange` at each change in it, `onFailed` (or a throw) when
   * it cannot follow it any more; the request is then read every pollMs again. Ends when `signal` aborts.
   */
  watchRequests?(dir: string, onChange: () => void, onFailed: (err: unknown) => void, signal: AbortSignal): void;
  /** While watchRequests follows the directory, the request is still read this often: the bound on a change it missed. */
  watchedPollMs?: number;
  /** Look at the prefs again this often even when nothing changed (someone else may have edited them). */
  resyncMs: number;
  /**
   * tailscaled runs from a config file (config-file-owner.ts configFileOwnsPrefs): `putBack` reloads it (the file's
   * list again), `watch` calls onChange at each prefs change (its owner's reloads) until the signal aborts.
   */
  configFile?: {
    putBack(signal: AbortSignal): Promise<unknown>;
    watch(onChange: () => void, signal: AbortSignal): Promise<void>;
  };
}

/** @forTests */
export interface AdvertiseAgent {
  start(): void;
  /** Withdraws the Services (within `signal`), says so in the status, and stops. */
  stop(signal: AbortSignal): Promise<void>;
}

/**
 * watchRequests through inotify (fs.watch): the exchange is an emptyDir both containers mount, and inotify reports
 * a change whichever mount (and mount namespace, and uid) made it; the agent's mount is read-only and still
 * reports certshare's writes (docs/performance.md, the advertise agent).
 */
export function watchDirectory(dir: string, onChange: () => void, onFailed: (err: unknown) => void, signal: AbortSignal): void {
  watch(dir, { signal }, () => onChange()).on('error', (err) => {
    if (!signal.aborted) onFailed(err);
  });
}

/** certshare's request file: its text (undefined: none yet), the request in it, or why it is refused. */
async function readRequestFile(dir: string): Promise<{ text: string | undefined; next?: AdvertiseRequest; refused?: string }> {
  try {
    const text = await readExchangeFile(requestPath(dir), 'advertise request');
    return { text, ...(text === undefined ? {} : { next: parseRequest(text) }) };
  } catch (err) {
    return { text: `refused: ${errorMessage(err)}`, refused: errorMessage(err) };
  }
}

/** A Service is advertised while certshare's request names it (withdrawOnly never adds: from a file, it stays). */
function decision(service: string, request: AdvertiseRequest | undefined): AdvertiseDecision {
  if (request?.advertise.includes(service)) return { advertise: true };
  return { advertise: false, why: request ? 'certshare does not ask for it' : 'no valid request' };
}

/**
 * Calls `read` (certshare's request read) until `signal` aborts, `afterFirst` once after the first: at once after each
 * change watchRequests saw in the request's directory, and every watchedPollMs besides; every pollMs without a
 * watch, or from the moment it failed (said once).
 */
async function readRequests(o: AdvertiseAgentOptions, read: () => Promise<void>, afterFirst: () => void, signal: AbortSignal): Promise<void> {
  let watched = false;
  /** A change seen since the last read began; what ends the pause under way. */
  let changed = false;
  let wake: (() => void) | undefined;
  const failed = (err: unknown): void => {
    if (!watched) return;
    watched = false;
    o.logger.warn({ err: errorMessage(err) }, `cannot follow the advertise request's directory: reading the request every ${o.pollMs} ms`);
    wake?.();
  };
  if (o.watchRequests) {
    watched = true;
    try {
      // Before the first read: a change between that read and the watch's start would wait for the next poll.
      const sawChange = (): void => {
        changed = true;
        wake?.();
      };
      o.watchRequests(join(o.dir, REQUEST_DIR), sawChange, failed, signal);
    } catch (err) {
      failed(err);
    }
  }
  for (let first = true; !signal.aborted; first = false) {
    changed = false;
    await read();
    if (first) afterFirst();
    if (changed) continue;
    const woken = new AbortController();
    wake = () => woken.abort();
    const ms = watched ? (o.watchedPollMs ?? o.pollMs) : o.pollMs;
    await o.clock.sleep(ms, AbortSignal.any([signal, woken.signal])).catch(() => {});
    wake = undefined;
  }
}

export function createAdvertiseAgent(o: AdvertiseAgentOptions): AdvertiseAgent {
  const { clock, logger } = o;
  const stopping = new AbortController();
  let request: AdvertiseRequest | undefined;
  let requestText: string | undefined;
  /** Whether certshare ever wrote a request: from a file, the owner's list stands until then. */
  let asked = false;
  /** The request the decisions of the reconcile under way read: the one its status then names. */
  let applying: AdvertiseRequest | undefined;
  let warned: string | undefined;
  /** Status writes in order: a later one never overtaken by an earlier one. */
  let written: Promise<void> = Promise.resolve();
  const status = (advertised: ReadonlySet<string>, stopped: boolean): Promise<void> => {
    const seq = applying?.seq;
    written = written
      .then(() => writeStatus(o.dir, { seq, advertised: [...advertised], stopped, ...(o.configFile ? { fromFile: true } : {}) }))
      .catch((err: unknown) => logger.warn({ err: errorMessage(err) }, 'could not write the advertise status'));
    return written;
  };

  const readRequest = async (): Promise<void> => {
    const { text, next, refused } = await readRequestFile(o.dir);
    // Garbage withdraws: never advertise on a request that cannot be read.
    if (refused !== undefined && warned !== refused)
      logger.warn({ code: 'CERTSHARE_BAD_EXCHANGE', err: refused }, 'advertise request refused: withdrawing every Service');
    warned = refused;
    if (text === requestText) return;
    requestText = text;
    request = next;
    asked ||= text !== undefined;
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
    decide: ({ service }) => (o.configFile && !asked ? { advertise: true } : decision(service, applying)),
    nextEdge: () => undefined,
    clock,
    logger,
    resyncMs: o.resyncMs,
    onReconciled: (advertised) => void status(advertised, false),
  });

  if (o.configFile) advertiser.withdrawOnly((signal) => o.configFile!.putBack(signal));
  let polling: Promise<void> | undefined;
  let watching: Promise<void> | undefined;

  return {
    start() {
      watching ??= o.configFile?.watch(() => advertiser.notify(), stopping.signal);
      polling ??= readRequests(o, readRequest, () => advertiser.start(), stopping.signal);
    },
    async stop(signal) {
      stopping.abort();
      await Promise.all([polling, watching]);
      await advertiser.withdraw(signal);
      await status(advertiser.advertised, true);
    },
  };
}
