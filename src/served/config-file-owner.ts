// Whether tailscaled runs from a config file (tailscaled --config; Tailscale's containerboot starts it so from
// the file its operator writes). That file owns AdvertiseServices: tailscaled puts the file's list back at
// every reload (ipn.ConfigVAlpha.ToPrefs sets AdvertiseServicesSet), and containerboot reloads whenever the
// file changes (and only then), so an addition of certshare's would be undone, or would undo the owner's. certshare
// then never adds: it withdraws a Service this replica must not serve (advertiser.ts withdrawOnly), puts the file's
// list back by the same reload, and says so once.
import { doubling } from '../core/issuance/backoff.ts';
import type { Clock } from '../core/ports/clock.ts';
import { errorMessage, errorText } from '../core/errors.ts';
import { LocalApiError, NotifyMask, type LocalApi } from '../core/ports/localapi.ts';
import type { Logger } from '../core/ports/logger.ts';
import type { Advertiser } from './advertiser.ts';

const FIRST_RETRY_MS = 500;
const MAX_RETRY_MS = 30_000;

/** What the owner check is told: the Services advertised, those the injector left to the file, and the agent. */
interface OwnerSettings {
  advertiseServices: readonly string[] | string;
  advertiseLeftToFile: readonly string[];
  /** --advertise-agent: its edits add as well as remove, so under a config file nothing of certshare's starts. */
  advertiseAgent: string | undefined;
}

/** What the owner check does with the advertiser: start it, as it is or withdrawing only, and wake it at a reload. */
type OwnedAdvertiser = Pick<Advertiser, 'start' | 'withdrawOnly' | 'notify'>;

/**
 * Who advertises the Services: certshare's advertiser, or the owner of tailscaled's config file. At start it says
 * which Services the injector left to the file, asks tailscaled (configFileOwnsPrefs), and starts the advertiser: as
 * it is when no file owns the prefs; from a file, only withdrawing (advertiser.ts withdrawOnly), its list put back by
 * reload-config and its reloads followed on the IPN bus; through the agent under a file, not at all.
 */
export class AdvertisementOwner {
  readonly #settings: OwnerSettings;
  readonly #deps: { localApi: Pick<LocalApi, 'reloadConfig' | 'watchIpnBus'>; clock: Clock; logger: Logger };
  readonly #stop = new AbortController();
  /** Whether a config file owns the prefs (false before start and without an advertiser), and the watch of its reloads. */
  #checked: Promise<{ owned: boolean; prefsWatch?: Promise<void> }> = Promise.resolve({ owned: false });

  constructor(settings: OwnerSettings, deps: { localApi: Pick<LocalApi, 'reloadConfig' | 'watchIpnBus'>; clock: Clock; logger: Logger }) {
    this.#settings = settings;
    this.#deps = deps;
  }

  start(advertiser: OwnedAdvertiser | undefined): void {
    const { advertiseLeftToFile } = this.#settings;
    if (advertiseLeftToFile.length > 0) sayLeftToFile(advertiseLeftToFile, this.#deps.logger, false);
    if (advertiser) this.#checked = this.#startAdvertising(advertiser);
  }

  async #startAdvertising(advertiser: OwnedAdvertiser): Promise<{ owned: boolean; prefsWatch?: Promise<void> }> {
    const { localApi } = this.#deps;
    const { signal } = this.#stop;
    // Through the agent, the agent asks tailscaled and, under a file, only withdraws (advertise-agent.ts); its status
    // says so and certshare's decisions then only withdraw.
    if (this.#settings.advertiseAgent) {
      advertiser.start();
      return { owned: false };
    }
    const owned = await configFileOwnsPrefs(localApi, this.#settings.advertiseServices, this.#deps, signal, true);
    if (signal.aborted) return { owned };
    let prefsWatch: Promise<void> | undefined;
    if (owned) {
      advertiser.withdrawOnly((s) => localApi.reloadConfig!(s));
      prefsWatch = watchPrefsChanges(localApi, () => advertiser.notify(), this.#deps, signal);
    }
    advertiser.start();
    return { owned, prefsWatch };
  }

  /** Whether a config file's owner advertises (then certshare withdraws nothing at its stop), once tailscaled answered. */
  async ownedByFile(): Promise<boolean> {
    return (await this.#checked).owned;
  }

  /** Stops asking and following the file's reloads; resolves once both ended. */
  async stop(): Promise<void> {
    this.#stop.abort();
    await (await this.#checked).prefsWatch;
  }
}

/**
 * Says, once, that the config file's owner advertises `services`: found by asking tailscaled, or told by the
 * injector (--advertise-left-to-file), whose sidecar has no right to ask.
 */
function sayLeftToFile(services: readonly string[] | string, logger: Logger, withdrawOnly: boolean): void {
  const how = withdrawOnly ? "; certshare never adds them, withdraws them only while this replica must not serve them, then puts the file's list back" : '';
  const text = errorText('CERTSHARE_ADVERTISE_CONFIG_FILE', { services: String(services), how });
  logger.warn({ code: 'CERTSHARE_ADVERTISE_CONFIG_FILE', services, withdrawOnly }, text);
}

/**
 * Asks tailscaled (POST /localapi/v0/reload-config: `Reloaded` only from a config file; it puts back what the
 * file says), until it answers: true when a config file owns the prefs. A refusal (no such endpoint, no write right) says prefs only: the
 * prefs edit then meets the same refusal and reports it. Resolves false when `signal` aborts first.
 */
export async function configFileOwnsPrefs(
  localApi: Pick<LocalApi, 'reloadConfig'>,
  services: readonly string[] | string,
  deps: { clock: Clock; logger: Logger },
  signal: AbortSignal,
  withdrawOnly: boolean,
): Promise<boolean> {
  if (!localApi.reloadConfig) return false;
  for (let failures = 1; !signal.aborted; failures++) {
    try {
      if (!(await localApi.reloadConfig(signal))) return false;
      sayLeftToFile(services, deps.logger, withdrawOnly);
      return true;
    } catch (err) {
      if (signal.aborted) break;
      if (err instanceof LocalApiError && err.status !== undefined && err.status >= 400 && err.status < 500) return false;
      if (failures === 1) deps.logger.info({ err: errorMessage(err) }, 'asking tailscaled whether it runs from a config file; retrying');
      await deps.clock.sleep(doubling(FIRST_RETRY_MS, failures, MAX_RETRY_MS), signal).catch(() => {});
    }
  }
  return false;
}

/**
 * Calls `onChange` at each change of tailscaled's prefs (the IPN bus's Notify.Prefs, sent by every prefs edit and every
 * reload of the config file), until `signal` aborts: a reload that put a withdrawn Service back is seen in
 * milliseconds, not at the next read. A lost or refused stream is opened again, doubling from FIRST_RETRY_MS up to MAX_RETRY_MS;
 * the advertiser's own reads every check interval stay the floor. @forTests
 */
export async function watchPrefsChanges(
  localApi: Pick<LocalApi, 'watchIpnBus'>,
  onChange: () => void,
  deps: { clock: Clock; logger: Logger },
  signal: AbortSignal,
): Promise<void> {
  for (let failures = 0; !signal.aborted; ) {
    try {
      // InitialPrefs: a stream opened again after tailscaled restarted (which reads the file again) reads the prefs at once.
      for await (const notify of localApi.watchIpnBus(NotifyMask.NoNetMap | NotifyMask.InitialPrefs, signal)) {
        failures = 0;
        if (notify.Prefs) onChange();
      }
    } catch (err) {
      if (signal.aborted) break;
      if (failures === 0) deps.logger.info({ err: errorMessage(err) }, "watching tailscaled's prefs for the config file's reloads; retrying");
    }
    failures++;
    await deps.clock.sleep(doubling(FIRST_RETRY_MS, failures, MAX_RETRY_MS), signal).catch(() => {});
  }
}
