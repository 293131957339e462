// Issuer pinning (src/core/certificates/trust.ts): a chain counts only if its signatures hold up to a trust anchor.
import assert from 'node:assert/strict';
import { X509Certificate } from 'node:crypto';
import { describe, it } from 'node:test';
import { validateCertPair } from '../../src/core/certificates/certificate.ts';
import { CertshareError } from '../../src/core/errors.ts';
import { checkTrusted, defaultTrustAnchors, type TrustAnchors, trustAnchors } from '../../src/core/certificates/trust.ts';

/** Whether checkTrusted passes. */
function isTrusted(certPem: string, domain: string, anchors: TrustAnchors): boolean {
  try {
    checkTrusted(certPem, domain, anchors);
    return true;
  } catch {
    return false;
  }
}
import { createCertificateAuthority } from '../../src/pki/ca.ts';
import { DAY, makePair, selfSignedPair, testCa } from '../support/certs.ts';

const domain = 'web.tailnet-1234.ts.net';
const now = Date.now();

function untrusted(fn: () => unknown, pattern: RegExp): void {
  assert.throws(fn, (err: unknown) => {
    assert.ok(err instanceof CertshareError && err.code === 'CERTSHARE_CERT_UNTRUSTED', String(err));
    assert.match(err.message, pattern);
    assert.doesNotMatch(err.message, /BEGIN|END|PRIVATE/, 'no PEM text in the message');
    return true;
  });
}

/** The PEM blocks of a chain, leaf first. */
const blocksOf = (pem: string): string[] => pem.match(/-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----\n?/g) ?? [];

/** `pem` with the last byte of its signature changed: the same names and key identifiers, a signature that fails. */
function forgedSignature(pem: string): string {
  const der = Buffer.from(new X509Certificate(pem).raw);
  der.writeUInt8(der.readUInt8(der.length - 1) ^ 0x01, der.length - 1);
  const body = der.toString('base64').replace(/.{64}/g, '$&\n');
  return `-----BEGIN CERTIFICATE-----\n${body}${body.endsWith('\n') ? '' : '\n'}-----END CERTIFICATE-----\n`;
}

describe('checkTrusted: the chain must be signed all along, up to a trust anchor', () => {
  it('accepts a chain ending at the anchor, and a leaf alone that the anchor signed', async () => {
    const ca = await testCa();
    const anchors = trustAnchors([ca.certPem], 'test');
    const pair = await makePair(domain, now - DAY, 90 * DAY);
    checkTrusted(pair.certPem, domain, anchors);
    const [leaf] = blocksOf(pair.certPem);
    checkTrusted(leaf!, domain, anchors);
  });

  it('refuses a self-signed leaf, which validateCertPair accepts', async () => {
    const pair = await selfSignedPair(domain, now - DAY, 10 * 365 * DAY);
    validateCertPair(pair, domain, now);
    const anchors = trustAnchors([(await testCa()).certPem], 'test');
    untrusted(() => checkTrusted(pair.certPem, domain, anchors), new RegExp(`self-signed CN=${domain}`));
  });

  it('refuses a chain whose names match the anchor but whose leaf signature is forged', async () => {
    const ca = await testCa();
    const [leaf, caBlock] = blocksOf((await makePair(domain, now - DAY, 90 * DAY)).certPem);
    const forged = forgedSignature(leaf!);
    assert.ok(new X509Certificate(forged).checkIssued(new X509Certificate(caBlock!)), 'the names still match');
    untrusted(() => checkTrusted(forged + caBlock!, domain, trustAnchors([ca.certPem], 'test')), /signature of chain element 0 does not verify/);
    // The leaf alone: the anchor's name, not its signature.
    untrusted(() => checkTrusted(forged, domain, trustAnchors([ca.certPem], 'test')), /ends at a certificate issued by .*certshare test CA/);
  });

  it('refuses a CA that copies the name of the trusted one, and a root nobody trusts', async () => {
    const trusted = await testCa();
    const anchors = trustAnchors([trusted.certPem], 'test');
    const lookalike = await createCertificateAuthority({ name: 'certshare test CA', now });
    const copied = await makePair(domain, now - DAY, 90 * DAY, lookalike);
    untrusted(
      () => checkTrusted(copied.certPem, domain, anchors),
      /ends at the self-signed .*CN=certshare test CA, which none of the 1 trust anchors \(test\)/,
    );
    const [leaf] = blocksOf(copied.certPem);
    untrusted(() => checkTrusted(leaf!, domain, anchors), /issued by .*certshare test CA/);
    const other = await createCertificateAuthority({ name: 'some other CA', now });
    const foreign = (await makePair(domain, now - DAY, 90 * DAY, other)).certPem;
    untrusted(() => checkTrusted(foreign, domain, anchors), /self-signed .*some other CA/);
  });

  it('refuses a chain out of order, and one whose issuer is not the next element', async () => {
    const anchors = trustAnchors([(await testCa()).certPem], 'test');
    const [leaf, caBlock] = blocksOf((await makePair(domain, now - DAY, 90 * DAY)).certPem);
    untrusted(() => checkTrusted(caBlock! + leaf!, domain, anchors), /not a CA certificate/);
    const other = await createCertificateAuthority({ name: 'some other CA', now });
    untrusted(() => checkTrusted(leaf! + other.certPem, domain, anchors), /out of order at position 1/);
  });

  it('keeps the verdict of the last chain per domain, and checks a new chain or other anchors in full', async () => {
    const ca = await testCa();
    const anchors = trustAnchors([ca.certPem], 'test');
    const bad = (await selfSignedPair(domain, now - DAY, 90 * DAY)).certPem;
    assert.equal(isTrusted(bad, domain, anchors), false);
    assert.equal(isTrusted(`${bad}`.slice(0), domain, anchors), false, 'read again: refused again');
    const good = (await makePair(domain, now - DAY, 90 * DAY)).certPem;
    assert.equal(isTrusted(good, domain, anchors), true);
    const elsewhere = trustAnchors([(await createCertificateAuthority({ name: 'x', now })).certPem], 'other');
    assert.equal(isTrusted(good, domain, elsewhere), false);
  });

  it('reads the anchors: refuses a source without a certificate; Node default trusts both ISRG roots', () => {
    assert.throws(
      () => trustAnchors(['not a certificate'], 'ca.pem'),
      (err: unknown) => err instanceof CertshareError && err.code === 'CERTSHARE_BAD_CONFIG',
    );
    const subjects = [...defaultTrustAnchors().bySubject.keys()];
    for (const root of ['ISRG Root X1', 'ISRG Root X2'])
      assert.ok(
        subjects.some((s) => s.includes(`CN=${root}`)),
        root,
      );
  });
});
