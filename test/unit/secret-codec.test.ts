import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { validateCertPair } from '../../src/core/certificates/certificate.ts';
import { ANNOTATION_SERIAL, certSecret, readCertSecret } from '../../src/kube/secret-codec.ts';
import { makePair } from '../support/certs.ts';

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
