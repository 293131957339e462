// The emulator's ACME Renewal Information, read by certshare's own ARI client: the directory, pebble's
// default window, a revocation, windows and raw answers set through the control API, unknown IDs.
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { RenewalInfoClient } from '../../../src/acme/renewal-info-client.ts';
import { ariCertificateId } from '../../../src/core/renewal/certificate-id.ts';
import type { AriCertificate } from '../../../src/core/renewal/renewal-info.ts';
import { type Emulator, startEmulator } from '../../../src/emulator/server.ts';
import { certPath, control, fakeClock, get, splitPair, testEnv, type TestEnv } from '../../support/emulator.ts';

const A = 'a.tailnet-1234.ts.net';
const H = 3_600_000;
const DAY = 24 * H;

/** Issues a pair for `domain` through the LocalAPI and returns what the ARI client needs of it. */
async function issue(em: Emulator, domain: string): Promise<AriCertificate & { serial: string }> {
  const { certs, certPem } = splitPair((await get(em.address, certPath(domain, '0s'))).body);
  const leaf = certs[0]!;
  return { certId: await ariCertificateId(certPem), notBefore: Date.parse(leaf.validFrom), notAfter: Date.parse(leaf.validTo), serial: leaf.serialNumber };
}

describe('emulator ARI', () => {
  let env: TestEnv;
  before(async () => {
    env = await testEnv();
  });
  after(() => env.cleanup());

  test("serves pebble's default window (the 2/3 point +/- 24 h) with Retry-After 6 h, from its own directory", async () => {
    const clock = fakeClock();
    const em = await env.start({ listen: '127.0.0.1:0', domains: [A], clock, certLifetimeMs: 90 * DAY });
    assert.equal(em.acmeDirectoryUrl, `${em.address}/acme/directory`);
    const cert = await issue(em, A);
    const client = new RenewalInfoClient({ directoryUrl: em.acmeDirectoryUrl!, timeoutMs: 5000, now: clock.now });
    const check = await client.check(cert);
    assert.ok(check.outcome === 'ok', JSON.stringify(check));
    const mid = cert.notBefore + 60 * DAY;
    assert.deepEqual(check.info.window, { start: mid - DAY, end: mid + DAY });
    assert.equal(check.retryAfterMs, 6 * H);
    assert.deepEqual(em.stats().ariRequests, { '200': 1 });
  });

  test('clamps the default window to the lifetime of a short certificate', async () => {
    const clock = fakeClock();
    const em = await env.start({ listen: '127.0.0.1:0', domains: [A], clock, certLifetimeMs: 30 * 60_000 });
    const cert = await issue(em, A);
    const check = await new RenewalInfoClient({ directoryUrl: em.acmeDirectoryUrl!, now: clock.now }).check(cert);
    assert.deepEqual(check.outcome === 'ok' && check.info.window, { start: cert.notBefore, end: cert.notAfter });
  });

  test('a revoked certificate gets a one-second window an hour ago; set windows, raw answers and reset through the control API', async () => {
    const clock = fakeClock();
    const em = await env.start({ listen: '127.0.0.1:0', domains: [A], clock });
    const cert = await issue(em, A);
    const client = new RenewalInfoClient({ directoryUrl: em.acmeDirectoryUrl!, now: clock.now });

    const revoked = await control(em.address, 'ari/revoke', { serial: cert.serial.toLowerCase() });
    assert.equal(revoked.status, 200, revoked.body);
    assert.equal(JSON.parse(revoked.body).certId, cert.certId);
    clock.advance(10_000);
    const afterRevocation = await client.check(cert);
    assert.deepEqual(afterRevocation.outcome === 'ok' && afterRevocation.info.window, { start: clock.now() - H, end: clock.now() - H + 1000 });

    const start = clock.now() - 5 * 60_000;
    const set = await control(em.address, 'ari', {
      domain: A,
      window: { start: new Date(start).toISOString(), end: new Date(start + H).toISOString() },
      explanationURL: 'https://ca.example/incident',
    });
    assert.equal(set.status, 200, set.body);
    const moved = await client.check(cert);
    assert.ok(moved.outcome === 'ok');
    assert.deepEqual(moved.info.window, { start, end: start + H });
    assert.equal(moved.info.explanationUrl, 'https://ca.example/incident');

    assert.equal((await control(em.address, 'ari', { certId: cert.certId, response: '{"suggestedWindow": ' })).status, 200);
    const malformed = await client.check(cert);
    assert.equal(malformed.outcome === 'bad_response' && malformed.code, 'CERTSHARE_ARI_BAD_RESPONSE');

    assert.equal((await control(em.address, 'ari', { certId: cert.certId, reset: true })).status, 200);
    const reset = await client.check(cert);
    assert.deepEqual(reset.outcome === 'ok' && reset.info.window, { start: clock.now() - H, end: clock.now() - H + 1000 }, 'still revoked');
  });

  test('answers 404 for a certificate it did not sign, 400 for a malformed ID; the control API says which selector matched nothing', async () => {
    const em = await env.start({ listen: '127.0.0.1:0', domains: [A] });
    await issue(em, A);
    const client = new RenewalInfoClient({ directoryUrl: em.acmeDirectoryUrl! });
    const unknown = await client.check({ certId: 'aYhba4dGQEHhs3uEe6CuLN4ByNQ.AIdlQyE', notBefore: 0, notAfter: Date.now() + DAY });
    assert.equal(unknown.outcome === 'not_found' && unknown.code, 'CERTSHARE_ARI_NOT_FOUND');
    assert.equal((await get(em.address, '/acme/renewal-info/not-an-id')).status, 400);
    const noMatch = await control(em.address, 'ari/revoke', { domain: 'other.tailnet-1234.ts.net' });
    assert.equal(noMatch.status, 400);
    assert.match(noMatch.body, /no certificate signed by this emulator matches/);
    assert.match((await control(em.address, 'ari', { domain: A, window: { start: 'soon' } })).body, /want "window"/);
    assert.deepEqual(em.stats().ariRequests, { '404': 1, '400': 1 });
  });

  test('lists every certificate it signed with its ARI ID', async () => {
    const clock = fakeClock();
    const em = await env.start({ domains: [A], clock, certLifetimeMs: 90 * DAY });
    const first = await issue(em, A);
    clock.advance(61 * DAY);
    const second = await issue(em, A); // past 2/3 with min_validity 0: renewed in the background
    await em.idle();
    const listed = JSON.parse((await get(em.address, '/certshare-emulator/v0/ari')).body) as { certificates: Array<{ certId: string; domain: string }> };
    assert.equal(second.certId, first.certId, 'the cached pair first');
    assert.equal(listed.certificates.length, 2);
    assert.equal(listed.certificates[0]!.certId, first.certId);
    assert.ok(listed.certificates.every((c) => c.domain === A));
  });

  test('a unix-socket emulator serves ARI on its own TCP listener when asked, not otherwise', async () => {
    const plain = await env.start({ domains: [A] });
    assert.equal(plain.acmeDirectoryUrl, undefined);
    const em = await env.start({ domains: [A], acmeListen: '127.0.0.1:0' });
    assert.match(em.acmeDirectoryUrl ?? '', /^http:\/\/127\.0\.0\.1:\d+\/acme\/directory$/);
    const cert = await issue(em, A);
    const check = await new RenewalInfoClient({ directoryUrl: em.acmeDirectoryUrl! }).check(cert);
    assert.equal(check.outcome, 'ok');
    const lapi = await fetch(em.acmeDirectoryUrl!.replace('/acme/directory', '/localapi/v0/status'));
    assert.equal(lapi.status, 404, 'the ACME listener serves no LocalAPI');
  });

  test('refuses an ACME address that is not TCP, and one in use, leaving no listener behind', async () => {
    await assert.rejects(startEmulator({ listen: join(env.dir, 'acme-refused.sock'), acmeListen: join(env.dir, 'acme.sock') }), /acmeListen must be HOST:PORT/);
    const busy = createServer();
    await new Promise<void>((resolve) => busy.listen(0, '127.0.0.1', resolve));
    const socket = join(env.dir, 'acme-busy.sock');
    try {
      const port = (busy.address() as AddressInfo).port;
      await assert.rejects(startEmulator({ listen: socket, acmeListen: `127.0.0.1:${port}` }), /EADDRINUSE/);
      const again = await startEmulator({ listen: socket });
      await again.close();
    } finally {
      busy.close();
    }
  });
});
