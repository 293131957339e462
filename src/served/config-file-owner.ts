// Whether tailscaled runs from a config file (tailscaled --config; Tailscale's containerboot starts it so from
// the file its operator writes). That file owns AdvertiseServices: tailscaled puts the file's list back at
// every reload (ipn.ConfigVAlpha.ToPrefs sets AdvertiseServicesSet), and containerboot reloads whenever the
// file changes, so an edit of certshare's would be undone, or would undo the owner's: the Service would flap.
// certshare then leaves the advertisement to the file's owner and says so once.
import { doubling } from '../core/issuance/backoff.ts';
import type { Clock } from '../core/ports/clock.ts';
import { errorMessage, errorText } from '../core/errors.ts';
import { LocalApiError, type LocalApi } from '../core/ports/localapi.ts';
import type { Logger } from '../core/ports/logger.ts';
import type { Advertiser } from './advertiser.ts';

const FIRST_RETRY_MS = 500;
const MAX_RETRY_MS = 30_000;

/** What the owner check is told: the Services certshare advertises, and those the injector left to the file. */
interface OwnerSettings {
  advertiseServices: readonly string[] | string;
  advertiseLeftToFile: readonly string[];
}

/**
 * Who advertises the Services: certshare's advertiser, unless the owner of tailscaled's config file does. At start
 * it says which Services the injector left to the file, then asks tailscaled (configFileOwnsPrefs) and starts the
 * advertiser only when no config file owns the prefs.
 */
export class AdvertisementOwner {
  readonly #settings: OwnerSettings;
  readonly #deps: { localApi: Pick<LocalApi, 'reloadConfig'>; clock: Clock; logger: Logger };
  readonly #stop = new AbortController();
  /** Resolves true when a config file owns the advertisement; false before start and without an advertiser. */
  #owned: Promise<boolean> = Promise.resolve(false);

  constructor(settings: OwnerSettings, deps: { localApi: Pick<LocalApi, 'reloadConfig'>; clock: Clock; logger: Logger }) {
    this.#settings = settings;
    this.#deps = deps;
  }

  start(advertiser: Advertiser | undefined): void {
    const { advertiseServices, advertiseLeftToFile } = this.#settings;
    if (advertiseLeftToFile.length > 0) sayLeftToFile(advertiseLeftToFile, this.#deps.logger);
    if (!advertiser) return;
    this.#owned = (async () => {
      const owned = await configFileOwnsPrefs(this.#deps.localApi, advertiseServices, this.#deps, this.#stop.signal);
      if (!owned && !this.#stop.signal.aborted) advertiser.start();
      return owned;
    })();
  }

  /** Whether a config file owns the advertisement (then certshare has nothing to withdraw), once tailscaled answered. */
  ownedByFile(): Promise<boolean> {
    return this.#owned;
  }

  /** Stops asking; resolves once the question under way ended. */
  async stop(): Promise<void> {
    this.#stop.abort();
    await this.#owned;
  }
}

/**
 * Says, once, that the config file's owner advertises `services`: found by asking tailscaled, or told by the
 * injector (--advertise-left-to-file), whose sidecar has no right to ask.
 */
function sayLeftToFile(services: readonly string[] | string, logger: Logger): void {
  const text = errorText('CERTSHARE_ADVERTISE_CONFIG_FILE', { services: String(services) });
  logger.warn({ code: 'CERTSHARE_ADVERTISE_CONFIG_FILE', services }, text);
}

/**
 * Asks tailscaled (POST /localapi/v0/reload-config: `Reloaded` only from a config file), until it answers:
 * true when a config file owns the prefs. A refusal (no such endpoint, no write right) says prefs only: the
 * prefs edit then meets the same refusal and reports it. Resolves false when `signal` aborts first.
 */
export async function configFileOwnsPrefs(
  localApi: Pick<LocalApi, 'reloadConfig'>,
  services: readonly string[] | string,
  deps: { clock: Clock; logger: Logger },
  signal: AbortSignal,
): Promise<boolean> {
  if (!localApi.reloadConfig) return false;
  for (let failures = 1; !signal.aborted; failures++) {
    try {
      if (!(await localApi.reloadConfig(signal))) return false;
      sayLeftToFile(services, deps.logger);
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
