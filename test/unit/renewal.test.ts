import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { CertInfo } from '../../src/core/certificates/certificate.ts';
import { isRenewalDue, minValidityFor, nextCheckTime, renewalTime, tooShortReason } from '../../src/core/renewal/renewal.ts';

const DAY = 86_400_000;
const policy = { renewFraction: 1 / 3, checkIntervalMs: DAY };
const cert = (notBefore: number, lifetime: number): CertInfo => ({
  domain: 'a.b',
  notBefore,
  notAfter: notBefore + lifetime,
  serial: '01',
  fingerprint256: '',
});

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

  it('asks tailscaled for the renewal share of the lifetime so its cache renews too', () => {
    assert.equal(minValidityFor(undefined, 0, policy), 0);
    const asked = minValidityFor(cert(0, 90 * DAY), 60 * DAY, policy);
    assert.ok(asked > 30 * DAY && asked < 31 * DAY);
  });

  it('measures from when the certificate was obtained, not from a backdated notBefore', () => {
    // 45 s valid when obtained, notBefore 60 s back: due after 22.5 s, not at once.
    const held = { notBefore: 0, notAfter: 105_000, obtainedAt: 60_000 };
    assert.equal(isRenewalDue(held, 60_000, policy), false);
    assert.equal(renewalTime(held, policy), 82_500);
    assert.equal(isRenewalDue({ notBefore: 0, notAfter: 105_000 }, 60_000, policy), true, 'without obtainedAt: from notBefore');
  });

  it('never asks for more validity than a fresh certificate from this issuer has', () => {
    const held = { notBefore: 0, notAfter: 105_000, obtainedAt: 60_000 };
    const asked = minValidityFor(held, 82_500, policy);
    assert.ok(asked > 22_500, 'more than the held certificate still has');
    assert.ok(asked <= 45_000, 'no more than a fresh one has');
    assert.ok(minValidityFor(cert(0, 90 * DAY), 60 * DAY, policy, 6 * DAY) <= 6 * DAY, 'capped by the shortest fresh validity seen');
  });

  it('calls a certificate too short when it has less than asked, or is due sooner than the minimum interval', () => {
    const asked = { minValidityMs: 30_000, minIssueIntervalMs: 10_000 };
    assert.match(tooShortReason({ notBefore: 0, notAfter: 80_000 }, 60_000, policy, asked) ?? '', /less than the 30000 ms asked/);
    assert.match(
      tooShortReason({ notBefore: 60_000, notAfter: 75_000 }, 60_000, policy, { minValidityMs: 0, minIssueIntervalMs: 10_000 }) ?? '',
      /sooner than the 10000 ms minimum/,
    );
    assert.equal(tooShortReason({ notBefore: 0, notAfter: 105_000 }, 60_000, policy, asked), undefined);
  });
});
