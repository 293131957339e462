// /healthz and /metrics through fastify's inject: status by health, and the Pod address headers on every
// response (the routing check of the readiness gate reads them from whatever answer it gets).
import assert from 'node:assert/strict';
import { after, describe, it } from 'node:test';
import { HealthState } from '../../src/core/loop/health.ts';
import { IssuanceSlots } from '../../src/core/issuance/issuance-slots.ts';
import { buildHttpServer } from '../../src/http/http-server.ts';
import { Metrics } from '../../src/http/daemon-metrics.ts';
import { FakeClock } from '../support/fake-clock.ts';

describe('http server', () => {
  const clock = new FakeClock();
  const health = new HealthState();
  const metrics = new Metrics(clock, { renewFraction: 1 / 3, checkIntervalMs: 86_400_000 }, { defaultMetrics: false });
  const app = buildHttpServer({ health, metrics, clock, pod: { ipv4: '10.1.2.3', ipv6: 'fd00::3' } });
  after(() => app.close());

  const podHeaders = (res: { headers: Record<string, unknown> }) => [res.headers['pod-ipv4'], res.headers['pod-ipv6']];

  it('answers /healthz 503 with the reason until every domain has a certificate, with the Pod addresses', async () => {
    health.manage(['web.example.ts.net']);
    const res = await app.inject({ method: 'GET', url: '/healthz' });
    assert.equal(res.statusCode, 503);
    assert.equal(res.body, 'web.example.ts.net: no certificate yet');
    assert.match(String(res.headers['content-type']), /^text\/plain/);
    assert.deepEqual(podHeaders(res), ['10.1.2.3', 'fd00::3']);
    health.manage([]);
    const ok = await app.inject({ method: 'GET', url: '/healthz' });
    assert.equal(ok.statusCode, 200);
    assert.equal(ok.body, 'ok');
    assert.deepEqual(podHeaders(ok), ['10.1.2.3', 'fd00::3']);
  });

  it('shows the detail only to loopback callers: another Pod through the Service gets the status, the addresses and no domain', async () => {
    health.manage(['web.example.ts.net']);
    health.renewalInfo('web.example.ts.net', 'CA suggests renewal now');
    for (const url of ['/healthz', '/healthz?verbose']) {
      const remote = await app.inject({ method: 'GET', url, remoteAddress: '10.201.0.7' });
      assert.equal(remote.statusCode, 503);
      assert.deepEqual(podHeaders(remote), ['10.1.2.3', 'fd00::3'], 'the routing check still learns who answered');
      assert.doesNotMatch(remote.body, /web\.example|CA suggests/, url);
      for (const local of ['127.0.0.1', '::1', '::ffff:127.0.0.1'])
        assert.match((await app.inject({ method: 'GET', url, remoteAddress: local })).body, /web\.example\.ts\.net: no certificate yet/, local);
    }
    health.renewalInfo('web.example.ts.net', undefined);
    health.manage([]);
    assert.equal((await app.inject({ method: 'GET', url: '/healthz', remoteAddress: '10.201.0.7' })).body, 'ok');
  });

  it("says in /healthz's reason why no domain can be learned (a refused IPN-bus watch), until that is over", async () => {
    health.manage(['web.example.ts.net']);
    const why = 'tailscaled 1.104.5 refused GET /localapi/v0/watch-ipn-bus?mask=282: HTTP 400: nope; asking again in 10m0s';
    health.sourceProblem(why);
    const res = await app.inject({ method: 'GET', url: '/healthz' });
    assert.equal(res.statusCode, 503);
    assert.equal(res.body, `web.example.ts.net: no certificate yet (${why})`);
    health.sourceProblem(undefined);
    assert.equal((await app.inject({ method: 'GET', url: '/healthz' })).body, 'web.example.ts.net: no certificate yet');
    health.manage([]);
  });

  it('adds the CA renewal window per domain to /healthz?verbose only; the plain answer stays the verdict', async () => {
    const domains = ['b.example.ts.net', 'a.example.ts.net'];
    health.manage(domains);
    health.renewalInfo('b.example.ts.net', 'CA suggests renewal 2026-11-25T10:00:00.000Z..2026-11-25T11:00:00.000Z, chosen 2026-11-25T10:30:00.000Z');
    const verbose = await app.inject({ method: 'GET', url: '/healthz?verbose' });
    assert.equal(
      verbose.body,
      'a.example.ts.net: no certificate yet; b.example.ts.net: no certificate yet\n' +
        'b.example.ts.net: CA suggests renewal 2026-11-25T10:00:00.000Z..2026-11-25T11:00:00.000Z, chosen 2026-11-25T10:30:00.000Z',
    );
    assert.equal((await app.inject({ method: 'GET', url: '/healthz' })).body, 'a.example.ts.net: no certificate yet; b.example.ts.net: no certificate yet');
    health.renewalInfo('b.example.ts.net', undefined);
    assert.equal((await app.inject({ method: 'GET', url: '/healthz?verbose' })).body.includes('CA suggests'), false);
    health.manage([]);
  });

  it('answers /healthz 503 once the certificate expires, with nothing else changing (the answer is kept per verdict)', async () => {
    const now = clock.now();
    health.manage(['web.example.ts.net']);
    const info = { domain: 'web.example.ts.net', notBefore: now - 60_000, notAfter: now + 60_000, serial: '01', fingerprint256: '' };
    health.certificate('web.example.ts.net', { pair: { certPem: '', keyPem: '' }, info });
    for (let i = 0; i < 2; i++) {
      const ok = await app.inject({ method: 'GET', url: '/healthz' });
      assert.deepEqual([ok.statusCode, ok.body, podHeaders(ok)], [200, 'ok', ['10.1.2.3', 'fd00::3']]);
    }
    await clock.advance(60_000);
    const expired = await app.inject({ method: 'GET', url: '/healthz' });
    assert.deepEqual([expired.statusCode, expired.body, podHeaders(expired)], [503, 'web.example.ts.net: certificate expired', ['10.1.2.3', 'fd00::3']]);
    assert.match(String(expired.headers['content-type']), /^text\/plain/);
    health.manage([]);
  });

  it('reports the issuance slots in use and the domains waiting for one', async () => {
    const slots = new IssuanceSlots(2);
    metrics.watchIssuanceSlots(slots);
    const scrape = async (): Promise<string[]> =>
      (await app.inject({ method: 'GET', url: '/metrics' })).body.split('\n').filter((line) => /^certshare_issuance_slots_/.test(line));
    assert.deepEqual(await scrape(), ['certshare_issuance_slots_in_use 0', 'certshare_issuance_slots_waiting 0']);
    const stop = new AbortController();
    const releases = [await slots.acquire(stop.signal), await slots.acquire(stop.signal)];
    const queued = [slots.acquire(stop.signal), slots.acquire(stop.signal), slots.acquire(stop.signal)];
    assert.deepEqual(await scrape(), ['certshare_issuance_slots_in_use 2', 'certshare_issuance_slots_waiting 3']);
    releases[0]!();
    (await queued[0]!)();
    assert.deepEqual(await scrape(), ['certshare_issuance_slots_in_use 2', 'certshare_issuance_slots_waiting 1']);
    stop.abort();
    await Promise.allSettled(queued);
    releases[1]!();
    (await queued[1]!)();
    assert.deepEqual(await scrape(), ['certshare_issuance_slots_in_use 0', 'certshare_issuance_slots_waiting 0']);
  });

  it("labels CertPair calls with why they were made, the decision's reason shows in /healthz, and both go with the domain", async () => {
    const domain = 'web.example.ts.net';
    health.manage([domain]);
    health.decided(domain, { action: 'wait', reason: 'budget_exhausted', at: clock.now() + 60_000 });
    health.problem(domain, 'waiting for the issuance budget');
    assert.equal((await app.inject({ method: 'GET', url: '/healthz' })).body, `${domain}: waiting for the issuance budget [budget_exhausted]`);
    metrics.attempt(domain, 'success', 'no_certificate');
    metrics.attempt(domain, 'rejected', 'expiry');
    const attempts = async (): Promise<string[]> =>
      (await app.inject({ method: 'GET', url: '/metrics' })).body.split('\n').filter((line) => /^certshare_issuance_attempts_total\{/.test(line));
    assert.deepEqual(await attempts(), [
      `certshare_issuance_attempts_total{domain="${domain}",result="success",reason="no_certificate"} 1`,
      `certshare_issuance_attempts_total{domain="${domain}",result="rejected",reason="expiry"} 1`,
    ]);
    metrics.stopped(domain);
    assert.deepEqual(await attempts(), [], 'every series of a domain no longer managed is gone');
    health.manage([]);
  });

  it('carries the Pod addresses on /metrics, HEAD and unknown paths too', async () => {
    for (const [method, url, status] of [
      ['GET', '/metrics', 200],
      ['HEAD', '/healthz', 200],
      ['GET', '/nope', 404],
      ['POST', '/healthz', 404],
    ] as const) {
      const res = await app.inject({ method, url });
      assert.equal(res.statusCode, status, `${method} ${url}`);
      assert.deepEqual(podHeaders(res), ['10.1.2.3', 'fd00::3'], `${method} ${url}`);
    }
  });
});

describe('GET /leave-rotation', () => {
  const clock = new FakeClock();
  const metrics = new Metrics(clock, { renewFraction: 1 / 3, checkIntervalMs: 86_400_000 }, { defaultMetrics: false });
  const token = 'leave-token-0123456789';
  let terminating: boolean | Error = false;
  let left = 0;
  const app = buildHttpServer({
    health: new HealthState(),
    metrics,
    clock,
    pod: { ipv4: '10.1.2.3', ipv6: undefined },
    leaveRotation: {
      token,
      terminating: async () => {
        if (terminating instanceof Error) throw terminating;
        return terminating;
      },
      leave: async () => {
        left++;
      },
    },
  });
  after(() => app.close());
  const call = (headers: Record<string, string>) => app.inject({ method: 'GET', url: '/leave-rotation', headers, remoteAddress: '10.201.0.7' });

  it('refuses a wrong token (403) before asking anything', async () => {
    terminating = new Error('must not be asked');
    const wrong: Array<Record<string, string>> = [{}, { 'certshare-leave-token': 'leave-token-0123456780' }, { 'certshare-leave-token': 'short' }];
    for (const headers of wrong) assert.equal((await call(headers)).statusCode, 403, JSON.stringify(headers));
    assert.equal(left, 0);
  });

  it('answers 409 and changes nothing while the Pod is not terminating, 503 when it cannot tell, and leaves once it is', async () => {
    terminating = false;
    const refused = await call({ 'certshare-leave-token': token });
    assert.equal(refused.statusCode, 409);
    assert.match(refused.body, /not terminating/);
    assert.equal(refused.headers['pod-ipv4'], '10.1.2.3');
    terminating = new Error('apiserver down');
    const unknown = await call({ 'certshare-leave-token': token });
    assert.equal(unknown.statusCode, 503);
    assert.match(unknown.body, /apiserver down/);
    assert.equal(left, 0, 'the token alone never takes the replica out of rotation');
    terminating = true;
    const done = await call({ 'certshare-leave-token': token });
    assert.equal(done.statusCode, 200);
    assert.equal(done.body, 'left rotation');
    assert.equal(left, 1);
  });
});
