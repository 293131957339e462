// The member's judge of the federation home's writer (src/kube/home-writer-judge.ts): when it takes the home Lease
// over (failedHolder), and how it believes the home's intents in a failed window. A CI run at load renewed twice in one
// window: two members took the Lease from each other past the safety point, and the second ignored the first's
// genuine intent, stamped after its own bound.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { CertInfo } from '../../src/core/certificates/certificate.ts';
import { breakGlassPoint, failedWindowIntentBound } from '../../src/core/federation/home-verdicts.ts';
import { intentTtl } from '../../src/core/issuance/issuance-policy.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import type { StoreRead, StoredCert } from '../../src/core/ports/store.ts';
import { LEASE_DURATION_FACTOR } from '../../src/core/values/untrusted-values.ts';
import { HomeWriterJudge } from '../../src/kube/home-writer-judge.ts';
import { FakeClock } from '../support/fake-clock.ts';

const DOMAIN = 'proxy.tailnet-0000.ts.net';
const DAY = 86_400_000;
const renewal = { renewFraction: 1 / 3 };
const readinessLeadMs = 60_000;
const leaseDurationMs = 15_000;
const intentTtlMs = intentTtl(300_000);

/** A 90-day copy 80 days old: past its safety point, before its readiness exit. */
const judgeInfo = (now: number): CertInfo => ({ domain: DOMAIN, notBefore: now - 80 * DAY, notAfter: now + 10 * DAY, serial: 'AA', fingerprint256: '' });

function setup() {
  const clock = new FakeClock();
  const start = clock.now();
  const info = judgeInfo(start);
  const copy: StoredCert = { pair: { certPem: '', keyPem: '' }, info };
  const judge = new HomeWriterJudge({ clock, logger: silentLogger, renewal, readinessLeadMs, leaseDurationMs, intentTtlMs });
  let looks = 0;
  const lease = { look: () => void looks++ };
  const read = (intent?: { holder: string; at: number }): StoreRead => ({ state: 'valid', cert: copy, ...(intent ? { coordination: { intent } } : {}) });
  /** One read of the home as federation-home.ts makes it: judged, then its records bounded. */
  const look = (intent?: { holder: string; at: number }): StoreRead => {
    judge.judge(DOMAIN, { home: read(intent), local: read(), localCopy: copy }, lease);
    return judge.bounded(DOMAIN, read(intent));
  };
  return { clock, info, judge, look, looks: () => looks };
}

describe('the judge of the home writer (HomeWriterJudge)', () => {
  it('past the safety point takes the Lease over, but not from a member whose announced call runs, until its lifetime ends', async () => {
    const { clock, info, judge, look, looks } = setup();
    assert.ok(clock.now() > breakGlassPoint(info, renewal, readinessLeadMs), 'the copy is past its safety point');
    look();
    assert.match(judge.failedHolder() ?? '', /passed its safety point .* with no renewal at the home/);
    assert.equal(looks(), 1, 'newly failed: the Lease looked at at once');
    // West took the Lease over and announced its call: no takeover from it while the call may run.
    const at = clock.now();
    look({ holder: 'west/proxy-0_1', at });
    assert.equal(judge.failedHolder(), undefined, 'west is calling');
    await clock.advance(intentTtlMs - 1);
    look({ holder: 'west/proxy-0_1', at });
    assert.equal(judge.failedHolder(), undefined);
    await clock.advance(1);
    look({ holder: 'west/proxy-0_1', at });
    assert.ok(judge.failedHolder(), "west's call is over, the copy still unrenewed: the holder failed");
  });

  it("knows the home read's call under way as it judges, before the read's records are bounded for the loop", () => {
    // The elector, woken by a newly failed verdict, reads failedHolder while federation-home.ts still mirrors copies.
    const { clock, judge, look } = setup();
    look();
    const { judge: fresh, clock: freshClock } = setup();
    const intent = { holder: 'west/proxy-0_1', at: freshClock.now() };
    const copy = { state: 'valid' as const, cert: { pair: { certPem: '', keyPem: '' }, info: judgeInfo(freshClock.now()) } };
    fresh.judge(DOMAIN, { home: { ...copy, coordination: { intent } }, local: copy, localCopy: copy.cert }, { look: () => {} });
    assert.equal(fresh.failedHolder(), undefined, 'west is calling');
    assert.ok(judge.failedHolder(), `no call announced at ${clock.now()}: the holder failed`);
  });

  it("believes a genuine intent stamped after this member's own takeover, and no thief's re-stamped one past the bound", async () => {
    const { clock, judge, look } = setup();
    const since = clock.now();
    look();
    const bound = failedWindowIntentBound({ since, leaseBoundMs: LEASE_DURATION_FACTOR * leaseDurationMs, intentTtlMs });
    // West takes the Lease over late in the window and calls: its intent blocks this member as stamped.
    await clock.advance(bound - since);
    const west = look({ holder: 'west/proxy-0_1', at: clock.now() });
    assert.deepEqual(west.coordination?.intent, { holder: 'west/proxy-0_1', at: bound });
    assert.equal(judge.failedHolder(), undefined);
    // A thief stamps its intent anew at every look: it blocks only up to the bound plus one lifetime.
    for (let t = clock.now(); t < bound + intentTtlMs; t = clock.now()) {
      look({ holder: 'thief', at: t });
      assert.equal(judge.failedHolder(), undefined);
      await clock.advance(60_000);
    }
    look({ holder: 'thief', at: clock.now() });
    assert.ok(judge.failedHolder(), 'the thief holds nobody past the bound plus one lifetime');
  });
});
