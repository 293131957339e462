import { KeyObject, webcrypto } from 'node:crypto';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { loadX509 } from '../../src/core/certificates/x509.ts';
import { createCertificateAuthority, randomSerialHex, type CertificateAuthority } from '../../src/pki/ca.ts';
import type { CertPair } from '../../src/core/ports/localapi.ts';

export const DAY = 86_400_000;

let shared: Promise<CertificateAuthority> | undefined;

/** One CA per test process: generating keys is the slow part. */
export function testCa(): Promise<CertificateAuthority> {
  shared ??= createCertificateAuthority({ name: 'certshare test CA', now: Date.now() });
  return shared;
}

/**
 * A CA for emulators run as processes to share (their `--ca FILE`: its certificate and key), and its certificate
 * alone (certshare's `--federation-trust-anchors`): one CA behind every emulated tailscaled, as Let's Encrypt is.
 */
export async function writeSharedCa(dir: string, name: string): Promise<{ caFile: string; anchorsFile: string }> {
  const ca = await createCertificateAuthority({ name, now: Date.now() });
  const caFile = join(dir, 'emulator-ca.pem');
  const anchorsFile = join(dir, 'trust-anchors.pem');
  await writeFile(caFile, ca.certPem + ca.keyPem, { mode: 0o600 });
  await writeFile(anchorsFile, ca.certPem);
  return { caFile, anchorsFile };
}

/** A pair for `domain` valid from `notBefore` for `lifetimeMs` (whole seconds, as X.509 stores them). */
export async function makePair(domain: string, notBefore: number, lifetimeMs: number, ca?: CertificateAuthority): Promise<CertPair> {
  const authority = ca ?? (await testCa());
  const start = Math.floor(notBefore / 1000) * 1000;
  const leaf = await authority.sign({ dnsName: domain, notBefore: start, notAfter: start + lifetimeMs });
  return { keyPem: leaf.keyPem, certPem: leaf.chainPem };
}

/**
 * A self-signed pair for `domain` (a leaf that is its own issuer, the SAN right, the key matching): what anyone
 * with write access to a store can make, which validateCertPair accepts and only a trust check refuses.
 */
export async function selfSignedPair(domain: string, notBefore: number, lifetimeMs: number): Promise<CertPair> {
  const x509 = await loadX509();
  const alg = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' } as const;
  const keys = (await webcrypto.subtle.generateKey(alg, true, ['sign', 'verify'])) as webcrypto.CryptoKeyPair;
  const start = Math.floor(notBefore / 1000) * 1000;
  const cert = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: randomSerialHex(),
    name: `CN=${domain}`,
    keys,
    notBefore: new Date(start),
    notAfter: new Date(start + lifetimeMs),
    signingAlgorithm: alg,
    extensions: [new x509.SubjectAlternativeNameExtension([{ type: 'dns', value: domain }], false)],
  });
  const keyPem = KeyObject.from(keys.privateKey).export({ type: 'pkcs8', format: 'pem' }).toString();
  return { certPem: `${cert.toString('pem')}\n`, keyPem };
}
