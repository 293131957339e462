// A TLS listener's certificate, changed in-process. kube-apiserver's loopback certificate lives a year and
// only a restart renews it; Kubernetes' serving-cert reload fixed that by validating the new pair and
// swapping it per handshake. Node's equivalent is tls.Server#setSecureContext: new handshakes get the new
// context, established connections keep the one they negotiated with, nothing restarts. The injector's
// webhook, its --metrics-tls listener and the daemon's --tls listener all serve through this.
import { X509Certificate } from 'node:crypto';
import { createSecureContext, type SecureContextOptions, type Server } from 'node:tls';
import type { Clock } from '../core/ports/clock.ts';
import { CertshareError, errorMessage } from '../core/errors.ts';
import type { Logger } from '../core/ports/logger.ts';

export interface ServingPair {
  /** The leaf, then its CA (the chain a client needs). */
  certPem: string;
  keyPem: string;
}

const MIN_VERSION = 'TLSv1.2';

/** The options of a secure context for the pair, once it parses and the key matches; CERTSHARE_CERT_INVALID otherwise. */
export function checkedPair(pair: ServingPair): { options: SecureContextOptions; serial: string; notAfter: number } {
  let cert: X509Certificate;
  try {
    cert = new X509Certificate(pair.certPem);
    // createSecureContext checks that the key belongs to the certificate ("key values mismatch").
    createSecureContext({ cert: pair.certPem, key: pair.keyPem });
  } catch (err) {
    // The TLS library's message never quotes key material; it says which check failed.
    throw new CertshareError('CERTSHARE_CERT_INVALID', { certificate: 'serving certificate', reason: errorMessage(err) }, { cause: err });
  }
  return { options: { cert: pair.certPem, key: pair.keyPem, minVersion: MIN_VERSION }, serial: cert.serialNumber, notAfter: cert.validToDate.getTime() };
}

/** Validates the pair, then serves it to every new handshake of `server`; throws and keeps the old one otherwise. Returns its serial. */
export function servePair(server: Server, pair: ServingPair): string {
  const checked = checkedPair(pair);
  server.setSecureContext(checked.options);
  return checked.serial;
}

/** A followed pair: start() reads the first (a start-up check: it throws when unusable), then onPair gets each change. */
export interface PairSource {
  start(): Promise<ServingPair>;
  stop(): Promise<void>;
}

/** --tls: tls.crt and tls.key from a directory, or a kubernetes.io/tls Secret of the Pod's namespace. */
export type TlsChoice = { kind: 'dir'; path: string } | { kind: 'secret'; name: string };

export interface PairSourceOptions {
  logger: Logger;
  clock: Clock;
  env: NodeJS.ProcessEnv;
  /** A changed pair, not yet validated (the listener validates it and keeps the old one if it is unusable). */
  onPair(pair: ServingPair): void;
  /** The flag that chose the source, for messages (default `tls`; the injector's `metrics-tls`). */
  flag?: string;
  /** The source of a `secret:NAME` choice (Kubernetes code, which the caller loads only then: kube/tls-secret.ts). */
  secretSource?(name: string, options: PairSourceOptions): Promise<PairSource>;
}

/** The pair a source last handed on: a re-read that finds the same content hands nothing on. */
export class LastPair {
  #text: string | undefined;

  /** True, and remembered, when `pair` differs from the last one. */
  changed(pair: ServingPair): boolean {
    const text = `${pair.certPem}\0${pair.keyPem}`;
    if (text === this.#text) return false;
    this.#text = text;
    return true;
  }
}
