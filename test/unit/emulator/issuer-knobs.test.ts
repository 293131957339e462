// The emulator's knobs for issuers that backdate, give less than asked, or run on a skewed clock.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { checkTrusted, trustAnchors } from '../../../src/core/certificates/trust.ts';
import { parseEmulatorArgs } from '../../../src/emulator/options.ts';
import { createCertificateAuthority } from '../../../src/pki/ca.ts';
import { certPath, fakeClock, get, splitPair, testEnv, type TestEnv } from '../../support/emulator.ts';

const D = 'knobs.tailnet-1234.ts.net';

describe('emulated issuer knobs', () => {
  let env: TestEnv;
  before(async () => {
    env = await testEnv();
  });
  after(() => env.cleanup());

  const leafOf = async (address: string, minValidity = '0s'): Promise<{ notBefore: number; notAfter: number; serial: string }> => {
    const r = await get(address, certPath(D, minValidity));
    assert.equal(r.status, 200, r.body);
    const leaf = splitPair(r.body).certs[0]!;
    return { notBefore: Date.parse(leaf.validFrom), notAfter: Date.parse(leaf.validTo), serial: leaf.serialNumber };
  };

  test('--cert-backdate: notBefore that far back, valid for the lifetime from issuance', async () => {
    const clock = fakeClock();
    const em = await env.start({ domains: [D], clock, certLifetimeMs: 45_000, certBackdateMs: 60_000 });
    const leaf = await leafOf(em.address);
    assert.equal(leaf.notBefore, clock.now() - 60_000);
    assert.equal(leaf.notAfter, clock.now() + 45_000);
  });

  test('--clock-skew: stamped on the CA clock; the cache judges on tailscaled clock (ahead: invalid, so it orders anew)', async () => {
    const clock = fakeClock();
    const behind = await env.start({ domains: [D], clock, certLifetimeMs: 90_000, clockSkewMs: -120_000 });
    const late = await leafOf(behind.address);
    assert.equal(late.notBefore, clock.now() - 120_000);
    assert.equal(late.notAfter, clock.now() - 30_000, 'already expired on tailscaled clock');
    const ahead = await env.start({ domains: [D], clock, certLifetimeMs: 90_000, clockSkewMs: 30_000 });
    const early = await leafOf(ahead.address);
    assert.equal(early.notBefore, clock.now() + 30_000);
    const second = await leafOf(ahead.address);
    assert.notEqual(second.serial, early.serial, 'not valid yet: tailscaled orders again, like validCertPEM');
    clock.advance(30_000);
    assert.equal((await leafOf(ahead.address)).serial, second.serial, 'cached once valid');
    assert.equal(ahead.stats().issuances[D], 2);
  });

  test('--cert-short-by: less validity than min_validity asks for', async () => {
    const clock = fakeClock();
    const em = await env.start({ domains: [D], clock, certLifetimeMs: 86_400_000, certBackdateMs: 0, certShortByMs: 10_000 });
    const first = await leafOf(em.address, '0s');
    assert.equal(first.notAfter, clock.now() + 86_400_000, 'without min_validity: the usual lifetime');
    clock.advance(1000);
    const short = await leafOf(em.address, '24h');
    assert.notEqual(short.serial, first.serial);
    assert.equal(short.notAfter, clock.now() + 86_400_000 - 10_000, '10 s less than asked');
    assert.notEqual((await leafOf(em.address, '24h')).serial, short.serial, 'asking the same again orders again');
    assert.equal((await leafOf(em.address, '12h')).notAfter, clock.now() + 86_400_000 - 10_000, 'less than the cached one has: cached');
    assert.equal(em.stats().issuances[D], 3);
  });

  test('--ca: emulators given one CA sign with it, so one trust anchor covers them all; without, each has its own', async () => {
    const ca = await createCertificateAuthority({ name: 'shared emulator CA', now: Date.now() });
    const file = join(env.dir, 'ca.pem');
    await writeFile(file, ca.certPem + ca.keyPem);
    const parsed = parseEmulatorArgs(['--ca', file]);
    assert.ok(!parsed.help);
    assert.deepEqual(parsed.options.ca, { certPem: ca.certPem, keyPem: ca.keyPem });
    const anchors = trustAnchors([ca.certPem], 'test');
    for (const em of [await env.start({ domains: [D], ca: parsed.options.ca }), await env.start({ domains: [D], ca: parsed.options.ca })]) {
      assert.equal(await em.caCertPem(), ca.certPem);
      checkTrusted(splitPair((await get(em.address, certPath(D, '0s'))).body).certPem, D, anchors);
    }
    const own = await env.start({ domains: [D] });
    assert.notEqual(await own.caCertPem(), ca.certPem);
    await writeFile(file, ca.certPem);
    assert.throws(() => parseEmulatorArgs(['--ca', file]), /--ca: .* needs a PEM CERTIFICATE and a PKCS#8 PRIVATE KEY/);
    assert.throws(() => parseEmulatorArgs(['--ca', join(env.dir, 'absent.pem')]), /--ca: cannot read/);
  });

  test('flags', () => {
    const parsed = parseEmulatorArgs(['--cert-lifetime', '45s', '--cert-backdate', '60s', '--clock-skew=-120s', '--cert-short-by', '5s']);
    assert.ok(!parsed.help);
    assert.equal(parsed.options.certBackdateMs, 60_000);
    assert.equal(parsed.options.clockSkewMs, -120_000);
    assert.equal(parsed.options.certShortByMs, 5_000);
    const ahead = parseEmulatorArgs(['--clock-skew', '+2m']);
    assert.ok(!ahead.help);
    assert.equal(ahead.options.clockSkewMs, 120_000);
    assert.throws(() => parseEmulatorArgs(['--clock-skew', 'soon']), /--clock-skew: invalid duration/);
    assert.throws(() => parseEmulatorArgs(['--cert-backdate=-5s']), /--cert-backdate: invalid duration/);
  });
});
