import { X509Certificate, createHash, createPrivateKey, type KeyObject } from 'node:crypto';
import { CertshareError } from '../errors.ts';
import type { CertPair } from '../ports/localapi.ts';
import { iso } from '../ports/clock.ts';

/** What certshare knows about a validated certificate pair; never holds key material. */
export interface CertInfo {
  domain: string;
  notBefore: number;
  notAfter: number;
  serial: string;
  fingerprint256: string;
}

const CERT_BLOCK = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g;

/**
 * The longest certificate chain accepted, in PEM characters: the bound of a CertPair answer from tailscaled
 * (LOCALAPI_ANSWER_BOUNDS), and under what TLS clients take in one handshake once decoded (OpenSSL's
 * default: docs/security.md). A store's writer could otherwise pad a real, trusted chain with its self-signed
 * root, every link checking out, and have every proxy serve what clients refuse. @forTests
 */
export const MAX_CHAIN_PEM_CHARS = 64 * 1024;

/** The PEM certificate blocks of `text`, in order (none: an empty list). */
export function pemCertificates(text: string): string[] {
  return text.match(CERT_BLOCK) ?? [];
}

function invalid(domain: string, reason: string, cause?: unknown): CertshareError {
  return new CertshareError('CERTSHARE_CERT_INVALID', { certificate: `certificate for ${domain}`, reason }, { cause });
}

/**
 * Checks a pair before it is used or shared: it parses, the key matches the leaf, the leaf covers the
 * domain, `now` is inside its validity window and each certificate is issued by the next one.
 * Error messages never quote PEM content, so they are safe to log.
 */
export function validateCertPair(pair: CertPair, domain: string, now: number): CertInfo {
  return checkValidAt(inspectCertPair(pair, domain), now);
}

/**
 * The last pairs that passed inspection, per domain, by a digest of its PEM text (not a copy of it): a
 * store hands the same pair back on every read (each watch event, each loop turn, of every domain), and
 * parsing it (the X.509 chain, the key, their match) is the costly part. Any other pair is inspected in full.
 */
const lastInspected = new Map<string, { digest: string; info: Readonly<CertInfo> }[]>();
/** Pairs kept per domain: the served one and one stored for later (StoreRead.pending), read together. */
const INSPECTED_PER_DOMAIN = 2;

function pairDigest(pair: CertPair): string {
  return createHash('sha256').update(pair.certPem).update('\0').update(pair.keyPem).digest('base64');
}

/** validateCertPair without the time check: for a pair whose validity starts later (an issuer whose clock is ahead). */
export function inspectCertPair(pair: CertPair, domain: string): CertInfo {
  const digest = pairDigest(pair);
  const kept = lastInspected.get(domain) ?? [];
  const hit = kept.find((k) => k.digest === digest);
  if (hit) return hit.info;
  const info = Object.freeze(inspectUncached(pair, domain));
  lastInspected.set(domain, [{ digest, info }, ...kept].slice(0, INSPECTED_PER_DOMAIN));
  return info;
}

/**
 * The pair's details if it is whole and for `domain`, and only its validity has ended: what says the name was
 * held before (StoreRead's `expired`), never a pair to serve.
 */
export function expiredInfo(pair: CertPair, domain: string, now: number): CertInfo | undefined {
  try {
    const info = inspectCertPair(pair, domain);
    return now >= info.notAfter ? info : undefined;
  } catch {
    return undefined;
  }
}

function inspectUncached(pair: CertPair, domain: string): CertInfo {
  if (pair.certPem.length > MAX_CHAIN_PEM_CHARS) {
    throw invalid(domain, `certificate chain is ${pair.certPem.length} characters of PEM, more than ${MAX_CHAIN_PEM_CHARS}: longer than a CA issues`);
  }
  if (pair.certPem.includes('PRIVATE KEY')) throw invalid(domain, 'certificate part contains a private key');
  const blocks = pemCertificates(pair.certPem);
  if (blocks.length === 0) throw invalid(domain, 'no PEM certificate found');
  let chain: X509Certificate[];
  try {
    chain = blocks.map((block) => new X509Certificate(block));
  } catch (err) {
    throw invalid(domain, 'certificate does not parse', err);
  }
  let key: KeyObject;
  try {
    key = createPrivateKey(pair.keyPem);
  } catch {
    // The parser's message may echo input: keep it out of the error.
    throw invalid(domain, 'private key does not parse');
  }
  const leaf = chain[0]!;
  if (!leaf.checkPrivateKey(key)) throw invalid(domain, 'private key does not match the certificate');
  if (leaf.checkHost(domain, { wildcards: true, subject: 'never' }) === undefined) {
    throw invalid(domain, `certificate does not cover ${domain} (SAN: ${leaf.subjectAltName ?? 'none'})`);
  }
  for (let i = 0; i + 1 < chain.length; i++) {
    if (!chain[i]!.checkIssued(chain[i + 1]!)) throw invalid(domain, `chain out of order at position ${i + 1}`);
  }
  return {
    domain,
    notBefore: leaf.validFromDate.getTime(),
    notAfter: leaf.validToDate.getTime(),
    serial: leaf.serialNumber,
    fingerprint256: leaf.fingerprint256,
  };
}

/** Throws CERTSHARE_CERT_INVALID unless `now` lies inside the certificate's validity window. */
export function checkValidAt(info: CertInfo, now: number): CertInfo {
  if (now < info.notBefore) throw invalid(info.domain, `not valid before ${iso(info.notBefore)}`);
  if (now >= info.notAfter) throw invalid(info.domain, `expired at ${iso(info.notAfter)}`);
  return info;
}

/** True while `now` lies inside the certificate's validity window. */
export function isCurrentlyValid(info: CertInfo, now: number): boolean {
  return now >= info.notBefore && now < info.notAfter;
}
