// The chaos runner's reading of break-glass claims (claimed-windows.ts): a writer that claimed a window and lost
// the certificate before storing it made a break-glass issuance, not a second one in the window; a claim stands
// for exactly one issuance of the claiming process. Seen in a 30-minute run (seed 48): c2-proxy-0 claimed,
// obtained the pair, could not write it (its apiserver restarting) and was killed: counted as an extra issuance.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ClaimedWindows } from './claimed-windows.ts';
import type { Issuance } from './ledger.ts';

const D = 'proxy.tailnet-0000.ts.net';
const issuance = (time: number, serial: string, emulator = 'c2-proxy-0', domain = D): Issuance => ({
  time,
  emulator,
  domain,
  serial,
  notBefore: time,
  notAfter: time + 20_000,
  trigger: 'request',
});

describe('the chaos runner counts a claimed window once', () => {
  it("takes the claiming process's next issuance of the name as that window's break-glass", () => {
    const claims = new ClaimedWindows();
    claims.claimed(1, 'c2-proxy-0', D, '15AF9F03', 1_000);
    assert.equal(claims.take(issuance(500, 'EARLIER')), undefined, 'an issuance before the claim');
    assert.equal(claims.take(issuance(1_200, 'OTHER', 'c2-proxy-1')), undefined, 'another replica');
    assert.equal(claims.take(issuance(1_200, 'OTHER', 'c2-proxy-0', 'other.ts.net')), undefined, 'another name');
    assert.deepEqual(claims.take(issuance(1_500, 'A')), { member: 1, window: '15AF9F03' });
    assert.deepEqual(claims.take(issuance(1_500, 'A')), { member: 1, window: '15AF9F03' }, 'asked again for the same issuance');
    assert.equal(claims.take(issuance(9_000, 'B')), undefined, 'a second issuance of the process: no claim stands for it');
  });

  it('a claim of a process that ended stands for nothing its successor issues', () => {
    const claims = new ClaimedWindows();
    claims.claimed(1, 'c2-proxy-0', D, '15AF9F03', 1_000);
    claims.started('c2-proxy-0', 2_000);
    assert.equal(claims.take(issuance(3_000, 'AFTER-RESTART')), undefined);
    claims.claimed(1, 'c2-proxy-0', D, '15AF9F03', 4_000);
    assert.deepEqual(claims.take(issuance(4_500, 'SUCCESSOR')), { member: 1, window: '15AF9F03' }, "the successor's own claim");
  });
});
