import { watch, type FSWatcher } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { basename, dirname } from 'node:path';
import { errorMessage } from '../core/errors.ts';
import type { Logger } from '../core/logger.ts';
import { domainsFromServeConfig } from './serve-config.ts';

/**
 * Follows a ServeConfig file and reports its domain set whenever it changes. Watches the directory, not
 * the file: a mounted ConfigMap is updated by swapping a symlink, which a file watch would miss.
 * A malformed or missing file is reported and the last good set kept.
 */
export class ServeConfigWatcher {
  readonly #path: string;
  readonly #logger: Logger;
  readonly #onDomains: (domains: string[]) => void;
  #watcher: FSWatcher | undefined;
  #debounce: NodeJS.Timeout | undefined;
  #last: string | undefined;
  #reading: Promise<void> = Promise.resolve();

  constructor(path: string, logger: Logger, onDomains: (domains: string[]) => void) {
    this.#path = path;
    this.#logger = logger.child({ serveConfig: path });
    this.#onDomains = onDomains;
  }

  async start(): Promise<void> {
    this.#watcher = watch(dirname(this.#path), { persistent: false }, (_event, name) => {
      if (name && !name.startsWith('..') && name !== basename(this.#path)) return;
      clearTimeout(this.#debounce);
      this.#debounce = setTimeout(() => void this.reload(), 50);
    });
    this.#watcher.on('error', (err) => this.#logger.error({ err: errorMessage(err) }, 'serve config watch failed'));
    await this.reload();
  }

  /** Re-reads the file now; resolves after the domains (if changed) were reported. */
  reload(): Promise<void> {
    this.#reading = this.#reading.then(() => this.#readOnce());
    return this.#reading;
  }

  stop(): void {
    clearTimeout(this.#debounce);
    this.#watcher?.close();
  }

  async #readOnce(): Promise<void> {
    let domains: string[];
    try {
      domains = domainsFromServeConfig(await readFile(this.#path, 'utf8'), this.#path);
    } catch (err) {
      this.#logger.error({ code: 'CERTSHARE_BAD_CONFIG', err: errorMessage(err) }, 'serve config unusable; keeping the previous domains');
      return;
    }
    const key = domains.join(',');
    if (key === this.#last) return;
    this.#last = key;
    this.#logger.info({ domains }, 'serve config domains');
    this.#onDomains(domains);
  }
}
