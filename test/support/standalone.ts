import { mkdtemp, rm } from 'node:fs/promises';
import { after, before } from 'node:test';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseFlags } from '../../src/flags/flags.ts';
import { RUN_FLAGS, daemonConfigFrom } from '../../src/config/run-options.ts';
import type { Clock } from '../../src/core/ports/clock.ts';
import { silentLogger, type Logger } from '../../src/core/ports/logger.ts';
import { startDaemon, type Daemon, type DaemonDeps } from '../../src/daemon/daemon.ts';
import { startEmulator, type Emulator, type EmulatorOptions } from '../../src/emulator/server.ts';

export const DOMAIN = 'web.tailnet-test.ts.net';

/**
 * Scaled-down timing flags: renewals and backoff in seconds. ACME Renewal Information off: no test asks a
 * real CA (Let's Encrypt is the default); a test of ARI passes --acme-directory with the emulator's URL.
 * The CA's limit per exact name (--name-limit, 5 per 168 h) off: scaled renewals renew a name more often
 * than that in a real week; a test of the limit passes it again.
 */
export const FAST_FLAGS = [
  '--acme-directory',
  'none',
  '--name-limit',
  '0',
  '--first-retry',
  '200ms',
  '--retry-cap',
  '5s',
  '--rate-limit-retry',
  '1s',
  '--check-interval',
  '1h',
  '--cert-timeout',
  '10s',
  '--listen',
  '127.0.0.1:0',
];

export async function tempDir(prefix = 'certshare-test-'): Promise<{ path: string; remove(): Promise<void> }> {
  const path = await mkdtemp(join(tmpdir(), prefix));
  return { path, remove: () => rm(path, { recursive: true, force: true }) };
}

export function emulatorIn(dir: string, options: EmulatorOptions = {}): Promise<Emulator> {
  return startEmulator({ listen: join(dir, 'tailscaled.sock'), domains: [DOMAIN], ...options });
}

/** A temporary directory for the enclosing describe block, removed after it; call the accessor in tests. */
export function useTempDir(): () => string {
  let dir: { path: string; remove(): Promise<void> } | undefined;
  before(async () => {
    dir = await tempDir();
  });
  after(() => dir?.remove());
  return () => {
    if (!dir) throw new Error('useTempDir(): before() hook has not run');
    return dir.path;
  };
}

/** The daemon in-process, configured through the same flag parser as the CLI; `emulator` may also be a real tailscaled. */
export function standaloneDaemon(
  emulator: Pick<Emulator, 'address'>,
  certDir: string,
  flags: string[] = [],
  logger: Logger = silentLogger,
  clock?: Clock,
  heapSaving?: DaemonDeps['heapSaving'],
): Promise<Daemon> {
  const values = parseFlags(RUN_FLAGS, ['--localapi', emulator.address, '--store', `dir:${certDir}`, ...FAST_FLAGS, ...flags], {});
  if (!values.domain && !values['serve-config']) values.domain = [DOMAIN];
  const env = { POD_IPS: '10.1.2.3,fd00::3' };
  return startDaemon(daemonConfigFrom(values, env), { logger, env, ...(clock ? { clock } : {}), ...(heapSaving ? { heapSaving } : {}) });
}
