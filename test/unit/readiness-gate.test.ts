// The readiness gate's loop (src/kube/readiness-gate.ts) on an injected clock, its patches recorded: what
// the proxy serves not settled (a projection write stalled on a loaded disk, seen in a 30-minute chaos run
// with three clusters) must not hold the Pod in rotation past a certificate's exit from it.
import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { describe, it } from 'node:test';
import type { CertInfo } from '../../src/core/certificates/certificate.ts';
import { validateCertPair } from '../../src/core/certificates/certificate.ts';
import { CertLoop } from '../../src/core/loop/cert-loop.ts';
import { HealthState } from '../../src/core/loop/health.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import { fanOut } from '../../src/core/ports/observer.ts';
import { staticRole } from '../../src/core/ports/store.ts';
import { rotationExitTime } from '../../src/core/renewal/renewal.ts';
import type { KubeConnection } from '../../src/kube/connection.ts';
import { ReadinessGate } from '../../src/kube/readiness-gate.ts';
import { makePair } from '../support/certs.ts';
import { FakeClock } from '../support/fake-clock.ts';
import { MemoryStore } from '../support/memory-store.ts';
import { nextEvent } from '../support/wait.ts';

const DOMAIN = 'proxy.tailnet-0000.ts.net';
const LEAD_MS = 1_000;
const cert = (serial: string, notBefore: number, notAfter: number) => ({
  pair: { certPem: '', keyPem: '' },
  info: { domain: DOMAIN, notBefore, notAfter, serial, fingerprint256: '' } satisfies CertInfo,
  obtainedAt: notBefore,
});

/**
 * A connection whose pods/status patches are recorded (status, reason), each announced as 'patched' once
 * answered. `answer(status)`, if given, decides when a patch is answered: a promise that rejects when the
 * request's signal aborts, as the transport's does.
 */
function recordingConnection(answer?: (status: string, signal: AbortSignal | undefined) => Promise<void>): {
  connection: KubeConnection;
  patches: Array<[string, string]>;
  events: EventEmitter;
} {
  const patches: Array<[string, string]> = [];
  const events = new EventEmitter();
  const core = {
    async patchNamespacedPodStatus(
      request: { body: { status: { conditions: Array<{ status: string; reason: string }> } } },
      options?: { middleware?: Array<{ pre(context: { setSignal(s: AbortSignal): void; setHeaderParam(): void }): unknown }> },
    ) {
      const condition = request.body.status.conditions[0]!;
      let signal: AbortSignal | undefined;
      for (const m of options?.middleware ?? []) m.pre({ setSignal: (s) => (signal = s), setHeaderParam: () => {} });
      await answer?.(condition.status, signal);
      patches.push([condition.status, condition.reason]);
      events.emit('patched', condition);
      return {};
    },
  };
  return { connection: { core, namespace: 'proxy', requestTimeoutMs: 1_000 } as unknown as KubeConnection, patches, events };
}

/** proxy-0's gate of the condition certshare.io/certificates, with `options` (validityEnd, settled). */
const gateOf = (connection: KubeConnection, health: HealthState, clock: FakeClock, options: Partial<ConstructorParameters<typeof ReadinessGate>[0]>) =>
  new ReadinessGate({ connection, podName: 'proxy-0', conditionType: 'certshare.io/certificates', health, clock, logger: silentLogger, ...options });

describe('the readiness gate', () => {
  it('leaves rotation at the exit time even while what the proxy serves is not settled', { timeout: 10_000 }, async () => {
    const clock = new FakeClock();
    const health = new HealthState();
    health.manage([DOMAIN]);
    const start = clock.now();
    health.certificate(DOMAIN, cert('A', start, start + 20_000));
    let stalled = false;
    const { connection, patches, events } = recordingConnection();
    const gate = gateOf(connection, health, clock, {
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

  it('says False, never True first, when settling what the proxy serves turns health unhealthy (a projection write that failed)', async () => {
    const clock = new FakeClock();
    const health = new HealthState();
    health.manage([DOMAIN]);
    health.certificate(DOMAIN, cert('A', clock.now(), clock.now() + 20_000));
    const { connection, patches, events } = recordingConnection();
    const gate = gateOf(connection, health, clock, {
      // The Projector reports a failed write through health before its attempt ends.
      settled: async () => health.pending(`files:${DOMAIN}`, `${DOMAIN}: could not write its certificate files (ENOSPC)`),
    });
    const first = nextEvent(events, 'patched');
    gate.start();
    try {
      await first;
      assert.deepEqual(patches, [['False', 'CertificateNotValid']]);
    } finally {
      await gate.stop();
    }
  });

  it('leaves rotation at the exit point while the loop sits in a CertPair call that never answers', { timeout: 20_000 }, async () => {
    // Found by the three-cluster chaos run (seed 42, invariant 5): a replica Ready inside its readiness lead
    // stayed True past the exit point and the expiry, with no patch at all, while its loop sat in a CertPair
    // call that hung. A pass of the gate that straddles the exit point (here a patch to True answered after it;
    // there, most likely, a timer that fired a millisecond early: True decided just before the point, the next
    // exit looked up just after it) found no later exit and slept an hour, until a health change, which only the
    // loop's turn sends. The gate's own timer must take the Pod out at the exit point.
    const clock = new FakeClock();
    const health = new HealthState();
    health.manage([DOMAIN]);
    const start = clock.now();
    // 20 s, 15 s old: due (renewed at half), its exit point 1 s before expiry (5% of the lifetime).
    const pair = await makePair(DOMAIN, start - 15_000, 20_000);
    const info = validateCertPair(pair, DOMAIN, start);
    const store = new MemoryStore();
    await store.save(DOMAIN, { pair, info });
    let callStarted!: () => void;
    const called = new Promise<void>((resolve) => (callStarted = resolve));
    const loop = new CertLoop(DOMAIN, {
      localApi: {
        certPair: (_domain, { signal }) => {
          callStarted();
          return new Promise((_resolve, reject) => signal.addEventListener('abort', () => reject(signal.reason), { once: true }));
        },
      },
      store,
      role: staticRole('proxy-0', true),
      availability: { waitFor: async () => {} },
      clock,
      renewal: { renewFraction: 1 / 3, checkIntervalMs: 3_600_000 },
      backoff: { firstRetryMs: 1_000, retryCapMs: 60_000, rateLimitFirstRetryMs: 60_000 },
      observer: fanOut([health]),
      logger: silentLogger,
      intentTtlMs: 60_000,
    });
    let releaseTrue!: () => void;
    const trueAnswered = new Promise<void>((resolve) => (releaseTrue = resolve));
    const { connection, patches, events } = recordingConnection(async (status, signal) => {
      if (status !== 'True') return;
      // The API server answers the patch to True late: after the exit point.
      await new Promise<void>((resolve, reject) => {
        void trueAnswered.then(resolve);
        signal?.addEventListener('abort', () => reject(signal.reason), { once: true });
      });
    });
    const renewal = { renewFraction: 1 / 3, checkIntervalMs: 3_600_000 };
    const gate = gateOf(connection, health, clock, { validityEnd: (held) => rotationExitTime(held, renewal, 60_000) });
    const stop = new AbortController();
    const running = loop.run(stop.signal);
    try {
      await called; // the renewal's CertPair call: it never answers
      gate.start();
      const exitAt = rotationExitTime({ notBefore: info.notBefore, notAfter: info.notAfter }, renewal, 60_000);
      assert.equal(exitAt, info.notAfter - 1_000);
      const left = nextEvent<{ status: string; reason: string }>(events, 'patched', (c) => c.status === 'False', 5_000);
      await clock.waitForSleepers(1);
      await clock.advance(exitAt - clock.now());
      releaseTrue();
      const condition = await left;
      assert.equal(condition.reason, 'CertificateExpiring');
      assert.ok(clock.now() < info.notAfter, 'out of rotation at the exit point, before the expiry');
      assert.deepEqual(patches.at(-1), ['False', 'CertificateExpiring']);
    } finally {
      stop.abort();
      await running;
      await gate.stop();
    }
  });

  it('says the certificate expired at its notAfter, past the exit point, with no health change to wake it', { timeout: 10_000 }, async () => {
    // Found by CI: a reader's gate said CertificateExpiring at the exit point, then slept until its minute's resend
    // (no later exit point), so CertificateNotValid came a minute late unless the loop's turn happened to wake it.
    const clock = new FakeClock();
    const health = new HealthState();
    health.manage([DOMAIN]);
    const start = clock.now();
    health.certificate(DOMAIN, cert('A', start, start + 20_000));
    const { connection, patches, events } = recordingConnection();
    const gate = gateOf(connection, health, clock, { validityEnd: (held) => held.notAfter - LEAD_MS });
    const ready = nextEvent(events, 'patched');
    gate.start();
    try {
      await ready;
      await clock.waitForSleepers(1);
      const expiring = nextEvent(events, 'patched');
      await clock.advance(20_000 - LEAD_MS);
      await expiring;
      await clock.waitForSleepers(1);
      const expired = nextEvent(events, 'patched', () => true, 5_000);
      await clock.advance(LEAD_MS);
      await expired;
      assert.deepEqual(patches, [
        ['True', 'CertificatesValid'],
        ['False', 'CertificateExpiring'],
        ['False', 'CertificateNotValid'],
      ]);
    } finally {
      await gate.stop();
    }
  });

  it("sends its False again as it was written, a minute on: a True written over it with the Pod's token does not stand", { timeout: 10_000 }, async () => {
    // certshare never reads its Pod: on cd68f49 it patched only when what it wanted changed, so one True written with
    // the Pod's token (a proxy sharing the process namespace reads it) held the Pod Ready with no valid certificate.
    const clock = new FakeClock();
    const health = new HealthState();
    health.manage([DOMAIN]);
    const sent: unknown[] = [];
    const { connection, events } = recordingConnection();
    events.on('patched', (condition) => sent.push(condition));
    const gate = gateOf(connection, health, clock, {});
    try {
      const first = nextEvent(events, 'patched');
      gate.start();
      await first;
      await clock.waitForSleepers(1);
      await clock.advance(59_999);
      assert.equal(sent.length, 1, 'nothing sent again within the minute');
      const again = nextEvent(events, 'patched', () => true, 5_000);
      await clock.advance(1);
      await again;
      assert.deepEqual(sent, [sent[0], sent[0]], 'the same condition, its transition time included: a no-op while it stands');
      assert.equal((sent[0] as { status: string }).status, 'False');
    } finally {
      await gate.stop();
    }
  });

  it('patches False after a patch to True cut at the exit point, which the API server may have applied', { timeout: 10_000 }, async () => {
    const clock = new FakeClock();
    const health = new HealthState();
    health.manage([DOMAIN]);
    const start = clock.now();
    health.certificate(DOMAIN, cert('A', start, start + 20_000));
    // What the Pod's condition says: a patch is applied when sent; the answer to one to True may never come.
    let condition = '';
    let hangTrue = false;
    const sent = new EventEmitter();
    const { connection, events } = recordingConnection(async (status, signal) => {
      condition = status;
      sent.emit('sent', status);
      if (status === 'True' && hangTrue) {
        await new Promise<void>((_resolve, reject) => signal?.addEventListener('abort', () => reject(signal.reason), { once: true }));
      }
    });
    const gate = gateOf(connection, health, clock, { validityEnd: (held) => held.notAfter - LEAD_MS });
    try {
      const ready = nextEvent(events, 'patched');
      gate.start();
      await ready;
      const expiring = nextEvent<{ reason: string }>(events, 'patched', (c) => c.reason === 'CertificateExpiring', 5_000);
      await clock.waitForSleepers(1);
      await clock.advance(20_000 - LEAD_MS); // A leaves rotation: False, CertificateExpiring
      await expiring;
      // B arrives; its patch to True is applied, never answered, and cut at B's exit point.
      hangTrue = true;
      const trueSent = nextEvent(sent, 'sent', (status) => status === 'True');
      health.certificate(DOMAIN, cert('B', clock.now(), clock.now() + 20_000));
      await trueSent;
      const left = nextEvent<{ reason: string }>(events, 'patched', (c) => c.reason === 'CertificateExpiring', 5_000);
      await clock.advance(20_000 - LEAD_MS);
      await left;
      assert.equal(condition, 'False', 'the condition says False again, not the True the cut patch left');
    } finally {
      await gate.stop();
    }
  });

  it('leaves rotation when the clock passes the exit point while a pass waits for what the proxy serves', { timeout: 10_000 }, async () => {
    // A pass that judged the certificates valid just before the exit point looked for the next exit just after
    // it: none, so it waited for the projection without a bound (a stalled write: for ever), the Pod in rotation.
    const fake = new FakeClock();
    let skew = 0;
    const clock = { now: () => fake.now() + skew, sleep: (ms: number, signal?: AbortSignal) => fake.sleep(ms, signal) };
    const health = new HealthState();
    health.manage([DOMAIN]);
    const start = clock.now();
    health.certificate(DOMAIN, cert('A', start, start + 20_000));
    let stalled = false;
    let jump = false;
    const waiting = new EventEmitter();
    const judge = health.evaluate.bind(health);
    // The clock reaches the exit point right after the gate's verdict, before it looks for the next exit.
    health.evaluate = (now, end) => {
      const verdict = judge(now, end);
      if (jump && verdict.healthy) {
        jump = false;
        skew = start + 20_000 - LEAD_MS - fake.now();
      }
      return verdict;
    };
    const { connection, events } = recordingConnection();
    const gate = new ReadinessGate({
      connection,
      podName: 'proxy-0',
      conditionType: 'certshare.io/certificates',
      health,
      clock,
      logger: silentLogger,
      validityEnd: (held) => held.notAfter - LEAD_MS,
      settled: () => {
        if (!stalled) return Promise.resolve();
        waiting.emit('waiting');
        return new Promise<void>(() => {}); // a projection write that never ends
      },
    });
    try {
      const ready = nextEvent(events, 'patched');
      gate.start();
      await ready;
      await fake.advance(20_000 - LEAD_MS - 1); // a millisecond before the exit point
      stalled = true;
      jump = true;
      const left = nextEvent<{ status: string; reason: string }>(events, 'patched', (c) => c.status === 'False', 5_000);
      const waits = nextEvent(waiting, 'waiting');
      health.certificate(DOMAIN, cert('A', start, start + 20_000)); // any change: a new pass
      await waits; // the new pass waits for the projection, past the exit point
      assert.equal(clock.now(), start + 20_000 - LEAD_MS);
      await fake.advance(1);
      assert.equal((await left).reason, 'CertificateExpiring');
    } finally {
      await gate.stop();
    }
  });
});
