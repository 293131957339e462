// The daemon's certificate loops put together from their own settings: one bound on the CertPair calls of all
// domains, the issuance budget and name limit kept in the storage mode's ledger, every observer told of every loop
// report, and the supervisor (loop-supervisor.ts) handed them.
import type { DomainAvailability } from './cert-loop.ts';
import { IssuanceSlots } from '../issuance/issuance-slots.ts';
import type { BackoffPolicy } from '../issuance/backoff.ts';
import { IssuanceBudget, type BudgetLimit, type LedgerStore } from '../issuance/issuance-budget.ts';
import type { RenewalPolicy } from '../renewal/renewal.ts';
import type { AriStateSource } from '../renewal/renewal-info.ts';
import type { Clock } from '../ports/clock.ts';
import type { LocalApi } from '../ports/localapi.ts';
import type { Logger } from '../ports/logger.ts';
import { fanOut, type LoopObserver } from '../ports/observer.ts';
import type { CertStore, IssuanceRole } from '../ports/store.ts';
import type { StartupGrace } from './startup-grace.ts';
import { LoopSupervisor } from './loop-supervisor.ts';
import { intentTtl } from '../issuance/issuance-policy.ts';

/** The settings of the certificate loops and their issuance, and only those (DaemonConfig extends them). */
export interface RenewalSettings {
  renewal: RenewalPolicy;
  backoff: BackoffPolicy;
  /** The CertPair call's timeout. */
  certTimeoutMs: number;
  /** How many domains this process issues at once (CertPair calls and their store writes). */
  issuanceConcurrency: number;
  /** First issuances per registered domain per window (Let's Encrypt's 50 per 7 days); undefined: no budget. */
  issuanceBudget: BudgetLimit | undefined;
  /** --name-limit: certificates per exact name in a window (kept in the budget's ledger); undefined: none. */
  nameLimit: BudgetLimit | undefined;
  /** --readiness-lead: how long before expiry the gate takes the Pods out (where a certificate's safety point falls). */
  readinessLeadMs: number;
}

/** What the loops are built with beside their settings. */
interface LoopParts {
  clock: Clock;
  logger: Logger;
  startup: StartupGrace;
  localApi: LocalApi;
  /** The storage mode's store, ledger, role and observers (store/store-backend.ts StoreBackend). */
  backend: { store: CertStore; ledger: LedgerStore; role: IssuanceRole; observers: LoopObserver[] };
  /** The daemon's metrics: told of every loop report, and reading the slots' and the budget's queues at each scrape. */
  metrics: LoopObserver & { watchIssuanceSlots(slots: IssuanceSlots): void; watchBudget(budget: IssuanceBudget): void };
  /** tailscaled's cert domains as the loops wait for them. */
  availability: DomainAvailability;
  /** ACME Renewal Information: told of every certificate held; undefined: off. */
  ari: (LoopObserver & AriStateSource) | undefined;
  health: LoopObserver;
  /** Observers beside health, metrics, the backend's and ARI's. */
  extraObservers: LoopObserver[];
}

/** The loops, one per domain, their supervisor, the issuance budget and slots; `ari` told of every certificate held. */
export function certificateLoops(settings: RenewalSettings, p: LoopParts): LoopSupervisor {
  const { clock, logger, backend, metrics, ari } = p;
  const issuanceSlots = new IssuanceSlots(settings.issuanceConcurrency);
  metrics.watchIssuanceSlots(issuanceSlots);
  const observer = fanOut([p.health, metrics, ...backend.observers, ...(ari ? [ari] : []), ...p.extraObservers]);
  const budget = settings.issuanceBudget
    ? new IssuanceBudget({
        limit: settings.issuanceBudget,
        nameLimit: settings.nameLimit,
        store: backend.ledger,
        clock,
        logger: logger.child({ component: 'issuance-budget' }),
        onOutOfBounds: observer.outOfBounds,
      })
    : undefined;
  if (budget) metrics.watchBudget(budget);
  return new LoopSupervisor({
    localApi: p.localApi,
    store: backend.store,
    role: backend.role,
    availability: p.availability,
    clock,
    renewal: settings.renewal,
    backoff: settings.backoff,
    observer,
    logger,
    intentTtlMs: intentTtl(settings.certTimeoutMs),
    budget,
    issuanceSlots,
    startup: p.startup,
    renewalInfo: ari,
    readinessLeadMs: settings.readinessLeadMs,
  });
}
