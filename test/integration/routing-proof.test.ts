// Proofs of routing: a routing check's call, signed with a key derived from the group's certificate key,
// proves the route to whichever Pod of the group receives it; nobody without that key can give one.
import assert from 'node:assert/strict';
import { generateKeyPairSync } from 'node:crypto';
import { describe, it } from 'node:test';
import type { StoredCert } from '../../src/core/ports/store.ts';
import { RoutingProofs } from '../../src/http/routing-proof.ts';
import { FakeClock } from '../support/fake-clock.ts';

const URL_ = 'http://proxy-health:9002/healthz';
const DOMAIN = 'proxy.tailnet-0000.ts.net';

/** A held certificate as the loops report it; the proofs read only its private key. */
const held = (keyPem: string): StoredCert => ({ pair: { keyPem, certPem: '' }, info: {} as StoredCert['info'] });
const newKey = (): string => generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey.export({ format: 'pem', type: 'pkcs8' }).toString();

/** Two replicas of one group: the same certificate key. */
function group(clock = new FakeClock()): { a: RoutingProofs; b: RoutingProofs; clock: FakeClock; key: string } {
  const key = newKey();
  const a = new RoutingProofs(clock);
  const b = new RoutingProofs(clock);
  a.certificate(DOMAIN, held(key));
  b.certificate(DOMAIN, held(key));
  return { a, b, clock, key };
}

describe('routing proofs', () => {
  it("a replica's call to the Service proves the route to the replica that receives it, for as long as it listens", () => {
    const { a, b } = group();
    let proofs = 0;
    const unlisten = b.onProof(URL_, () => proofs++);
    assert.equal(b.received(a.sign(URL_)), true);
    assert.equal(b.received(b.sign(URL_)), true, 'its own call, come back through the Service, is as good');
    assert.equal(proofs, 2);
    unlisten();
    assert.equal(b.received(a.sign(URL_)), false, 'nobody listens any more: nothing is checked');
    assert.equal(proofs, 2);
  });

  it('the same key read another way (PKCS#1 instead of PKCS#8 PEM) gives the same proofs', () => {
    const pkcs8 = generateKeyPairSync('rsa', { modulusLength: 1024 }).privateKey;
    const clock = new FakeClock();
    const a = new RoutingProofs(clock);
    const b = new RoutingProofs(clock);
    a.certificate(DOMAIN, held(pkcs8.export({ format: 'pem', type: 'pkcs8' }).toString()));
    b.certificate(DOMAIN, held(pkcs8.export({ format: 'pem', type: 'pkcs1' }).toString()));
    b.onProof(URL_, () => {});
    assert.equal(b.received(a.sign(URL_)), true);
  });

  it('refuses a call signed with another key, for another URL, out of time, forged or garbled', async () => {
    const { a, b, clock } = group();
    b.onProof(URL_, () => assert.fail('no proof expected'));
    const stranger = new RoutingProofs(clock);
    stranger.certificate(DOMAIN, held(newKey()));
    assert.equal(b.received(stranger.sign(URL_)), false, 'another group (or anyone) with a key of its own');
    assert.equal(b.received(a.sign('http://other-service:9002/healthz')), false, 'a call to another Service');
    const old = a.sign(URL_)!;
    await clock.advance(30_001);
    assert.equal(b.received(old), false, 'a proof seen on the wire, replayed 30 s later');
    const [domain, at, mac] = a.sign(URL_)!.split(' ');
    const flipped = Buffer.from(mac!, 'base64url');
    flipped[0]! ^= 1;
    for (const header of [
      `${domain} ${at} ${flipped.toString('base64url')}`,
      `${domain} ${Number(at) + 1} ${mac}`,
      `other.example ${at} ${mac}`,
      `${domain} ${at} ${mac} extra`,
      `${domain} ${at}`,
      `${domain} 1e12 ${mac}`,
      '',
      'x'.repeat(10_000),
      undefined,
      [`${domain} ${at} ${mac}`, 'twice'],
    ]) {
      assert.equal(b.received(header), false, `header ${JSON.stringify(header)?.slice(0, 80)}`);
    }
  });

  it('signs nothing without a certificate key, and forgets a key once its certificate is gone', () => {
    const clock = new FakeClock();
    const proofs = new RoutingProofs(clock);
    assert.equal(proofs.sign(URL_), undefined);
    proofs.certificate(DOMAIN, held('not a key'));
    assert.equal(proofs.sign(URL_), undefined, 'a key that does not parse');
    const { a } = group(clock);
    a.certificate(DOMAIN, undefined);
    assert.equal(a.sign(URL_), undefined);
  });

  it('never carries the key: the header is the domain, the time and a MAC', () => {
    const { a, key } = group();
    const header = a.sign(URL_)!;
    assert.match(header, /^proxy\.tailnet-0000\.ts\.net \d+ [\w-]{43}$/);
    const body = key.split('\n').slice(1, -2).join('');
    assert.ok(!header.includes(body.slice(0, 16)));
  });
});
