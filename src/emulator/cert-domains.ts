// The node's cert domains as the emulator shows them: those visible now, those that appear only after
// --domain-delay, and each change announced (the log, the event, the IPN bus).
import type { EventEmitter } from 'node:events';
import type { Logger } from '../core/ports/logger.ts';

export class CertDomains {
  readonly #visible = new Set<string>();
  #delayed: string[] = [];
  #delayTimer: NodeJS.Timeout | undefined;
  readonly #logger: Logger;
  readonly #events: EventEmitter;
  readonly #announce: () => void;

  /** `announce` tells the IPN bus's streams (bus.ts announceCertDomains). */
  constructor(logger: Logger, events: EventEmitter, announce: () => void) {
    this.#logger = logger;
    this.#events = events;
    this.#announce = announce;
  }

  sorted(): string[] {
    return [...this.#visible].sort();
  }

  /** The configured domains: visible at once, or all together after `delayMs`, announced as one change. */
  show(configured: readonly string[], delayMs: number): void {
    if (delayMs <= 0) {
      for (const d of configured) this.#visible.add(d);
      return;
    }
    this.#delayed = [...configured];
    this.#delayTimer = setTimeout(() => {
      this.#delayTimer = undefined;
      const adding = this.#delayed.filter((d) => !this.#visible.has(d));
      this.#delayed = [];
      if (adding.length === 0) return;
      for (const d of adding) this.#visible.add(d);
      this.#changed();
    }, delayMs);
  }

  add(domain: string): void {
    if (!domain) throw new Error('domain must be non-empty');
    if (this.#visible.has(domain)) return;
    this.#visible.add(domain);
    this.#changed();
  }

  remove(domain: string): void {
    this.#delayed = this.#delayed.filter((d) => d !== domain);
    if (!this.#visible.delete(domain)) return;
    this.#changed();
  }

  /** No delayed domain appears any more (the emulator closes). */
  stop(): void {
    if (this.#delayTimer) clearTimeout(this.#delayTimer);
  }

  #changed(): void {
    const domains = this.sorted();
    this.#logger.info({ certDomains: domains }, 'cert domains changed');
    this.#events.emit('certDomains', { domains });
    this.#announce();
  }
}
