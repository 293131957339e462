// `certshare advertise-agent`: the advertise agent until SIGTERM/SIGINT (src/served/advertise-agent.ts).
import { systemClock } from '../core/ports/clock.ts';
import { commandUsage, parseFlags } from '../flags/flags.ts';
import { ADVERTISE_AGENT_FLAGS, ADVERTISE_AGENT_HELP, advertiseAgentConfigFrom } from '../config/advertise-agent-options.ts';
import { createLocalApiClient } from '../localapi/client.ts';
import { createLineLogger } from '../logging/line-logger.ts';
import { createAdvertiseAgent, watchDirectory } from '../served/advertise-agent.ts';
import { configFileOwnsPrefs, watchPrefsChanges } from '../served/config-file-owner.ts';
import { stopOnSignal } from '../signals/stop-on-signal.ts';

/**
 * How often certshare's request is read where its directory cannot be followed (watchDirectory failed): a
 * withdrawal asked at shutdown waits at most this for the agent to see it.
 */
const POLL_MS = 250;
/**
 * How often it is read while watchDirectory follows the directory (a change is seen at once): the bound on a change
 * the watch missed, well inside certshare's wait for an answer (served-rotation.ts), for a fraction of POLL_MS's CPU
 * at rest in every replica (docs/performance.md, the advertise agent).
 */
const WATCHED_POLL_MS = 2000;
/** Read the prefs again this often, to put the Services right if someone else changed them. */
const RESYNC_MS = 60_000;
/** On SIGTERM, the withdrawal's bound (a Pod's grace period is 30 s by default). */
const SHUTDOWN_TIMEOUT_MS = 10_000;

export async function advertiseAgentCommand(argv: string[]): Promise<number> {
  const values = parseFlags(ADVERTISE_AGENT_FLAGS, argv, process.env);
  if (values.help) {
    console.log(commandUsage(ADVERTISE_AGENT_HELP));
    return 0;
  }
  const config = advertiseAgentConfigFrom(values);
  const logger = createLineLogger(config.logLevel, 'certshare-advertise-agent', config.logFormat);
  const localApi = createLocalApiClient({ address: config.localapi, certTimeoutMs: 30_000, logger });
  // A tailscaled run from a config file (containerboot) has its owner's AdvertiseServices: the agent, the one
  // process that may ask (certshare's uid gets 403), then only withdraws from the file's list and puts it back.
  const starting = new AbortController();
  const stopStarting = (): void => starting.abort();
  process.once('SIGTERM', stopStarting).once('SIGINT', stopStarting);
  const deps = { clock: systemClock, logger };
  const owned = await configFileOwnsPrefs(localApi, config.services, deps, starting.signal, true);
  process.off('SIGTERM', stopStarting).off('SIGINT', stopStarting);
  if (starting.signal.aborted) return 0;
  const agent = createAdvertiseAgent({
    api: { prefs: (signal) => localApi.prefs!(signal), editPrefs: (masked, signal) => localApi.editPrefs!(masked, signal) },
    services: config.services,
    ...(owned
      ? {
          configFile: {
            putBack: (signal: AbortSignal) => localApi.reloadConfig!(signal),
            watch: (onChange: () => void, signal: AbortSignal) => watchPrefsChanges(localApi, onChange, deps, signal),
          },
        }
      : {}),
    dir: config.dir,
    clock: systemClock,
    logger,
    pollMs: POLL_MS,
    watchRequests: watchDirectory,
    watchedPollMs: WATCHED_POLL_MS,
    resyncMs: RESYNC_MS,
  });
  agent.start();
  logger.info({ services: config.services, exchange: config.dir, localapi: config.localapi, fromFile: owned }, 'advertise agent started');
  const stop = { stop: () => agent.stop(AbortSignal.timeout(SHUTDOWN_TIMEOUT_MS)) };
  const code = await stopOnSignal(stop, logger, SHUTDOWN_TIMEOUT_MS + 1000);
  process.exit(code);
}
