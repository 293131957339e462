import type { FailureKind } from '../core/issuance/failure.ts';
import type { IssueReason } from '../core/issuance/issuance-policy.ts';
import type { AttemptResult, LoopObserver } from '../core/ports/observer.ts';
import type { StoredCert } from '../core/ports/store.ts';
import { type OutOfBoundsReport, untrustedText } from '../core/values/untrusted-values.ts';
import type { KubeMetrics } from './kube-metrics.ts';
import type { EventOccurrence } from './event-recorder.ts';
import { iso } from '../core/ports/clock.ts';

/**
 * The reasons of the Events certshare records about its Pod: a fixed set, documented in docs/operations.md
 * (Kubernetes section). Changing one changes what users' alerts and `kubectl get events` filters match.
 * @forTests
 */
export const EVENT_REASONS = {
  Issued: 'a first certificate for a domain was obtained from tailscaled (and stored)',
  Renewed: 'a certificate was renewed (its renewal point came, or the CA asked: ACME Renewal Information)',
  Loaded: 'a certificate read from the Secret (stored by the writer) was taken into use',
  IssuanceFailed: 'a certificate request failed: the failure code (issuance-policy / failure kind) and the next retry',
  RateLimited: 'the CA refused with a rate limit: no request before the time given',
  BudgetQueued: "a first issuance waits for a slot of the issuance budget (--issuance-budget): the domain's turn",
  BreakGlassIssued: 'a certificate was issued without the federation home, unreachable past the safety point (docs/federation.md)',
  UntrustedCertificate:
    "a federated group's Secret (the home's or this member's) holds a pair whose chain reaches no trust anchor: refused, never served (docs/security.md)",
  OutOfBoundsValue:
    "a time read from a record another credential can write (a Secret's retry-not-before or issuing annotation, " +
    "a ledger entry, a break-glass claim's time, a Lease's duration) was out of its bound: ignored (CERTSHARE_UNTRUSTED_VALUE)",
  RenewRefused: 'a renew request (certshare renew) was refused: the minimum interval or the issuance budget says no (served ones are Renewed)',
  Ready: "the Pod's readiness condition turned True",
  NotReady: "the Pod's readiness condition turned False, with its reason",
  BecameWriter: 'this replica won the group Lease: it issues and writes the Secrets',
  LostWriter: 'this replica no longer holds the group Lease',
  BecameHomeWriter: "this replica won its group's Lease at the federation home: it issues for every member cluster",
  LostHomeWriter: "this replica no longer holds its group's Lease at the federation home",
  HomeWriterTakenOver: "this replica took its group's Lease at the federation home over from a holder that let the newest copy pass its safety point unrenewed",
  ServedCertificate: 'what the proxy serves for a domain changed (--served-check): current, previous, expired, other_name, other, handshake_failed or unknown',
  ServiceDomainWait:
    "a Tailscale Service's domain is not among the node's cert domains (control grants it only to the Service's hosts): the first issuance waits",
} as const;
type EventReason = keyof typeof EVENT_REASONS;

const WRITER_EVENTS = {
  local: {
    won: ['BecameWriter', 'holds the group Lease: issues and writes the Secrets'],
    lost: ['LostWriter', 'no longer holds the group Lease: reads the Secrets'],
  },
  home: {
    won: ['BecameHomeWriter', 'holds the group Lease at the federation home: issues for every member cluster'],
    lost: ['LostHomeWriter', 'no longer holds the group Lease at the federation home: mirrors what the home holds'],
  },
} as const satisfies Record<string, Record<'won' | 'lost', readonly [EventReason, string]>>;

type RecordEvent = (occurrence: EventOccurrence & { reason: EventReason }) => void;

const FIRST_ISSUE: ReadonlySet<IssueReason> = new Set(['no_certificate', 'stored_unusable']);

/**
 * Maps what the loops, the readiness gate and the Lease report onto Events (EVENT_REASONS). A
 * certificate change is reported by the loop before the attempt that obtained it, in the same
 * synchronous run: one not claimed by an attempt by the next microtask came from the store (Loaded).
 */
export class PodEvents {
  readonly #record: RecordEvent;
  /** The certificate each domain took into use and nobody has reported yet. */
  readonly #unclaimed = new Map<string, StoredCert>();
  /** A failed call per domain, recorded once the loop says when it tries again. */
  readonly #failed = new Map<string, { result: AttemptResult; kind: FailureKind; message: string }>();
  /** Domains waiting in the issuance budget's queue: recorded when they enter it, not on every turn there. */
  readonly #queued = new Set<string>();

  constructor(record: RecordEvent) {
    this.#record = record;
  }

  readonly observer: LoopObserver = {
    certificate: (domain, cert) => {
      if (!cert) return;
      this.#unclaimed.set(domain, cert);
      queueMicrotask(() => {
        if (this.#unclaimed.get(domain) !== cert) return;
        this.#unclaimed.delete(domain);
        this.#record({
          type: 'Normal',
          reason: 'Loaded',
          action: 'Load',
          key: domain,
          note: `${domain}: certificate ${cert.info.serial} read from the Secret, valid until ${iso(cert.info.notAfter)}`,
        });
      });
    },
    attempt: (domain, result, why, failure) => {
      if (result === 'success' || result === 'too_short') {
        const cert = this.#unclaimed.get(domain);
        this.#unclaimed.delete(domain);
        const first = FIRST_ISSUE.has(why);
        const serial = cert ? ` ${cert.info.serial}` : '';
        const until = cert ? `, valid until ${iso(cert.info.notAfter)}` : '';
        const short = result === 'too_short' ? ' (shorter than the renewal rule wants: backing off)' : '';
        const reason = first ? 'Issued' : 'Renewed';
        this.#record({ type: 'Normal', reason, action: 'Issue', key: domain, note: `${domain}: certificate${serial} obtained (${why})${until}${short}` });
        // Only the writer obtains certificates, and it stores each in the domain's Secret (named after the
        // domain) before reporting: the same fact on the Secret, for `kubectl describe secret`.
        this.#record({
          type: 'Normal',
          reason,
          action: 'Store',
          key: domain,
          about: { kind: 'Secret', name: domain },
          note: `${domain}: certificate${serial} obtained (${why}) and stored in this Secret by the writer (the related Pod)${until}`,
        });
      } else if (failure && result !== 'unchanged') {
        this.#failed.set(domain, { result, kind: failure.kind, message: failure.message });
      }
    },
    decided: (domain, decision) => {
      if (decision.reason !== 'budget_exhausted') {
        if (decision.action === 'issue' || decision.action === 'use') this.#queued.delete(domain);
        return;
      }
      if (this.#queued.has(domain)) return;
      this.#queued.add(domain);
      this.#record({
        type: 'Normal',
        reason: 'BudgetQueued',
        action: 'Issue',
        key: domain,
        note: `${domain}: a first issuance waits for the issuance budget; its turn at ${iso(decision.at)}`,
      });
    },
    planned: (domain, at) => {
      const failed = this.#failed.get(domain);
      if (!failed) return;
      this.#failed.delete(domain);
      if (failed.result === 'rate_limited') {
        this.#record({
          type: 'Warning',
          reason: 'RateLimited',
          action: 'Issue',
          key: domain,
          note: `${domain}: rate limited until ${iso(at)}: ${failed.message}`,
        });
      } else {
        this.#record({
          type: 'Warning',
          reason: 'IssuanceFailed',
          action: 'Issue',
          key: `${domain}\u0000${failed.kind}`,
          // A repeat counts in the Event's series and keeps this note (immutable): the first retry's time.
          note: `${domain}: issuance failed [${failed.kind}]: ${failed.message}; next retry at ${iso(at)}, then backing off`,
        });
      }
    },
    renewRequest: (domain, outcome) => {
      if (outcome.result !== 'refused') return; // served: the Renewed Event of its attempt says (operator_requested)
      this.#record({
        type: 'Warning',
        reason: 'RenewRefused',
        action: 'Issue',
        key: `${domain}\u0000${outcome.id}`,
        note: `${domain}: ${outcome.message}`,
      });
    },
    outOfBounds: (where, value) => {
      this.#record({
        type: 'Warning',
        reason: 'OutOfBoundsValue',
        action: 'Verify',
        key: `${where}\u0000${value.field}\u0000${value.value}`,
        note: untrustedText(where, value),
      });
    },
    stopped: (domain) => {
      this.#unclaimed.delete(domain);
      this.#failed.delete(domain);
      this.#queued.delete(domain);
    },
  };

  /** The readiness gate wrote its condition. */
  readiness(status: 'True' | 'False', reason: string, message: string): void {
    const ready = status === 'True';
    this.#record({
      type: ready ? 'Normal' : 'Warning',
      reason: ready ? 'Ready' : 'NotReady',
      action: 'UpdateReadiness',
      key: reason,
      note: `${reason}: ${message}`,
    });
  }

  /** The served check saw the proxy serve something else for a domain (served-checker.ts ServedReport). */
  served(domain: string, outcome: string, ok: boolean, description: string): void {
    this.#record({
      type: ok ? 'Normal' : 'Warning',
      reason: 'ServedCertificate',
      action: 'CheckServed',
      key: `${domain} ${outcome}`,
      note: `${domain}: ${description}`,
    });
  }

  /** A Service's domain waits for control's grant (CERTSHARE_SERVICE_DOMAIN_NOT_GRANTED); undefined: it came. */
  serviceDomainWait(domain: string, text: string | undefined): void {
    if (text === undefined) return;
    this.#record({ type: 'Warning', reason: 'ServiceDomainWait', action: 'Issue', key: domain, note: text });
  }

  /** A certificate issued without the federation home (break-glass), recorded in the local Secret. */
  breakGlass(domain: string, serial: string): void {
    this.#record({
      type: 'Warning',
      reason: 'BreakGlassIssued',
      action: 'Issue',
      key: `${domain} ${serial}`,
      note: `${domain}: certificate ${serial} issued without the federation home (unreachable past the safety point)`,
    });
  }

  /** The group's Lease at the federation home taken over from a holder that renewed nothing by the safety point. */
  homeTakeover(holder: string, reason: string): void {
    this.#record({
      type: 'Warning',
      reason: 'HomeWriterTakenOver',
      action: 'Elect',
      key: reason,
      note: `took the federation home's Lease over from ${holder}: ${reason}`,
    });
  }

  /** A federated group's Secret (at the home, or the member's own) holds a pair that no trust anchor vouches for. */
  untrusted(domain: string, serial: string, store: 'home' | 'local'): void {
    this.#record({
      type: 'Warning',
      reason: 'UntrustedCertificate',
      action: 'Verify',
      key: `${domain} ${store} ${serial}`,
      note: `${domain}: certificate ${serial} in the ${store === 'home' ? 'federation home' : 'local'} Secret refused: its chain does not reach a trust anchor`,
    });
  }

  /** The group Lease (`local`), or the group's Lease at the federation home (`home`), was won or lost. */
  writer(leader: boolean, lease: 'local' | 'home' = 'local'): void {
    const [reason, note] = WRITER_EVENTS[lease][leader ? 'won' : 'lost'];
    this.#record({ type: 'Normal', reason, action: 'Elect', key: '', note });
  }
}

/** How Kubernetes mode tells a value read back out of its bound beside the log: the metric, and an Event when there is a Pod. */
export function reportOutOfBounds(metrics: Pick<KubeMetrics, 'outOfBounds'>, podEvents: PodEvents | undefined): OutOfBoundsReport {
  return (where, value) => {
    metrics.outOfBounds(where, value);
    podEvents?.observer.outOfBounds?.(where, value);
  };
}
