import type { Logger } from '../ports/logger.ts';
import type { HealthState } from './health.ts';
import type { LoopSupervisor } from './loop-supervisor.ts';

/** What follows the managed domains beside the loops and health: ACME Renewal Information keeps their checks only. */
interface DomainsFollower {
  retain(domains: Iterable<string>): void;
}

/** The managed domains: the flags' and the ServeConfig's, applied to the loops, ARI and health once started. */
export class ManagedDomains {
  current: string[] = [];
  readonly #static: string[];
  readonly #logger: Logger;
  readonly #heapSaving: (count: number) => boolean;
  #fromConfig: string[] = [];
  #started = false;
  #apply: (all: string[]) => void = () => {};

  /** `heapSaving` is told the count on each change and says whether it switched V8's heap to save memory. */
  constructor(staticDomains: string[], logger: Logger, heapSaving: (count: number) => boolean) {
    this.#static = staticDomains;
    this.#logger = logger;
    this.#heapSaving = heapSaving;
  }

  drive(manager: LoopSupervisor, ari: DomainsFollower | undefined, health: HealthState): void {
    this.#apply = (all) => {
      manager.setDomains(all);
      ari?.retain(all);
      health.manage(all);
    };
  }

  /** The first ServeConfig read (before start) only records its domains. */
  fromServeConfig(domains: string[]): void {
    this.#fromConfig = domains;
    this.#update();
  }

  start(): void {
    this.#started = true;
    this.#update();
  }

  #update(): void {
    if (!this.#started) return;
    const all = [...new Set([...this.#static, ...this.#fromConfig])].sort();
    if (this.#heapSaving(all.length)) this.#logger.info({ domains: all.length }, 'many domains: V8 heap set to save memory (--optimize-for-size)');
    this.current = all;
    this.#apply(all);
  }
}
