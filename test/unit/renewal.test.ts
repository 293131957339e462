import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { CertInfo } from '../../src/core/certificate.ts';
import { isRenewalDue, minValidityFor, nextCheckTime, renewalTime } from '../../src/core/renewal.ts';

const DAY = 86_400_000;
const policy = { renewFraction: 1 / 3, checkIntervalMs: DAY };
const cert = (notBefore: number, lifetime: number): CertInfo => ({ domain: 'a.b', notBefore, notAfter: notBefore + lifetime, serial: '01', fingerprint256: '' });

describe('renewal decision', () => {
  it('renews a 90-day certificate with 30 days left, not before', () => {
    const info = cert(0, 90 * DAY);
    assert.equal(renewalTime(info, policy), 60 * DAY);
    assert.equal(isRenewalDue(info, 60 * DAY - 1, policy), false);
    assert.equal(isRenewalDue(info, 60 * DAY, policy), true);
  });

  it('follows the actual lifetime (45-day and 6-day certificates), half for short ones', () => {
    assert.equal(renewalTime(cert(0, 45 * DAY), policy), 30 * DAY);
    assert.equal(renewalTime(cert(0, 6 * DAY), policy), 3 * DAY);
    assert.equal(renewalTime(cert(0, 60_000), policy), 30_000);
  });

  it('is due with no certificate at all', () => {
    assert.equal(isRenewalDue(undefined, 0, policy), true);
  });

  it('checks again at the renewal point or the interval, whichever is sooner', () => {
    const info = cert(0, 90 * DAY);
    assert.equal(nextCheckTime(info, 10 * DAY, policy), 11 * DAY);
    assert.equal(nextCheckTime(info, 59.5 * DAY, policy), 60 * DAY);
  });

  it("asks tailscaled for the renewal share of the lifetime so its cache renews too", () => {
    assert.equal(minValidityFor(undefined, policy), 0);
    assert.ok(minValidityFor(cert(0, 90 * DAY), policy) > 30 * DAY);
    assert.ok(minValidityFor(cert(0, 90 * DAY), policy) < 31 * DAY);
  });
});
