import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { validateCertPair } from '../../src/core/certificates/certificate.ts';
import { trustAnchors } from '../../src/core/certificates/trust.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import { OutOfBoundsLog, type UntrustedValue } from '../../src/core/values/untrusted-values.ts';
import { ANNOTATION_SERIAL, certSecret, olderVersion, readCertSecret } from '../../src/kube/secret-codec.ts';
import { trustedExpired } from '../../src/kube/secret-store.ts';
import { DAY, makePair, selfSignedPair, testCa } from '../support/certs.ts';

const domain = 'codec.tailnet-3.ts.net';
const meta = { namespace: 'proxy', group: 'g', writer: 'proxy-0' };

describe('Secret codec: when the certificate was obtained', () => {
  it('carries obtainedAt for readers and restarts, only for the certificate it was written with', async () => {
    const now = Math.floor(Date.now() / 1000) * 1000;
    // Backdated an hour: the renewal rule must measure from when it was obtained, not from notBefore.
    const pair = await makePair(domain, now - 3_600_000, 6 * 86_400_000);
    const info = validateCertPair(pair, domain, now);
    const secret = certSecret(domain, undefined, meta, { cert: { pair, info, obtainedAt: now }, coordination: {} });
    const read = readCertSecret(secret, domain, now);
    assert.equal(read.state, 'valid');
    assert.equal(read.state === 'valid' ? read.cert.obtainedAt : undefined, now);
    secret.metadata!.annotations![ANNOTATION_SERIAL] = 'edited by hand';
    const edited = readCertSecret(secret, domain, now);
    assert.equal(edited.state === 'valid' ? edited.cert.obtainedAt : 'not valid', undefined);
    const restored = certSecret(domain, secret, meta, { cert: { pair, info }, coordination: {} });
    assert.equal(restored.metadata?.annotations?.['certshare.io/obtained-at'], undefined, 'no stale value next to a pair without one');
  });
});

describe('Secret codec: an empty Secret is the first issuance running, anything else unusable is damage', () => {
  it('marks only a Secret without tls.crt and tls.key empty: an intent record, not garbage or half a pair', async () => {
    const now = Math.floor(Date.now() / 1000) * 1000;
    const intent = certSecret(domain, undefined, meta, { coordination: { intent: { holder: 'proxy-0', at: now } } });
    const pair = await makePair(domain, now, 86_400_000);
    const b64 = (text: string): string => Buffer.from(text).toString('base64');
    const cases: Array<[name: string, data: Record<string, string> | undefined, empty: boolean]> = [
      ["the writer's intent before its first certificate", intent.data, true],
      ['no data at all', undefined, true],
      ['tls.crt without tls.key', { 'tls.crt': b64(pair.certPem), 'tls.key': '' }, false],
      ['garbage', { 'tls.crt': b64('not a certificate'), 'tls.key': b64('not a key') }, false],
    ];
    for (const [name, data, empty] of cases) {
      const read = readCertSecret({ metadata: {}, ...(data ? { data } : {}) }, domain, now);
      assert.equal(read.state, 'unusable', name);
      assert.equal(read.state === 'unusable' && read.empty === true, empty, name);
    }
  });
});

describe('Secret codec: an expired pair tells a restarted replica the name was held, only from a pinned issuer', () => {
  it('reports an expired whole pair as `expired`; the store keeps it only when it chains to a trust anchor', async () => {
    const now = Math.floor(Date.now() / 1000) * 1000;
    const b64 = (text: string): string => Buffer.from(text).toString('base64');
    const secretOf = (pair: { certPem: string; keyPem: string }) => ({ metadata: {}, data: { 'tls.crt': b64(pair.certPem), 'tls.key': b64(pair.keyPem) } });
    const ca = await testCa();
    const anchors = { anchors: trustAnchors([ca.certPem], 'test'), onUntrusted: () => {} };
    const genuine = readCertSecret(secretOf(await makePair(domain, now - 2 * DAY, DAY)), domain, now);
    assert.ok(genuine.state === 'unusable' && genuine.expired, 'an expired pair of the CA: reported');
    assert.ok(
      trustedExpired(genuine, domain, anchors).state === 'unusable' && 'expired' in trustedExpired(genuine, domain, anchors),
      'kept: it chains to the anchor',
    );
    assert.ok(!('expired' in trustedExpired(genuine, domain, undefined)), 'dropped where no issuer is pinned (anybody can make such a pair)');
    const forged = readCertSecret(secretOf(await selfSignedPair(domain, now - 2 * DAY, DAY)), domain, now);
    assert.ok(forged.state === 'unusable' && forged.expired, 'a self-signed expired pair parses as well');
    assert.ok(!('expired' in trustedExpired(forged, domain, anchors)), 'dropped: it chains to no anchor');
    const other = readCertSecret(secretOf(await makePair('other.tailnet-3.ts.net', now - 2 * DAY, DAY)), domain, now);
    assert.ok(other.state === 'unusable' && !other.expired, "another name's pair is no evidence");
  });
});

describe('Secret codec: the certificate of record outlives a hand edit of the data', () => {
  it('names the serial and expiry certshare wrote, after the data is edited; a malformed serial names none', async () => {
    const now = Math.floor(Date.now() / 1000) * 1000;
    const pair = await makePair(domain, now - 60_000, DAY);
    const info = validateCertPair(pair, domain, now);
    const secret = certSecret(domain, undefined, meta, { cert: { pair, info }, coordination: {} });
    secret.data!['tls.crt'] = Buffer.from('edited by hand').toString('base64');
    const read = readCertSecret(secret, domain, now);
    assert.equal(read.state, 'unusable');
    assert.deepEqual(read.record, { serial: info.serial, notAfter: info.notAfter });
    secret.metadata!.annotations![ANNOTATION_SERIAL] = `${'A'.repeat(43)}`;
    assert.equal(readCertSecret(secret, domain, now).record, undefined, 'longer than any X.509 serial');
    secret.metadata!.annotations![ANNOTATION_SERIAL] = 'not hex';
    assert.equal(readCertSecret(secret, domain, now).record, undefined);
  });
});

describe('Secret codec: the serials the CA asked to replace now, named for every replica', () => {
  it('keeps the latest 4 newest first; a reader ignores a value out of its form whole and counts it (replaced-now)', async () => {
    const now = Math.floor(Date.now() / 1000) * 1000;
    const pair = await makePair(domain, now, 86_400_000);
    const cert = { pair, info: validateCertPair(pair, domain, now) };
    let secret = certSecret(domain, undefined, meta, { cert, coordination: {} });
    for (const serial of ['a1', 'B2', 'C3', 'D4', 'E5']) secret = certSecret(domain, secret, meta, { cert, coordination: {}, replacedNow: serial });
    assert.equal(secret.metadata?.annotations?.['certshare.io/replaced-now'], 'E5,D4,C3,B2');
    const later = certSecret(domain, secret, meta, { cert, coordination: {} });
    assert.equal(later.metadata?.annotations?.['certshare.io/replaced-now'], 'E5,D4,C3,B2', 'kept by a save for another reason');
    const refused: UntrustedValue[] = [];
    const log = new OutOfBoundsLog(silentLogger, (_where, value) => refused.push(value));
    const bounds = { retryCapMs: 60_000 };
    assert.equal(log.bounded(readCertSecret(later, domain, now), 'the Secret', now, bounds).replacedNow, 'E5,D4,C3,B2');
    assert.equal(refused.length, 0);
    for (const value of ['A,B,C,D,E', 'A'.repeat(43), 'not hex', '', `A,${'x'.repeat(100_000)}`]) {
      const edited = certSecret(domain, later, meta, { cert, coordination: {}, annotations: { 'certshare.io/replaced-now': value } });
      assert.equal(log.bounded(readCertSecret(edited, domain, now), 'the Secret', now, bounds).replacedNow, undefined, value.slice(0, 20));
      assert.equal(refused.at(-1)?.field, 'replaced-now');
      assert.ok((refused.at(-1)?.value.length ?? 0) <= 200, 'a long value is not logged whole');
      // The writer's next save drops what it cannot read and names only the serial it replaced.
      const next = certSecret(domain, edited, meta, { cert, coordination: {}, replacedNow: 'F6' });
      assert.equal(next.metadata?.annotations?.['certshare.io/replaced-now'], 'F6');
    }
  });
});

describe('Secret codec: which of two versions of a Secret is older', () => {
  it('orders by resourceVersion as a number; an absence or a version of another form orders nothing', () => {
    const at = (resourceVersion: string | undefined) => ({ metadata: { name: domain, resourceVersion } });
    assert.equal(olderVersion(at('99'), at('100')), true, 'numerically, not as text');
    assert.equal(olderVersion(at('100'), at('99')), false);
    assert.equal(olderVersion(at('100'), at('100')), false);
    assert.equal(olderVersion(at('123456789012345678901'), at('123456789012345678902')), true, 'beyond 2^53');
    for (const [a, b] of [
      [null, at('5')],
      [at('5'), null],
      [at('5'), undefined],
      [at(undefined), at('5')],
      [at('a1'), at('5')],
      [at('5'), at('')],
    ] as const) {
      assert.equal(olderVersion(a, b), false, `${JSON.stringify(a)} against ${JSON.stringify(b)}`);
    }
  });
});
