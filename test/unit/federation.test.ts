// The federation home's first pieces (src/core/federation/home-verdicts.ts): the safety point of a home outage, the
// member's verdict while the home is away, and which copy wins when it is back.
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { describe, it } from 'node:test';
import { loadAll } from 'js-yaml';
import {
  breakGlassPoint,
  breakGlassSpent,
  formatBreakGlassRecord,
  homeOutageVerdict,
  parseBreakGlassRecord,
  reconcile,
  unbelievedClaims,
  windowClaimable,
} from '../../src/core/federation/home-verdicts.ts';
import { renewalTime, rotationExitTime } from '../../src/core/renewal/renewal.ts';
import { breakGlassClaimNames } from '../../src/kube/break-glass-claim.ts';

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

  it('serves the local copy before it, issues once from it, never twice in its window', () => {
    const held = { serial: 'A1', notBefore: T0, notAfter: T0 + 90 * DAY };
    const at = breakGlassPoint(held, policy, LEAD);
    assert.deepEqual(homeOutageVerdict({ held, now: T0 + 61 * DAY, policy, readinessLeadMs: LEAD }), { kind: 'serve', until: at });
    assert.deepEqual(homeOutageVerdict({ held, now: at, policy, readinessLeadMs: LEAD }), { kind: 'break_glass' });
    const spent = { serial: 'B9', window: 'A1' };
    assert.deepEqual(homeOutageVerdict({ held, now: at, policy, readinessLeadMs: LEAD, breakGlass: spent }), { kind: 'broken', serial: 'B9' });
    assert.deepEqual(homeOutageVerdict({ held: undefined, now: T0, policy, readinessLeadMs: LEAD }), { kind: 'break_glass' }, 'nothing to serve');
  });

  it('a later window has its own one: the break-glass certificate itself (adopted everywhere or not), or the home copy', () => {
    const record = { serial: 'B9', window: 'A1' };
    const bg = { serial: 'B9', notBefore: T0 + 75 * DAY, notAfter: T0 + 165 * DAY };
    const at = breakGlassPoint(bg, policy, LEAD);
    assert.deepEqual(homeOutageVerdict({ held: bg, now: at - 1, policy, readinessLeadMs: LEAD, breakGlass: record }), { kind: 'serve', until: at });
    assert.deepEqual(homeOutageVerdict({ held: bg, now: at, policy, readinessLeadMs: LEAD, breakGlass: record }), { kind: 'break_glass' });
    // Its copy expired: the window it had no valid copy in is spent only when the record says so.
    const expired = { ...bg, notAfter: at };
    assert.deepEqual(homeOutageVerdict({ held: expired, now: at, policy, readinessLeadMs: LEAD, breakGlass: record }), { kind: 'break_glass' });
    const none = { serial: 'C3', window: null };
    assert.deepEqual(homeOutageVerdict({ held: undefined, now: at, policy, readinessLeadMs: LEAD, breakGlass: none }), { kind: 'broken', serial: 'C3' });
    // Issued with no copy held, then expired while still cut off: that certificate's own window is a new one.
    const c3 = { serial: 'C3', notBefore: at, notAfter: at + 90 * DAY };
    const later = c3.notAfter + MIN;
    assert.deepEqual(homeOutageVerdict({ held: c3, now: later, policy, readinessLeadMs: LEAD, breakGlass: none }), { kind: 'break_glass' });
    // A record of before windows were named (issue 40: the serial alone) stands while its certificate is held.
    const legacy = { serial: 'B9', window: undefined };
    assert.deepEqual(homeOutageVerdict({ held: bg, now: at, policy, readinessLeadMs: LEAD, breakGlass: legacy }), { kind: 'broken', serial: 'B9' });
  });

  it('reads and writes the record, and takes nothing else for one', () => {
    assert.equal(formatBreakGlassRecord({ serial: '1B6474B1', window: '0A' }), '1B6474B1 replacing 0A');
    assert.deepEqual(parseBreakGlassRecord('1B6474B1 replacing 0A'), { serial: '1B6474B1', window: '0A' });
    assert.deepEqual(parseBreakGlassRecord('1B6474B1 replacing none'), { serial: '1B6474B1', window: null });
    assert.deepEqual(parseBreakGlassRecord('1B6474B1'), { serial: '1B6474B1', window: undefined });
    for (const garbage of [undefined, '', 'x', '1B replacing', '1B replacing 0A extra', `${'A'.repeat(41)} replacing 0A`, ' 1B', '1b'])
      assert.equal(parseBreakGlassRecord(garbage), undefined, String(garbage));
    assert.equal(breakGlassSpent(undefined, 'A1'), false);
    assert.equal(breakGlassSpent({ serial: 'B9', window: 'A1' }, 'A1'), true);
    assert.equal(breakGlassSpent({ serial: 'B9', window: 'A1' }, 'B9'), false);
    assert.equal(breakGlassSpent({ serial: 'B9', window: null }, undefined), true);
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

describe("a member's break-glass claims (src/kube/break-glass-claim.ts)", () => {
  it('names each window two Leases of at most 50 characters, certshare-*, whatever the length of the group, name and serial', () => {
    const serial = 'F'.repeat(40);
    const domain = `${'a'.repeat(63)}.${'b'.repeat(63)}.${'c'.repeat(63)}.ts.net`;
    const { first, last } = breakGlassClaimNames('g'.repeat(63), domain, serial);
    assert.equal(last, `${first}-2`);
    for (const name of [first, last]) {
      assert.match(name, /^certshare-glass-[0-9a-f]{32}(-2)?$/, 'a DNS subdomain, named as the sidecar may create (certshare-*)');
      assert.ok(name.length <= 50);
    }
  });

  it("names them as certshare-break-glass-claims keys on (manifests/base), and a group's Lease never so", async () => {
    const docs = loadAll(await readFile(new URL('../../manifests/base/admission-policy.yaml', import.meta.url), 'utf8')) as Array<{
      kind: string;
      metadata: { name: string };
      spec?: { matchConditions?: Array<{ expression: string }> };
    }>;
    const policy = docs.find((d) => d.kind === 'ValidatingAdmissionPolicy' && d.metadata.name === 'certshare-break-glass-claims');
    const expression = policy?.spec?.matchConditions?.map((c) => c.expression).join(' && ') ?? '';
    // The label alone, which whoever may create a Lease writes, froze a group's Lease (on cd68f49).
    const pattern = /^oldObject\.metadata\.name\.matches\('([^']+)'\)$/.exec(expression)?.[1];
    assert.ok(pattern, `the policy keys on a claim's name, not on its label alone: ${expression || 'no matchConditions'}`);
    const claimName = new RegExp(pattern);
    const { first, last } = breakGlassClaimNames('proxy', 'a.ts.net', 'AB');
    for (const name of [first, last, ...Object.values(breakGlassClaimNames('proxy', 'a.ts.net', null))]) assert.match(name, claimName);
    for (const lease of ['certshare-proxy', 'certshare-glass', 'certshare-glass-proxy', `${first}-3`, `x${first}`]) assert.doesNotMatch(lease, claimName);
  });

  it('claims no window older than one claimed or issued past (a pair put back), nor none after a claim (a Secret emptied)', () => {
    const replaced = T0 + 90 * DAY;
    const issued = T0 + 150 * DAY;
    // 90-day copies, looked at inside their window.
    const copy = (notAfter: number) => ({ notBefore: notAfter - 90 * DAY, notAfter });
    // Claims created as it looks (their creation bounds nothing more than now does).
    const claimable = (notAfter: number | undefined, claims: Array<number | undefined>) => {
      const now = (notAfter ?? replaced) - 10 * DAY;
      return windowClaimable(
        notAfter === undefined ? undefined : copy(notAfter),
        claims.map((recorded) => ({ recorded, created: now })),
        now,
      );
    };
    assert.equal(claimable(replaced, []), true, 'the first claim of a name');
    assert.equal(claimable(undefined, []), true, 'no copy, no claim yet: a member that never held one');
    assert.equal(claimable(replaced, [replaced]), true, "its own window again (a successor): the claim's name decides");
    assert.equal(claimable(replaced, [replaced, issued]), false, 'the replaced pair put back once the window closed');
    assert.equal(claimable(replaced - 30 * DAY, [replaced]), false, 'a pair of an earlier window, kept and put back');
    assert.equal(claimable(issued, [replaced, issued]), true, "the break-glass certificate's own window");
    assert.equal(claimable(issued + DAY, [replaced, issued]), true, 'a newer copy (the home back, then cut off again)');
    assert.equal(claimable(undefined, [undefined]), false, 'no copy after a claim of none');
    assert.equal(claimable(replaced, [undefined]), true, 'a claim recording nothing (of none, or not a time) bounds no window');
    // A claim written by hand (any Lease creator may): a time no stored certificate can have is no claim.
    assert.equal(claimable(replaced, [Date.UTC(9999, 11, 31)]), true, 'a claim dated 9999 switches nothing off');
    const now = replaced - 10 * DAY;
    assert.equal(claimable(replaced, [now + 90 * DAY]), false, 'one lifetime from now: a certificate a member may have stored');
    assert.equal(claimable(replaced, [now + 91 * DAY]), true, 'past one lifetime (and the skew) from now: ignored');
  });

  it('tells exactly the claims it ignores, as values out of their bound (counted, logged, an Event)', () => {
    const replaced = T0 + 90 * DAY;
    const now = replaced - 10 * DAY;
    const held = { notBefore: replaced - 90 * DAY, notAfter: replaced };
    const hand = Date.UTC(9999, 11, 31);
    const read = (recorded: number | undefined) => ({ recorded, created: now });
    const refused = unbelievedClaims(held, [replaced, undefined, now + 90 * DAY, hand, now + 91 * DAY].map(read), now);
    assert.deepEqual(
      refused.map((r) => [r.field, r.value]),
      [
        ['break-glass-claim', new Date(hand).toISOString()],
        ['break-glass-claim', new Date(now + 91 * DAY).toISOString()],
      ],
    );
    assert.ok(
      refused.every((r) => r.why.includes(new Date(now + 90 * DAY + 30_000).toISOString())),
      'the bound it was held to',
    );
    assert.deepEqual(unbelievedClaims(undefined, [read(hand)], now), [], 'without a copy every claim counts (a Secret emptied): none ignored');
  });

  it("believes a claim's time only up to one lifetime from its creation: claims dated ahead, written once, never come due", () => {
    // 90-day copies. Whoever may create a Lease writes, on one day, claims dated a lifetime apart for years ahead.
    const written = T0;
    const mines = Array.from({ length: 40 }, (_, i) => ({ recorded: written + (i + 3) * 45 * DAY, created: written }));
    for (const renewed of [written + 60 * DAY, written + 400 * DAY, written + 1500 * DAY]) {
      const held = { notBefore: renewed, notAfter: renewed + 90 * DAY };
      const now = renewed + 75 * DAY;
      assert.equal(windowClaimable(held, mines, now), true, `a copy issued ${(renewed - written) / DAY} days after them (1043d72: not one window claimable)`);
      assert.equal(unbelievedClaims(held, mines, now).length, 40, 'each told as a value out of its bound');
    }
    // A claim speaks of a certificate that existed when it was created: one lifetime (and the skew) from then.
    const held = { notBefore: written - 80 * DAY, notAfter: written + 10 * DAY };
    const late = written + 30 * DAY;
    assert.equal(windowClaimable(held, [{ recorded: written + 90 * DAY, created: written }], late), false, 'a certificate stored at its creation');
    assert.equal(windowClaimable(held, [{ recorded: written + 91 * DAY, created: written }], late), true, 'later than any it could have stored');
    assert.equal(windowClaimable(held, [{ recorded: late + 91 * DAY, created: late + DAY }], late), true, 'a creation after now counts as now');
  });

  it('gives no two windows, names or groups one name; no copy (none) is a window of its own', () => {
    const names = [
      breakGlassClaimNames('proxy', 'a.ts.net', 'AB'),
      breakGlassClaimNames('proxy', 'a.ts.net', 'ABC'),
      breakGlassClaimNames('proxy', 'a.ts.net', null),
      breakGlassClaimNames('proxy', 'b.ts.net', 'AB'),
      breakGlassClaimNames('proxy2', 'a.ts.net', 'AB'),
      // The separator keeps the parts apart: group `proxy` and name `a.ts.net` are not `proxya` and `.ts.net`.
      breakGlassClaimNames('proxya', '.ts.net', 'AB'),
    ].map((n) => n.first);
    assert.equal(new Set(names).size, names.length);
    assert.deepEqual(breakGlassClaimNames('proxy', 'a.ts.net', 'AB'), breakGlassClaimNames('proxy', 'a.ts.net', 'AB'), 'the same window, the same claim');
  });
});
