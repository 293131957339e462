import type { StoredCert } from './store.ts';
import type { FailureKind } from './failure.ts';

export type AttemptResult = 'success' | 'unchanged' | 'rate_limited' | 'error' | 'rejected' | 'too_short';

/** What the cert loops report; health, metrics and projection subscribe without the core knowing them. */
export interface LoopObserver {
  /** The best valid certificate for the domain changed (undefined: none). */
  certificate?(domain: string, cert: StoredCert | undefined): void;
  attempt?(domain: string, result: AttemptResult, failure?: { kind: FailureKind; message: string }): void;
  /** The next CertPair call is planned at `at` (epoch ms); backoffMs is 0 when not backing off. */
  planned?(domain: string, at: number, backoffMs: number): void;
  problem?(domain: string, message: string | undefined): void;
  stopped?(domain: string): void;
}

export function fanOut(observers: LoopObserver[]): Required<LoopObserver> {
  return {
    certificate: (d, i) => {
      for (const o of observers) o.certificate?.(d, i);
    },
    attempt: (d, r, f) => {
      for (const o of observers) o.attempt?.(d, r, f);
    },
    planned: (d, a, b) => {
      for (const o of observers) o.planned?.(d, a, b);
    },
    problem: (d, m) => {
      for (const o of observers) o.problem?.(d, m);
    },
    stopped: (d) => {
      for (const o of observers) o.stopped?.(d);
    },
  };
}
