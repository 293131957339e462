import type { CertInfo } from './certificate.ts';

// cert-manager's and Let's Encrypt's rule: renew when a third of the lifetime remains; short-lived
// certificates (under 10 days) at half, so a 6-day certificate is not renewed with 2 days left.
const SHORT_LIFETIME_MS = 10 * 86_400_000;

export interface RenewalPolicy {
  /** Renew when less than this fraction of the lifetime remains (default 1/3). */
  renewFraction: number;
  /** Upper bound between two checks of a certificate that is not yet due (default 24h). */
  checkIntervalMs: number;
}

/** What the renewal rule reads of a certificate: its validity period. */
type Validity = Pick<CertInfo, 'notBefore' | 'notAfter'>;

export function remainingFractionAtRenewal(info: Validity, policy: Pick<RenewalPolicy, 'renewFraction'>): number {
  const lifetime = info.notAfter - info.notBefore;
  return lifetime < SHORT_LIFETIME_MS ? Math.max(policy.renewFraction, 0.5) : policy.renewFraction;
}

/** The instant from which this certificate should be replaced. */
export function renewalTime(info: Validity, policy: Pick<RenewalPolicy, 'renewFraction'>): number {
  const lifetime = info.notAfter - info.notBefore;
  return info.notAfter - Math.round(lifetime * remainingFractionAtRenewal(info, policy));
}

export function isRenewalDue(info: CertInfo | undefined, now: number, policy: RenewalPolicy): boolean {
  return info === undefined || now >= renewalTime(info, policy) || now >= info.notAfter;
}

/** When to look again at a certificate that is not due: its renewal point or the check interval, whichever is sooner. */
export function nextCheckTime(info: CertInfo, now: number, policy: RenewalPolicy): number {
  return Math.min(now + policy.checkIntervalMs, renewalTime(info, policy));
}

/**
 * The `min_validity` to send with CertPair: with no certificate, 0 lets tailscaled hand back its cached
 * one (no new issuance); when renewing, asking for the renewal share of the lifetime makes tailscaled
 * renew a cached certificate that is as old as ours instead of returning it again.
 */
export function minValidityFor(current: CertInfo | undefined, policy: RenewalPolicy): number {
  if (!current) return 0;
  const lifetime = current.notAfter - current.notBefore;
  return Math.ceil(lifetime * remainingFractionAtRenewal(current, policy)) + 1000;
}
