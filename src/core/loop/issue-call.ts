// One CertPair call of a CertLoop and what follows it: the call, the acceptance of its answer
// (issue-answer.ts, pure), its use (kept, stored or held for later), or the failure handled; then the wait
// until the loop's next turn. The loop (cert-loop.ts) decides when to call; this is the call.
import { CertshareError, errorMessage } from '../errors.ts';
import type { CertInfo } from '../certificates/certificate.ts';
import { type Clock, iso } from '../ports/clock.ts';
import { held, type HeldCertificate } from './held-certificate.ts';
import type { IssueFailures } from '../issuance/issue-failures.ts';
import { acceptAnswer, minValidityOf, type AcceptedAnswer, type Asked } from '../issuance/issue-answer.ts';
import type { IssuanceBudget } from '../issuance/issuance-budget.ts';
import { isAriReason, planAfterCall, type IssuanceSnapshot, type IssueReason } from '../issuance/issuance-policy.ts';
import type { CertPair, LocalApi } from '../ports/localapi.ts';
import type { Logger } from '../ports/logger.ts';
import type { LoopObserver } from '../ports/observer.ts';
import type { CertStore, StoredCert } from '../ports/store.ts';
import type { RenewalPolicy } from '../renewal/renewal.ts';
import { issuedAnswer } from '../renewal/renew-request.ts';
import type { AriStateSource } from '../renewal/renewal-info.ts';
import { isConflict } from './store-restore.ts';

/** What a CertLoop shares with its calls: its dependencies, its log, the certificate it holds and its failures. */
interface IssueCallDeps {
  domain: string;
  localApi: Pick<LocalApi, 'certPair'>;
  store: CertStore;
  clock: Clock;
  renewal: RenewalPolicy;
  observer: Required<LoopObserver>;
  budget?: IssuanceBudget | undefined;
  renewalInfo?: AriStateSource | undefined;
  log: Logger;
  held: HeldCertificate;
  failures: IssueFailures;
  minIssueIntervalMs: number;
  /** The ARI state of the certificate held (CertLoop's). */
  ari: () => IssuanceSnapshot['ari'];
  /** Stores a pair valid only later beside the served one (store-restore.ts restoreToStore, within the call's slot). */
  storePending: (cert: StoredCert, signal: AbortSignal) => Promise<'stored' | 'conflict' | { failed: unknown }>;
  /** Watches the store while the call is under way and aborts `call` when a copy supersedes it (superseding-copy.ts). */
  watchCall?: ((replaced: StoredCert | undefined, call: AbortController) => () => void) | undefined;
}

export class IssueCall {
  readonly domain: string;
  readonly #deps: IssueCallDeps;
  readonly #log: Logger;
  readonly #held: HeldCertificate;
  readonly #failures: IssueFailures;
  readonly #minIssueIntervalMs: number;
  readonly #ari: () => IssuanceSnapshot['ari'];

  constructor(deps: IssueCallDeps) {
    this.domain = deps.domain;
    this.#deps = deps;
    this.#log = deps.log;
    this.#held = deps.held;
    this.#failures = deps.failures;
    this.#minIssueIntervalMs = deps.minIssueIntervalMs;
    this.#ari = deps.ari;
  }

  /**
   * An issuance, for `reason` (the attempt's label); `reserved`: a slot of the budget was taken for it;
   * `serving`: the renew request pending when it was decided (a new certificate answers it, in the same
   * write). The call, the acceptance of its answer (issue-answer.ts, pure), its use, or the failure handled.
   */
  async issue(signal: AbortSignal, reason: IssueReason, reserved: boolean, serving: string | undefined): Promise<number> {
    const { clock, renewal } = this.#deps;
    const previous = this.#held.best;
    const minValidityMs = minValidityOf(previous, reason, {
      now: clock.now(),
      renewal,
      freshValidityMs: this.#held.freshValidityMs,
      ari: () => this.#ari(),
      log: this.#log,
    });
    const asked: Asked = { minValidityMs, minIssueIntervalMs: this.#minIssueIntervalMs, reason, serving };
    const superseded = new AbortController();
    try {
      const pair = await this.#call(signal, asked, previous, reserved, superseded);
      const now = clock.now();
      return await this.#use(acceptAnswer(pair, this.domain, previous, now, renewal, asked), now, asked, signal, previous);
    } catch (err) {
      if (signal.aborted) throw err;
      if (isConflict(err)) return 0;
      if (superseded.signal.aborted) {
        this.#deps.observer.attempt(this.domain, 'superseded', reason);
        return 0;
      }
      return this.#failures.failed(err, reason, signal);
    }
  }

  /**
   * The CertPair call (`superseded` aborts it alone, not what follows it), and what it settles whatever its pair
   * is worth: the CA's request, the budget's slot.
   */
  async #call(signal: AbortSignal, asked: Asked, previous: StoredCert | undefined, reserved: boolean, superseded: AbortController): Promise<CertPair> {
    const stopWatching = this.#deps.watchCall?.(previous, superseded);
    let pair: CertPair;
    try {
      pair = await this.#deps.localApi.certPair(this.domain, { minValidityMs: asked.minValidityMs, signal: AbortSignal.any([signal, superseded.signal]) });
    } finally {
      stopWatching?.();
    }
    // The CA's request for this certificate has been acted on (at most one order each).
    if (previous && isAriReason(asked.reason)) this.#deps.renewalInfo?.renewalDone(this.domain, previous.info.serial);
    this.#deps.budget?.certificateReturned(this.domain);
    if (reserved) {
      // The CA issued (whatever our validation says next): later issuances of this domain are renewals.
      await this.#deps.budget?.issued(this.domain, signal).catch((err: unknown) => {
        if (signal.aborted) throw err;
        this.#log.warn({ err: errorMessage(err) }, 'could not mark the first issuance done in the ledger; its slot stays taken');
      });
    }
    return pair;
  }

  /**
   * Uses an accepted answer: kept, stored or held for later; the wait until the next turn. A certificate that
   * replaces `previous` because the CA asked for it now is stored naming `previous` (SaveOptions.replacedNow).
   */
  async #use(answer: AcceptedAnswer, now: number, asked: Asked, signal: AbortSignal, previous: StoredCert | undefined): Promise<number> {
    const { store, observer } = this.#deps;
    if (answer.kind === 'unchanged') {
      observer.attempt(this.domain, 'unchanged', asked.reason);
      return this.#succeeded();
    }
    // A new pair was issued (or tailscaled had a newer one). Used or not, it is what tailscaled has cached.
    const info = answer.kind === 'older' ? answer.info : answer.cert.info;
    this.#held.obtained(info.notBefore, info.notAfter, now, asked.minValidityMs > 0);
    if (answer.kind === 'older') {
      if (answer.tooShort) return this.#tooShort(info, now, asked, answer.tooShort);
      throw new CertshareError('CERTSHARE_CERT_STALE', {
        returned: 'a certificate that expires before the current one',
        detail: `notAfter ${iso(info.notAfter)}`,
      });
    }
    if (answer.usableAt === 'not_before') {
      // The issuer's clock is ahead of ours: tailscaled would see this pair as invalid too and order
      // another on every call. Keep it and use it from its notBefore, without asking again.
      this.#held.keepPending(answer.cert);
      this.#log.warn(
        { code: 'CERTSHARE_CERT_INVALID', serial: info.serial, notBefore: iso(info.notBefore) },
        'certificate not valid yet (issuer clock ahead?); using it from its notBefore',
      );
      // Stored at once beside the served pair; not stored, the loop's next turn (at once) tries again.
      const stored = await this.#deps.storePending(answer.cert, signal);
      if (stored !== 'stored') {
        observer.attempt(this.domain, 'success', asked.reason);
        this.#failures.succeeded();
        return 0;
      }
    } else {
      const { serving } = asked;
      try {
        const renewAnswer = serving === undefined ? undefined : issuedAnswer(serving, info.serial, this.#deps.budget?.renewLeft(this.domain, serving));
        const replacedNow = asked.reason === 'ca_requested_now' ? previous?.info.serial : undefined;
        const options = renewAnswer || replacedNow ? { ...(renewAnswer ? { renewAnswer } : {}), ...(replacedNow ? { replacedNow } : {}) } : undefined;
        await store.save(this.domain, answer.cert, signal, options);
      } finally {
        // Held even when the save failed: the next turn restores it to the store instead of issuing again.
        this.#held.consider(answer.cert);
      }
      this.#log.info({ serial: info.serial, notAfter: iso(info.notAfter), ...(serving ? { renewRequest: serving } : {}) }, 'certificate issued and stored');
      if (serving !== undefined) observer.renewRequest(this.domain, { id: serving, result: 'issued', serial: info.serial });
    }
    if (answer.tooShort) return this.#tooShort(info, now, asked, answer.tooShort);
    observer.attempt(this.domain, 'success', asked.reason);
    return this.#succeeded();
  }

  #succeeded(): number {
    this.#failures.succeeded();
    return this.#planAfterCall();
  }

  /** A certificate due again (almost) at once: used, but backed off from as after a failure (issue-failures.ts). */
  #tooShort(info: CertInfo, now: number, asked: Asked, why: string): number {
    this.#failures.tooShort(info, now, asked, why);
    return this.#planAfterCall();
  }

  /** The wait after a call that gave a certificate (issuance-policy.ts planAfterCall), reported. */
  #planAfterCall(): number {
    const { observer, clock } = this.#deps;
    const now = clock.now();
    const pending = this.#held.pending && { notBefore: this.#held.pending.info.notBefore };
    const backoff = this.#failures.backoff;
    const decision = planAfterCall({ now, held: this.#held.best && held(this.#held.best), pending, backoff }, this.#deps);
    observer.decided(this.domain, decision);
    observer.planned(this.domain, decision.at, Math.max(0, (backoff?.until ?? 0) - now));
    return Math.max(0, decision.at - now);
  }
}
