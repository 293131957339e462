// `certshare run`: the daemon until SIGTERM/SIGINT.
import { startDaemon } from '../daemon/daemon.ts';
import type { DaemonConfig } from '../config/daemon-config.ts';
import { createLogger } from '../logging/pino-logger.ts';
import { stopOnSignal } from '../signals/stop-on-signal.ts';

/** `started` is called once the daemon has started (it turns V8's optimizing compilers back on: main.ts). */
export async function runUntilSignal(config: DaemonConfig, started: () => void = () => {}): Promise<number> {
  const logger = createLogger(config.logLevel, undefined, config.logFormat);
  const daemon = await startDaemon(config, { logger, env: process.env });
  started();
  const code = await stopOnSignal(daemon, logger, config.shutdownTimeoutMs);
  // Exit explicitly: a stuck handle (a hanging LocalAPI request) must not keep a stopped sidecar alive.
  process.exit(code);
}
