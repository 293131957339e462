// A long-running command's graceful stop: the first SIGTERM/SIGINT stops it within a bound, a second exits at once.
import { errorMessage } from '../core/errors.ts';
import type { Logger } from '../core/ports/logger.ts';

/** What a long-running command stops gracefully: the daemon, the injector. */
interface Stoppable {
  stop(): Promise<void>;
}

/** Stops `target` on the first SIGTERM/SIGINT, within the shutdown bound; a second signal exits at once. */
export function stopOnSignal(target: Stoppable, logger: Logger, shutdownTimeoutMs: number): Promise<number> {
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
      target.stop().then(
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
