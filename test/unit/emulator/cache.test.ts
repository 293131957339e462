import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { certPath, fakeClock, get, splitPair, testEnv, waitEvent, type TestEnv } from '../../support/emulator.ts';
import type { Emulator } from '../../../src/emulator/server.ts';
import type { IssuedEvent } from '../../../src/emulator/issuer.ts';

const D = 'web.tailnet-1234.ts.net';
const DAY = 86_400_000;

async function serial(em: Emulator, minValidity = '0s', domain = D): Promise<string> {
  const r = await get(em.address, certPath(domain, minValidity));
  assert.equal(r.status, 200, r.body);
  return splitPair(r.body).certs[0]!.serialNumber;
}

describe('issuance cache (tailscaled policy)', () => {
  let env: TestEnv;
  before(async () => {
    env = await testEnv();
  });
  after(() => env.cleanup());

  test('a second call returns the cached pair: same serial, no new issuance', async () => {
    const clock = fakeClock();
    const em = await env.start({ domains: [D], clock, certLifetimeMs: 90 * DAY });
    const s1 = await serial(em);
    clock.advance(10 * DAY);
    const s2 = await serial(em);
    assert.equal(s2, s1);
    assert.equal(em.stats().issuances[D], 1);
    assert.equal(em.stats().certRequests[D], 2);
  });

  test('min_validity above the remaining validity forces a synchronous re-issue', async () => {
    const clock = fakeClock();
    const em = await env.start({ domains: [D], clock, certLifetimeMs: 90 * DAY });
    const s1 = await serial(em);
    clock.advance(40 * DAY); // about 50 days left
    assert.equal(await serial(em, '720h'), s1, '30 days wanted, 50 left: cached');
    const s2 = await serial(em, `${60 * 24}h`);
    assert.notEqual(s2, s1, '60 days wanted, 50 left: re-issued');
    assert.equal(em.stats().issuances[D], 2);
    // With min_validity set, the 2/3 rule does not apply (tailscaled checks only min_validity then).
    clock.advance(70 * DAY);
    assert.equal(await serial(em, '1h'), s2);
    assert.equal(em.stats().issuances[D], 2);
  });

  test('past 2/3 of the lifetime: the cached pair is returned and renewed in the background', async () => {
    const clock = fakeClock();
    const em = await env.start({ domains: [D], clock, certLifetimeMs: 90_000 }); // 90 s, not backdated
    const s1 = await serial(em);
    clock.advance(59_000);
    assert.equal(await serial(em), s1, 'before 2/3: cached');
    assert.equal(em.stats().issuances[D], 1);
    clock.advance(2_000); // 61 s of 90: past 2/3
    const renewed = waitEvent<IssuedEvent>(em, 'issued', (e) => e.trigger === 'background');
    assert.equal(await serial(em), s1, 'tailscaled answers with the current pair and renews asynchronously');
    const event = await renewed;
    await em.idle();
    assert.equal(em.stats().issuances[D], 2);
    assert.equal(await serial(em), event.serial, 'the next call gets the renewed pair');
    assert.equal(em.stats().issuances[D], 2);
  });

  test('asyncRenewal: false renews synchronously past 2/3', async () => {
    const clock = fakeClock();
    const em = await env.start({ domains: [D], clock, certLifetimeMs: 90_000, asyncRenewal: false });
    const s1 = await serial(em);
    clock.advance(61_000);
    const s2 = await serial(em);
    assert.notEqual(s2, s1);
    assert.equal(em.stats().issuances[D], 2);
  });

  test('an expired cached pair is replaced synchronously', async () => {
    const clock = fakeClock();
    const em = await env.start({ domains: [D], clock, certLifetimeMs: 10_000 });
    const s1 = await serial(em);
    clock.advance(10_001);
    const s2 = await serial(em);
    assert.notEqual(s2, s1);
    assert.equal(em.stats().issuances[D], 2);
  });

  test('concurrent requests share the one issuance in flight', async () => {
    const clock = fakeClock();
    const em = await env.start({ domains: [D, 'other.tailnet-1234.ts.net'], clock, certLifetimeMs: 90 * DAY });
    const serials = await Promise.all([...Array.from({ length: 8 }, () => serial(em)), serial(em, '0s', 'other.tailnet-1234.ts.net')]);
    assert.equal(new Set(serials.slice(0, 8)).size, 1);
    assert.deepEqual(em.stats().issuances, { [D]: 1, 'other.tailnet-1234.ts.net': 1 });
    // Synchronous renewals requested concurrently also share one issuance.
    clock.advance(40 * DAY);
    const forced = await Promise.all(Array.from({ length: 5 }, () => serial(em, `${60 * 24}h`)));
    assert.equal(new Set(forced).size, 1);
    assert.notEqual(forced[0], serials[0]);
    assert.equal(em.stats().issuances[D], 2);
  });

  test('min_validity longer than the lifetime re-issues on every call (the rate-limit trap)', async () => {
    const em = await env.start({ domains: [D], certLifetimeMs: 7 * DAY });
    const a = await serial(em, '720h');
    const b = await serial(em, '720h');
    assert.notEqual(a, b);
    assert.equal(em.stats().issuances[D], 2);
  });

  test('the ledger gets one JSON line per real issuance; several emulators share it', async () => {
    const ledgerPath = join(env.dir, 'ledger.jsonl');
    const clock = fakeClock();
    const e1 = await env.start({ domains: [D], clock, ledgerPath, id: 'emu-one', certLifetimeMs: 90 * DAY });
    const e2 = await env.start({ domains: [D], clock, ledgerPath, id: 'emu-two', certLifetimeMs: 90 * DAY });
    const s1 = await serial(e1);
    await serial(e1); // cached: no line
    e1.injectFault('cert:rate_limit_429');
    assert.equal((await get(e1.address, certPath(D))).status, 429); // faulted: no line
    const s2 = await serial(e2);
    const lines = (await readFile(ledgerPath, 'utf8'))
      .trimEnd()
      .split('\n')
      .map((l) => JSON.parse(l));
    assert.equal(lines.length, 2);
    assert.deepEqual(
      lines.map((l) => [l.emulator, l.domain, l.serial]),
      [
        ['emu-one', D, s1],
        ['emu-two', D, s2],
      ],
    );
    for (const l of lines) {
      assert.equal(l.time, new Date(clock.now()).toISOString());
      assert.equal(l.notBefore, new Date(clock.now() - 60_000).toISOString());
      assert.equal(l.notAfter, new Date(clock.now() - 60_000 + 90 * DAY).toISOString());
      assert.deepEqual(Object.keys(l).sort(), ['domain', 'emulator', 'notAfter', 'notBefore', 'serial', 'time']);
    }
  });
});
