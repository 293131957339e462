// The end-of-run comparison against a renewal stored in its last moments (issue 34): a synthetic history
// with a virtual clock, no processes. The race of a 30-minute run, reproduced: the writer stored a renewal
// 23 ms before the final comparison while the replicas converged within 170 ms.
import assert from 'node:assert/strict';
import { X509Certificate } from 'node:crypto';
import { describe, it } from 'node:test';
import { Checker, type CheckerContext } from './checker.ts';
import { endSettleAllowanceMs, judgeAtEnd } from './end-check.ts';
import type { Instance } from './replicas.ts';
import { makePair } from '../support/certs.ts';

const D = 'proxy.tailnet-0000.ts.net';
const REPLICAS = ['proxy-0', 'proxy-1', 'proxy-2'];
const GRACE_MS = 2000;
const b64 = (s: string): string => Buffer.from(s).toString('base64');

interface Stored {
  obj: { metadata: { name: string }; data: Record<string, string> };
  view: { serial: string; notBefore: number; notAfter: number; keyMatch: true };
}

async function stored(notBefore: number): Promise<Stored> {
  const pair = await makePair(D, notBefore, 60_000);
  const x = new X509Certificate(pair.certPem);
  return {
    obj: { metadata: { name: D }, data: { 'tls.crt': b64(pair.certPem), 'tls.key': b64(pair.keyPem) } },
    view: { serial: x.serialNumber, notBefore: x.validFromDate.getTime(), notAfter: x.validToDate.getTime(), keyMatch: true },
  };
}

function checkerFor(): Checker {
  const inst: Instance = { replica: 'x', pid: 7, startedAt: 0, readyAt: 0 };
  const ctx: CheckerContext = {
    domains: [D],
    graceMs: GRACE_MS,
    replicaNames: REPLICAS,
    running: () => inst,
    instanceAt: (emulator) => `${emulator}/7`,
    quietAt: () => true,
    podsInSync: () => true,
    reachableSince: () => 0,
    verbose: () => {},
  };
  return new Checker(ctx);
}

/**
 * A run's history up to `t0`: the first certificate and its renewal stored in quiet periods, each on every
 * replica 170 ms later (the measured p99), then a renewal stored 23 ms before t0 that the replicas pick up
 * `lateMs` after it was stored (never, with Infinity).
 */
async function history(t0: number): Promise<{ checker: Checker; last: Stored }> {
  const [a, b, last] = await Promise.all([stored(t0 - 70_000), stored(t0 - 38_000), stored(t0 - 1000)]);
  const checker = checkerFor();
  for (const [pair, at] of [
    [a, t0 - 69_000],
    [b, t0 - 37_000],
  ] as const) {
    checker.secret(D, pair.obj, at);
    for (const r of REPLICAS) checker.files(r, D, { cert: pair.view, at: at + 170 });
    checker.tick(at + 200);
  }
  // Every pair the Secret holds was issued by an emulator (the checker's ledger sanity check).
  for (const pair of [a, b, last]) {
    const iso = (t: number): string => new Date(t).toISOString();
    const { serial, notBefore, notAfter } = pair.view;
    checker.ledger({
      kind: 'issuance',
      time: iso(notBefore),
      emulator: 'proxy-0',
      domain: D,
      serial,
      notBefore: iso(notBefore),
      notAfter: iso(notAfter),
      trigger: 'request',
    });
  }
  checker.secret(D, last.obj, t0 - 23);
  return { checker, last };
}

/** A virtual clock whose sleeps deliver the replicas' files when their time comes. */
function clock(start: number, deliveries: Array<{ at: number; run: () => void }>): { now: () => number; sleep: (ms: number) => Promise<void> } {
  let t = start;
  return {
    now: () => t,
    sleep: async (ms) => {
      t += ms;
      for (const d of deliveries.filter((x) => x.at <= t)) {
        d.run();
        deliveries.splice(deliveries.indexOf(d), 1);
      }
    },
  };
}

describe('chaos end-of-run check', () => {
  it('gives a certificate stored in the last moments the measured p99 with a margin, bounded by the grace', () => {
    assert.equal(endSettleAllowanceMs({ samples: 40, p99Ms: 170 }, GRACE_MS), 340);
    assert.equal(endSettleAllowanceMs({ samples: 40, p99Ms: 1800 }, GRACE_MS), GRACE_MS, 'never above the bound');
    assert.equal(endSettleAllowanceMs({ samples: 0, p99Ms: 0 }, GRACE_MS), GRACE_MS, 'nothing measured: the bound');
  });

  it('does not judge a renewal stored 23 ms before the comparison against replicas that hold the one before', async () => {
    const t0 = Date.now();
    const { checker } = await history(t0);
    assert.deepEqual(checker.quietConvergence(), { samples: 2, p99Ms: 170 });
    // Judged at once (the runner's comparison until now judged the Secret's newest pair here: 3 inv4).
    const result = checker.finish(t0, { mustHold: true, settleMs: endSettleAllowanceMs(checker.quietConvergence(), GRACE_MS) });
    assert.deepEqual(result.violations, []);
  });

  it('waits for the renewal to converge, then judges it', async () => {
    const t0 = Date.now();
    const { checker, last } = await history(t0);
    const deliveries = REPLICAS.map((r, i) => ({
      at: t0 - 23 + 150 + 10 * i,
      run: () => checker.files(r, D, { cert: last.view, at: t0 - 23 + 150 + 10 * i }),
    }));
    const c = clock(t0, deliveries);
    const end = await judgeAtEnd(checker, { boundMs: GRACE_MS, ...c });
    assert.deepEqual(end.result.violations, []);
    assert.equal(end.allowanceMs, 340);
    assert.ok(end.waitedMs >= 150 && end.waitedMs < 340, `waited ${end.waitedMs} ms`);
    assert.equal(deliveries.length, 0, 'judged after every replica held the renewal');
    assert.equal(checker.converged(), true);
  });

  it('still reports a replica that lacks the renewal once the renewal has had its allowance', async () => {
    const t0 = Date.now();
    const { checker, last } = await history(t0);
    // proxy-2 never picks it up.
    const deliveries = REPLICAS.slice(0, 2).map((r) => ({ at: t0 + 100, run: () => checker.files(r, D, { cert: last.view, at: t0 + 100 }) }));
    const end = await judgeAtEnd(checker, { boundMs: GRACE_MS, ...clock(t0, deliveries) });
    assert.equal(end.waitedMs, 340 - 23, 'the allowance counts from when the renewal was stored');
    const inv4 = end.result.violations.filter((v) => v.startsWith('inv4'));
    assert.equal(inv4.length, 1, end.result.violations.join('\n'));
    assert.match(inv4[0]!, /at the end proxy-2 holds/);
  });

  it('judges a certificate stored long before the end strictly, without waiting', async () => {
    const t0 = Date.now();
    const { checker } = await history(t0);
    const c = clock(t0 + 5000, []);
    const end = await judgeAtEnd(checker, { boundMs: GRACE_MS, ...c });
    assert.equal(end.waitedMs, 0);
    assert.equal(end.result.violations.filter((v) => v.includes('at the end')).length, 3, end.result.violations.join('\n'));
  });
});
