import { test } from 'node:test';
import assert from 'node:assert/strict';
import { NotifyMask } from '../../../src/core/ports/localapi.ts';
import { NETMAP_WATCH_MASK, STATUS_WATCH_MASK, parseTailscaledVersion, planWatch, refusedBitsIn, releaseFeatures } from '../../../src/localapi/releases.ts';

test('parses the forms of version.Long() and refuses anything else', () => {
  const cases: Array<[string | undefined, [number, number, number] | undefined]> = [
    ['1.104.5', [1, 104, 5]],
    ['1.104.5-t0a1b2c3d4-g5e6f7a8b9', [1, 104, 5]],
    ['1.102.5-dev20260101-t0123456789ab-dirty', [1, 102, 5]],
    ['1.104.5-ERR-BuildInfo', [1, 104, 5]],
    ['1.96.4', [1, 96, 4]],
    [' 1.100.0 ', [1, 100, 0]],
    ['', undefined],
    ['-ERR-BuildInfo', undefined],
    ['1.104', undefined],
    ['latest', undefined],
    [undefined, undefined],
  ];
  for (const [text, want] of cases) {
    const v = parseTailscaledVersion(text);
    assert.deepEqual(v && [v.major, v.minor, v.patch], want, String(text));
  }
});

test('the mask each release accepts, and where the first Notify carries the domains', () => {
  // version → [mask, initial domains]; every mask here is one the release accepts (see the emulator's bus test).
  const table: Array<[string | undefined, number, 'InitialStatus' | 'NetMap']> = [
    [undefined, STATUS_WATCH_MASK, 'InitialStatus'], // unknown: the one mask every release accepts
    ['garbage', STATUS_WATCH_MASK, 'InitialStatus'],
    ['1.105.0-dev20261101-t0123', STATUS_WATCH_MASK, 'InitialStatus'],
    ['1.104.5', STATUS_WATCH_MASK, 'InitialStatus'],
    ['1.104.0', STATUS_WATCH_MASK, 'InitialStatus'],
    ['1.103.0-pre', STATUS_WATCH_MASK, 'InitialStatus'],
    ['1.102.5', STATUS_WATCH_MASK, 'InitialStatus'],
    ['1.100.0', STATUS_WATCH_MASK, 'InitialStatus'],
    ['1.98.10', NETMAP_WATCH_MASK, 'NetMap'],
    ['1.98.0', NETMAP_WATCH_MASK, 'NetMap'],
    ['1.96.5', NETMAP_WATCH_MASK, 'NetMap'],
    ['1.90.0', NETMAP_WATCH_MASK, 'NetMap'],
  ];
  for (const [version, mask, initialDomains] of table) {
    const plan = planWatch(parseTailscaledVersion(version));
    assert.equal(plan.mask, mask, `${version}: mask`);
    assert.equal(plan.initialDomains, initialDomains, `${version}: initial domains`);
  }
  assert.equal(STATUS_WATCH_MASK, 16402);
  assert.equal(NETMAP_WATCH_MASK, 282);
  // 1.104 refuses the obsolete bits: never in a mask chosen for it.
  assert.equal(planWatch(parseTailscaledVersion('1.104.5')).mask & (NotifyMask.InitialNetMap | NotifyMask.RateLimit), 0);
  // 1.102 refuses RateLimit beside InitialStatus: never both.
  const m102 = planWatch(parseTailscaledVersion('1.102.5')).mask;
  assert.ok(!((m102 & NotifyMask.RateLimit) !== 0 && (m102 & NotifyMask.InitialStatus) !== 0));
});

test('refused bits change the plan: RateLimit dropped first, InitialNetMap refused means InitialStatus', () => {
  const old = parseTailscaledVersion('1.98.10');
  assert.equal(planWatch(old, NotifyMask.RateLimit).mask, NETMAP_WATCH_MASK & ~NotifyMask.RateLimit);
  assert.equal(planWatch(old, NotifyMask.RateLimit).initialDomains, 'NetMap');
  assert.equal(planWatch(old, NotifyMask.InitialNetMap).mask, STATUS_WATCH_MASK);
  assert.equal(planWatch(old, NotifyMask.InitialNetMap | NotifyMask.RateLimit).mask, STATUS_WATCH_MASK);
  assert.equal(planWatch(parseTailscaledVersion('1.104.5'), NotifyMask.RateLimit).mask, STATUS_WATCH_MASK);
});

test('the bits a watch-ipn-bus 400 names (texts of tailscale.com ipn/backend.go)', () => {
  const cases: Array<[string, number]> = [
    ['the NotifyRateLimit IPN bus subscription bit is no longer supported', NotifyMask.RateLimit],
    ['the NotifyInitialNetMap IPN bus subscription bit is no longer supported; seed from NotifyInitialStatus instead', NotifyMask.InitialNetMap],
    ['NotifyRateLimit is incompatible with new-style IPN bus subscription bits ipn.NotifyInitialStatus', NotifyMask.RateLimit],
    ['NotifyInProcessNoDisconnect is only valid for in-process IPN bus subscribers', 0],
    ['bad mask', 0],
    ['watch ipn bus access denied', 0],
  ];
  for (const [body, bits] of cases) assert.equal(refusedBitsIn(body), bits, body);
});

test('release features follow the source thresholds', () => {
  const f = (v: string) => releaseFeatures(parseTailscaledVersion(v));
  assert.deepEqual(f('1.96.5'), {
    selfChange: false,
    certDomainsEndpoint: false,
    initialStatus: false,
    resendsNetMap: true,
    netMapField: true,
    validatesMask: false,
    refusesObsoleteBits: false,
    capabilityVersion: 133,
  });
  // tailcfg.CurrentCapabilityVersion per release line (tailcfg/tailcfg.go).
  assert.deepEqual(
    ['1.96.0', '1.98.10', '1.100.0', '1.102.5', '1.104.5', '1.90.0'].map((v) => f(v).capabilityVersion),
    [133, 138, 141, 142, 148, 133],
  );
  assert.equal(f('1.98.0').certDomainsEndpoint, true);
  assert.equal(f('1.98.0').selfChange, true);
  assert.equal(f('1.98.10').initialStatus, false);
  assert.equal(f('1.100.0').initialStatus, true);
  assert.equal(f('1.100.0').resendsNetMap, false);
  assert.equal(f('1.100.0').validatesMask, false);
  assert.equal(f('1.102.0').validatesMask, true);
  assert.equal(f('1.102.5').refusesObsoleteBits, false);
  assert.equal(f('1.104.0').refusesObsoleteBits, true);
  assert.equal(f('1.104.0').netMapField, false);
});
