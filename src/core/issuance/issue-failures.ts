// A loop's failure handling: its own backoff (after a failed CertPair call, a rate limit, a certificate
// too short), the coordination record updated after a failed call, and what each failure reports.
import { type BackoffPolicy, FailureStreak, retryDelay } from './backoff.ts';
import type { CertInfo } from '../certificates/certificate.ts';
import { type Clock, iso } from '../ports/clock.ts';
import { CertshareError, errorMessage, errorText } from '../errors.ts';
import { classifyIssuanceFailure } from './failure.ts';
import type { Asked } from './issue-answer.ts';
import type { IssuanceSnapshot, IssueReason } from './issuance-policy.ts';
import { LocalApiError } from '../ports/localapi.ts';
import type { Logger } from '../ports/logger.ts';
import type { LoopObserver } from '../ports/observer.ts';
import type { CertStore } from '../ports/store.ts';

interface IssueFailuresDeps {
  domain: string;
  store: Pick<CertStore, 'recordRateLimit' | 'clearIntent'>;
  clock: Clock;
  backoff: BackoffPolicy;
  observer: Required<LoopObserver>;
  log: Logger;
}

export class IssueFailures {
  readonly #deps: IssueFailuresDeps;
  #streak = new FailureStreak();
  /** This loop's own backoff: no call before `until`. */
  #backoff: IssuanceSnapshot['backoff'];

  constructor(deps: IssueFailuresDeps) {
    this.#deps = deps;
  }

  get backoff(): IssuanceSnapshot['backoff'] {
    return this.#backoff;
  }

  /** A call that gave a usable answer: the streak and the backoff end. */
  succeeded(): void {
    this.#streak.reset();
    this.#backoff = undefined;
    this.#deps.observer.problem(this.#deps.domain, undefined);
  }

  /** A failed call: backoff, the coordination record updated, reported; the wait until the next try. */
  async failed(err: unknown, reason: IssueReason, signal: AbortSignal): Promise<number> {
    const { domain, store, clock, backoff, observer, log } = this.#deps;
    const failure = classifyIssuanceFailure(err);
    const delay = retryDelay(failure, this.#streak.record(failure.kind), backoff);
    const retryAt = clock.now() + delay;
    this.#backoff = { until: retryAt, reason: failure.kind === 'rate_limited' ? 'rate_limited' : 'retry_backoff' };
    const result = failure.kind === 'rate_limited' ? 'rate_limited' : failure.kind === 'rejected' ? 'rejected' : 'error';
    // A timeout or a dropped connection leaves the intent standing: tailscaled may still be issuing.
    const answered = !(err instanceof LocalApiError) || (err.status !== undefined && !err.timedOut);
    // Recorded for the other replicas no later than the retry cap from now: a later date is one they ignore
    // (untrusted-values.ts), whoever wrote it. This loop's own backoff keeps the CA's exact Retry-After.
    const recorded = Math.min(retryAt, clock.now() + backoff.retryCapMs);
    const update =
      failure.kind === 'rate_limited' ? store.recordRateLimit?.(domain, recorded, signal) : answered ? store.clearIntent?.(domain, signal) : undefined;
    await update?.catch((updateErr: unknown) => {
      log.warn({ err: errorMessage(updateErr) }, 'could not update the coordination record in the store');
    });
    observer.attempt(domain, result, reason, failure);
    observer.decided(domain, { action: 'wait', reason: this.#backoff.reason, at: retryAt });
    observer.planned(domain, retryAt, delay);
    observer.problem(domain, failure.message);
    const code = err instanceof CertshareError ? err.code : undefined;
    log.warn({ kind: failure.kind, ...(code ? { code } : {}), err: failure.message, retryInMs: delay }, 'certificate issuance failed');
    return delay;
  }

  /**
   * A renewal answered with a certificate that is due again (almost) at once. It is used (it is valid and
   * newer), but asking again on its schedule would be an issuance storm: back off as after a failure.
   */
  tooShort(info: CertInfo, now: number, asked: Asked, why: string): void {
    const { domain, backoff, observer, log } = this.#deps;
    const failure = { kind: 'too_short' as const, message: errorText('CERTSHARE_CERT_TOO_SHORT', { why }) };
    const delay = retryDelay(failure, this.#streak.record(failure.kind), backoff);
    // A longer backoff under way (a rate limit) keeps its end and its reason.
    if (now + delay >= (this.#backoff?.until ?? -Infinity)) this.#backoff = { until: now + delay, reason: 'too_short' };
    const retryAt = this.#backoff!.until;
    log.warn(
      {
        code: 'CERTSHARE_CERT_TOO_SHORT',
        serial: info.serial,
        notBefore: iso(info.notBefore),
        notAfter: iso(info.notAfter),
        lifetimeMs: info.notAfter - info.notBefore,
        validFromNowMs: info.notAfter - Math.max(info.notBefore, now),
        minValidityMs: asked.minValidityMs,
        minIssueIntervalMs: asked.minIssueIntervalMs,
        retryInMs: retryAt - now,
      },
      `the issuer gave a certificate too short for the renewal rule (${why}); backing off`,
    );
    observer.attempt(domain, 'too_short', asked.reason, failure);
    // Shown by /healthz once the short certificate has expired during the backoff.
    observer.problem(domain, failure.message);
  }

  /** A rate limit recorded in the store by a replica (or by this one before a restart): ours from now on, if later. */
  rateLimitedUntil(at: number, now: number): void {
    if (at <= (this.#backoff?.until ?? -Infinity)) return;
    this.#backoff = { until: at, reason: 'rate_limited' };
    this.#deps.observer.planned(this.#deps.domain, at, at - now);
    this.#deps.observer.problem(this.#deps.domain, `rate limited until ${iso(at)}`);
  }
}
