// Issuer pinning: whether a certificate chain ends at a CA this process trusts. validateCertPair checks that a
// pair is whole and valid now; it cannot tell a pair the CA issued from one anybody made (a self-signed pair,
// names copied from the real chain). A store written by someone holding a stolen credential (docs/security.md)
// can hold such a pair; this check tells it apart by the signatures, up to a trust anchor.
import { X509Certificate, createHash } from 'node:crypto';
import { getCACertificates } from 'node:tls';
import { pemCertificates } from './certificate.ts';
import { CertshareError } from '../errors.ts';

/** CA certificates a chain must end at, indexed for the check. */
export interface TrustAnchors {
  /** Where they come from, for logs ("Node's default CA store", a file name). */
  readonly source: string;
  readonly size: number;
  /** SHA-256 fingerprints (X509Certificate#fingerprint256): a chain that carries an anchor itself. */
  readonly fingerprints: ReadonlySet<string>;
  /** By subject: the anchors that may have issued a certificate naming this issuer. */
  readonly bySubject: ReadonlyMap<string, readonly X509Certificate[]>;
}

/** Parses PEM CA certificates into anchors. Throws CERTSHARE_BAD_CONFIG when a block does not parse, or there is none. */
export function trustAnchors(pems: readonly string[], source: string): TrustAnchors {
  const fingerprints = new Set<string>();
  const bySubject = new Map<string, X509Certificate[]>();
  const blocks = pems.flatMap(pemCertificates);
  if (blocks.length === 0) throw new CertshareError('CERTSHARE_BAD_CONFIG', { source: `trust anchors (${source})`, reason: 'no PEM certificate found' });
  for (const [i, block] of blocks.entries()) {
    let cert: X509Certificate;
    try {
      cert = new X509Certificate(block);
    } catch (err) {
      throw new CertshareError('CERTSHARE_BAD_CONFIG', { source: `trust anchors (${source})`, reason: `certificate ${i + 1} does not parse` }, { cause: err });
    }
    if (fingerprints.has(cert.fingerprint256)) continue; // Node's default store lists a root both bundled and from the system
    fingerprints.add(cert.fingerprint256);
    const same = bySubject.get(cert.subject);
    if (same) same.push(cert);
    else bySubject.set(cert.subject, [cert]);
  }
  return { source, size: fingerprints.size, fingerprints, bySubject };
}

let nodeDefault: TrustAnchors | undefined;

/**
 * What Node itself trusts for TLS: its bundled Mozilla roots, the system's when started with --use-system-ca,
 * and NODE_EXTRA_CA_CERTS (read at process start): Let's Encrypt's roots, and a private ACME CA configured the
 * documented way (docs/install.md). Parsed once, on first use.
 */
export function defaultTrustAnchors(): TrustAnchors {
  nodeDefault ??= trustAnchors(getCACertificates('default'), "Node's default CA certificates (with NODE_EXTRA_CA_CERTS)");
  return nodeDefault;
}

function untrusted(domain: string, problem: string): CertshareError {
  return new CertshareError('CERTSHARE_CERT_UNTRUSTED', { domain, problem });
}

/** A distinguished name on one line: "CN=R11, O=Let's Encrypt, C=US" (X509Certificate prints one per line). */
const nameOf = (dn: string): string => dn.split('\n').reverse().join(', ');

/**
 * Throws CERTSHARE_CERT_UNTRUSTED unless `certPem`'s chain (leaf first, each element issued by the next) is
 * signed all along and reaches `anchors`: each element's signature verifies with the next one's key, each
 * issuer is a CA, and some element is an anchor itself or is issued and signed by one (usually the last; an
 * element past it, such as a root cross-signed by an older one, changes nothing). Names, signatures and the CA
 * flag only: validity dates are the leaf's (validateCertPair), and path-length or name constraints are not
 * checked. The message names the issuer of the last element, never PEM text. The pair's other checks
 * (parse, key, name, dates) are validateCertPair's; call it first.
 */
export function checkTrusted(certPem: string, domain: string, anchors: TrustAnchors): void {
  const digest = createHash('sha256').update(certPem).digest('base64');
  const last = lastChecked.get(domain);
  if (last?.digest === digest && last.anchors === anchors) {
    if (last.problem !== undefined) throw untrusted(domain, last.problem);
    return;
  }
  const problem = chainProblem(certPem, anchors);
  lastChecked.set(domain, { digest, anchors, problem });
  if (problem !== undefined) throw untrusted(domain, problem);
}

/**
 * The last chain checked per domain, by a digest of its PEM text, with its verdict: a store hands the same pair
 * back on every read, and the signatures are the costly part (as inspectCertPair's cache in certificate.ts).
 */
const lastChecked = new Map<string, { digest: string; anchors: TrustAnchors; problem: string | undefined }>();

function chainProblem(certPem: string, anchors: TrustAnchors): string | undefined {
  const blocks = pemCertificates(certPem);
  if (blocks.length === 0) return 'no PEM certificate found';
  let chain: X509Certificate[];
  try {
    chain = blocks.map((block) => new X509Certificate(block));
  } catch {
    return 'certificate does not parse';
  }
  for (let i = 0; i + 1 < chain.length; i++) {
    const [cert, issuer] = [chain[i]!, chain[i + 1]!];
    if (!issuer.ca) return `chain element ${i + 1} (${nameOf(issuer.subject)}) is not a CA certificate`;
    if (!cert.checkIssued(issuer)) return `chain out of order at position ${i + 1}`;
    if (!cert.verify(issuer.publicKey)) return `the signature of chain element ${i} does not verify with the key of ${nameOf(issuer.subject)}`;
  }
  if (chain.some((cert) => anchored(cert, anchors))) return undefined;
  const tail = chain[chain.length - 1]!;
  const selfSigned = tail.checkIssued(tail) && tail.verify(tail.publicKey);
  return (
    `its chain ends at ${selfSigned ? 'the self-signed ' : 'a certificate issued by '}${nameOf(tail.issuer)}, ` +
    `which none of the ${anchors.size} trust anchors (${anchors.source}) is or signed`
  );
}

function anchored(cert: X509Certificate, anchors: TrustAnchors): boolean {
  if (anchors.fingerprints.has(cert.fingerprint256)) return true;
  return (anchors.bySubject.get(cert.issuer) ?? []).some((anchor) => signedByCa(cert, anchor));
}

/** `cert` names `issuer` as its issuer, `issuer` is a CA, and `cert`'s signature verifies with `issuer`'s key. */
export function signedByCa(cert: X509Certificate, issuer: X509Certificate): boolean {
  return issuer.ca && cert.checkIssued(issuer) && cert.verify(issuer.publicKey);
}
