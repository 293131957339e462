import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createPrivateKey } from 'node:crypto';
import { parseFaultSpec, normalizeFault } from '../../../src/emulator/faults.ts';
import type { Emulator } from '../../../src/emulator/server.ts';
import { certPath, fakeClock, get, getJson, openRequest, splitPair, testEnv, waitEvent, type TestEnv } from '../../support/emulator.ts';

const D = 'app.tailnet-1234.ts.net';
const E = 'api.tailnet-1234.ts.net';

describe('fault specs', () => {
  test('parses the CLI form', () => {
    assert.deepEqual(parseFaultSpec('cert:rate_limit_429:retry_after=30:count=2'), {
      target: 'cert',
      kind: 'rate_limit_429',
      retryAfterSeconds: 30,
      count: 2,
    });
    assert.deepEqual(parseFaultSpec('bus:disconnect'), { target: 'bus', kind: 'disconnect' });
    assert.deepEqual(parseFaultSpec('cert:slow:delay=1m30s:domain=a.b.ts.net:count=always'), {
      target: 'cert',
      kind: 'slow',
      delayMs: 90_000,
      domain: 'a.b.ts.net',
      count: 'always',
    });
    assert.equal((parseFaultSpec('cert:hang:count=0') as { count?: unknown }).count, 'always');
    assert.deepEqual(parseFaultSpec('bus:huge_line:bytes=2m'), { target: 'bus', kind: 'huge_line', bytes: 2 * 1024 * 1024 });
    assert.deepEqual(parseFaultSpec('cert:error_500:count=3:message=acme: boom: again'), {
      target: 'cert',
      kind: 'error_500',
      count: 3,
      message: 'acme: boom: again',
    });
  });

  test('rejects bad specs with one clear line', () => {
    for (const bad of [
      'cert',
      'cert:nope',
      'disk:full',
      'cert:slow:delay=soon',
      'cert:hang:count=-1',
      'cert:hang:colour=red',
      'bus:disconnect:domain=x.ts.net',
      'cert:hang:oops',
    ]) {
      assert.throws(
        () => parseFaultSpec(bad),
        (err: Error) => err.message.includes(bad) && !err.message.includes('\n'),
        bad,
      );
    }
    assert.throws(() => normalizeFault({ target: 'cert', kind: 'slow', delayMs: 'x' }));
    assert.throws(() => normalizeFault(42));
  });
});

describe('cert faults', () => {
  let env: TestEnv;
  let em: Emulator;
  before(async () => {
    env = await testEnv();
    em = await env.start({ domains: [D, E], certLifetimeMs: 90 * 86_400_000 });
  });
  after(() => env.cleanup());

  const fetchPair = (domain = D) => get(em.address, certPath(domain));

  test('rate_limit_429: Retry-After and the ACME text, for `count` requests; never an issuance', async () => {
    em.injectFault({ target: 'cert', kind: 'rate_limit_429', retryAfterSeconds: 30, count: 2 });
    for (let i = 0; i < 2; i++) {
      const r = await fetchPair();
      assert.equal(r.status, 429);
      assert.equal(r.headers['retry-after'], '30');
      assert.match(
        r.body,
        /^429 urn:ietf:params:acme:error:rateLimited: too many certificates \(5\) already issued for this exact set of domains in the last 168h0m0s/,
      );
    }
    const before = em.stats().issuances[D] ?? 0;
    const ok = await fetchPair();
    assert.equal(ok.status, 200);
    assert.equal(em.stats().faultsApplied['cert:rate_limit_429'], 2);
    assert.ok((em.stats().issuances[D] ?? 0) <= before + 1);
    assert.equal(em.stats().certResponses[D]?.['429'], 2);
  });

  test('acme_rate_limit_500: older tailscaled, HTTP 500, no Retry-After', async () => {
    em.injectFault('cert:acme_rate_limit_500');
    const r = await fetchPair();
    assert.equal(r.status, 500);
    assert.equal(r.headers['retry-after'], undefined);
    assert.equal(
      r.body,
      '429 urn:ietf:params:acme:error:rateLimited: too many certificates (5) already issued for this exact set of domains in the last 168h0m0s\n',
    );
  });

  test('error_500 with a custom message, and access_denied_403', async () => {
    em.injectFault({ target: 'cert', kind: 'error_500', message: 'acme: order failed' });
    em.injectFault({ target: 'cert', kind: 'access_denied_403' });
    const r1 = await fetchPair();
    assert.equal(r1.status, 500);
    assert.equal(r1.body, 'acme: order failed\n');
    const r2 = await fetchPair();
    assert.equal(r2.status, 403);
    assert.equal(r2.body, 'cert access denied\n');
    assert.equal((await fetchPair()).status, 200);
  });

  test('a fault limited to one domain leaves the others alone; count "always" lasts until cleared', async () => {
    em.injectFault({ target: 'cert', kind: 'access_denied_403', domain: E, count: 'always' });
    assert.equal((await fetchPair(D)).status, 200);
    for (let i = 0; i < 3; i++) assert.equal((await fetchPair(E)).status, 403);
    em.clearFaults();
    assert.equal((await fetchPair(E)).status, 200);
  });

  test('slow: the normal answer after delayMs', async () => {
    em.injectFault({ target: 'cert', kind: 'slow', delayMs: 150 });
    const t0 = performance.now();
    const r = await fetchPair();
    assert.ok(performance.now() - t0 >= 140);
    assert.equal(r.status, 200);
    assert.equal(splitPair(r.body).certs.length, 2);
  });

  test('hang: no answer until the client gives up', async () => {
    em.injectFault('cert:hang');
    const hanging = waitEvent(em, 'certResponse', (e: { status: unknown }) => e.status === 'hang');
    const ac = new AbortController();
    const pending = openRequest(em.address, certPath(D), { signal: ac.signal });
    await hanging;
    ac.abort();
    await assert.rejects(pending, { name: 'AbortError' });
    assert.equal((await fetchPair()).status, 200, 'the emulator goes on serving');
  });

  test('garbage: 200 without any PEM', async () => {
    em.injectFault('cert:garbage');
    const r = await fetchPair();
    assert.equal(r.status, 200);
    assert.ok(!r.body.includes('-----BEGIN'));
  });

  test('mismatched: a valid certificate with the key of another', async () => {
    const before = em.stats().issuancesTotal;
    em.injectFault('cert:mismatched');
    const r = await fetchPair();
    assert.equal(r.status, 200);
    const { keyPem, certs } = splitPair(r.body);
    assert.match(certs[0]!.subjectAltName!, new RegExp(D.replaceAll('.', '\\.')));
    assert.equal(certs[0]!.checkPrivateKey(createPrivateKey(keyPem)), false);
    assert.equal(em.stats().issuancesTotal, before, 'a faulted answer is not an issuance');
  });

  test('wrong_domain: a valid pair for another name', async () => {
    em.injectFault('cert:wrong_domain');
    const { keyPem, certs } = splitPair((await fetchPair()).body);
    assert.ok(certs[0]!.checkPrivateKey(createPrivateKey(keyPem)));
    assert.ok(!certs[0]!.subjectAltName!.split(', ').includes(`DNS:${D}`));
  });

  test('expired: notAfter in the past', async () => {
    em.injectFault('cert:expired');
    const { keyPem, certs } = splitPair((await fetchPair()).body);
    assert.ok(certs[0]!.checkPrivateKey(createPrivateKey(keyPem)));
    assert.ok(Date.parse(certs[0]!.validTo) < Date.now());
  });

  test('reset: the socket is destroyed without a response', async () => {
    em.injectFault('cert:reset');
    await assert.rejects(fetchPair(), (err: NodeJS.ErrnoException) => err.code === 'ECONNRESET' || /socket hang up/.test(err.message));
    assert.equal(em.stats().certResponses[D]?.reset, 1);
    assert.equal((await fetchPair()).status, 200);
  });

  test('faults apply before the domain check, in injection order', async () => {
    em.injectFault('cert:access_denied_403');
    em.injectFault('cert:rate_limit_429');
    assert.equal((await fetchPair('unknown.example.com')).status, 403);
    assert.equal((await fetchPair()).status, 429);
    assert.equal((await fetchPair('unknown.example.com')).status, 500);
  });
});

describe('control API', () => {
  let env: TestEnv;
  before(async () => {
    env = await testEnv();
  });
  after(() => env.cleanup());

  test('POST/GET/DELETE faults, POST domains, GET stats', async () => {
    const em = await env.start({ domains: [D], clock: fakeClock() });
    const post = (path: string, body: unknown) =>
      get(em.address, `/certshare-emulator/v0/${path}`, { method: 'POST', body: JSON.stringify(body), headers: { 'Content-Type': 'application/json' } });

    const r1 = await post('faults', [{ target: 'cert', kind: 'rate_limit_429', retryAfterSeconds: 5 }, 'cert:error_500:count=2']);
    assert.equal(r1.status, 200, r1.body);
    assert.deepEqual(
      JSON.parse(r1.body).pending.map((f: { kind: string; remaining: unknown }) => [f.kind, f.remaining]),
      [
        ['rate_limit_429', 1],
        ['error_500', 2],
      ],
    );
    const r429 = await get(em.address, certPath(D));
    assert.equal(r429.status, 429);
    assert.equal(r429.headers['retry-after'], '5');
    const listed = await getJson<{ pending: unknown[] }>(em.address, '/certshare-emulator/v0/faults');
    assert.equal(listed.pending.length, 1);
    const del = await get(em.address, '/certshare-emulator/v0/faults', { method: 'DELETE' });
    assert.equal(del.status, 200);
    assert.equal((await get(em.address, certPath(D))).status, 200);

    const bad = await post('faults', { target: 'cert', kind: 'meteor' });
    assert.equal(bad.status, 400);
    assert.match(bad.body, /unknown cert fault kind/);
    assert.equal((await post('faults', 'not json at all' as unknown)).status, 400);

    const dom = await post('domains', { add: ['z.tailnet-1234.ts.net'], remove: [D] });
    assert.deepEqual(JSON.parse(dom.body), { certDomains: ['z.tailnet-1234.ts.net'] });
    assert.equal((await get(em.address, certPath(D))).status, 500);

    const stats = await getJson<Record<string, any>>(em.address, '/certshare-emulator/v0/stats');
    assert.deepEqual(stats.issuances, { [D]: 1 });
    assert.deepEqual(stats.certRequests, { [D]: 3 });
    assert.equal(stats.busConnections, 0);
    assert.deepEqual(stats.faultsApplied, { 'cert:rate_limit_429': 1 });
    assert.deepEqual(stats.certDomains, ['z.tailnet-1234.ts.net']);
    assert.equal((await get(em.address, '/certshare-emulator/v0/nope')).status, 404);
  });
});
