// The federation home's first pieces (src/core/federation/home-verdicts.ts): the safety point of a home outage, the
// member's verdict while the home is away, and which copy wins when it is back.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { breakGlassPoint, homeOutageVerdict, reconcile } from '../../src/core/federation/home-verdicts.ts';
import { renewalTime, rotationExitTime } from '../../src/core/renewal/renewal.ts';

const MIN = 60_000;
const DAY = 86_400_000;
const T0 = Date.UTC(2026, 10, 1);
const policy = { renewFraction: 1 / 3 };
const LEAD = MIN;

describe('the safety point of a home outage', () => {
  it('lies halfway from the renewal point to the readiness exit', () => {
    const ninety = { notBefore: T0, notAfter: T0 + 90 * DAY };
    assert.equal(renewalTime(ninety, policy), T0 + 60 * DAY);
    assert.equal(breakGlassPoint(ninety, policy, LEAD), T0 + 75 * DAY - MIN / 2, 'about 15 days before expiry');
    const six = { notBefore: T0, notAfter: T0 + 6 * DAY };
    assert.equal(breakGlassPoint(six, policy, LEAD), T0 + 4.5 * DAY - MIN / 2, 'a day and a half before expiry (renewed at half)');
    // A long lead is bounded by the renewal margin (rotationExitTime): the point stays after the renewal point.
    const lead = 40 * DAY;
    const exit = rotationExitTime(ninety, policy, lead);
    assert.ok(breakGlassPoint(ninety, policy, lead) > renewalTime(ninety, policy));
    assert.ok(breakGlassPoint(ninety, policy, lead) < exit);
  });

  it('serves the local copy before it, issues once from it, never twice', () => {
    const held = { notBefore: T0, notAfter: T0 + 90 * DAY };
    const at = breakGlassPoint(held, policy, LEAD);
    assert.deepEqual(homeOutageVerdict({ held, now: T0 + 61 * DAY, policy, readinessLeadMs: LEAD }), { kind: 'serve', until: at });
    assert.deepEqual(homeOutageVerdict({ held, now: at, policy, readinessLeadMs: LEAD }), { kind: 'break_glass' });
    assert.deepEqual(homeOutageVerdict({ held, now: at, policy, readinessLeadMs: LEAD, breakGlass: { serial: 'bg1' } }), { kind: 'broken', serial: 'bg1' });
    assert.deepEqual(homeOutageVerdict({ held: undefined, now: T0, policy, readinessLeadMs: LEAD }), { kind: 'break_glass' }, 'nothing to serve');
  });
});

describe('reconciliation when the home is back: the newest valid certificate wins', () => {
  const now = T0 + 10 * DAY;
  const cert = (serial: string, notAfter: number, notBefore = T0) => ({ serial, notBefore, notAfter });
  const rows: Array<[string, ReturnType<typeof cert> | undefined, ReturnType<typeof cert> | undefined, string]> = [
    ['the same certificate', cert('a', T0 + 90 * DAY), cert('a', T0 + 90 * DAY), 'in_sync'],
    ['a newer one at home', cert('b', T0 + 95 * DAY), cert('a', T0 + 90 * DAY), 'mirror_to_local'],
    ['a newer one here (break-glass)', cert('a', T0 + 90 * DAY), cert('bg', T0 + 99 * DAY), 'push_to_home'],
    ['nothing at home', undefined, cert('a', T0 + 90 * DAY), 'push_to_home'],
    ['nothing here', cert('a', T0 + 90 * DAY), undefined, 'mirror_to_local'],
    ['an expired one here never wins', cert('a', T0 + 90 * DAY), cert('x', now - 1), 'mirror_to_local'],
    ['an expired one at home never wins', cert('x', now - 1), cert('a', T0 + 90 * DAY), 'push_to_home'],
    ['a not-yet-valid one never wins', cert('a', T0 + 90 * DAY), cert('f', T0 + 200 * DAY, now + DAY), 'mirror_to_local'],
    ['a tie: the home decides', cert('h', T0 + 90 * DAY), cert('l', T0 + 90 * DAY), 'mirror_to_local'],
    ['neither valid', undefined, cert('x', now - 1), 'in_sync'],
  ];
  for (const [name, home, local, expected] of rows) it(name, () => assert.equal(reconcile(home, local, now).kind, expected));
});
