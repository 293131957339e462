import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createPrivateKey, X509Certificate } from 'node:crypto';
import { startEmulator } from '../../../src/emulator/server.ts';
import { certPath, fakeClock, get, getJson, splitPair, testEnv, type TestEnv } from '../../support/emulator.ts';

const A = 'a.tailnet-1234.ts.net';
const B = 'b.tailnet-1234.ts.net';

describe('cert pair wire format', () => {
  let env: TestEnv;
  before(async () => {
    env = await testEnv();
  });
  after(() => env.cleanup());

  test('key PEM first, then leaf and CA; parses, key matches, SAN covers the domain', async () => {
    const clock = fakeClock();
    const em = await env.start({ domains: [A, B], clock, certLifetimeMs: 90 * 86_400_000 });
    const r = await get(em.address, certPath(A));
    assert.equal(r.status, 200);
    assert.equal(r.headers['content-type'], 'text/plain');
    assert.equal(r.headers['tailscale-version'], '1.104.5');
    assert.match(r.body, /^-----BEGIN EC PRIVATE KEY-----\n/);
    const { keyPem, certs, certPem } = splitPair(r.body);
    assert.ok(!certPem.includes('PRIVATE KEY'));
    assert.equal(certs.length, 2);
    const [leaf, ca] = certs as [X509Certificate, X509Certificate];
    assert.ok(leaf.checkPrivateKey(createPrivateKey(keyPem)));
    assert.match(leaf.subjectAltName ?? '', new RegExp(`DNS:${A.replaceAll('.', '\\.')}`));
    assert.ok(leaf.checkIssued(ca), 'leaf issued by the second certificate');
    assert.ok(leaf.verify(ca.publicKey), 'leaf signature verifies with the CA key');
    assert.ok(ca.ca);
    assert.equal(ca.toString(), new X509Certificate(await em.caCertPem()).toString());
    assert.equal(leaf.publicKey.asymmetricKeyDetails?.namedCurve, 'prime256v1');
    // notBefore is backdated one minute; notAfter = notBefore + lifetime.
    assert.equal(Date.parse(leaf.validFrom), clock.now() - 60_000);
    assert.equal(Date.parse(leaf.validTo), clock.now() - 60_000 + 90 * 86_400_000);
    assert.ok(/^[0-7][0-9A-F]{31}$/.test(leaf.serialNumber), 'random positive 128-bit serial');
  });

  test('tiny lifetimes are not backdated', async () => {
    const clock = fakeClock();
    const em = await env.start({ domains: [A], clock, certLifetimeMs: 30_000 });
    const { certs } = splitPair((await get(em.address, certPath(A))).body);
    assert.equal(Date.parse(certs[0]!.validFrom), clock.now());
    assert.equal(Date.parse(certs[0]!.validTo), clock.now() + 30_000);
  });

  test('type=cert and type=key; other types are 400', async () => {
    const em = await env.start({ domains: [A] });
    const cert = await get(em.address, certPath(A, '0s', 'cert'));
    assert.equal(cert.status, 200);
    assert.match(cert.body, /^-----BEGIN CERTIFICATE-----/);
    const key = await get(em.address, certPath(A, '0s', 'key'));
    assert.match(key.body, /^-----BEGIN EC PRIVATE KEY-----/);
    assert.ok(!key.body.includes('CERTIFICATE'));
    const bad = await get(em.address, certPath(A, '0s', 'chain'));
    assert.equal(bad.status, 400);
    assert.equal(bad.headers['content-type'], 'text/plain; charset=utf-8');
    assert.equal(em.stats().issuances[A], 1, 'one issuance shared by both calls');
  });

  test('bad min_validity is 400', async () => {
    const em = await env.start({ domains: [A] });
    const r = await get(em.address, certPath(A, 'soon'));
    assert.equal(r.status, 400);
    assert.match(r.body, /^invalid validity parameter: time: invalid duration "soon"/);
    assert.equal(em.stats().issuancesTotal, 0);
  });

  test('a domain that is not a cert domain: 500 with tailscaled wording', async () => {
    const em = await env.start({ domains: [B, A] });
    const r = await get(em.address, certPath('nope.example.com'));
    assert.equal(r.status, 500);
    assert.equal(r.body, `invalid domain "nope.example.com"; must be one of ["${A}" "${B}"]\n`);
    assert.equal(r.headers['tailscale-version'], '1.104.5');
    assert.deepEqual(em.stats().issuances, {});
    assert.equal(em.stats().certRequests['nope.example.com'], 1);
  });

  test('no cert domains at all: tailscaled says the account does not support certs', async () => {
    const em = await env.start({ domains: [] });
    const r = await get(em.address, certPath(A));
    assert.equal(r.status, 500);
    assert.equal(r.body, 'your Tailscale account does not support getting TLS certs\n');
  });

  test('Referer or Origin: 403, refused before tailscaled sets its headers', async () => {
    const em = await env.start({ domains: [A] });
    for (const headers of [{ Referer: 'http://evil.example/' }, { Origin: 'http://evil.example' }] as Array<Record<string, string>>) {
      const r = await get(em.address, certPath(A), { headers });
      assert.equal(r.status, 403);
      assert.equal(r.body, 'invalid localapi request\n');
      assert.equal(r.headers['tailscale-version'], undefined);
    }
    const ok = await get(em.address, '/localapi/v0/cert-domains');
    assert.equal(ok.headers['tailscale-version'], '1.104.5');
    assert.equal(ok.headers['tailscale-cap'], '148');
    assert.equal(ok.headers['x-frame-options'], 'DENY');
    const r = await get(em.address, '/certshare-emulator/v0/stats', { headers: { Origin: 'x' } });
    assert.equal(r.status, 403);
    assert.equal(em.stats().issuancesTotal, 0);
  });

  test('status carries BackendState, Version and top-level CertDomains', async () => {
    const em = await env.start({ domains: [B, A], tailscaledVersion: '1.99.0' });
    const st = await getJson<Record<string, any>>(em.address, '/localapi/v0/status');
    assert.equal(st.BackendState, 'Running');
    assert.equal(st.Version, '1.99.0');
    assert.deepEqual(st.CertDomains, [A, B]);
    const empty = await env.start({ domains: [] });
    assert.equal((await getJson<Record<string, any>>(empty.address, '/localapi/v0/status')).CertDomains, null);
  });

  test('unknown routes are 404', async () => {
    const em = await env.start({ domains: [A] });
    assert.equal((await get(em.address, '/localapi/v0/nope')).status, 404);
  });
});

describe('TCP transport', () => {
  test('listens on 127.0.0.1:0 and serves pairs over http://127.0.0.1:PORT', async () => {
    const em = await startEmulator({ listen: '127.0.0.1:0', domains: [A] });
    try {
      assert.match(em.address, /^http:\/\/127\.0\.0\.1:\d+$/);
      assert.ok(em.port && em.port > 0);
      assert.equal(em.socketPath, undefined);
      const r = await get(em.address, certPath(A));
      assert.equal(r.status, 200);
      const { certs, keyPem } = splitPair(r.body);
      assert.ok(certs[0]!.checkPrivateKey(createPrivateKey(keyPem)));
      assert.deepEqual(await getJson(em.address, '/localapi/v0/cert-domains'), [A]);
    } finally {
      await em.close();
    }
  });
});
