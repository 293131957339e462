import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { classifyIssuanceFailure } from '../../../src/core/issuance/failure.ts';
import { parseEmulatorArgs } from '../../../src/emulator/options.ts';
import type { Emulator } from '../../../src/emulator/server.ts';
import { createLocalApiClient } from '../../../src/localapi/client.ts';
import { silentLogger } from '../../../src/core/ports/logger.ts';
import { certPath, fakeClock, get, testEnv, type TestEnv } from '../../support/emulator.ts';

const A = 'a.tailnet-limits.ts.net';
const B = 'b.tailnet-limits.ts.net';
const C = 'c.tailnet-limits.ts.net';

describe("--limit-new-certs / --limit-orders: Let's Encrypt's limits on the wire", () => {
  let env: TestEnv;
  let em: Emulator;
  const clock = fakeClock();
  before(async () => {
    env = await testEnv();
    em = await env.start({
      domains: [A, B, C],
      certLifetimeMs: 3_600_000,
      clock,
      limits: { newCertsPerRegisteredDomain: { count: 2, windowMs: 600_000 }, ordersPerAccount: { count: 4, windowMs: 3 * 3_600_000 } },
    });
  });
  after(() => env.cleanup());

  test('a first issuance past the limit is a 429 with the CA text and Retry-After, which certshare reads as a rate limit; renewals pass', async () => {
    assert.equal((await get(em.address, certPath(A))).status, 200);
    clock.advance(60_000);
    assert.equal((await get(em.address, certPath(B))).status, 200);
    const refused = await get(em.address, certPath(C));
    assert.equal(refused.status, 429);
    assert.equal(refused.headers['retry-after'], '540'); // A's slot frees 10 minutes after it was taken
    assert.match(
      refused.body,
      /^429 urn:ietf:params:acme:error:rateLimited: too many certificates \(2\) already issued for "tailnet-limits\.ts\.net" in the last 10m0s/,
    );
    const client = createLocalApiClient({ address: em.address, certTimeoutMs: 5000, logger: silentLogger });
    const failure = await client.certPair(C, { minValidityMs: 0, signal: new AbortController().signal }).then(
      () => assert.fail('issued past the limit'),
      (err: unknown) => classifyIssuanceFailure(err),
    );
    assert.equal(failure.kind, 'rate_limited');
    assert.equal(failure.retryAfterMs, 540_000);
    // A renewal (min_validity above what A has left) is a new order but not a new certificate.
    assert.equal((await get(em.address, certPath(A, '2h'))).status, 200);
    assert.equal(em.stats().issuances[A], 2);
    // The account's 4 orders in 3 h are used up (A, B, A's renewal, and now B's renewal): the next order is refused.
    assert.equal((await get(em.address, certPath(B, '2h'))).status, 200);
    const orders = await get(em.address, certPath(A, '3h'));
    assert.equal(orders.status, 429);
    assert.match(orders.body, /too many new orders \(4\) from this account in the last 3h0m0s/);
    assert.deepEqual(em.stats().rateLimitRefusals, { newCerts: 2, orders: 1 });
    clock.advance(540_000);
    assert.equal((await get(em.address, certPath(C))).status, 429, 'orders per account still used up');
  });

  test('the flags parse COUNT/WINDOW and refuse anything else', () => {
    const parsed = parseEmulatorArgs(['--limit-new-certs', '50/168h', '--limit-orders', '300/3h']);
    assert.ok(!parsed.help);
    assert.deepEqual(parsed.options.limits, {
      newCertsPerRegisteredDomain: { count: 50, windowMs: 168 * 3_600_000 },
      ordersPerAccount: { count: 300, windowMs: 3 * 3_600_000 },
    });
    assert.throws(() => parseEmulatorArgs(['--limit-new-certs', '0/1h']), /--limit-new-certs: "0\/1h" needs a COUNT of at least 1/);
    assert.throws(() => parseEmulatorArgs(['--limit-orders', 'abc']), /--limit-orders: "abc" is not COUNT\/WINDOW/);
  });
});
