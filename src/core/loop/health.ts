import type { CertInfo } from '../certificates/certificate.ts';
import { isCurrentlyValid } from '../certificates/certificate.ts';
import type { IssuanceDecision, IssuanceReason } from '../issuance/issuance-policy.ts';
import type { LoopObserver, RenewOutcome } from '../ports/observer.ts';
import { describeRenewOutcome } from '../renewal/renew-request.ts';
import type { HeldValidity } from '../renewal/renewal.ts';
import type { StoredCert } from '../ports/store.ts';
import { iso, type Clock } from '../ports/clock.ts';
import type { Logger } from '../ports/logger.ts';

export interface HealthVerdict {
  healthy: boolean;
  /**
   * "ok", or why not, naming each domain that lacks a valid certificate: what its loop last reported and,
   * in brackets, the reason code of its last decision (issuance-policy.ts), e.g. `[budget_exhausted]`.
   */
  reason: string;
  /** Unhealthy only because certificates still valid now are past their `end` (see evaluate). */
  expiring?: boolean;
}

/** Where a certificate's usable validity ends for a question: its notAfter, or earlier (leaving rotation ahead). */
export type ValidityEnd = (held: HeldValidity) => number;

const atNotAfter: ValidityEnd = (held) => held.notAfter;

interface DomainHealth {
  info: CertInfo | undefined;
  obtainedAt: number | undefined;
  problem: string | undefined;
  /** The reason of the loop's last decision, unless that was to use a valid certificate. */
  reason: IssuanceReason | undefined;
  /** What the CA said about the certificate through ACME Renewal Information (renewal-info.ts describeAriAnswer). */
  renewalInfo?: string | undefined;
  /** What the proxy serves for the domain (the served check), one line. */
  served?: string | undefined;
  /** The last renew request answered for the domain (renew-request.ts describeRenewOutcome). */
  renewOutcome?: string | undefined;
}

/**
 * Healthy means every managed domain has a certificate that is valid now. Validity is judged at the
 * moment of the question, so an expired certificate turns the verdict without waiting for a loop turn.
 */
export class HealthState implements LoopObserver {
  readonly #domains = new Map<string, DomainHealth>();
  readonly #listeners = new Set<() => void>();
  /** Reasons that hold the verdict at unhealthy whatever the certificates, by source (e.g. a ServeConfig never read). */
  readonly #pending = new Map<string, string>();
  /** current()'s verdict and the span of time it holds for; undefined once anything it was built from changed. */
  #current: { verdict: HealthVerdict; from: number; until: number } | undefined;

  /** Holds the verdict at unhealthy with `reason` until called again with undefined for the same source. */
  pending(source: string, reason: string | undefined): void {
    if (reason === undefined) this.#pending.delete(source);
    else this.#pending.set(source, reason);
    this.#notify();
  }
  #sourceProblem: string | undefined;

  manage(domains: Iterable<string>): void {
    const wanted = new Set(domains);
    for (const d of [...this.#domains.keys()]) if (!wanted.has(d)) this.#domains.delete(d);
    for (const d of wanted) if (!this.#domains.has(d)) this.#domains.set(d, { info: undefined, obtainedAt: undefined, problem: undefined, reason: undefined });
    this.#notify();
  }

  certificate(domain: string, cert: StoredCert | undefined): void {
    const entry = this.#domains.get(domain);
    if (!entry) return;
    entry.info = cert?.info;
    entry.obtainedAt = cert?.obtainedAt;
    this.#notify();
  }

  problem(domain: string, message: string | undefined): void {
    const entry = this.#domains.get(domain);
    if (!entry || entry.problem === message) return;
    entry.problem = message;
    // Part of the reason only, no change of verdict: listeners are not told, the kept verdict is dropped.
    this.#current = undefined;
  }

  decided(domain: string, decision: IssuanceDecision): void {
    const entry = this.#domains.get(domain);
    const reason = decision.action === 'use' ? undefined : decision.reason;
    if (!entry || entry.reason === reason) return;
    entry.reason = reason;
    // Part of the reason only, as problem(): the kept verdict is dropped.
    this.#current = undefined;
  }

  /**
   * What keeps every domain from being learned or issued (e.g. tailscaled refusing the IPN-bus watch), or
   * undefined: added to the reason of each domain without a valid certificate.
   */
  sourceProblem(message: string | undefined): void {
    if (this.#sourceProblem === message) return;
    this.#sourceProblem = message;
    this.#notify();
  }

  /** The CA's ARI answer for the domain's certificate, one line (undefined: none applies). */
  renewalInfo(domain: string, description: string | undefined): void {
    const entry = this.#domains.get(domain);
    if (entry) entry.renewalInfo = description;
  }

  /** What the served check last saw for the domain, one line (undefined: no check). */
  servedInfo(domain: string, description: string | undefined): void {
    const entry = this.#domains.get(domain);
    if (entry) entry.served = description;
  }

  /** The last renew request answered for the domain: shown by /healthz?verbose until the next one. */
  renewRequest(domain: string, outcome: RenewOutcome): void {
    const entry = this.#domains.get(domain);
    if (entry) entry.renewOutcome = describeRenewOutcome(outcome);
  }

  /**
   * One line per domain with an ARI answer, one per domain the served check looked at, and one per domain
   * with a renew request answered, for /healthz?verbose.
   */
  details(): string[] {
    const lines: string[] = [];
    for (const [domain, { renewalInfo, served, renewOutcome }] of this.#domains) {
      if (renewalInfo) lines.push(`${domain}: ${renewalInfo}`);
      if (served) lines.push(`${domain}: served: ${served}`);
      if (renewOutcome) lines.push(`${domain}: ${renewOutcome}`);
    }
    return lines.sort();
  }

  infoOf(domain: string): CertInfo | undefined {
    return this.#domains.get(domain)?.info;
  }

  /**
   * The earliest instant at which a currently valid certificate reaches its `end` (default: expires), for
   * timers that flip readiness.
   */
  nextExpiry(now: number, end: ValidityEnd = atNotAfter): number | undefined {
    let next: number | undefined;
    for (const entry of this.#domains.values()) {
      const at = entry.info ? end(held(entry.info, entry.obtainedAt)) : undefined;
      if (at !== undefined && at > now && (next === undefined || at < next)) next = at;
    }
    return next;
  }

  /** evaluate(now).healthy without building the reason: called on every certificate change of every domain. */
  isHealthy(now: number): boolean {
    if (this.#pending.size > 0) return false;
    for (const { info } of this.#domains.values()) if (!info || !isCurrentlyValid(info, now)) return false;
    return true;
  }

  /**
   * evaluate(now) with validity to notAfter (/healthz), computed once per change rather than per question:
   * kept until the state changes (every mutator drops it) or a certificate's validity starts or ends, and
   * recomputed when the clock goes back before the instant it was computed at. A kept answer is the same
   * object, so a caller can keep what it derives from it (an HTTP response) by identity.
   */
  current(now: number): HealthVerdict {
    const kept = this.#current;
    if (kept !== undefined && now >= kept.from && now < kept.until) return kept.verdict;
    const verdict = this.evaluate(now);
    this.#current = { verdict, from: now, until: this.#nextValidityEdge(now) };
    return verdict;
  }

  /** The first instant after `now` at which a certificate becomes valid (notBefore) or expires (notAfter); Infinity if none. */
  #nextValidityEdge(now: number): number {
    let next = Number.POSITIVE_INFINITY;
    for (const { info } of this.#domains.values()) {
      if (!info) continue;
      if (info.notBefore > now) next = Math.min(next, info.notBefore);
      if (info.notAfter > now) next = Math.min(next, info.notAfter);
    }
    return next;
  }

  /**
   * Healthy when every domain's certificate is valid at `now`, its validity ending at `end` (default: its
   * notAfter; the readiness gate ends it earlier, to leave rotation before the certificate expires).
   */
  evaluate(now: number, end: ValidityEnd = atNotAfter): HealthVerdict {
    const missing: string[] = [...this.#pending.values()];
    let onlyExpiring = missing.length === 0;
    for (const [domain, { info, obtainedAt, problem, reason }] of this.#domains) {
      const valid = info !== undefined && isCurrentlyValid(info, now);
      const endsAt = info ? end(held(info, obtainedAt)) : undefined;
      if (valid && endsAt !== undefined && now < endsAt) continue;
      if (valid) {
        missing.push(`${domain}: certificate expires at ${iso(info.notAfter)}, leaving rotation ahead of it`);
        continue;
      }
      onlyExpiring = false;
      const why = info ? 'certificate expired' : (problem ?? 'no certificate yet');
      missing.push(`${domain}: ${why}${this.#sourceProblem ? ` (${this.#sourceProblem})` : ''}${reason ? ` [${reason}]` : ''}`);
    }
    if (missing.length === 0) return { healthy: true, reason: 'ok' };
    return { healthy: false, reason: missing.sort().join('; '), ...(onlyExpiring ? { expiring: true } : {}) };
  }

  /** Called whenever a certificate or the set of domains changed. */
  onChange(listener: () => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  #notify(): void {
    this.#current = undefined;
    for (const l of this.#listeners) l();
  }
}

/** Logs the verdict each time it turns (healthy, not healthy), with the reason. */
export function logHealthChanges(health: HealthState, clock: Clock, logger: Logger): void {
  let lastHealthy: boolean | undefined;
  health.onChange(() => {
    // The reason (a string naming every domain without a certificate) only for a change worth a log line:
    // building it on each of N certificates at start-up would cost O(N^2).
    const now = clock.now();
    if (health.isHealthy(now) === lastHealthy) return;
    const verdict = health.evaluate(now);
    logger.info({ healthy: verdict.healthy, reason: verdict.reason }, verdict.healthy ? 'healthy' : 'not healthy');
    lastHealthy = verdict.healthy;
  });
}

function held(info: CertInfo, obtainedAt: number | undefined): HeldValidity {
  return { notBefore: info.notBefore, notAfter: info.notAfter, obtainedAt };
}
