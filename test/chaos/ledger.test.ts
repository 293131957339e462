// The chaos checker's own logic on synthetic histories (no processes): it must see what it claims to see.
import assert from 'node:assert/strict';
import { X509Certificate } from 'node:crypto';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { Checker, type CheckerContext } from './checker.ts';
import { analyseWindows, checkRateLimits, parseLedgerLine, renewalPoint, type CertRequest, type Issuance } from './ledger.ts';
import type { Instance } from './replicas.ts';
import { startEmulator } from '../../src/emulator/server.ts';
import { get } from '../emulator/helpers.ts';
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
      domain: D,
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
    checker.secret({ metadata: { name: D }, data: { 'tls.crt': b64(good.crt), 'tls.key': b64(good.key) } }, now);
    checker.files('proxy-1', { cert: { serial: 'OLD', notBefore: now - 30_000, notAfter: now - 10_000, keyMatch: true }, at: now });
    checker.pods('proxy-1', { status: { conditions: [{ type: 'certshare.io/certificates', status: 'True' }] } }, now);
    checker.tick(now + 1000);
    assert.equal(checker.snapshot().violations, 0, 'within the grace');
    checker.tick(now + 2500);
    checker.files('proxy-1', { cert: { serial: good.serial, notBefore: now - 1000, notAfter: good.notAfter, keyMatch: true }, at: now + 3000 });
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
});
