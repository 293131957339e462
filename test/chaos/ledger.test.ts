// The chaos checker's own logic on synthetic histories (no processes): it must see what it claims to see.
import assert from 'node:assert/strict';
import { X509Certificate } from 'node:crypto';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { Checker, type CheckerContext } from './checker.ts';
import type { FilesState } from './observers.ts';
import { analyseWindows, checkRateLimits, parseLedgerLine, renewalPoint, type CertRequest, type Issuance } from './ledger.ts';
import type { Instance } from './replicas.ts';
import { startEmulator } from '../../src/emulator/server.ts';
import { get } from '../support/emulator.ts';
import { makePair } from '../support/certs.ts';

const D = 'proxy.tailnet-0000.ts.net';
const S = 1000;
/** A 20 s certificate issued at t (notBefore floored to the second, like the emulator). */
const issued = (t: number, serial: string, emulator = 'proxy-0'): Issuance => ({
  time: t,
  emulator,
  domain: D,
  serial,
  notBefore: Math.floor(t / S) * S,
  notAfter: Math.floor(t / S) * S + 20 * S,
  trigger: 'request',
});
const req = (t: number, emulator: string, outcome: string, retryAfterSeconds?: number): CertRequest => ({
  time: t,
  end: t + 10,
  emulator,
  domain: D,
  minValidity: '11s',
  outcome,
  ...(retryAfterSeconds !== undefined ? { retryAfterSeconds } : {}),
});

describe('chaos ledger analysis', () => {
  it('renews short-lived certificates at half their lifetime', () => {
    assert.equal(renewalPoint({ notBefore: 0, notAfter: 20 * S }), 10 * S);
    assert.equal(renewalPoint({ notBefore: 0, notAfter: 90 * 86_400_000 }), 60 * 86_400_000);
  });

  it('counts one window per due issuance and flags an issuance while a certificate still covers', () => {
    const base = 1_000_000 * S;
    const chain = [issued(base, 'a'), issued(base + 10_050, 'b'), issued(base + 20_100, 'c')];
    const clean = analyseWindows(chain);
    assert.deepEqual([clean.windows, clean.issuances, clean.maxIssuancesPerWindow, clean.extras.length], [2, 3, 1, 0]);

    // A second writer issues 3 s after "b": "b" was valid and not due, even though it was never stored.
    const extra = analyseWindows([...chain, issued(base + 13_000, 'x', 'proxy-1')]);
    assert.deepEqual([extra.windows, extra.issuances, extra.maxIssuancesPerWindow], [2, 4, 2]);
    assert.equal(extra.extras[0]?.issuance.serial, 'x');
    assert.equal(extra.extras[0]?.coveredBy.serial, 'b');

    // After a gap (everything expired) a new issuance opens a window: not an extra one.
    const gap = analyseWindows([issued(base, 'a'), issued(base + 45_000, 'b')]);
    assert.deepEqual([gap.windows, gap.extras.length], [1, 0]);
  });

  it('reads old ledger lines (no kind) as issuances and request lines as requests', () => {
    const old = parseLedgerLine({
      time: '2026-01-01T00:00:00.000Z',
      emulator: 'e',
      domain: D,
      serial: 'S',
      notBefore: '2026-01-01T00:00:00.000Z',
      notAfter: '2026-01-01T00:00:20.000Z',
    });
    assert.equal(old.issuance?.serial, 'S');
    const r = parseLedgerLine({
      kind: 'request',
      time: '2026-01-01T00:00:00.000Z',
      end: '2026-01-01T00:00:00.050Z',
      emulator: 'e',
      domain: D,
      minValidity: '0s',
      outcome: '429',
      retryAfterSeconds: 3,
    });
    assert.equal(r.request?.retryAfterSeconds, 3);
    assert.equal(r.issuance, undefined);
  });

  it('flags CertPair calls before a retry time recorded in the Secret or known to the same process', () => {
    const t = 5_000_000;
    const instance = (emulator: string, at: number): string => (emulator === 'proxy-0' ? (at < t + 2000 ? 'proxy-0/1' : 'proxy-0/2') : `${emulator}/9`);
    const requests = [
      req(t, 'proxy-0', '429', 3),
      req(t + 1000, 'proxy-0', '200'),
      req(t + 2500, 'proxy-0', '200'),
      req(t + 2600, 'proxy-1', '200'),
      req(t + 3100, 'proxy-1', '200'),
    ];
    const none = checkRateLimits(requests, [], instance);
    assert.equal(none.violations.length, 1, none.violations.join('\n')); // the same process, 1 s after its 429
    assert.match(none.violations[0]!, /proxy-0 \(proxy-0\/1\)/);
    assert.equal(none.unshared.length, 2); // a restarted proxy-0 and proxy-1 could not know
    const recorded = checkRateLimits(requests, [{ domain: D, observedAt: t + 100, until: t + 3010 }], instance);
    assert.equal(recorded.violations.length, 3, recorded.violations.join('\n'));
    assert.equal(recorded.unshared.length, 0);
    // A federated member's calls while its way to the home is open follow the home's records, not its Secret's.
    const viaHome = checkRateLimits(requests, [{ domain: D, observedAt: t + 100, until: t + 3010 }], instance, 20, (r) => r.emulator !== 'proxy-1');
    assert.equal(viaHome.violations.length, 2, viaHome.violations.join('\n'));
    assert.equal(viaHome.unshared.length, 1, 'the limit proxy-1 could not read from its Secret: the 429 proxy-0 met');
  });
});

describe('chaos checker', () => {
  const pem = async (): Promise<{ crt: string; key: string; serial: string; notAfter: number }> => {
    const pair = await makePair(D, Date.now() - 2000, 60_000);
    const x = new X509Certificate(pair.certPem);
    return { crt: pair.certPem, key: pair.keyPem, serial: x.serialNumber, notAfter: x.validToDate.getTime() };
  };

  it('reports a replica that projects an expired pair while the Secret holds a valid one, after the grace', async () => {
    const good = await pem();
    const started: Instance = { replica: 'proxy-1', pid: 42, startedAt: 0, readyAt: 0 };
    const ctx: CheckerContext = {
      domains: [D],
      graceMs: 2000,
      replicaNames: ['proxy-1'],
      running: () => started,
      instanceAt: () => undefined,
      quietAt: () => true,
      podsInSync: () => true,
      reachableSince: () => 0,
      verbose: () => {},
    };
    const checker = new Checker(ctx);
    const now = Date.now();
    const b64 = (s: string): string => Buffer.from(s).toString('base64');
    checker.secret(D, { metadata: { name: D }, data: { 'tls.crt': b64(good.crt), 'tls.key': b64(good.key) } }, now);
    checker.files('proxy-1', D, { cert: { serial: 'OLD', notBefore: now - 30_000, notAfter: now - 10_000, keyMatch: true }, at: now });
    checker.pods('proxy-1', { status: { conditions: [{ type: 'certshare.io/certificates', status: 'True' }] } }, now);
    checker.tick(now + 1000);
    assert.equal(checker.snapshot().violations, 0, 'within the grace');
    checker.tick(now + 2500);
    checker.files('proxy-1', D, { cert: { serial: good.serial, notBefore: now - 1000, notAfter: good.notAfter, keyMatch: true }, at: now + 3000 });
    checker.tick(now + 3100);
    const result = checker.finish(now + 3200, { mustHold: true });
    assert.ok(
      result.violations.some((v) => v.startsWith('inv2') && v.includes('proxy-1')),
      result.violations.join('\n'),
    );
    assert.ok(
      result.violations.some((v) => v.startsWith('inv5')),
      result.violations.join('\n'),
    );
    assert.ok(
      result.violations.some((v) => v.startsWith('inv4')),
      'the quiet-period sample took more than 2 s',
    );
    assert.ok(
      result.violations.some((v) => v.startsWith('ledger:')),
      'a Secret serial that no emulator issued',
    );
  });
});

describe('chaos checker with many domains per group', () => {
  const E = 'proxy-2.tailnet-0000.ts.net';
  const b64 = (s: string): string => Buffer.from(s).toString('base64');
  const context = (domains: string[], replicaNames: string[]): CheckerContext => {
    const inst: Instance = { replica: 'x', pid: 7, startedAt: 0, readyAt: 0 };
    return {
      domains,
      graceMs: 2000,
      replicaNames,
      running: () => inst,
      instanceAt: (emulator) => `${emulator}/7`,
      quietAt: () => true,
      podsInSync: () => true,
      reachableSince: () => 0,
      verbose: () => {},
    };
  };
  const ledgerIssuance = (i: Issuance): Record<string, unknown> => ({
    kind: 'issuance',
    time: new Date(i.time).toISOString(),
    emulator: i.emulator,
    domain: i.domain,
    serial: i.serial,
    notBefore: new Date(i.notBefore).toISOString(),
    notAfter: new Date(i.notAfter).toISOString(),
    trigger: 'request',
  });
  const secretOf = async (
    domain: string,
    notBefore = Date.now() - 2000,
    lifetimeMs = 60_000,
  ): Promise<{ obj: { metadata: { name: string }; data: Record<string, string> }; serial: string; notAfter: number }> => {
    const pair = await makePair(domain, notBefore, lifetimeMs);
    const x = new X509Certificate(pair.certPem);
    return {
      obj: { metadata: { name: domain }, data: { 'tls.crt': b64(pair.certPem), 'tls.key': b64(pair.keyPem) } },
      serial: x.serialNumber,
      notAfter: x.validToDate.getTime(),
    };
  };

  it("counts windows per domain: a renewal of one domain inside another one's window is not extra; a second one is, and names its domain", () => {
    const base = 2_000_000 * S;
    const onD = (t: number, serial: string): Issuance => issued(t, serial);
    const onE = (t: number, serial: string, emulator = 'proxy-0'): Issuance => ({ ...issued(t, serial, emulator), domain: E });
    const checker = new Checker(context([D, E], ['proxy-0']));
    for (const i of [onD(base, 'd1'), onE(base + 500, 'e1'), onD(base + 10_050, 'd2'), onE(base + 10_600, 'e2'), onE(base + 12_000, 'e3', 'proxy-1')]) {
      checker.ledger(ledgerIssuance(i));
    }
    const result = checker.finish(base + 13_000, { mustHold: false });
    assert.deepEqual(result.issuancesByDomain, { [D]: 2, [E]: 3 });
    assert.deepEqual(result.windows.perWindow, { [D]: [1, 1], [E]: [1, 2] });
    const inv1 = result.violations.filter((v) => v.startsWith('inv1'));
    assert.equal(inv1.length, 1, result.violations.join('\n'));
    assert.match(inv1[0]!, new RegExp(`^inv1 \\S+ ${E.replaceAll('.', '\\.')}: extra issuance e3 by proxy-1`));
  });

  it('excuses an issuance only after a certificate lost with a SIGKILLed writer; a SIGTERMed one still counts', () => {
    const base = 4_000_000 * S;
    const onE = (t: number, serial: string, emulator: string): Issuance => ({ ...issued(t, serial, emulator), domain: E });
    const run = (ended: 'SIGKILL' | 'SIGTERM' | undefined) => {
      const ctx = context([E], ['proxy-0', 'proxy-1']);
      ctx.endedAround = (emulator, t) => (emulator === 'proxy-0' && t === base + 10_050 ? ended : undefined);
      const checker = new Checker(ctx);
      // "lost" (proxy-0, never in the Secret), then proxy-1 issues again 5 s later, inside lost's window.
      for (const i of [onE(base, 'first', 'proxy-1'), onE(base + 10_050, 'lost', 'proxy-0'), onE(base + 15_000, 'again', 'proxy-1')]) {
        checker.ledger(ledgerIssuance(i));
      }
      return checker.finish(base + 16_000, { mustHold: false });
    };
    const killed = run('SIGKILL');
    assert.equal(killed.violations.filter((v) => v.startsWith('inv1')).length, 0, killed.violations.join('\n'));
    assert.equal(killed.reissuedAfterLost.length, 1);
    assert.match(killed.reissuedAfterLost[0]!, /extra issuance again by proxy-1 .*lost \(issued \S+ by proxy-0, never stored: its writer ended \(SIGKILL\)/);
    for (const ended of ['SIGTERM', undefined] as const) {
      const result = run(ended);
      const inv1 = result.violations.filter((v) => v.startsWith('inv1'));
      assert.equal(inv1.length, 1, `${ended}: ${result.violations.join('\n')}`);
      assert.equal(result.reissuedAfterLost.length, 0);
      if (ended) assert.match(inv1[0]!, /its writer ended \(SIGTERM\)/);
    }
  });

  it('excuses a renewal inside the window of a certificate stranded in a member cut off from the home, and says so', () => {
    const base = 5_000_000 * S;
    const onE = (t: number, serial: string, emulator: string): Issuance => ({ ...issued(t, serial, emulator), domain: E });
    const run = (stranded: boolean) => {
      const ctx = context([E], ['c3-proxy-0']);
      ctx.strandedBetween = (cover, extra) =>
        stranded && cover.serial === 'kept' && extra.serial === 'again' ? 'its member c1 cut off from the home' : undefined;
      const checker = new Checker(ctx);
      for (const i of [onE(base, 'first', 'c3-proxy-0'), onE(base + 10_050, 'kept', 'c1-proxy-1'), onE(base + 15_000, 'again', 'c3-proxy-0')]) {
        checker.ledger(ledgerIssuance(i));
      }
      return checker.finish(base + 16_000, { mustHold: false });
    };
    const excused = run(true);
    assert.equal(excused.violations.filter((v) => v.startsWith('inv1')).length, 0, excused.violations.join('\n'));
    assert.match(excused.reissuedAfterLost.join('\n'), /extra issuance again by c3-proxy-0 .*kept \(issued \S+ by c1-proxy-1, stranded: its member c1 cut off/);
    const counted = run(false);
    assert.equal(counted.violations.filter((v) => v.startsWith('inv1')).length, 1, counted.violations.join('\n'));
    assert.equal(counted.reissuedAfterLost.length, 0);
  });

  it('counts the grace of a stale replica from when the newer pair landed, not from when the Secret became valid', async () => {
    const now = Date.now();
    // The Secret and the replica's files hold a pair valid for 30 s, expiring about now + 10 s.
    const [old, renewal] = await Promise.all([secretOf(D, now - 20_000, 30_000), secretOf(D)]);
    const checker = new Checker(context([D], ['proxy-1']));
    checker.secret(D, old.obj, now - 19_000);
    checker.files('proxy-1', D, { cert: { serial: old.serial, notBefore: now - 20_000, notAfter: old.notAfter, keyMatch: true }, at: now - 19_000 });
    // The renewal lands 300 ms before the files' pair expires (the writer was rate limited until then).
    const expiry = old.notAfter;
    checker.secret(D, renewal.obj, expiry - 300);
    checker.tick(expiry + 100);
    assert.equal(checker.snapshot().violations, 0, 'expired 100 ms ago, but the renewal landed only 400 ms ago');
    checker.tick(expiry + 1800);
    const inv2 = checker.finish(expiry + 1900, { mustHold: true }).violations.filter((v) => v.startsWith('inv2'));
    assert.equal(inv2.length, 1, 'the renewal has been there past the 2 s grace');
  });

  it("counts a stale replica's grace from when its own reads of Secrets got through again", async () => {
    const now = Date.now();
    const [old, renewal] = await Promise.all([secretOf(D, now - 20_000, 30_000), secretOf(D)]);
    // proxy-1's requests for Secrets fail (429s, 5xx) until expiry + 3 s; proxy-0's get through.
    let readsSince = Number.POSITIVE_INFINITY;
    const ctx = context([D], ['proxy-0', 'proxy-1']);
    const checker = new Checker({ ...ctx, quietAt: () => false, secretsReachableSince: (name) => (name === 'proxy-1' ? readsSince : 0) });
    checker.secret(D, old.obj, now - 19_000);
    for (const name of ['proxy-0', 'proxy-1']) {
      checker.files(name, D, { cert: { serial: old.serial, notBefore: now - 20_000, notAfter: old.notAfter, keyMatch: true }, at: now - 19_000 });
    }
    const expiry = old.notAfter;
    checker.secret(D, renewal.obj, expiry - 5000);
    checker.tick(expiry + 2500);
    assert.equal(checker.snapshot().violations, 1, 'proxy-0 could read, and did not pick the renewal up');
    readsSince = expiry + 3000;
    checker.tick(expiry + 4900);
    assert.equal(checker.snapshot().violations, 1, 'proxy-1 got through 1.9 s ago: within the grace');
    checker.tick(expiry + 5100);
    const inv2 = checker.finish(expiry + 5200, { mustHold: true }).violations.filter((v) => v.startsWith('inv2'));
    assert.deepEqual(
      inv2.map((v) => /: (proxy-\d) /.exec(v)?.[1]),
      ['proxy-0', 'proxy-1'],
      `proxy-1 has read for 2.1 s and still projects the expired pair: ${inv2.join('\n')}`,
    );
  });

  it('reads the files again before it flags them: a starved runner learns of a swap late (seed 45)', async () => {
    // Seed 45's second flag: the Secret valid again (a hand edit repaired) at t, the replica's files swapped to that
    // pair at t + 870 ms (its log), the runner's watcher still reporting the expired pair at t + 2337 ms.
    const now = Date.now();
    const [old, renewal] = await Promise.all([secretOf(D, now - 20_000, 20_000), secretOf(D, now - 2000, 60_000)]);
    const view = (p: { serial: string; notAfter: number }, notBefore: number): FilesState => ({
      cert: { serial: p.serial, notBefore, notAfter: p.notAfter, keyMatch: true },
      at: now,
    });
    const t = old.notAfter + 1000;
    let reads = 0;
    const violationsWith = (swapped: boolean): string[] => {
      let reported = view(old, now - 20_000);
      const onDisk = swapped ? { ...view(renewal, now - 2000), at: t + 870 } : reported;
      const checker = new Checker({
        ...context([D], ['proxy-1']),
        // What DirWatch.readNow does: the files as they are, reported if they changed.
        refreshFiles: (name, domain) => {
          reads++;
          if (onDisk === reported) return;
          reported = onDisk;
          checker.files(name, domain, onDisk);
        },
      });
      checker.secret(D, old.obj, now - 19_000);
      checker.files('proxy-1', D, reported);
      checker.pods('proxy-1', { status: { conditions: [{ type: 'certshare.io/certificates', status: 'True' }] } }, now - 19_000);
      checker.secret(D, renewal.obj, t);
      checker.tick(t + 2337);
      checker.tick(t + 2437);
      return checker.finish(t + 2500, { mustHold: false }).violations.filter((v) => /^inv[25] /.test(v));
    };
    assert.deepEqual(violationsWith(true), [], 'the files hold the valid pair: nothing to flag');
    assert.ok(reads > 0, 'the files were read again before a violation could open');
    const flagged = violationsWith(false);
    assert.deepEqual(
      flagged.map((v) => v.slice(0, 4)),
      ['inv2', 'inv5'],
      `the files still hold the expired pair: both invariants flag it\n${flagged.join('\n')}`,
    );
  });

  it('flags the one replica and domain whose files are stale, and at the end the domain a replica lacks', async () => {
    const [d, e] = await Promise.all([secretOf(D), secretOf(E)]);
    const checker = new Checker(context([D, E], ['proxy-0', 'proxy-1']));
    const now = Date.now();
    checker.secret(D, d.obj, now);
    checker.secret(E, e.obj, now);
    const fresh = (c: { serial: string; notAfter: number }): FilesState => ({
      cert: { serial: c.serial, notBefore: now - 2000, notAfter: c.notAfter, keyMatch: true },
      at: now,
    });
    checker.files('proxy-0', D, fresh(d));
    checker.files('proxy-0', E, fresh(e));
    checker.files('proxy-1', D, fresh(d));
    // proxy-1 still projects an expired certificate for E.
    checker.files('proxy-1', E, { cert: { serial: 'OLD', notBefore: now - 30_000, notAfter: now - 10_000, keyMatch: true }, at: now });
    checker.pods('proxy-1', { status: { conditions: [{ type: 'certshare.io/certificates', status: 'True' }] } }, now);
    checker.pods('proxy-0', { status: { conditions: [{ type: 'certshare.io/certificates', status: 'True' }] } }, now);
    assert.equal(checker.converged(), false);
    checker.tick(now + 2500);
    const result = checker.finish(now + 2600, { mustHold: true });
    const about = (prefix: string): string[] => result.violations.filter((v) => v.startsWith(prefix));
    assert.equal(about('inv2').length, 1, result.violations.join('\n'));
    assert.match(about('inv2')[0]!, new RegExp(`${E.replaceAll('.', '\\.')}: proxy-1 .* expired serial OLD`));
    assert.equal(about('inv5').length, 1, result.violations.join('\n'));
    assert.match(about('inv5')[0]!, new RegExp(`${E.replaceAll('.', '\\.')}: proxy-1`));
    assert.ok(
      about('inv4').some((v) => v.includes(`${E}: at the end proxy-1 holds OLD`)),
      result.violations.join('\n'),
    );
    assert.ok(!result.violations.some((v) => v.includes(`${D}:`) && !v.startsWith('ledger:')), result.violations.join('\n'));
  });

  it('excuses garbage written into a Secret by hand, measures its repair, and still flags a mismatched pair', async () => {
    const [d, e] = await Promise.all([secretOf(D), secretOf(E)]);
    const checker = new Checker(context([D], ['proxy-0']));
    const now = Date.now();
    checker.secret(D, d.obj, now);
    checker.handEdited(D, now + 100);
    checker.secret(D, { metadata: { name: D }, data: { 'tls.crt': b64('garbage'), 'tls.key': b64('garbage') } }, now + 100);
    checker.secret(D, d.obj, now + 350);
    let result = checker.finish(now + 400, { mustHold: false });
    assert.deepEqual(result.handEdits, { count: 1, repaired: 1, repairMaxMs: 250, repairP50Ms: 250 });
    assert.equal(result.violations.filter((v) => v.startsWith('inv3')).length, 0, result.violations.join('\n'));

    // D's certificate with E's key: a pair certshare must never store.
    const mixed = new Checker(context([D], ['proxy-0']));
    mixed.secret(D, { metadata: { name: D }, data: { 'tls.crt': d.obj.data['tls.crt']!, 'tls.key': e.obj.data['tls.key']! } }, now);
    result = mixed.finish(now + 100, { mustHold: false });
    assert.ok(
      result.violations.some((v) => v.startsWith(`inv3`) && v.includes(`${D}: the Secret holds a pair whose key does not match`)),
      result.violations.join('\n'),
    );
  });

  it('analyses a long run of 200 domains without comparing every event with every other', () => {
    const base = 3_000_000 * S;
    const domains = Array.from({ length: 200 }, (_, i) => `proxy-${i}.tailnet-0000.ts.net`);
    const checker = new Checker(context(domains, ['proxy-0']));
    // 240 renewals per domain, 10 s apart (48,000 issuances), each preceded by a 429 and followed by a 200.
    for (let k = 0; k < 240; k++) {
      for (const domain of domains) {
        const t = base + k * 10_050;
        checker.ledger({ ...ledgerIssuance({ ...issued(t, `${domain}-${k}`), domain }) });
        const request = (at: number, outcome: string, retryAfterSeconds?: number): Record<string, unknown> => ({
          kind: 'request',
          time: new Date(at).toISOString(),
          end: new Date(at + 10).toISOString(),
          emulator: 'proxy-0',
          domain,
          minValidity: '11s',
          outcome,
          ...(retryAfterSeconds !== undefined ? { retryAfterSeconds } : {}),
        });
        checker.ledger(request(t - 3100, '429', 3));
        checker.ledger(request(t, '200'));
      }
    }
    const started = performance.now();
    const result = checker.finish(base + 240 * 10_050, { mustHold: false });
    const tookMs = performance.now() - started;
    assert.equal(result.windows.issuances, 48_000);
    assert.equal(result.windows.windows, 200 * 239);
    assert.equal(result.violations.filter((v) => !v.startsWith('ledger:')).length, 0, result.violations.slice(0, 5).join('\n'));
    assert.equal(result.rateLimitedAnswers, 48_000);
    // Comparing each request with every 429 (the analysis before it was grouped by domain) took 4.9 s for
    // half of this history, and grows with its square; grouped, this takes well under a second.
    assert.ok(tookMs < 5000, `the final analysis took ${Math.round(tookMs)} ms`);
  });
});

describe('the emulator ledger with --ledger-requests', () => {
  it('writes a request line per cert request (arrival, answer, outcome, Retry-After, serial) and kinded issuances', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'certshare-ledger-'));
    const ledgerPath = join(dir, 'ledger.jsonl');
    const emu = await startEmulator({ listen: join(dir, 'ts.sock'), domains: [D], ledgerPath, ledgerRequests: true, id: 'emu-l', certLifetimeMs: 20_000 });
    try {
      emu.injectFault('cert:rate_limit_429:retry_after=3');
      const path = `/localapi/v0/cert/${D}?type=pair&min_validity=0s`;
      assert.equal((await get(emu.address, path)).status, 429);
      assert.equal((await get(emu.address, path)).status, 200);
      const lines = (await readFile(ledgerPath, 'utf8'))
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l) as Record<string, unknown>);
      const parsed = lines.map((l) => parseLedgerLine(l));
      const requests = parsed.flatMap((p) => (p.request ? [p.request] : []));
      const issuances = parsed.flatMap((p) => (p.issuance ? [p.issuance] : []));
      assert.deepEqual(
        requests.map((r) => [r.outcome, r.retryAfterSeconds, r.minValidity]),
        [
          ['429', 3, '0s'],
          ['200', undefined, '0s'],
        ],
      );
      assert.equal(issuances.length, 1);
      assert.equal(lines.find((l) => l.kind === 'issuance')?.trigger, 'request');
      assert.equal(requests[1]!.serial, issuances[0]!.serial);
      assert.ok(requests[0]!.time <= requests[0]!.end && requests[0]!.end <= requests[1]!.time);
    } finally {
      await emu.close();
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("stamps a request's end when its answer is given, not when the emulator gets round to the rest (seed 46)", async () => {
    // Seed 46: an emulator starved of CPU answered a 429 (Retry-After: 3) at 19:07:33.961 and stamped its end at
    // 34.549; its caller had the answer by 34.094 at the latest and called again at 37.094, flagged as inv6.
    const dir = await mkdtemp(join(tmpdir(), 'certshare-ledger-'));
    const ledgerPath = join(dir, 'ledger.jsonl');
    let now = Date.parse('2026-11-29T19:07:33.961Z');
    const clock = { now: () => now };
    const emu = await startEmulator({ listen: join(dir, 'ts.sock'), domains: [D], ledgerPath, ledgerRequests: true, id: 'emu-s', clock });
    // The process descheduled right after it answered: its clock has moved on when it next runs.
    emu.events.on('certResponse', () => {
      now += 588;
    });
    try {
      emu.injectFault('cert:rate_limit_429:retry_after=3');
      assert.equal((await get(emu.address, `/localapi/v0/cert/${D}?type=pair`)).status, 429);
      const [line] = (await readFile(ledgerPath, 'utf8')).trim().split('\n');
      const { request } = parseLedgerLine(JSON.parse(line!) as Record<string, unknown>);
      assert.equal(new Date(request!.end).toISOString(), '2026-11-29T19:07:33.961Z');
      const call = req(Date.parse('2026-11-29T19:07:37.094Z'), 'emu-s', '429', 3);
      assert.deepEqual(checkRateLimits([request!, call], [], () => 'emu-s/1').violations, [], 'the call came 3.1 s after the answer');
    } finally {
      await emu.close();
      await rm(dir, { recursive: true, force: true });
    }
  });
});
