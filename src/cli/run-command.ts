// `certshare run`: the daemon until SIGTERM/SIGINT.
import { startDaemon } from '../daemon/daemon.ts';
import type { DaemonConfig } from '../config/daemon-config.ts';
import { stopOnSignal } from '../signals/stop-on-signal.ts';

/** `started` is called once the daemon has started (it turns V8's optimizing compilers back on: main.ts). */
export async function runUntilSignal(config: DaemonConfig, started: () => void = () => {}): Promise<number> {
  // The daemon builds its logger from the configuration, and the stop logs with it.
  const daemon = await startDaemon(config, { env: process.env });
  started();
  const code = await stopOnSignal(daemon, daemon.logger, config.shutdownTimeoutMs);
  // Exit explicitly: a stuck handle (a hanging LocalAPI request) must not keep a stopped sidecar alive.
  process.exit(code);
}
