import type { CertInfo } from '../certificates/certificate.ts';

// cert-manager's and Let's Encrypt's rule: renew when a third of the lifetime remains; short-lived
// certificates (under 10 days) at half, so a 6-day certificate is not renewed with 2 days left.
const SHORT_LIFETIME_MS = 10 * 86_400_000;

export interface RenewalPolicy {
  /** Renew when less than this fraction of the lifetime remains (default 1/3). */
  renewFraction: number;
  /** Upper bound between two checks of a certificate that is not yet due (default 24h). */
  checkIntervalMs: number;
}

/**
 * What the renewal rule reads of a certificate: its validity period and, when known, the instant this
 * process (or the writer that stored it) obtained it from tailscaled.
 */
export type HeldValidity = Pick<CertInfo, 'notBefore' | 'notAfter'> & { obtainedAt?: number | undefined };

/**
 * Where the usable life of a certificate starts. CAs backdate notBefore (Let's Encrypt by an hour, test
 * CAs by more than a short certificate lives) and issuers' clocks drift: the time before we obtained it
 * was never ours to use, so the rule measures from max(notBefore, obtainedAt). Without obtainedAt (a
 * certificate read back from a store that does not keep it) the rule falls back to notBefore, which
 * renews earlier, never later.
 */
function usableStart(held: HeldValidity): number {
  if (held.obtainedAt === undefined) return held.notBefore;
  return Math.min(Math.max(held.notBefore, held.obtainedAt), held.notAfter);
}

/** The validity the rule works with: from usableStart to notAfter. */
export function usableLifetime(held: HeldValidity): number {
  return held.notAfter - usableStart(held);
}

/** The share of a lifetime of `lifetimeMs` that should remain at the renewal point. */
function remainingShareFor(lifetimeMs: number, policy: Pick<RenewalPolicy, 'renewFraction'>): number {
  return lifetimeMs < SHORT_LIFETIME_MS ? Math.max(policy.renewFraction, 0.5) : policy.renewFraction;
}

/**
 * The share of the usable lifetime that remains at the renewal point. Whether the certificate counts as
 * short-lived is read from its X.509 lifetime (notBefore..notAfter), so measuring from obtainedAt never
 * moves the renewal point earlier than measuring from notBefore would.
 */
function remainingFractionAtRenewal(held: HeldValidity, policy: Pick<RenewalPolicy, 'renewFraction'>): number {
  return remainingShareFor(held.notAfter - held.notBefore, policy);
}

/** The instant from which this certificate should be replaced. */
export function renewalTime(held: HeldValidity, policy: Pick<RenewalPolicy, 'renewFraction'>): number {
  return held.notAfter - Math.round(usableLifetime(held) * remainingFractionAtRenewal(held, policy));
}

/**
 * When a replica should leave rotation (its readiness condition False) ahead of a certificate's expiry. A
 * Pod leaves a Service's endpoints some time after its condition turns False (the patch, the endpoints
 * controller, kube-proxy, a load balancer's health checks), so waiting for notAfter serves an expired
 * certificate for that long. The lead is `maxLeadMs`, but at most 5% of the lifetime and half the time
 * from the renewal point to expiry, so a renewal that works never takes the Pod out of rotation.
 */
export function rotationExitTime(held: HeldValidity, policy: Pick<RenewalPolicy, 'renewFraction'>, maxLeadMs: number): number {
  const fromRenewal = Math.max(0, held.notAfter - renewalTime(held, policy));
  const lead = Math.min(maxLeadMs, Math.floor((held.notAfter - held.notBefore) / 20), Math.floor(fromRenewal / 2));
  return held.notAfter - Math.max(0, lead);
}

export function isRenewalDue(held: HeldValidity | undefined, now: number, policy: Pick<RenewalPolicy, 'renewFraction'>): boolean {
  return held === undefined || now >= renewalTime(held, policy) || now >= held.notAfter;
}

/** When to look again at a certificate that is not due: its renewal point or the check interval, whichever is sooner. */
export function nextCheckTime(held: HeldValidity, now: number, policy: RenewalPolicy): number {
  return Math.min(now + policy.checkIntervalMs, renewalTime(held, policy));
}

/**
 * The `min_validity` to send with CertPair. tailscaled keeps its cached pair while at least
 * `min_validity` of it remains and orders a new one otherwise, so the value must be
 * - 0 without a certificate: tailscaled hands back what it has cached (no new issuance);
 * - more than what the certificate being replaced still has (else tailscaled returns it again), and
 *   at least the renewal share of its usable lifetime, so a cached pair that is as old as ours is
 *   renewed too;
 * - never more than the renewal share of what a fresh certificate from this issuer has
 *   (`freshValidityMs`: the shortest validity seen on a certificate a renewal just returned; the
 *   held certificate's usable lifetime when nothing else is known). Asking for more makes tailscaled
 *   order anew on every call, which is the issuance storm.
 * Whole seconds, as tailscaled reads them: rounded up, but never above the fresh validity itself.
 */
export function minValidityFor(current: HeldValidity | undefined, now: number, policy: Pick<RenewalPolicy, 'renewFraction'>, freshValidityMs?: number): number {
  if (!current) return 0;
  const lifetime = usableLifetime(current);
  const fresh = Math.min(lifetime, freshValidityMs ?? Infinity);
  const fraction = remainingFractionAtRenewal(current, policy);
  const share = (validity: number): number => Math.ceil(validity * fraction);
  const margin = (validity: number): number => Math.min(1000, Math.ceil(validity / 10));
  const wanted = Math.max(share(lifetime), current.notAfter - now) + margin(lifetime);
  const cap = Math.min(Math.ceil((share(fresh) + margin(fresh)) / 1000), Math.floor(fresh / 1000));
  return Math.max(1000, Math.min(Math.ceil(wanted / 1000), cap) * 1000);
}

/**
 * Whether a certificate just obtained from tailscaled is too short to use as the answer of a renewal:
 * it has less validity than the `min_validity` that was asked for, or its own renewal point would come
 * sooner than the minimum interval between two issuances. Returns why (for the log), or undefined.
 */
export function tooShortReason(
  received: HeldValidity,
  now: number,
  policy: Pick<RenewalPolicy, 'renewFraction'>,
  asked: { minValidityMs: number; minIssueIntervalMs: number },
): string | undefined {
  const validity = received.notAfter - Math.max(received.notBefore, now);
  if (asked.minValidityMs > 0 && validity < asked.minValidityMs) {
    return `valid for ${validity} ms from now, less than the ${asked.minValidityMs} ms asked for (min_validity)`;
  }
  const window = renewalTime({ ...received, obtainedAt: now }, policy) - Math.max(received.notBefore, now);
  if (window < asked.minIssueIntervalMs) {
    return `due for renewal ${window} ms after it was obtained, sooner than the ${asked.minIssueIntervalMs} ms minimum between two issuances`;
  }
  return undefined;
}
