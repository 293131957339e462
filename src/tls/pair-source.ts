// Where a --tls listener's pair comes from, followed for renewals: a directory holding tls.crt and tls.key
// (a mounted kubernetes.io/tls Secret, a cert-manager csi volume, files another process renews), or a
// kubernetes.io/tls Secret read through the API and watched (src/kube/tls-secret.ts, which the caller loads only then).
import { watch, type FSWatcher } from 'node:fs';
import { readFile, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { CertshareError, errorMessage } from '../core/errors.ts';
import { LastPair, checkedPair, type PairSource, type PairSourceOptions, type ServingPair, type TlsChoice } from './serving-pair.ts';

export async function pairSource(choice: TlsChoice, options: PairSourceOptions): Promise<PairSource> {
  if (choice.kind === 'dir') return new TlsDirectory(choice.path, options);
  if (!options.secretSource) throw new CertshareError('CERTSHARE_INTERNAL', `--${options.flag ?? 'tls'} secret:${choice.name} without a Secret source`);
  return options.secretSource(choice.name, options);
}

/**
 * Follows DIR/tls.crt and DIR/tls.key. Watches the directory, not the files: a mounted Secret is updated
 * by swapping a symlink, which a file watch would miss. Two files written one after the other are briefly
 * a mismatched pair: that read is refused by validation and the next event brings the whole one.
 */
class TlsDirectory implements PairSource {
  readonly #path: string;
  readonly #o: PairSourceOptions;
  /** The flag that chose this source, for messages. */
  readonly #flag: string;
  #watcher: FSWatcher | undefined;
  #debounce: NodeJS.Timeout | undefined;
  readonly #last = new LastPair();

  constructor(path: string, options: PairSourceOptions) {
    this.#path = path;
    this.#o = options;
    this.#flag = `--${options.flag ?? 'tls'}`;
  }

  async #read(): Promise<ServingPair> {
    const [certPem, keyPem] = await Promise.all(['tls.crt', 'tls.key'].map((f) => readFile(join(this.#path, f), 'utf8')));
    return { certPem: certPem!, keyPem: keyPem! };
  }

  async start(): Promise<ServingPair> {
    let pair: ServingPair;
    try {
      if (!(await stat(this.#path)).isDirectory()) throw new Error('not a directory');
      pair = await this.#read();
    } catch (err) {
      const reason = `cannot read tls.crt and tls.key: ${errorMessage(err)}`;
      throw new CertshareError('CERTSHARE_BAD_CONFIG', { source: `${this.#flag} dir:${this.#path}`, reason }, { cause: err });
    }
    checkedPair(pair);
    this.#last.changed(pair);
    this.#watcher = watch(this.#path, { persistent: false }, () => {
      clearTimeout(this.#debounce);
      this.#debounce = setTimeout(() => void this.#again(), 50);
    });
    this.#watcher.on('error', (err) => this.#o.logger.error({ code: 'CERTSHARE_BAD_CONFIG', err: errorMessage(err) }, `${this.#flag} directory watch failed`));
    return pair;
  }

  async #again(): Promise<void> {
    try {
      const pair = await this.#read();
      if (this.#last.changed(pair)) this.#o.onPair(pair);
    } catch (err) {
      this.#o.logger.warn({ code: 'CERTSHARE_BAD_CONFIG', err: errorMessage(err) }, `${this.#flag} pair unreadable; keeping the one served`);
    }
  }

  async stop(): Promise<void> {
    clearTimeout(this.#debounce);
    this.#watcher?.close();
  }
}
