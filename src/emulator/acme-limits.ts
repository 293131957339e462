// Let's Encrypt's issuance limits, for the emulated CA: new certificates per registered domain (renewals
// exempt) and new orders per account. A refusal surfaces as tailscaled 1.102+ passes an ACME rate limit
// through its LocalAPI: HTTP 429, Let's Encrypt's problem text, Retry-After in seconds (the same shape as
// the rate_limit_429 fault). Counted over a sliding window, which is at least as strict as Let's Encrypt's
// gradual refill: a client that passes here passes there.
import { formatGoDuration } from '../core/values/duration.ts';
import type { BudgetLimit } from '../core/issuance/issuance-budget.ts';
import type { RegisteredDomainRule } from '../core/issuance/registered-domain.ts';
import { iso } from '../core/ports/clock.ts';

export interface AcmeLimits {
  /** New certificates (first issuances of a name) per registered domain. Let's Encrypt: 50/168h. */
  newCertsPerRegisteredDomain?: BudgetLimit | undefined;
  /** New orders per account, renewals included. Let's Encrypt: 300/3h. */
  ordersPerAccount?: BudgetLimit | undefined;
}

/** An order the CA refused: what tailscaled answers with (status 429, this text, Retry-After). */
export class AcmeRateLimited extends Error {
  readonly retryAfterSeconds: number;
  constructor(text: string, retryAfterSeconds: number) {
    super(text);
    this.name = 'AcmeRateLimited';
    this.retryAfterSeconds = retryAfterSeconds;
  }
}

/** "2026-11-23 15:00:00 UTC", as Let's Encrypt writes the instant to retry after. */
export function acmeRetryTime(ms: number): string {
  return iso(ms)
    .replace('T', ' ')
    .replace(/\.\d+Z$/, ' UTC');
}

export class AcmeLimiter {
  readonly #limits: AcmeLimits;
  readonly #registeredDomain: RegisteredDomainRule;
  readonly #orders: number[] = [];
  /** First issuances per registered domain (times), and every name ever issued (their orders are renewals). */
  readonly #newCerts = new Map<string, number[]>();
  readonly #issuedNames = new Set<string>();
  readonly refusals = { newCerts: 0, orders: 0 };

  /** `registeredDomain`: loadRegisteredDomainRule()'s rule (needed only with newCertsPerRegisteredDomain). */
  constructor(limits: AcmeLimits, registeredDomain: RegisteredDomainRule = (d) => d) {
    this.#limits = limits;
    this.#registeredDomain = registeredDomain;
  }

  /** Throws AcmeRateLimited when an order for `domain` now would be refused; records it otherwise. */
  order(domain: string, now: number): void {
    const { ordersPerAccount, newCertsPerRegisteredDomain } = this.#limits;
    if (ordersPerAccount) {
      const wait = waitFor(this.#orders, ordersPerAccount, now);
      if (wait > 0) {
        this.refusals.orders++;
        throw refusal(
          `too many new orders (${ordersPerAccount.count}) from this account in the last ${formatGoDuration(ordersPerAccount.windowMs)}`,
          now,
          wait,
          'new-orders-per-account',
        );
      }
    }
    const rd = this.#registeredDomain(domain);
    const firsts = this.#newCerts.get(rd) ?? [];
    const renewal = this.#issuedNames.has(domain);
    if (newCertsPerRegisteredDomain && !renewal) {
      const wait = waitFor(firsts, newCertsPerRegisteredDomain, now);
      if (wait > 0) {
        this.refusals.newCerts++;
        throw refusal(
          `too many certificates (${newCertsPerRegisteredDomain.count}) already issued for ${JSON.stringify(rd)} ` +
            `in the last ${formatGoDuration(newCertsPerRegisteredDomain.windowMs)}`,
          now,
          wait,
          'new-certificates-per-registered-domain',
        );
      }
    }
    this.#orders.push(now);
    if (!renewal) {
      firsts.push(now);
      this.#newCerts.set(rd, firsts);
    }
  }

  /** The order for `domain` produced a certificate: its later orders are renewals. */
  issued(domain: string): void {
    this.#issuedNames.add(domain);
  }
}

/** How long until one more fits in the window (0: it fits now); drops times that left the window. */
function waitFor(times: number[], limit: BudgetLimit, now: number): number {
  while (times.length > 0 && times[0]! <= now - limit.windowMs) times.shift();
  return times.length < limit.count ? 0 : times[times.length - limit.count]! + limit.windowMs - now;
}

function refusal(what: string, now: number, waitMs: number, anchor: string): AcmeRateLimited {
  const seconds = Math.max(1, Math.ceil(waitMs / 1000));
  return new AcmeRateLimited(
    `429 urn:ietf:params:acme:error:rateLimited: ${what}, retry after ${acmeRetryTime(now + seconds * 1000)}: ` +
      `see https://letsencrypt.org/docs/rate-limits/#${anchor}`,
    seconds,
  );
}
