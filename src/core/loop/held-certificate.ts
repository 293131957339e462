// What one domain's loop holds: the best valid certificate it has seen, a pair whose validity starts later
// (the issuer's clock ahead), and the earliest time another CertPair call may be made. CertLoop decides;
// this keeps the facts those decisions read, each change reported to the observer.
import { isCurrentlyValid } from '../certificates/certificate.ts';
import type { Clock } from '../ports/clock.ts';
import type { HeldValidity } from '../renewal/renewal.ts';
import type { Logger } from '../ports/logger.ts';
import type { LoopObserver } from '../ports/observer.ts';
import type { StartupCondition } from './startup-grace.ts';
import type { StoredCert } from '../ports/store.ts';

interface HeldCertificateDeps {
  domain: string;
  clock: Clock;
  observer: Pick<Required<LoopObserver>, 'certificate'>;
  log: Logger;
  /** The least time between two issuances of the domain. */
  minIssueIntervalMs: number;
  /** Cleared once a certificate is held (the start-up grace of an empty store record). */
  firstCertificate?: StartupCondition | undefined;
}

export class HeldCertificate {
  readonly #deps: HeldCertificateDeps;
  #best: StoredCert | undefined;
  /** A pair whose validity starts later (the issuer's clock is ahead): adopted at its notBefore, no call before. */
  #pending: StoredCert | undefined;
  /**
   * No CertPair call before this: the minimum interval after the last new certificate, or that
   * certificate's notBefore if later (until then tailscaled sees its cached pair as invalid and orders anew).
   */
  #callFloor = -Infinity;
  /** The shortest validity a certificate had when a renewal call returned it: what this issuer really gives. */
  #freshValidityMs: number | undefined;
  /** A valid certificate of the name was held once: its next issuance is a renewal, also after an expiry. */
  #wasHeld = false;

  constructor(deps: HeldCertificateDeps) {
    this.#deps = deps;
  }

  get best(): StoredCert | undefined {
    return this.#best;
  }

  /** Whether this loop ever held a valid certificate of the name (what dropIfExpired does not forget). */
  get wasHeld(): boolean {
    return this.#wasHeld;
  }

  get pending(): StoredCert | undefined {
    return this.#pending;
  }

  get callFloor(): number {
    return this.#callFloor;
  }

  get freshValidityMs(): number | undefined {
    return this.#freshValidityMs;
  }

  /** A new pair came back from a call at `now`: the minimum interval starts, and its validity is what this issuer gives. */
  obtained(notBefore: number, notAfter: number, now: number, renewal: boolean): void {
    this.#callFloor = Math.max(now + this.#deps.minIssueIntervalMs, notBefore);
    if (renewal) this.#freshValidityMs = Math.min(this.#freshValidityMs ?? Infinity, notAfter - Math.max(notBefore, now));
  }

  /** Keeps a pair valid only from its notBefore, to be taken into use then (adoptPending). */
  keepPending(cert: StoredCert): void {
    this.#pending = cert;
  }

  /**
   * A pair the store holds for later (StoreRead.pending, its start bounded where read): this loop's pending pair
   * unless what it holds, pending or served, ends as late (no copy ending earlier replaces the newest issuance).
   */
  considerPending(cert: StoredCert): void {
    const latest = Math.max(this.#pending?.info.notAfter ?? Number.NEGATIVE_INFINITY, this.#best?.info.notAfter ?? Number.NEGATIVE_INFINITY);
    if (cert.info.notAfter > latest) this.#pending = cert;
  }

  /** Takes a pending pair into use once its validity has started. */
  adoptPending(): void {
    const pending = this.#pending;
    if (!pending || this.#deps.clock.now() < pending.info.notBefore) return;
    this.#pending = undefined;
    this.consider(pending);
  }

  /**
   * A pair that was in the store: a candidate, and the start of the minimum interval. `record`: the pair the store
   * holds now (not a last valid one it kept): it also wins a tie by notAfter, so every replica serves what the store
   * holds (two certificates of one second: a member's break-glass one and the home's renewal, docs/federation.md).
   */
  considerStored(cert: StoredCert, record = false): void {
    this.consider(cert, record);
    // A stored certificate also starts the minimum interval (a restart right after an issuance): from
    // when the writer obtained it, or else from its notBefore, clipped to now.
    const start = cert.obtainedAt ?? Math.min(cert.info.notBefore, this.#deps.clock.now());
    this.#callFloor = Math.max(this.#callFloor, start + this.#deps.minIssueIntervalMs);
  }

  /** Keeps the candidate if it is valid now and expires later than what is held (`tieWins`: as late, another pair). */
  consider(candidate: StoredCert, tieWins = false): void {
    const now = this.#deps.clock.now();
    if (!isCurrentlyValid(candidate.info, now)) return;
    const best = this.#best?.info;
    if (best && (best.notAfter > candidate.info.notAfter || (best.notAfter === candidate.info.notAfter && (!tieWins || best.serial === candidate.info.serial))))
      return;
    this.#best = candidate;
    this.#wasHeld = true;
    this.#deps.firstCertificate?.cleared();
    this.#deps.observer.certificate(this.#deps.domain, candidate);
  }

  /** The store holds an expired pair of the name its issuer signed: never served, but the name was held. */
  heldBefore(): void {
    this.#wasHeld = true;
  }

  /** Stops serving an expired certificate; the name stays one that was held (wasHeld). */
  dropIfExpired(): void {
    if (this.#best && !isCurrentlyValid(this.#best.info, this.#deps.clock.now())) {
      this.#deps.log.warn({ serial: this.#best.info.serial }, 'certificate expired');
      this.#best = undefined;
      this.#deps.observer.certificate(this.#deps.domain, undefined);
    }
  }
}

/** What the renewal rule reads of a held certificate, and its serial (issuance-policy.ts mayRestore). */
export function held(cert: StoredCert): HeldValidity & { serial: string } {
  return { notBefore: cert.info.notBefore, notAfter: cert.info.notAfter, obtainedAt: cert.obtainedAt, serial: cert.info.serial };
}
