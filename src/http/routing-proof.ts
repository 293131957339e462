// Proof of routing received, not only sent. A routing check's call goes to the Service and lands on one of
// its endpoints; the answer tells the caller whether it landed on its own Pod. But the call proves just as
// much to the Pod it landed on: a call to the Service reached it, so the Service routes to it. When all
// the replicas start at once (a rollout, a node drain) every Pod is checking, most calls land on another
// Pod, and each of them now proves the route to the Pod that received it: N times the evidence for the
// same calls (issue 24: 10 Pods starting together waited up to 5 s for a call of their own to come back).
//
// Only a replica of the group may give that proof: the call carries an HMAC over the routing check's URL
// and the time, keyed by a key derived from the group's certificate private key, which the replicas hold
// and nobody else does. Anyone else who can reach the Pod's health port (any Pod of the cluster) can send
// the header but not a valid one; a proof older or newer than FRESH_MS is refused, so a call seen on the
// wire cannot be replayed later. Node's crypto only: no Kubernetes, no HTTP server.
import { createHmac, createPrivateKey, timingSafeEqual } from 'node:crypto';
import type { Clock } from '../core/ports/clock.ts';
import type { LoopObserver } from '../core/ports/observer.ts';
import type { StoredCert } from '../core/ports/store.ts';
import type { RoutingProofSource } from '../core/ports/routing-proof-source.ts';

/** How far a proof's time may be from the receiver's clock: the replicas' clocks differ a little. */
const FRESH_MS = 30_000;

export class RoutingProofs implements LoopObserver, RoutingProofSource {
  /** The HMAC key derived from each held certificate's private key, by domain. */
  readonly #keys = new Map<string, Buffer>();
  readonly #listeners = new Map<string, Set<() => void>>();
  readonly #clock: Clock;

  constructor(clock: Clock) {
    this.#clock = clock;
  }

  certificate(domain: string, cert: StoredCert | undefined): void {
    const key = cert && proofKey(cert.pair.keyPem);
    if (key) this.#keys.set(domain, key);
    else this.#keys.delete(domain);
  }

  sign(url: string): string | undefined {
    // The first domain in order: every replica of a group manages the same domains, so the receiver holds it.
    const domain = [...this.#keys.keys()].sort()[0];
    if (domain === undefined) return undefined;
    const at = Math.round(this.#clock.now());
    return `${domain} ${at} ${mac(this.#keys.get(domain)!, url, at).toString('base64url')}`;
  }

  onProof(url: string, listener: () => void): () => void {
    const listeners = this.#listeners.get(url) ?? new Set<() => void>();
    this.#listeners.set(url, listeners);
    listeners.add(listener);
    return () => {
      listeners.delete(listener);
      if (listeners.size === 0) this.#listeners.delete(url);
    };
  }

  /** A call carrying `header` reached this Pod's health endpoint. Says whether it proved a route being checked. */
  received(header: string | string[] | undefined): boolean {
    // Nothing is checked almost all the time: then nothing is parsed.
    if (this.#listeners.size === 0 || typeof header !== 'string') return false;
    const [domain, atText, macText, extra] = header.split(' ');
    const key = domain === undefined ? undefined : this.#keys.get(domain);
    const at = Number(atText);
    if (!key || extra !== undefined || !/^\d{1,16}$/.test(atText ?? '') || Math.abs(this.#clock.now() - at) > FRESH_MS) return false;
    const given = Buffer.from(macText ?? '', 'base64url');
    let proved = false;
    for (const [url, listeners] of [...this.#listeners]) {
      const expected = mac(key, url, at);
      if (given.length !== expected.length || !timingSafeEqual(given, expected)) continue;
      proved = true;
      for (const onProof of [...listeners]) onProof();
    }
    return proved;
  }
}

/** A key for proofs only (never the private key itself): HMAC-SHA256 of the key's PKCS#8 DER, which every replica reads alike. */
function proofKey(keyPem: string): Buffer | undefined {
  try {
    const der = createPrivateKey(keyPem).export({ format: 'der', type: 'pkcs8' });
    return createHmac('sha256', 'certshare routing proof v1').update(der).digest();
  } catch {
    return undefined; // a key that does not parse proves nothing; the store reports it
  }
}

function mac(key: Buffer, url: string, at: number): Buffer {
  return createHmac('sha256', key).update(`${url}\n${at}`).digest();
}
