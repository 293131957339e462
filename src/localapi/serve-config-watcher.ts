import { watch, type FSWatcher } from 'node:fs';
import { readFile, stat } from 'node:fs/promises';
import { basename, dirname } from 'node:path';
import { CertshareError, errorMessage } from '../core/errors.ts';
import type { Logger } from '../core/ports/logger.ts';
import { SERVE_CONFIG_SERVICES } from '../core/served/advertisement.ts';
import { domainsFromServeConfig, servicesFromServeConfig } from './serve-config.ts';

interface ServeConfigWatcherOptions {
  path: string;
  logger: Logger;
  onDomains(domains: string[]): void;
  /** Given: the file's Tailscale Services too (`Services` keys), whenever they change; a file with too many is malformed. */
  onServices?(services: string[]): void;
  /** Why the file has never been read (it does not exist yet), or undefined once it has been. */
  onPending?(reason: string | undefined): void;
}

function isMissing(err: unknown): boolean {
  return (err as NodeJS.ErrnoException)?.code === 'ENOENT';
}

/**
 * Follows a ServeConfig file and reports its domain set whenever it changes. Watches the directory, not
 * the file: a mounted ConfigMap is updated by swapping a symlink, which a file watch would miss.
 *
 * The first read is a start-up check: a missing directory, an unreadable or malformed file throws
 * CERTSHARE_BAD_CONFIG, so the daemon never runs on a configuration it could not read. The only thing
 * tolerated is a file that does not exist yet in an existing directory (a ConfigMap key written later):
 * that is reported as pending until the file appears. After one good read, a malformed or missing file
 * is logged and the last good set kept.
 */
export class ServeConfigWatcher {
  readonly #o: ServeConfigWatcherOptions;
  readonly #logger: Logger;
  #watcher: FSWatcher | undefined;
  #debounce: NodeJS.Timeout | undefined;
  #last: string | undefined;
  #lastServices: string | undefined;
  #readOnce = false;
  #reading: Promise<void> = Promise.resolve();

  constructor(options: ServeConfigWatcherOptions) {
    this.#o = options;
    this.#logger = options.logger.child({ serveConfig: options.path });
  }

  /** Starts watching and reads the file once; throws CERTSHARE_BAD_CONFIG when it cannot be used. */
  async start(): Promise<void> {
    const { path } = this.#o;
    const dir = dirname(path);
    const dirProblem = await stat(dir).then(
      (s) => (s.isDirectory() ? undefined : 'is not a directory'),
      (err: unknown) => (isMissing(err) ? 'is missing' : errorMessage(err)),
    );
    if (dirProblem) throw new CertshareError('CERTSHARE_BAD_CONFIG', { source: `serve config ${path}`, reason: `its directory ${dir} ${dirProblem}` });
    try {
      this.#watcher = watch(dir, { persistent: false }, (_event, name) => {
        if (name && !name.startsWith('..') && name !== basename(path)) return;
        clearTimeout(this.#debounce);
        this.#debounce = setTimeout(() => void this.reload(), 50);
      });
    } catch (err) {
      throw new CertshareError('CERTSHARE_BAD_CONFIG', { source: `serve config ${path}`, reason: `cannot watch ${dir}: ${errorMessage(err)}` }, { cause: err });
    }
    this.#watcher.on('error', (err) => this.#logger.error({ code: 'CERTSHARE_BAD_CONFIG', err: errorMessage(err) }, 'serve config watch failed'));
    try {
      await this.#first();
    } catch (err) {
      this.stop();
      throw err;
    }
  }

  /** Re-reads the file now; resolves after the domains (if changed) were reported. */
  reload(): Promise<void> {
    this.#reading = this.#reading.then(() => this.#again());
    return this.#reading;
  }

  stop(): void {
    clearTimeout(this.#debounce);
    this.#watcher?.close();
  }

  async #first(): Promise<void> {
    let text: string;
    try {
      text = await readFile(this.#o.path, 'utf8');
    } catch (err) {
      if (!isMissing(err))
        throw new CertshareError(
          'CERTSHARE_BAD_CONFIG',
          { source: `serve config ${this.#o.path}`, reason: `cannot be read: ${errorMessage(err)}` },
          { cause: err },
        );
      const reason = `serve config ${this.#o.path} not read yet: the file does not exist`;
      this.#logger.warn({ code: 'CERTSHARE_BAD_CONFIG' }, `${reason}; waiting for it`);
      this.#o.onPending?.(reason);
      return;
    }
    this.#use(text);
  }

  async #again(): Promise<void> {
    try {
      this.#use(await readFile(this.#o.path, 'utf8'));
    } catch (err) {
      if (!this.#readOnce && isMissing(err)) return; // still pending, already reported
      this.#logger.error({ code: 'CERTSHARE_BAD_CONFIG', err: errorMessage(err) }, 'serve config unusable; keeping the previous domains');
    }
  }

  /** Parses and reports; throws CERTSHARE_BAD_CONFIG on malformed content, before reporting anything. */
  #use(text: string): void {
    const { domains, refused } = domainsFromServeConfig(text, this.#o.path);
    const services = this.#o.onServices ? servicesFromServeConfig(text, this.#o.path) : undefined;
    for (const { name, reason } of refused) {
      this.#logger.error({ code: 'CERTSHARE_BAD_DOMAIN', host: name, err: reason }, 'serve config host refused; the other domains carry on');
    }
    for (const { name, reason } of services?.refused ?? []) {
      this.#logger.error({ code: 'CERTSHARE_BAD_CONFIG', service: name, err: reason }, 'serve config Service refused; the other Services carry on');
    }
    if (!this.#readOnce) {
      this.#readOnce = true;
      this.#o.onPending?.(undefined);
    }
    const key = domains.join(',');
    if (key !== this.#last) {
      this.#last = key;
      this.#logger.info({ domains }, 'serve config domains');
      this.#o.onDomains(domains);
    }
    const servicesKey = services?.services.join(',');
    if (services && servicesKey !== this.#lastServices) {
      this.#lastServices = servicesKey;
      this.#logger.info({ services: services.services }, 'serve config Tailscale Services');
      this.#o.onServices?.(services.services);
    }
  }
}

/** --serve-config, and whether its Services are the ones advertised (--advertise-services serve-config). */
export interface ServeConfigSettings {
  serveConfig: string | undefined;
  advertiseServices: readonly string[] | typeof SERVE_CONFIG_SERVICES;
}

/**
 * --serve-config: the file whose domains are managed and, with --advertise-services serve-config, whose Services
 * are advertised; undefined without the flag. Its domains go to `domains`, why it was never read to `health`.
 */
export function followServeConfig(
  settings: ServeConfigSettings,
  deps: {
    logger: Logger;
    domains: { fromServeConfig(domains: string[]): void };
    health: { pending(source: 'serve-config', reason: string | undefined): void };
    onServices: (services: string[]) => void;
  },
): ServeConfigWatcher | undefined {
  if (!settings.serveConfig) return undefined;
  const { domains, health, onServices } = deps;
  return new ServeConfigWatcher({
    path: settings.serveConfig,
    logger: deps.logger,
    onDomains: (fromConfig) => domains.fromServeConfig(fromConfig),
    onPending: (reason) => health.pending('serve-config', reason),
    ...(settings.advertiseServices === SERVE_CONFIG_SERVICES ? { onServices } : {}),
  });
}
