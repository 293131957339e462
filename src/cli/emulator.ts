// `certshare emulator`: the LocalAPI emulator (src/emulator/) until SIGINT/SIGTERM, logging JSON lines to stdout.
import type { Logger } from '../core/ports/logger.ts';
import { emulatorUsage, parseEmulatorArgs } from '../emulator/options.ts';
import { startEmulator } from '../emulator/server.ts';
import { createLogger } from '../logging/pino-logger.ts';

/**
 * Runs the emulator until SIGINT/SIGTERM (or `extra.signal` aborts), then closes it.
 * Bad flags throw CertshareError('CERTSHARE_BAD_FLAG') with a one-line message.
 */
export async function runEmulatorCli(argv: string[], extra: { signal?: AbortSignal; logger?: Logger } = {}): Promise<void> {
  const parsed = parseEmulatorArgs(argv);
  if (parsed.help) {
    process.stdout.write(`${emulatorUsage}\n`);
    return;
  }
  const logger = extra.logger ?? createLogger(parsed.logLevel, 'certshare-emulator');
  const emulator = await startEmulator({ ...parsed.options, logger });
  await new Promise<void>((resolve) => {
    const stop = (reason: string): void => {
      process.off('SIGINT', onInt);
      process.off('SIGTERM', onTerm);
      extra.signal?.removeEventListener('abort', onAbort);
      logger.info({ reason }, 'stopping emulator');
      resolve();
    };
    const onInt = (): void => stop('SIGINT');
    const onTerm = (): void => stop('SIGTERM');
    const onAbort = (): void => stop('aborted');
    process.once('SIGINT', onInt);
    process.once('SIGTERM', onTerm);
    if (extra.signal?.aborted) return stop('aborted');
    extra.signal?.addEventListener('abort', onAbort, { once: true });
  });
  await emulator.close();
}
