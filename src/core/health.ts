import type { CertInfo } from './certificate.ts';
import { isCurrentlyValid } from './certificate.ts';
import type { LoopObserver } from './observer.ts';
import type { StoredCert } from './store.ts';

export interface HealthVerdict {
  healthy: boolean;
  /** "ok", or why not, naming each domain that lacks a valid certificate. */
  reason: string;
}

interface DomainHealth {
  info: CertInfo | undefined;
  problem: string | undefined;
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
    for (const d of wanted) if (!this.#domains.has(d)) this.#domains.set(d, { info: undefined, problem: undefined });
    this.#notify();
  }

  certificate(domain: string, cert: StoredCert | undefined): void {
    const entry = this.#domains.get(domain);
    if (!entry) return;
    entry.info = cert?.info;
    this.#notify();
  }

  problem(domain: string, message: string | undefined): void {
    const entry = this.#domains.get(domain);
    if (entry) entry.problem = message;
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

  infoOf(domain: string): CertInfo | undefined {
    return this.#domains.get(domain)?.info;
  }

  /** The earliest instant at which a currently valid certificate expires (for timers that flip readiness). */
  nextExpiry(now: number): number | undefined {
    let next: number | undefined;
    for (const { info } of this.#domains.values()) {
      if (info && info.notAfter > now && (next === undefined || info.notAfter < next)) next = info.notAfter;
    }
    return next;
  }

  /** evaluate(now).healthy without building the reason: called on every certificate change of every domain. */
  isHealthy(now: number): boolean {
    if (this.#pending.size > 0) return false;
    for (const { info } of this.#domains.values()) if (!info || !isCurrentlyValid(info, now)) return false;
    return true;
  }

  evaluate(now: number): HealthVerdict {
    const missing: string[] = [...this.#pending.values()];
    for (const [domain, { info, problem }] of this.#domains) {
      if (info && isCurrentlyValid(info, now)) continue;
      const why = info ? 'certificate expired' : (problem ?? 'no certificate yet');
      missing.push(`${domain}: ${why}${this.#sourceProblem ? ` (${this.#sourceProblem})` : ''}`);
    }
    return missing.length === 0 ? { healthy: true, reason: 'ok' } : { healthy: false, reason: missing.sort().join('; ') };
  }

  /** Called whenever a certificate or the set of domains changed. */
  onChange(listener: () => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  #notify(): void {
    for (const l of this.#listeners) l();
  }
}
