import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { inspectCertPair, MAX_CHAIN_PEM_CHARS, validateCertPair } from '../../src/core/certificates/certificate.ts';
import { CertshareError } from '../../src/core/errors.ts';
import { DAY, makePair, testCa } from '../support/certs.ts';

const domain = 'web.tailnet-1234.ts.net';
const now = Date.now();

function rejects(fn: () => unknown, pattern: RegExp): void {
  assert.throws(fn, (err: unknown) => err instanceof CertshareError && err.code === 'CERTSHARE_CERT_INVALID' && pattern.test(err.message));
}

describe('validateCertPair', () => {
  it('accepts a matching, current pair and reports its window', async () => {
    const pair = await makePair(domain, now - DAY, 90 * DAY);
    const info = validateCertPair(pair, domain, now);
    assert.equal(info.domain, domain);
    assert.equal(info.notAfter - info.notBefore, 90 * DAY);
    assert.match(info.serial, /^[0-9A-F]+$/);
  });

  it('parses a pair read again only once, and still checks any other pair in full', async () => {
    const pair = await makePair(domain, now - DAY, 90 * DAY);
    const first = validateCertPair(pair, domain, now);
    // A store decodes the same pair anew on every read: equal text, other string instances.
    const again = validateCertPair({ certPem: `${pair.certPem}`.slice(0), keyPem: [...pair.keyPem].join('') }, domain, now);
    assert.equal(again, first, 'the same CertInfo, not a new parse');
    assert.ok(Object.isFrozen(first), 'shared, so immutable');
    const other = await makePair(domain, now - DAY, 90 * DAY);
    rejects(() => validateCertPair({ certPem: pair.certPem, keyPem: other.keyPem }, domain, now), /does not match/);
    rejects(() => inspectCertPair(pair, 'other.tailnet-1234.ts.net'), /does not cover/);
    // Time is checked on every call, cached or not.
    rejects(() => validateCertPair(pair, domain, now + 91 * DAY), /expired at/);
  });

  it('rejects a key that belongs to another certificate', async () => {
    const pair = await makePair(domain, now - DAY, 90 * DAY);
    const other = await makePair(domain, now - DAY, 90 * DAY);
    rejects(() => validateCertPair({ keyPem: other.keyPem, certPem: pair.certPem }, domain, now), /does not match/);
  });

  it('rejects a certificate for another name', async () => {
    const pair = await makePair('other.tailnet-1234.ts.net', now - DAY, 90 * DAY);
    rejects(() => validateCertPair(pair, domain, now), /does not cover web\.tailnet-1234\.ts\.net/);
  });

  it('rejects expired and not-yet-valid certificates', async () => {
    const expired = await makePair(domain, now - 10 * DAY, 5 * DAY);
    rejects(() => validateCertPair(expired, domain, now), /expired at/);
    const future = await makePair(domain, now + DAY, 90 * DAY);
    rejects(() => validateCertPair(future, domain, now), /not valid before/);
  });

  it('rejects garbage without echoing it', async () => {
    const pair = await makePair(domain, now - DAY, 90 * DAY);
    rejects(() => validateCertPair({ keyPem: pair.keyPem, certPem: 'hello world' }, domain, now), /no PEM certificate/);
    const secretish = '-----BEGIN EC PRIVATE KEY-----\nTOPSECRET\n-----END EC PRIVATE KEY-----\n';
    assert.throws(
      () => validateCertPair({ keyPem: secretish, certPem: pair.certPem }, domain, now),
      (err: Error) => /private key does not parse/.test(err.message) && !err.message.includes('TOPSECRET'),
    );
    rejects(() => validateCertPair({ keyPem: pair.keyPem, certPem: pair.certPem + pair.keyPem }, domain, now), /contains a private key/);
    const broken = pair.certPem.replace(/\n[A-Za-z0-9+/]{10}/, '\n!!!!!!!!!!');
    rejects(() => validateCertPair({ keyPem: pair.keyPem, certPem: broken }, domain, now), /does not parse/);
  });

  it('rejects a chain out of order', async () => {
    const pair = await makePair(domain, now - DAY, 90 * DAY);
    const ca = await testCa();
    const leafOnly = pair.certPem.replace(ca.certPem, '');
    // CA first, leaf second: the "leaf" position then holds the CA, which the key does not match.
    rejects(() => validateCertPair({ keyPem: pair.keyPem, certPem: ca.certPem + leafOnly }, domain, now), /does not match/);
    // Leaf followed by an unrelated certificate.
    const stranger = await makePair('x.example.com', now - DAY, 90 * DAY);
    const strangerLeaf = stranger.certPem.replace(ca.certPem, '');
    rejects(() => validateCertPair({ keyPem: pair.keyPem, certPem: leafOnly + strangerLeaf }, domain, now), /chain out of order/);
  });

  it('rejects a chain longer than a CA issues or a client takes', async () => {
    // Whoever writes a store (a tenant its Secret, the federation credential the home's record) can pad a real,
    // trusted pair with its root again and again: a self-signed root is its own issuer, so every link checks out.
    const pair = await makePair(domain, now - DAY, 90 * DAY);
    const ca = await testCa();
    assert.ok(pair.certPem.endsWith(ca.certPem), 'the chain ends with the root');
    const padded = pair.certPem + ca.certPem.repeat(Math.ceil(MAX_CHAIN_PEM_CHARS / ca.certPem.length));
    rejects(() => validateCertPair({ keyPem: pair.keyPem, certPem: padded }, domain, now), /PEM, more than 65536: longer than a CA issues/);
    // Up to the bound, the same padding is a chain like any other (it is the size that is refused).
    const fits = pair.certPem + ca.certPem.repeat(Math.floor((MAX_CHAIN_PEM_CHARS - pair.certPem.length) / ca.certPem.length));
    assert.equal(validateCertPair({ keyPem: pair.keyPem, certPem: fits }, domain, now).domain, domain);
  });
});
