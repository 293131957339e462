import { errorMessage } from '../core/errors.ts';
import type { Clock } from '../core/ports/clock.ts';
import type { Logger } from '../core/ports/logger.ts';
import type { LoopObserver } from '../core/ports/observer.ts';
import type { StoredCert } from '../core/ports/store.ts';
import { type CertDirectory, type FilesHealth, reportFilesWrite } from '../store/cert-directory.ts';
import { DeliveryRetry } from './retry.ts';

interface ProjectorDeps {
  logger: Logger;
  clock: Clock;
  /** Holds health (and so readiness) at unhealthy while a domain's files could not be written. */
  health: FilesHealth;
  onWritten: (domain: string, path: string) => void;
}

/**
 * Mirrors each domain's current certificate into a directory (for proxies that read files), with the
 * same atomic, validated write as the dir store, and reports files that changed. Writes per domain are
 * serialised so an older certificate can never land after a newer one. A write that fails (a disk full, a
 * read-only volume) leaves the proxy the files before, says so through health until a retry, or the write
 * of a newer certificate, succeeds: the Pod leaves rotation rather than stay there while what its proxy
 * serves runs out.
 */
export class Projector implements LoopObserver {
  readonly #dir: CertDirectory;
  readonly #deps: ProjectorDeps;
  readonly #queues = new Map<string, Promise<void>>();
  /** The latest certificate per domain: a retry of an older one gives way to it. */
  readonly #latest = new Map<string, StoredCert>();
  /** Domains whose files were written (or found as they should be) at least once by this process. */
  readonly #written = new Set<string>();
  readonly #stop = new AbortController();
  readonly #retry: DeliveryRetry<string>;

  constructor(dir: CertDirectory, deps: ProjectorDeps) {
    this.#dir = dir;
    this.#deps = deps;
    this.#retry = new DeliveryRetry(deps.clock, this.#stop.signal);
  }

  certificate(domain: string, cert: StoredCert | undefined): void {
    // An expired certificate is not deleted from disk: the proxy keeps its files and the gate goes False.
    if (!cert || this.#stop.signal.aborted) return;
    this.#latest.set(domain, cert);
    // Until the first write lands the proxy has nothing of this domain's to serve: health stays unhealthy meanwhile.
    // Set in the same turn in which health learns of the certificate, before the gate reads the verdict (after this
    // turn), so the Pod never enters rotation a write early.
    if (!this.#written.has(domain)) this.#deps.health.pending(`files:${domain}`, `${domain}: its certificate files are not written yet`);
    this.#enqueue(domain, cert);
  }

  #enqueue(domain: string, cert: StoredCert): void {
    const previous = this.#queues.get(domain) ?? Promise.resolve();
    this.#queues.set(
      domain,
      previous.then(() => this.#write(domain, cert)),
    );
  }

  async #write(domain: string, cert: StoredCert): Promise<void> {
    if (this.#latest.get(domain) !== cert) return; // a newer one is queued behind
    const { logger, health, onWritten } = this.#deps;
    try {
      if (await this.#dir.write(domain, cert.pair)) onWritten(domain, this.#dir.pathOf(domain));
      const first = !this.#written.has(domain);
      this.#written.add(domain);
      const failed = this.#retry.landed(domain);
      if (first || failed) reportFilesWrite(health, domain);
      if (failed) logger.info({ domain }, 'certificate files written after failed attempts');
    } catch (err) {
      const retryInMs = this.#retry.failed(domain, () => this.#enqueue(domain, cert));
      logger.error({ domain, err: errorMessage(err), retryInMs }, 'could not write certificate files');
      reportFilesWrite(health, domain, err);
    }
  }

  /** Resolves when every queued write has been attempted (a failed one is retried later, and reported meanwhile). */
  async idle(): Promise<void> {
    await Promise.all(this.#queues.values());
  }

  /** No more retries; resolves when the writes under way have ended. */
  async stop(): Promise<void> {
    this.#stop.abort();
    await this.idle();
  }
}
