import { createCertificateAuthority, type CertificateAuthority } from '../../src/pki/ca.ts';
import type { CertPair } from '../../src/core/localapi.ts';

export const DAY = 86_400_000;

let shared: Promise<CertificateAuthority> | undefined;

/** One CA per test process: generating keys is the slow part. */
export function testCa(): Promise<CertificateAuthority> {
  shared ??= createCertificateAuthority({ name: 'certshare test CA', now: Date.now() });
  return shared;
}

/** A pair for `domain` valid from `notBefore` for `lifetimeMs` (whole seconds, as X.509 stores them). */
export async function makePair(domain: string, notBefore: number, lifetimeMs: number, ca?: CertificateAuthority): Promise<CertPair> {
  const authority = ca ?? (await testCa());
  const start = Math.floor(notBefore / 1000) * 1000;
  const leaf = await authority.sign({ dnsName: domain, notBefore: start, notAfter: start + lifetimeMs });
  return { keyPem: leaf.keyPem, certPem: leaf.chainPem };
}
