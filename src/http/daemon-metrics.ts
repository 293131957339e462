import { Counter, Gauge, Registry, collectDefaultMetrics } from 'prom-client';
import type { CertInfo } from '../core/certificates/certificate.ts';
import { isCurrentlyValid } from '../core/certificates/certificate.ts';
import type { Clock } from '../core/ports/clock.ts';
import type { AttemptResult, LoopObserver, RenewOutcome } from '../core/ports/observer.ts';
import type { RenewalPolicy } from '../core/renewal/renewal.ts';
import { renewalTime } from '../core/renewal/renewal.ts';
import type { FailureKind } from '../core/issuance/failure.ts';
import type { QueueReport } from '../core/issuance/issuance-budget.ts';
import { ISSUE_REASONS, type IssueReason } from '../core/issuance/issuance-policy.ts';
import type { StoredCert } from '../core/ports/store.ts';
import type { SuggestedWindow } from '../core/renewal/renewal-info.ts';
import type { UntrustedValue } from '../core/values/untrusted-values.ts';
import { ARI_CHECK_OUTCOMES, type AriCheckOutcome } from '../acme/renewal-info-client.ts';

const seconds = (ms: number): number => ms / 1000;
const MISNAMED_DEFAULT_METRICS = ['nodejs_active_handles_total', 'nodejs_active_requests_total', 'nodejs_active_resources_total'];
/**
 * Its collector runs JavaScript after every garbage collection, which costs /healthz ~2% of its CPU under
 * load: the bundle leaves the collector out (scripts/build.ts LOAD_TIME_STAND_INS), runs from the sources drop
 * the metric, so both export the same set.
 */
const GC_METRIC = 'nodejs_gc_duration_seconds';
const ATTEMPT_RESULTS: AttemptResult[] = ['success', 'unchanged', 'rate_limited', 'error', 'rejected', 'too_short', 'superseded'];

/**
 * How often the event-loop delay histogram (nodejs_eventloop_lag_p50_seconds and the rest) samples, in ms.
 * prom-client's default, 10 ms, is a timer that wakes an idle daemon 100 times a second (strace of an idle
 * standalone daemon: an epoll wait of 10 ms, over and over); at 1 s an idle process wakes about once a second.
 * A stall still shows when a sample falls in it, and nodejs_eventloop_lag_seconds is measured at each scrape.
 * @forTests
 */
export const EVENT_LOOP_SAMPLE_MS = 1000;

/** The process and Node.js metrics, without the misnamed ones nor the garbage collector's (GC_METRIC). */
export function collectNodeMetrics(registry: Registry): void {
  collectDefaultMetrics({ register: registry, eventLoopMonitoringPrecision: EVENT_LOOP_SAMPLE_MS });
  // prom-client exports these totals as gauges with a `_total` suffix, which Prometheus reserves
  // for counters (`promtool check metrics` flags them); the same counts stay available by type
  // as nodejs_active_handles / _requests / _resources.
  for (const name of MISNAMED_DEFAULT_METRICS) registry.removeSingleMetric(name);
  registry.removeSingleMetric(GC_METRIC);
}

/**
 * Prometheus metrics, named after REFERENCE §6 and cert-manager's (which users already alert on):
 * timestamps rather than "time since", base units, `_total` counters, the domain as the only label
 * besides a few fixed values (an attempt's result and reason).
 */
export class Metrics implements LoopObserver {
  readonly registry = new Registry();
  readonly #certs = new Map<string, CertInfo>();
  readonly #renewal: RenewalPolicy;
  readonly #expiration: Gauge;
  readonly #renewalAt: Gauge;
  readonly #attempts: Counter;
  readonly #renewRequests: Counter;
  readonly #backoff: Gauge;
  readonly #nextAttempt: Gauge;
  readonly #ariWindowStart: Gauge;
  readonly #ariWindowEnd: Gauge;
  readonly #ariChecks: Counter;
  readonly busConnected: Gauge;
  readonly busReconnects: Counter;
  readonly busBadLines: Counter;
  readonly reloads: Counter;
  readonly storeErrors: Counter;
  readonly eventsDropped: Counter;
  readonly breakGlass: Counter;
  readonly homeTakeovers: Counter;
  readonly untrusted: Counter;
  readonly outOfBoundsValues: Counter;
  readonly writer: Gauge;
  readonly homeWriter: Gauge;
  /** The issuance budget's queues, read at each scrape (none until watchBudget). */
  #budgetQueues: () => QueueReport[] = () => [];
  #slots: { inUse: number; waiting: number } = { inUse: 0, waiting: 0 };

  constructor(clock: Clock, renewal: RenewalPolicy, options: { defaultMetrics?: boolean } = {}) {
    this.#renewal = renewal;
    const registers = [this.registry];
    ({ expiration: this.#expiration, renewalAt: this.#renewalAt } = certificateMetrics(registers, clock, this.#certs));
    ({ attempts: this.#attempts, renewRequests: this.#renewRequests, backoff: this.#backoff, nextAttempt: this.#nextAttempt } = issuanceMetrics(registers));
    ({ windowStart: this.#ariWindowStart, windowEnd: this.#ariWindowEnd, checks: this.#ariChecks } = ariMetrics(registers));
    ({
      busConnected: this.busConnected,
      busReconnects: this.busReconnects,
      busBadLines: this.busBadLines,
      reloads: this.reloads,
      storeErrors: this.storeErrors,
      eventsDropped: this.eventsDropped,
      outOfBoundsValues: this.outOfBoundsValues,
      writer: this.writer,
    } = processMetrics(registers));
    ({ breakGlass: this.breakGlass, homeTakeovers: this.homeTakeovers, untrusted: this.untrusted, homeWriter: this.homeWriter } = federationMetrics(registers));
    budgetMetrics(
      registers,
      () => this.#budgetQueues(),
      () => this.#slots,
    );
    if (options.defaultMetrics ?? true) collectNodeMetrics(this.registry);
  }

  /** Reports the process's issuance slots (issuance-slots.ts) from now on. */
  watchIssuanceSlots(slots: { readonly inUse: number; readonly waiting: number }): void {
    this.#slots = slots;
  }

  /** Reports the budget's queues from now on. */
  watchBudget(budget: { queues(): QueueReport[] }): void {
    this.#budgetQueues = () => budget.queues();
  }

  certificate(domain: string, cert: StoredCert | undefined): void {
    const info = cert?.info;
    if (!info) {
      this.#certs.delete(domain);
      this.#expiration.remove({ domain });
      this.#renewalAt.remove({ domain });
      return;
    }
    this.#certs.set(domain, info);
    this.#expiration.set({ domain }, seconds(info.notAfter));
    this.#renewalAt.set({ domain }, seconds(renewalTime({ ...info, obtainedAt: cert?.obtainedAt }, this.#renewal)));
  }

  attempt(domain: string, result: AttemptResult, reason: IssueReason, _failure?: { kind: FailureKind }): void {
    this.#attempts.inc({ domain, result, reason });
  }

  outOfBounds(_where: string, value: UntrustedValue): void {
    this.outOfBoundsValues.inc({ field: value.field });
  }

  renewRequest(domain: string, outcome: RenewOutcome): void {
    this.#renewRequests.inc({ domain, result: outcome.result, reason: outcome.result === 'refused' ? outcome.reason : 'operator_requested' });
  }

  planned(domain: string, at: number, backoffMs: number): void {
    this.#nextAttempt.set({ domain }, seconds(at));
    this.#backoff.set({ domain }, seconds(backoffMs));
  }

  /** The CA's window for the certificate in use, or none (no answer yet, the certificate replaced, ARI off). */
  ariWindow(domain: string, window: SuggestedWindow | undefined): void {
    if (!window) {
      for (const gauge of [this.#ariWindowStart, this.#ariWindowEnd]) gauge.remove({ domain });
      return;
    }
    this.#ariWindowStart.set({ domain }, seconds(window.start));
    this.#ariWindowEnd.set({ domain }, seconds(window.end));
  }

  /** One ARI check done, by outcome. */
  ariCheck(outcome: AriCheckOutcome): void {
    this.#ariChecks.inc({ outcome });
  }

  stopped(domain: string): void {
    this.certificate(domain, undefined);
    for (const gauge of [this.#backoff, this.#nextAttempt, this.#ariWindowStart, this.#ariWindowEnd]) gauge.remove({ domain });
    for (const result of ATTEMPT_RESULTS) for (const reason of ISSUE_REASONS) this.#attempts.remove({ domain, result, reason });
  }
}

type Registers = Registry[];

/** The certificate held per domain: its expiry, its renewal point, and whether it is valid now (read at each scrape). */
function certificateMetrics(registers: Registers, clock: Clock, certs: ReadonlyMap<string, CertInfo>): { expiration: Gauge; renewalAt: Gauge } {
  const expiration = new Gauge({
    name: 'certshare_certificate_expiration_timestamp_seconds',
    help: 'NotAfter of the certificate in use, per domain.',
    labelNames: ['domain'],
    registers,
  });
  const renewalAt = new Gauge({
    name: 'certshare_certificate_renewal_timestamp_seconds',
    help: 'When the certificate in use becomes due for renewal, per domain.',
    labelNames: ['domain'],
    registers,
  });
  new Gauge({
    name: 'certshare_certificate_ready_status',
    help: 'Whether the domain has a certificate valid now (condition="True") or not (condition="False").',
    labelNames: ['domain', 'condition'],
    registers,
    collect() {
      this.reset();
      const now = clock.now();
      for (const [domain, info] of certs) {
        const ready = isCurrentlyValid(info, now);
        this.set({ domain, condition: 'True' }, ready ? 1 : 0);
        this.set({ domain, condition: 'False' }, ready ? 0 : 1);
      }
    },
  });
  return { expiration, renewalAt };
}

/** The CertPair calls, the renew requests answered, the backoff and the next look, per domain. */
function issuanceMetrics(registers: Registers): { attempts: Counter; renewRequests: Counter; backoff: Gauge; nextAttempt: Gauge } {
  const attempts = new Counter({
    name: 'certshare_issuance_attempts_total',
    help:
      'CertPair calls by result (success, unchanged, rate_limited, error, rejected, too_short) and by the reason ' +
      'the call was made (no_certificate, stored_unusable, expiry).',
    labelNames: ['domain', 'result', 'reason'],
    registers,
  });
  const renewRequests = new Counter({
    name: 'certshare_renew_requests_total',
    help: 'Renew requests (certshare renew) answered by the writer: result issued, or refused with the reason (min_interval, budget_exhausted, name_reserve).',
    labelNames: ['domain', 'result', 'reason'],
    registers,
  });
  const backoff = new Gauge({
    name: 'certshare_issuance_backoff_seconds',
    help: 'Current wait before the next CertPair call after failures (0 when not backing off).',
    labelNames: ['domain'],
    registers,
  });
  const nextAttempt = new Gauge({
    name: 'certshare_issuance_next_check_timestamp_seconds',
    help: 'When the domain is next looked at (renewal point, check interval or end of backoff).',
    labelNames: ['domain'],
    registers,
  });
  return { attempts, renewRequests, backoff, nextAttempt };
}

/** The CA's renewal window per domain (ACME Renewal Information), and the checks by outcome. */
function ariMetrics(registers: Registers): { windowStart: Gauge; windowEnd: Gauge; checks: Counter } {
  const windowStart = new Gauge({
    name: 'certshare_ari_window_start_timestamp_seconds',
    help: "Start of the CA's suggested renewal window (ACME Renewal Information) for the certificate in use, per domain.",
    labelNames: ['domain'],
    registers,
  });
  const windowEnd = new Gauge({
    name: 'certshare_ari_window_end_timestamp_seconds',
    help: "End of the CA's suggested renewal window (ACME Renewal Information) for the certificate in use, per domain.",
    labelNames: ['domain'],
    registers,
  });
  const checks = new Counter({
    name: 'certshare_ari_checks_total',
    help: 'ACME Renewal Information checks by outcome (ok, not_found, unavailable, timeout, bad_response, unsupported).',
    labelNames: ['outcome'],
    registers,
  });
  // Every outcome from the start, so rate() and absent() see a series before the first failure.
  for (const outcome of ARI_CHECK_OUTCOMES) checks.inc({ outcome }, 0);
  return { windowStart, windowEnd, checks };
}

/** What the process's other parts count: the IPN bus, the reload command, the store, Events, the writer role. */
function processMetrics(registers: Registers) {
  const busConnected = new Gauge({ name: 'certshare_ipn_bus_connected', help: '1 while the IPN bus stream is connected.', registers });
  const busReconnects = new Counter({
    name: 'certshare_ipn_bus_reconnects_total',
    help: 'IPN bus reconnections after the stream ended or failed.',
    registers,
  });
  const busBadLines = new Counter({
    name: 'certshare_ipn_bus_bad_lines_total',
    help: 'IPN bus lines that were not valid Notify JSON and were skipped.',
    registers,
  });
  const reloads = new Counter({
    name: 'certshare_reload_command_runs_total',
    help:
      "Reloads of the proxy by method (command: --reload-command; signal: --reload-signal; haproxy: a push to HAProxy's runtime API) " +
      'and result (success, failure; skipped: the proxy had not started, no pid file yet).',
    labelNames: ['method', 'result'],
    registers,
  });
  const storeErrors = new Counter({
    name: 'certshare_store_errors_total',
    help: 'Failed reads or writes of the certificate store.',
    labelNames: ['operation'],
    registers,
  });
  const eventsDropped = new Counter({
    name: 'certshare_events_dropped_total',
    help: 'Kubernetes Events not recorded: the queue was full, or the API refused or did not answer.',
    registers,
  });
  const outOfBoundsValues = new Counter({
    name: 'certshare_out_of_bounds_values_total',
    help:
      'Times read from an object another credential can write, out of their bound and ignored (CERTSHARE_UNTRUSTED_VALUE): ' +
      "a Secret's retry-not-before, issuing or replaced-now annotation, a pair stored for later starting too late, an issuance ledger entry, " +
      "a break-glass claim's time, a Lease's duration; " +
      'counted at each read.',
    labelNames: ['field'],
    registers,
  });
  const writer = new Gauge({
    name: 'certshare_writer',
    help: '1 while this replica may issue certificates (rw mode, or holding the group Lease in auto mode).',
    registers,
  });
  return { busConnected, busReconnects, busBadLines, reloads, storeErrors, eventsDropped, outOfBoundsValues, writer };
}

/** A federated group's series (--federation-kubeconfig, docs/federation.md): the home writer, break-glass, takeovers. */
function federationMetrics(registers: Registers) {
  const breakGlass = new Counter({
    name: 'certshare_break_glass_issuances_total',
    help: 'Certificates this member issued on its own while the federation home was unreachable past the safety point.',
    labelNames: ['domain'],
    registers,
  });
  const homeTakeovers = new Counter({
    name: 'certshare_home_takeovers_total',
    help:
      "Takeovers of the group's Lease at the federation home from a holder that let the newest copy pass its safety point " +
      'unrenewed (CERTSHARE_HOME_WRITER_FAILED), whatever its renewTime said.',
    registers,
  });
  const untrusted = new Counter({
    name: 'certshare_untrusted_certificates_total',
    help:
      'Certificates of a federated group refused: their chain reaches no trust anchor (--federation-trust-anchors); ' +
      'each pair once, by the store that held it (home or local).',
    labelNames: ['domain', 'store'],
    registers,
  });
  const homeWriter = new Gauge({
    name: 'certshare_home_writer',
    help: "1 while this replica holds its group's Lease at the federation home: the one writer of every member cluster.",
    registers,
  });
  return { breakGlass, homeTakeovers, untrusted, homeWriter };
}

/** The issuance budget's queues and the issuance slots, read at each scrape. */
function budgetMetrics(registers: Registers, queues: () => QueueReport[], slots: () => { inUse: number; waiting: number }): void {
  new Gauge({
    name: 'certshare_issuance_queued',
    help: 'Domains waiting for a slot of the issuance budget (first issuances), per registered domain.',
    labelNames: ['registered_domain'],
    registers,
    collect() {
      this.reset();
      for (const q of queues()) this.set({ registered_domain: q.registeredDomain }, q.queued);
    },
  });
  new Gauge({
    name: 'certshare_issuance_queued_expiring',
    help: 'Queued domains whose certificate expires before their turn in the issuance budget, per registered domain.',
    labelNames: ['registered_domain'],
    registers,
    collect() {
      this.reset();
      for (const q of queues()) this.set({ registered_domain: q.registeredDomain }, q.expiringBeforeTurn);
    },
  });
  new Gauge({
    name: 'certshare_issuance_budget_next_slot_timestamp_seconds',
    help: 'When the next slot of the issuance budget frees for a queued domain, per registered domain.',
    labelNames: ['registered_domain'],
    registers,
    collect() {
      this.reset();
      for (const q of queues()) if (q.nextSlotAt !== undefined) this.set({ registered_domain: q.registeredDomain }, seconds(q.nextSlotAt));
    },
  });
  new Gauge({
    name: 'certshare_issuance_slots_in_use',
    help: 'Domains issuing or restoring now (intent, CertPair call, Secret writes), at most --issuance-concurrency.',
    registers,
    collect() {
      this.set(slots().inUse);
    },
  });
  new Gauge({
    name: 'certshare_issuance_slots_waiting',
    help: 'Domains due for an issuance or a restore, waiting for one of the --issuance-concurrency slots.',
    registers,
    collect() {
      this.set(slots().waiting);
    },
  });
}
