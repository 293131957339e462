// Issuance and the per-domain cache, with tailscaled's policy (feature/acme getCertPEMWithValidity):
// - a cached pair that is valid now is returned as is, unless
//   - min_validity > 0 and less than that remains: renew synchronously (the caller waits), or
//   - min_validity = 0 and 2/3 of the lifetime has passed: return the cached pair and renew in the
//     background (the next call gets the new one); with `asyncRenewal: false`, renew synchronously;
// - no cached pair, or it is expired: issue synchronously.
// One issuance at a time per domain: callers that need a new pair wait for the one in flight and then
// decide again, so concurrent requests share it.
import type { EventEmitter } from 'node:events';
import type { Logger } from '../core/ports/logger.ts';
import { errorMessage } from '../core/errors.ts';
import { createCertificateAuthority, loadCertificateAuthority, type CertificateAuthority, type SignedLeaf } from '../pki/ca.ts';
import type { RegisteredDomainRule } from '../core/issuance/registered-domain.ts';
import { AcmeLimiter, type AcmeLimits } from './acme-limits.ts';
import { appendLedger } from './ledger.ts';
import { iso } from '../core/ports/clock.ts';

/** Lifetimes below this get notBefore = now instead of now - 1 minute (the usual clock-skew backdating). */
const TINY_LIFETIME_MS = 3_600_000;
const BACKDATE_MS = 60_000;

export interface IssuerOptions {
  id: string;
  certLifetimeMs: number;
  /**
   * notBefore this long before the issuer's clock, and notAfter = issuer's clock + certLifetimeMs (valid for
   * the lifetime from issuance, like a CA that backdates). Undefined: the usual minute of backdating inside
   * the lifetime for lifetimes of an hour or more.
   */
  certBackdateMs?: number | undefined;
  /** The CA's clock minus tailscaled's (both signs): notBefore/notAfter are stamped on the CA's clock. */
  clockSkewMs?: number | undefined;
  /** The CA's own clock, tailscaled's (`clock`) unless given: notBefore/notAfter are stamped on it, plus clockSkewMs. */
  caClock?: { now(): number } | undefined;
  /** The CA as PEM (EmulatorOptions.ca); undefined: one made on first use. */
  ca?: { certPem: string; keyPem: string } | undefined;
  /** A CA that hands out less than asked: with min_validity set, notAfter at most min_validity minus this from now. */
  certShortByMs?: number | undefined;
  clock: { now(): number };
  ledgerPath: string | undefined;
  /** Ledger lines carry `kind` and `trigger` (the format with request lines); false: the original six fields. */
  ledgerKinds?: boolean;
  asyncRenewal: boolean;
  /** Let's Encrypt's limits, enforced on every new order (see acme-limits.ts). Default: none. */
  limits?: AcmeLimits | undefined;
  /** How the limits find a name's registered domain (loadRegisteredDomainRule). */
  registeredDomain?: RegisteredDomainRule | undefined;
  logger: Logger;
  events: EventEmitter;
  /** Told of every certificate signed and cached (the ARI desk indexes them by ARI ID). */
  onLeaf?: ((domain: string, leaf: SignedLeaf) => Promise<void>) | undefined;
}

/** Emitted as `issued` on the emulator's events, and written to the ledger. @forTests */
export interface IssuedEvent {
  domain: string;
  serial: string;
  notBefore: string;
  notAfter: string;
  /** 'request' (a caller waited for it) or 'background' (async renewal after 2/3 of the lifetime). */
  trigger: 'request' | 'background';
}

export class Issuer {
  readonly #opts: IssuerOptions;
  #ca: Promise<CertificateAuthority> | undefined;
  readonly #cache = new Map<string, SignedLeaf>();
  readonly #inflight = new Map<string, Promise<SignedLeaf>>();
  readonly issuances = new Map<string, number>();
  readonly limiter: AcmeLimiter;

  constructor(options: IssuerOptions) {
    this.#opts = options;
    this.limiter = new AcmeLimiter(options.limits ?? {}, options.registeredDomain);
  }

  ca(): Promise<CertificateAuthority> {
    const given = this.#opts.ca;
    this.#ca ??= given
      ? loadCertificateAuthority(given)
      : createCertificateAuthority({ name: `certshare emulator CA ${this.#opts.id}`, now: this.#opts.clock.now() });
    return this.#ca;
  }

  /** The pair tailscaled would return for `domain` (the domain is already known to be visible). */
  async getPair(domain: string, minValidityMs: number): Promise<SignedLeaf> {
    for (;;) {
      const now = this.#opts.clock.now();
      const cached = this.#cache.get(domain);
      if (cached && now >= cached.notBefore && now < cached.notAfter) {
        if (minValidityMs > 0) {
          if (cached.notAfter - now >= minValidityMs) return cached;
        } else {
          const renewAt = cached.notBefore + ((cached.notAfter - cached.notBefore) * 2) / 3;
          if (now <= renewAt) return cached;
          if (this.#opts.asyncRenewal) {
            if (!this.#inflight.has(domain)) {
              this.#opts.logger.info({ domain }, 'starting async renewal');
              this.#start(domain, 'background', 0).catch((err: unknown) => {
                this.#opts.logger.error({ domain, err: errorMessage(err) }, 'async renewal failed');
              });
            }
            return cached;
          }
        }
      }
      const running = this.#inflight.get(domain);
      if (running) {
        await running.catch(() => {});
        continue;
      }
      return this.#start(domain, 'request', minValidityMs);
    }
  }

  /** Resolves once no issuance is in flight (background renewals included). */
  async idle(): Promise<void> {
    while (this.#inflight.size > 0) {
      await Promise.allSettled([...this.#inflight.values()]);
    }
  }

  /**
   * notBefore/notAfter of a certificate issued now, on the CA's (possibly skewed) clock: by default backdated
   * a minute within the lifetime unless the lifetime is tiny; with certBackdateMs, backdated that much and
   * valid for the lifetime from now; with certShortByMs, shorter than the min_validity asked for.
   */
  freshWindow(minValidityMs = 0): { notBefore: number; notAfter: number } {
    const { certBackdateMs, clockSkewMs, certShortByMs } = this.#opts;
    const now = floorSecond((this.#opts.caClock ?? this.#opts.clock).now() + (clockSkewMs ?? 0));
    const lifetime = Math.max(1000, floorSecond(this.#opts.certLifetimeMs));
    let notBefore: number;
    let notAfter: number;
    if (certBackdateMs === undefined) {
      notBefore = lifetime < TINY_LIFETIME_MS ? now : now - BACKDATE_MS;
      notAfter = notBefore + lifetime;
    } else {
      notBefore = now - floorSecond(certBackdateMs);
      notAfter = now + lifetime;
    }
    if (certShortByMs !== undefined && minValidityMs > 0) notAfter = Math.min(notAfter, now + Math.max(1000, floorSecond(minValidityMs - certShortByMs)));
    return { notBefore, notAfter };
  }

  /** A pair that is neither cached nor counted: the payload of the mismatched, wrong_domain and expired faults. */
  async signDetached(dnsName: string, notBefore: number, notAfter: number): Promise<SignedLeaf> {
    const ca = await this.ca();
    return ca.sign({ dnsName, notBefore: floorSecond(notBefore), notAfter: floorSecond(notAfter) });
  }

  #start(domain: string, trigger: IssuedEvent['trigger'], minValidityMs: number): Promise<SignedLeaf> {
    // A new ACME order: refused (thrown at once, nothing cached) when the CA's limits say so.
    try {
      this.limiter.order(domain, this.#opts.clock.now());
    } catch (err) {
      return Promise.reject(err);
    }
    const promise = this.#issue(domain, trigger, minValidityMs).finally(() => {
      if (this.#inflight.get(domain) === promise) this.#inflight.delete(domain);
    });
    this.#inflight.set(domain, promise);
    return promise;
  }

  async #issue(domain: string, trigger: IssuedEvent['trigger'], minValidityMs: number): Promise<SignedLeaf> {
    const ca = await this.ca();
    const leaf = await ca.sign({ dnsName: domain, ...this.freshWindow(minValidityMs) });
    this.issuances.set(domain, (this.issuances.get(domain) ?? 0) + 1);
    this.limiter.issued(domain);
    const event: IssuedEvent = {
      domain,
      serial: leaf.serial,
      notBefore: iso(leaf.notBefore),
      notAfter: iso(leaf.notAfter),
      trigger,
    };
    if (this.#opts.ledgerPath) {
      const time = iso(this.#opts.clock.now());
      const { trigger, ...fields } = event;
      await appendLedger(
        this.#opts.ledgerPath,
        this.#opts.ledgerKinds ? { kind: 'issuance', time, emulator: this.#opts.id, ...fields, trigger } : { time, emulator: this.#opts.id, ...fields },
        this.#opts.logger,
      );
    }
    await this.#opts.onLeaf?.(domain, leaf);
    this.#cache.set(domain, leaf);
    this.#opts.logger.info({ ...event }, 'issued certificate');
    this.#opts.events.emit('issued', event);
    return leaf;
  }
}

function floorSecond(ms: number): number {
  return Math.floor(ms / 1000) * 1000;
}
