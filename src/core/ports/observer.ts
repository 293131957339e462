import type { StoredCert } from './store.ts';
import type { FailureKind } from '../issuance/failure.ts';
import type { UntrustedValue } from '../values/untrusted-values.ts';
import type { IssuanceDecision, IssueReason, RenewRefusal } from '../issuance/issuance-policy.ts';

/** What became of an operator's renew request. */
export type RenewOutcome = { id: string; result: 'issued'; serial: string } | { id: string; result: 'refused'; reason: RenewRefusal; message: string };

export type AttemptResult = 'success' | 'unchanged' | 'rate_limited' | 'error' | 'rejected' | 'too_short' | 'superseded';

/** What the cert loops report; health, metrics and projection subscribe without the core knowing them. */
export interface LoopObserver {
  /** The best valid certificate for the domain changed (undefined: none). */
  certificate?(domain: string, cert: StoredCert | undefined): void;
  /** A CertPair call ended; `reason` says why it was made (issuance-policy.ts ISSUE_REASONS). */
  attempt?(domain: string, result: AttemptResult, reason: IssueReason, failure?: { kind: FailureKind; message: string }): void;
  /** What the loop decided to do (issuance-policy.ts), or planned after a CertPair call. */
  decided?(domain: string, decision: IssuanceDecision): void;
  /** The next CertPair call is planned at `at` (epoch ms); backoffMs is 0 when not backing off. */
  planned?(domain: string, at: number, backoffMs: number): void;
  problem?(domain: string, message: string | undefined): void;
  /** A renew request was answered (recorded on the store). */
  renewRequest?(domain: string, outcome: RenewOutcome): void;
  /** The domain's record names these serials as replaced because the CA asked for it now (bounded, newest first). */
  replacedNow?(domain: string, serials: readonly string[]): void;
  /** A value read from a record someone else can write (`where`) was out of its bound and ignored (untrusted-values.ts). */
  outOfBounds?(where: string, value: UntrustedValue): void;
  stopped?(domain: string): void;
}

export function fanOut(observers: LoopObserver[]): Required<LoopObserver> {
  return {
    certificate: (d, i) => {
      for (const o of observers) o.certificate?.(d, i);
    },
    attempt: (d, r, why, f) => {
      for (const o of observers) o.attempt?.(d, r, why, f);
    },
    decided: (d, decision) => {
      for (const o of observers) o.decided?.(d, decision);
    },
    planned: (d, a, b) => {
      for (const o of observers) o.planned?.(d, a, b);
    },
    problem: (d, m) => {
      for (const o of observers) o.problem?.(d, m);
    },
    renewRequest: (d, o) => {
      for (const x of observers) x.renewRequest?.(d, o);
    },
    replacedNow: (d, s) => {
      for (const o of observers) o.replacedNow?.(d, s);
    },
    outOfBounds: (w, v) => {
      for (const o of observers) o.outOfBounds?.(w, v);
    },
    stopped: (d) => {
      for (const o of observers) o.stopped?.(d);
    },
  };
}
