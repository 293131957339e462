// `certshare injector`: the admission webhook (src/injector/injector.ts) until SIGTERM/SIGINT.
import { commandUsage, parseFlags } from '../flags/flags.ts';
import { startInjector } from '../injector/injector.ts';
import { INJECTOR_FLAGS, INJECTOR_HELP, injectorConfigFrom } from '../config/injector-options.ts';
import { createLogger } from '../logging/pino-logger.ts';
import { stopOnSignal } from '../signals/stop-on-signal.ts';

export async function injectorCommand(argv: string[]): Promise<number> {
  const values = parseFlags(INJECTOR_FLAGS, argv, process.env);
  if (values.help) {
    console.log(commandUsage(INJECTOR_HELP));
    return 0;
  }
  const config = injectorConfigFrom(values, process.env);
  const logger = createLogger(config.logLevel, 'certshare-injector', config.logFormat);
  const injector = await startInjector(config, { logger, env: process.env });
  const code = await stopOnSignal(injector, logger, config.drainDelayMs + 10_000);
  process.exit(code);
}
