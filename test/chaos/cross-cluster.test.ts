// The cross-cluster check of invariant 2 (cross-cluster.ts): when a member's expired copy was needless.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { needlessExpiry, strandedIn, type ExpiredCopyFacts } from './cross-cluster.ts';
import type { CertRequest, Issuance } from './ledger.ts';

const S = 1000;
// A 20 s certificate: renewal point at +10 s, expired at +20 s; the checker's grace 2 s.
const files = { serial: 'AAAA0001', notBefore: 0, notAfter: 20 * S, keyMatch: true };
const valid = { serial: 'BBBB0002', since: 12 * S };
const request = (time: number, outcome = '500'): CertRequest => ({ time, end: time + 10, emulator: 'c2-proxy-0', domain: 'd', minValidity: '', outcome });
const issuance = (time: number): Issuance => ({
  time,
  emulator: 'c2-proxy-0',
  domain: 'd',
  serial: 'CCCC0003',
  notBefore: time,
  notAfter: time + 20 * S,
  trigger: 'request',
});
const facts = (over: Partial<ExpiredCopyFacts>): ExpiredCopyFacts => ({
  now: 30 * S,
  graceMs: 2 * S,
  files,
  from: 20 * S,
  link: { open: true, since: 0 },
  writerSince: 0,
  noticeMs: 0,
  home: undefined,
  elsewhere: undefined,
  requests: [],
  issuances: [],
  ...over,
});

describe('invariant 2 across the clusters: an expired copy a member need not hold', () => {
  it('its way to the home open: the home held a valid pair for more than two graces', () => {
    const home = { where: 'home', ...valid };
    assert.match(needlessExpiry(facts({ home, elsewhere: home })) ?? '', /Secret at home holds valid serial BBBB0002/);
    assert.equal(needlessExpiry(facts({ home, now: 23 * S })), undefined, 'within two graces of its landing');
    assert.equal(needlessExpiry(facts({ home, link: { open: true, since: 27 * S } })), undefined, 'within two graces of the reconnection');
    // Only its writer mirrors the home's pair: none while its writers are killed, two graces from the takeover.
    assert.equal(needlessExpiry(facts({ home, writerSince: undefined })), undefined, 'no writer');
    assert.equal(needlessExpiry(facts({ home, writerSince: 27 * S })), undefined, 'within two graces of the takeover');
  });

  it('its way to the home open, a valid pair only at a member cut off from the home: nothing it could have had', () => {
    assert.equal(needlessExpiry(facts({ elsewhere: { where: 'c1', ...valid } })), undefined);
  });

  it('cut off, and no CertPair call since the renewal point while another cluster holds a valid pair: the break-glass never tried (issue 40)', () => {
    const text = needlessExpiry(facts({ link: { open: false, since: 5 * S }, elsewhere: { where: 'home', ...valid }, requests: [request(4 * S)] }));
    assert.match(text ?? '', /made no CertPair call since/);
  });

  it('cut off without a writer, or one that took over within two graces: nobody could have called yet', () => {
    const cut = { link: { open: false, since: 5 * S }, elsewhere: { where: 'home', ...valid } };
    assert.equal(needlessExpiry(facts({ ...cut, writerSince: undefined })), undefined);
    assert.equal(needlessExpiry(facts({ ...cut, writerSince: 29 * S })), undefined);
    assert.match(needlessExpiry(facts({ ...cut, writerSince: 25 * S })) ?? '', /made no CertPair call/);
  });

  it('cut off after its copy expired: a request timeout to learn of the cut, then two graces', () => {
    const cut = { link: { open: false, since: 22 * S }, elsewhere: { where: 'home', ...valid }, noticeMs: 5 * S };
    assert.equal(needlessExpiry(facts({ ...cut, now: 30 * S })), undefined);
    assert.match(needlessExpiry(facts({ ...cut, now: 32 * S })) ?? '', /made no CertPair call/);
  });

  it('cut off, its CA refused every call since the renewal point: the CA, not the member', () => {
    assert.equal(
      needlessExpiry(facts({ link: { open: false, since: 5 * S }, elsewhere: { where: 'home', ...valid }, requests: [request(15 * S)] })),
      undefined,
    );
  });

  it('cut off, its CA issued a valid pair that never reached the files within two graces', () => {
    const f = facts({ link: { open: false, since: 5 * S }, requests: [request(21 * S, '200')], issuances: [issuance(21 * S)] });
    assert.match(needlessExpiry(f) ?? '', /its member's CA issued serial CCCC0003/);
    assert.equal(needlessExpiry({ ...f, now: 24 * S }), undefined, 'within two graces of the issuance');
  });
});

describe('a certificate stranded in a member cut off from the home (invariant 1 across the clusters)', () => {
  // Seed 53: c1's writer obtained its renewal 0.9 s after its member was cut off, stored it in c1 only; the home's
  // copy ran out and c3's writer renewed for the others, inside the stranded one's window.
  const cover: Issuance = { ...issuance(4 * S), emulator: 'c1-proxy-1', serial: '6534F386' };
  const extra: Issuance = { ...issuance(13 * S), emulator: 'c3-proxy-0', serial: '591ADE90' };
  const cut = (from: number, to: number) => (member: number, t: number) =>
    member === 0 && t >= from && t < to ? { open: false, since: from } : { open: true, since: t >= to ? to : 0 };

  it("excuses the other member's renewal while the cut lasts from the issuance until it", () => {
    assert.match(strandedIn(cover, 0, extra, 2, cut(3 * S, 19 * S), 2 * S) ?? '', /member c1 cut off from the home from \S+ until after/);
    // Cut within the grace after the CA answered (the write to the home under way).
    assert.ok(strandedIn(cover, 0, extra, 2, cut(5 * S, 19 * S), 2 * S));
  });

  it('counts it when the certificate could have been known: the member back before, cut later, or the same member', () => {
    assert.equal(strandedIn(cover, 0, extra, 2, cut(3 * S, 10 * S), 2 * S), undefined, 'back before the renewal');
    assert.equal(strandedIn(cover, 0, extra, 2, cut(7 * S, 19 * S), 2 * S), undefined, 'cut after the grace: it had its time to push');
    assert.equal(strandedIn(cover, 0, { ...extra, emulator: 'c1-proxy-0' }, 0, cut(3 * S, 19 * S), 2 * S), undefined, 'its own member knows it');
    assert.equal(strandedIn(cover, undefined, extra, 2, cut(3 * S, 19 * S), 2 * S), undefined, 'not federated');
  });
});
