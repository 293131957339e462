// The readiness gate's loop (src/kube/readiness-gate.ts) on an injected clock, its patches recorded: what
// the proxy serves not settled (a projection write stalled on a loaded disk, seen in a 30-minute chaos run
// with three clusters) must not hold the Pod in rotation past a certificate's exit from it.
import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { describe, it } from 'node:test';
import type { CertInfo } from '../../src/core/certificates/certificate.ts';
import { HealthState } from '../../src/core/loop/health.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import type { KubeConnection } from '../../src/kube/connection.ts';
import { ReadinessGate } from '../../src/kube/readiness-gate.ts';
import { FakeClock } from '../support/fake-clock.ts';
import { nextEvent } from '../support/wait.ts';

const DOMAIN = 'proxy.tailnet-0000.ts.net';
const LEAD_MS = 1_000;
const cert = (serial: string, notBefore: number, notAfter: number) => ({
  pair: { certPem: '', keyPem: '' },
  info: { domain: DOMAIN, notBefore, notAfter, serial, fingerprint256: '' } satisfies CertInfo,
  obtainedAt: notBefore,
});

/** A connection whose pods/status patches are recorded (status, reason), each announced as 'patched'. */
function recordingConnection(): { connection: KubeConnection; patches: Array<[string, string]>; events: EventEmitter } {
  const patches: Array<[string, string]> = [];
  const events = new EventEmitter();
  const core = {
    async patchNamespacedPodStatus(request: { body: { status: { conditions: Array<{ status: string; reason: string }> } } }) {
      const condition = request.body.status.conditions[0]!;
      patches.push([condition.status, condition.reason]);
      events.emit('patched', condition);
      return {};
    },
  };
  return { connection: { core, namespace: 'proxy', requestTimeoutMs: 1_000 } as unknown as KubeConnection, patches, events };
}

describe('the readiness gate', () => {
  it('leaves rotation at the exit time even while what the proxy serves is not settled', { timeout: 10_000 }, async () => {
    const clock = new FakeClock();
    const health = new HealthState();
    health.manage([DOMAIN]);
    const start = clock.now();
    health.certificate(DOMAIN, cert('A', start, start + 20_000));
    let stalled = false;
    const { connection, patches, events } = recordingConnection();
    const gate = new ReadinessGate({
      connection,
      podName: 'proxy-0',
      conditionType: 'certshare.io/certificates',
      health,
      clock,
      logger: silentLogger,
      validityEnd: (held) => held.notAfter - LEAD_MS,
      settled: () => (stalled ? new Promise<void>(() => {}) : Promise.resolve()),
    });
    const ready = nextEvent(events, 'patched');
    gate.start();
    try {
      await ready;
      await clock.waitForSleepers(1); // the gate waits for the certificate's exit from rotation
      // Another copy of the certificate arrives; its files are never written.
      stalled = true;
      health.certificate(DOMAIN, cert('B', start, start + 20_000));
      const left = nextEvent<{ status: string }>(events, 'patched', (c) => c.status === 'False');
      await clock.waitForSleepers(1); // the old gate hangs on `settled` instead
      await clock.advance(20_000 - LEAD_MS);
      await left;
      assert.deepEqual(patches, [
        ['True', 'CertificatesValid'],
        ['False', 'CertificateExpiring'],
      ]);
    } finally {
      await gate.stop();
    }
  });
});
