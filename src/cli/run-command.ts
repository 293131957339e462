import { startDaemon, type Daemon } from '../daemon.ts';
import { errorMessage } from '../core/errors.ts';
import type { Logger } from '../core/logger.ts';
import { createLogger } from '../logging/logger.ts';
import type { DaemonConfig } from '../config/run-options.ts';

/** Stops the daemon on the first SIGTERM/SIGINT, within the shutdown bound; a second signal exits at once. */
export function stopOnSignal(daemon: Pick<Daemon, 'stop'>, logger: Logger, shutdownTimeoutMs: number): Promise<number> {
  return new Promise((resolve) => {
    let signalled = false;
    const onSignal = (signal: NodeJS.Signals): void => {
      if (signalled) {
        logger.warn({ signal }, 'second signal: exiting now');
        process.exit(1);
      }
      signalled = true;
      logger.info({ signal }, 'signal received');
      const bound = setTimeout(() => {
        logger.error({ shutdownTimeoutMs }, 'graceful stop took too long: exiting');
        resolve(1);
      }, shutdownTimeoutMs);
      bound.unref();
      daemon.stop().then(
        () => {
          clearTimeout(bound);
          resolve(0);
        },
        (err: unknown) => {
          logger.error({ err: errorMessage(err) }, 'error while stopping');
          resolve(1);
        },
      );
    };
    process.on('SIGTERM', onSignal);
    process.on('SIGINT', onSignal);
  });
}

export async function runUntilSignal(config: DaemonConfig): Promise<number> {
  const logger = createLogger(config.logLevel, undefined, config.logFormat);
  const daemon = await startDaemon(config, { logger, env: process.env });
  const code = await stopOnSignal(daemon, logger, config.shutdownTimeoutMs);
  // Exit explicitly: a stuck handle (a hanging LocalAPI request) must not keep a stopped sidecar alive.
  process.exit(code);
}
