// How a loop waiting in the issuance budget's queue says so: /healthz's reason and the planned time on every
// turn, the log line once per change (not per turn), and the queue left when the wait is over.
import { iso } from '../ports/clock.ts';
import { formatBudget, type BudgetVerdict, type IssuanceBudget } from './issuance-budget.ts';
import type { Logger } from '../ports/logger.ts';
import type { LoopObserver } from '../ports/observer.ts';

export class BudgetQueueLog {
  readonly #domain: string;
  readonly #budget: IssuanceBudget | undefined;
  readonly #observer: Pick<Required<LoopObserver>, 'problem' | 'planned'>;
  readonly #log: Logger;
  #queued = false;

  constructor(domain: string, budget: IssuanceBudget | undefined, observer: Pick<Required<LoopObserver>, 'problem' | 'planned'>, log: Logger) {
    this.#domain = domain;
    this.#budget = budget;
    this.#observer = observer;
    this.#log = log;
  }

  queued(verdict: Extract<BudgetVerdict, { kind: 'queued' }>): void {
    const budget = this.#budget;
    const next = Math.min(
      verdict.turnAt,
      ...(budget
        ?.queues()
        .filter((q) => q.registeredDomain === verdict.registeredDomain)
        .map((q) => q.nextSlotAt ?? Infinity) ?? []),
    );
    const limit = budget ? formatBudget(budget.limit) : '';
    const message =
      `waiting for the issuance budget (${limit} first issuances for ${verdict.registeredDomain}): ` +
      `${verdict.position} of ${verdict.queued} in the queue, next slot frees at ${iso(next)}, this domain's turn at ${iso(verdict.turnAt)}` +
      (verdict.holders ? ` (the window's slots by part: ${verdict.holders})` : '');
    if (!this.#queued) {
      this.#log.info(
        {
          registeredDomain: verdict.registeredDomain,
          position: verdict.position,
          queued: verdict.queued,
          turnAt: iso(verdict.turnAt),
          ...(verdict.holders ? { holders: verdict.holders } : {}),
        },
        'issuance budget exhausted; domain queued',
      );
    }
    this.#queued = true;
    this.#observer.problem(this.#domain, message);
    this.#observer.planned(this.#domain, verdict.turnAt, 0);
  }

  leave(why = 'no longer waiting'): void {
    this.#budget?.withdraw(this.#domain);
    if (this.#queued) this.#log.info({ why }, 'issuance budget: domain left the queue');
    this.#queued = false;
  }
}
