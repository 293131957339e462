import { errorMessage } from '../core/errors.ts';
import type { Logger } from '../core/ports/logger.ts';
import type { LoopObserver } from '../core/ports/observer.ts';
import type { StoredCert } from '../core/ports/store.ts';
import type { CertDirectory } from '../store/cert-directory.ts';

/**
 * Mirrors each domain's current certificate into a directory (for proxies that read files), with the
 * same atomic, validated write as the dir store, and reports files that changed. Writes per domain are
 * serialised so an older certificate can never land after a newer one.
 */
export class Projector implements LoopObserver {
  readonly #dir: CertDirectory;
  readonly #logger: Logger;
  readonly #onWritten: (domain: string, path: string) => void;
  readonly #queues = new Map<string, Promise<void>>();

  constructor(dir: CertDirectory, logger: Logger, onWritten: (domain: string, path: string) => void) {
    this.#dir = dir;
    this.#logger = logger;
    this.#onWritten = onWritten;
  }

  certificate(domain: string, cert: StoredCert | undefined): void {
    // An expired certificate is not deleted from disk: the proxy keeps its files and the gate goes False.
    if (!cert) return;
    const previous = this.#queues.get(domain) ?? Promise.resolve();
    const next = previous.then(async () => {
      try {
        if (await this.#dir.write(domain, cert.pair)) this.#onWritten(domain, this.#dir.pathOf(domain));
      } catch (err) {
        this.#logger.error({ domain, err: errorMessage(err) }, 'could not write certificate files');
      }
    });
    this.#queues.set(domain, next);
  }

  /** Resolves when every queued write has finished. */
  async idle(): Promise<void> {
    await Promise.all(this.#queues.values());
  }
}
