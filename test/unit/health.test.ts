import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { CertInfo } from '../../src/core/certificate.ts';
import { HealthState } from '../../src/core/health.ts';

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
