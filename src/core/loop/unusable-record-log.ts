// How a loop reports a store record it cannot use, once per change rather than every turn.
import type { Logger } from '../ports/logger.ts';
import type { StartupCondition } from './startup-grace.ts';
import type { StoreRead } from '../ports/store.ts';

export class UnusableRecordLog {
  readonly #log: Logger;
  readonly #firstCertificate: StartupCondition | undefined;
  /** The unusable store record last logged, and at which level. */
  #last: string | undefined;

  constructor(log: Logger, firstCertificate: StartupCondition | undefined) {
    this.#log = log;
    this.#firstCertificate = firstCertificate;
  }

  /**
   * An unusable record warns, except an empty one while the first issuance may still be running (the
   * start-up grace, and no certificate held yet): that one is said plainly at info, and warns once the
   * grace has passed. Garbage or a mismatched pair warns at once: bad input is never hidden.
   */
  report(read: StoreRead): void {
    if (read.state !== 'unusable') {
      this.#last = undefined;
      return;
    }
    const level = read.empty && this.#firstCertificate ? this.#firstCertificate.level() : 'warn';
    const logged = `${level} ${read.reason}`;
    if (logged === this.#last) return;
    this.#last = logged;
    if (level === 'info') this.#log.info({ reason: read.reason }, 'no certificate stored yet; waiting for the first issuance');
    else this.#log.warn({ reason: read.reason }, 'stored certificate unusable');
  }
}
