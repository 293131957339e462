import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { CertInfo } from '../../src/core/certificates/certificate.ts';
import { HealthState, logHealthChanges, type HealthVerdict } from '../../src/core/loop/health.ts';
import { FakeClock } from '../support/fake-clock.ts';
import { recordingLogger } from '../support/recording-logger.ts';

const HOUR = 3_600_000;
const cert = (domain: string, notBefore: number, notAfter: number): { pair: { certPem: string; keyPem: string }; info: CertInfo } => ({
  pair: { certPem: '', keyPem: '' },
  info: { domain, notBefore, notAfter, serial: '01', fingerprint256: '' },
});

describe('HealthState.isHealthy', () => {
  it('agrees with evaluate(now).healthy: every domain valid now, nothing pending', () => {
    const health = new HealthState();
    const now = 10 * HOUR;
    const agree = (at: number): boolean => {
      const fast = health.isHealthy(at);
      assert.equal(fast, health.evaluate(at).healthy, `at ${at}`);
      return fast;
    };
    assert.equal(agree(now), true, 'no domain: healthy');
    health.manage(['a.ts.net', 'b.ts.net']);
    assert.equal(agree(now), false, 'no certificate yet');
    health.certificate('a.ts.net', cert('a.ts.net', now - HOUR, now + HOUR));
    assert.equal(agree(now), false, 'one of two');
    health.certificate('b.ts.net', cert('b.ts.net', now - HOUR, now + 2 * HOUR));
    assert.equal(agree(now), true);
    assert.equal(agree(now + HOUR), false, 'a expired');
    health.pending('serve-config', 'not read yet');
    assert.equal(agree(now), false, 'a pending reason');
    health.pending('serve-config', undefined);
    health.manage(['b.ts.net']);
    assert.equal(agree(now + HOUR), true, 'a no longer managed');
  });
});

describe('HealthState.evaluate with an earlier end of validity (the readiness gate leaving rotation ahead)', () => {
  it('is unhealthy, and says "expiring", from the end on; expired wins over expiring', () => {
    const health = new HealthState();
    const now = 10 * HOUR;
    const tenMinutesAhead = (held: { notAfter: number }): number => held.notAfter - 600_000;
    health.manage(['a.ts.net', 'b.ts.net']);
    health.certificate('a.ts.net', cert('a.ts.net', now - HOUR, now + HOUR));
    health.certificate('b.ts.net', cert('b.ts.net', now - HOUR, now + 2 * HOUR));
    assert.deepEqual(health.evaluate(now, tenMinutesAhead), { healthy: true, reason: 'ok' });
    assert.equal(health.nextExpiry(now, tenMinutesAhead), now + HOUR - 600_000);
    assert.equal(health.nextExpiry(now), now + HOUR);

    const ahead = health.evaluate(now + HOUR - 1000, tenMinutesAhead);
    assert.equal(ahead.healthy, false);
    assert.equal(ahead.expiring, true);
    assert.match(ahead.reason, /a\.ts\.net: certificate expires at .*leaving rotation ahead/);
    assert.equal(health.evaluate(now + HOUR - 1000).healthy, true, '/healthz still healthy: the certificate is valid');

    const expired = health.evaluate(now + 2 * HOUR - 1000, tenMinutesAhead);
    assert.equal(expired.expiring, undefined, 'a expired: not merely expiring');
    assert.match(expired.reason, /a\.ts\.net: certificate expired; b\.ts\.net: certificate expires at/);
  });
});

describe("HealthState.evaluate names the reason of each loop's last decision", () => {
  it('in brackets after what the loop reported, for a domain without a valid certificate only', () => {
    const health = new HealthState();
    const now = 10 * HOUR;
    health.manage(['a.ts.net', 'b.ts.net']);
    health.decided('a.ts.net', { action: 'wait', reason: 'not_writer', at: now + 60_000 });
    health.problem('a.ts.net', 'waiting for the writer to store a certificate');
    health.decided('b.ts.net', { action: 'ask_budget', reason: 'no_certificate', at: now });
    assert.equal(
      health.evaluate(now).reason,
      'a.ts.net: waiting for the writer to store a certificate [not_writer]; b.ts.net: no certificate yet [no_certificate]',
    );
    health.certificate('b.ts.net', cert('b.ts.net', now - HOUR, now + HOUR));
    health.decided('b.ts.net', { action: 'use', reason: 'not_due', at: now + HOUR / 2 });
    assert.equal(health.evaluate(now).reason, 'a.ts.net: waiting for the writer to store a certificate [not_writer]');
    assert.match(health.evaluate(now + HOUR).reason, /; b\.ts\.net: certificate expired$/, 'the last decision was to use it: no reason');
  });
});

describe('HealthState.current (what /healthz answers)', () => {
  it('keeps one verdict object until the state changes or a validity edge passes, and equals evaluate(now) throughout', () => {
    const health = new HealthState();
    const now = 10 * HOUR;
    const same = (at: number, previous: object, why: string): void => {
      const verdict = health.current(at);
      assert.equal(verdict, previous, `kept: ${why}`);
      assert.deepEqual(verdict, health.evaluate(at), why);
    };
    const changed = (at: number, previous: object, why: string): HealthVerdict => {
      const verdict = health.current(at);
      assert.notEqual(verdict, previous, `recomputed: ${why}`);
      assert.deepEqual(verdict, health.evaluate(at), why);
      return verdict;
    };
    health.manage(['a.ts.net']);
    let v = health.current(now);
    assert.deepEqual(v, { healthy: false, reason: 'a.ts.net: no certificate yet' });
    same(now + HOUR, v, 'nothing changed, no certificate to expire');
    health.problem('a.ts.net', 'tailscaled says no');
    v = changed(now, v, 'a problem changes the reason');
    health.problem('a.ts.net', 'tailscaled says no');
    same(now, v, 'the same problem again');
    health.sourceProblem('bus refused');
    v = changed(now, v, 'a source problem');
    health.sourceProblem(undefined);
    health.decided('a.ts.net', { action: 'wait', reason: 'not_writer', at: now });
    v = changed(now, v, "a loop's decision (its bracketed reason)");
    health.decided('a.ts.net', { action: 'wait', reason: 'not_writer', at: now + 1 });
    same(now, v, 'the same reason again');
    health.decided('a.ts.net', { action: 'use', reason: 'not_due', at: now });
    health.problem('a.ts.net', undefined);
    // Valid from now + 1h (not yet), until now + 3h.
    health.certificate('a.ts.net', cert('a.ts.net', now + HOUR, now + 3 * HOUR));
    v = changed(now, v, 'a certificate');
    assert.equal(health.current(now).healthy, false, 'not valid yet');
    same(now + HOUR - 1, v, 'before notBefore');
    v = changed(now + HOUR, v, 'at notBefore: valid');
    assert.equal(health.current(now + HOUR).healthy, true);
    same(now + 3 * HOUR - 1, v, 'before notAfter');
    v = changed(now + 3 * HOUR, v, 'at notAfter: expired');
    assert.equal(health.current(now + 3 * HOUR).healthy, false);
    v = changed(now + 2 * HOUR, v, 'the clock went back: valid again');
    assert.equal(health.current(now + 2 * HOUR).healthy, true);
    health.pending('serve-config', 'not read yet');
    v = changed(now + 2 * HOUR, v, 'a pending reason');
    health.pending('serve-config', undefined);
    changed(now + 2 * HOUR, v, 'the pending reason gone');
    health.manage(['a.ts.net', 'b.ts.net']);
    assert.equal(health.current(now + 2 * HOUR).healthy, false, 'a new domain without a certificate');
  });
});

describe('logHealthChanges', () => {
  it('logs each turn of the verdict once, with its reason, and nothing on a change that keeps it (a problem while not healthy)', () => {
    const clock = new FakeClock(10 * HOUR);
    const { logger, entries } = recordingLogger();
    const health = new HealthState();
    logHealthChanges(health, clock, logger);
    health.manage(['a.ts.net', 'b.ts.net']);
    health.problem('a.ts.net', 'tailscaled not listening');
    health.certificate('a.ts.net', cert('a.ts.net', clock.now() - HOUR, clock.now() + HOUR));
    health.certificate('b.ts.net', cert('b.ts.net', clock.now() - HOUR, clock.now() + HOUR));
    health.certificate('b.ts.net', cert('b.ts.net', clock.now() - HOUR, clock.now() + 2 * HOUR));
    assert.deepEqual(
      entries.map(({ msg, healthy, reason }) => ({ msg, healthy, reason })),
      [
        { msg: 'not healthy', healthy: false, reason: 'a.ts.net: no certificate yet; b.ts.net: no certificate yet' },
        { msg: 'healthy', healthy: true, reason: 'ok' },
      ],
    );
  });
});
