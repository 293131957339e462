// The daemon against an emulated CA that backdates, runs on a skewed clock or hands out certificates too
// short for the renewal rule: one issuance per renewal window, never a loop (issue 10, part 1).
// Scaled a tenth: certificates valid 5 s from issuance stand for 45 s, backdating 6 s for 60 s. The daemon and
// the CA share a fake clock, moved to each check the daemon plans once it waits for it: a loaded machine makes
// the test slower, never the gaps different.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import type { IssuedEvent } from '../../src/emulator/issuer.ts';
import type { EmulatorOptions } from '../../src/emulator/server.ts';
import type { Daemon } from '../../src/daemon/daemon.ts';
import { FakeClock } from '../support/fake-clock.ts';
import { recordingLogger } from '../support/localapi.ts';
import { DOMAIN, emulatorIn, standaloneDaemon, useTempDir } from '../support/standalone.ts';
import { nextEvent, onEvent, until } from '../support/wait.ts';

const S = 1000;

interface Observed {
  issued: Array<{ at: number; event: IssuedEvent }>;
  requests: number;
  metrics: string;
  lines: ReturnType<typeof recordingLogger>['lines'];
}

/** A whole second of the wall clock's, as certificates' times are: where a test starts its fake clock. */
const wholeSecond = (): number => Math.ceil(Date.now() / S) * S;

/**
 * A CertPair call's timeout is the wall clock's (a network bound); the emulator answers from this process,
 * whose share of a loaded machine can keep an answer past FAST_FLAGS' timeout. Not what these cases test.
 */
const PATIENT = ['--cert-timeout', '10m'];

/**
 * Moves `clock` to each check the daemon plans, once its loop sleeps until then (moved before, the sleep would
 * start late), until `done`.
 */
async function drive(clock: FakeClock, daemon: Daemon, done: () => boolean): Promise<void> {
  const planned = new Set<number>();
  const onPlanned = ({ at }: { at: number }) => planned.add(at);
  daemon.events.on('planned', onPlanned);
  try {
    for (;;) {
      const dueAt = () => clock.pendingDues().find((due) => planned.has(due) && due > clock.now());
      const asleep = () => done() || dueAt() !== undefined;
      // Bounded by the test's timeout: how long a turn takes is the machine's business.
      await until('the daemon asleep until a check it planned', asleep, [onEvent(daemon.events, 'planned'), (l) => clock.onSleep(l)], 2 ** 31 - 1);
      if (done()) return;
      const due = dueAt()!;
      planned.clear();
      await clock.advance(due - clock.now());
    }
  } finally {
    daemon.events.off('planned', onPlanned);
  }
}

/** Runs the daemon against an emulator configured with `options` until `count` issuances happened, on a shared fake clock. */
async function observe(dir: string, name: string, options: EmulatorOptions, count: number, flags: string[] = []): Promise<Observed> {
  const clock = new FakeClock(wholeSecond());
  const emulator = await emulatorIn(dir, { listen: join(dir, `${name}.sock`), clock, ...options });
  const issued: Observed['issued'] = [];
  let requests = 0;
  emulator.events.on('issued', (event: IssuedEvent) => issued.push({ at: clock.now(), event }));
  emulator.events.on('certRequest', () => requests++);
  const { logger, lines } = recordingLogger();
  const daemon = await standaloneDaemon(emulator, join(dir, name), [...PATIENT, ...flags], logger, clock);
  try {
    await drive(clock, daemon, () => issued.length >= count);
    const metrics = await (await fetch(`${daemon.address}/metrics`)).text();
    return { issued, requests, metrics, lines };
  } finally {
    await daemon.stop();
    await emulator.close();
  }
}

/** Gaps between consecutive issuances, in ms of the fake clock. */
const gaps = (o: Observed): number[] => o.issued.slice(1).map((x, i) => x.at - o.issued[i]!.at);

// The cases run at once, each with its own clock, emulator, daemon and directory.
describe('issuance against backdating, skewed and short-lived issuers (standalone daemon + emulator)', { concurrency: true }, () => {
  const dir = useTempDir();

  it('5 s certificates backdated 6 s: one issuance per renewal window (about 2.5 s), not a storm', async () => {
    const o = await observe(dir(), 'storm', { certLifetimeMs: 5 * S, certBackdateMs: 6 * S }, 4);
    // Renewal at half of the validity left when obtained: 2.5 s, less up to 1 s of X.509 second rounding.
    for (const gap of gaps(o)) assert.ok(gap >= 1500, `issuances ${gap} ms apart (gaps ${gaps(o).join(', ')})`);
    assert.ok(o.requests <= o.issued.length + 2, `${o.requests} CertPair calls for ${o.issued.length} issuances`);
    assert.doesNotMatch(o.metrics, /result="too_short",reason="\w+"\} [1-9]/);
  });

  it('restarts inside the renewal window issue nothing: the directory store remembers when the pair was obtained', async () => {
    // 20 s certificates backdated 20 s: measured from notBefore they would be due at once after a restart.
    const clock = new FakeClock(wholeSecond());
    const emulator = await emulatorIn(dir(), { listen: join(dir(), 'restart.sock'), clock, certLifetimeMs: 20 * S, certBackdateMs: 20 * S });
    let issued = 0;
    emulator.events.on('issued', () => issued++);
    try {
      for (let start = 0; start < 3; start++) {
        const daemon = await standaloneDaemon(emulator, join(dir(), 'restart'), PATIENT, undefined, clock);
        try {
          // Its first turn ends with the next check planned: whatever it decided, it has done by then.
          await nextEvent(daemon.events, 'planned', () => true, 2 ** 31 - 1);
          assert.ok(daemon.health.evaluate(clock.now()).healthy);
        } finally {
          // Stopped whatever failed: a daemon left listening keeps the test process from exiting.
          await daemon.stop();
        }
        // Restarted a second later, well inside the window (renewal at 10 s of a 20 s certificate).
        await clock.advance(S);
      }
      assert.equal(issued, 1, `${issued} issuances over three starts inside one renewal window`);
    } finally {
      await emulator.close();
    }
  });

  it('a CA clock 3 s behind (certificates expire early): still one per window', async () => {
    const behind = await observe(dir(), 'behind', { certLifetimeMs: 8 * S, certBackdateMs: 6 * S, clockSkewMs: -3 * S }, 3);
    for (const gap of gaps(behind)) assert.ok(gap >= 1500, `CA behind: issuances ${gap} ms apart (gaps ${gaps(behind).join(', ')})`);
  });

  it('a CA clock 2 s ahead (not valid yet on arrival): used from its notBefore, still one per window', async () => {
    const ahead = await observe(dir(), 'ahead', { certLifetimeMs: 5 * S, certBackdateMs: 0, clockSkewMs: 2 * S }, 3);
    // Each pair is used from its notBefore (2 s after issuance) and renewed 2.5 s later: 4.5 s, less up to a
    // second where the certificate's whole-second notBefore falls.
    // A storm is gaps of milliseconds.
    for (const gap of gaps(ahead)) assert.ok(gap >= 3000, `CA ahead: issuances ${gap} ms apart (gaps ${gaps(ahead).join(', ')})`);
    assert.ok(
      ahead.requests <= ahead.issued.length + 1,
      `${ahead.requests} CertPair calls for ${ahead.issued.length} issuances: no call while a pair was not valid yet`,
    );
  });

  it('certificates due sooner than the minimum interval: CERTSHARE_CERT_TOO_SHORT, counted, logged, backing off', async () => {
    // 2 s certificates, a 1.5 s floor (--first-retry): due after 1 s, sooner than the floor allows.
    const o = await observe(dir(), 'short', { certLifetimeMs: 2 * S, certBackdateMs: 0 }, 3, ['--first-retry', '1500ms']);
    const g = gaps(o);
    assert.deepEqual(g, [1500, 3000], 'backoff doubles from the floor');
    // Summed over the reasons the calls were made (a first issuance, or a renewal of the short one).
    const tooShort = [...o.metrics.matchAll(/certshare_issuance_attempts_total\{domain="web\.tailnet-test\.ts\.net",result="too_short",reason="\w+"\} (\d+)/g)];
    assert.ok(tooShort.reduce((sum, m) => sum + Number(m[1]), 0) >= 2, `too_short attempts counted: ${tooShort.map((m) => m[0]).join('; ')}`);
    const line = o.lines.find((l) => (l.obj as { code?: string }).code === 'CERTSHARE_CERT_TOO_SHORT');
    assert.ok(line, 'a CERTSHARE_CERT_TOO_SHORT log line');
    const fields = line.obj as Record<string, unknown>;
    for (const key of ['notBefore', 'notAfter', 'lifetimeMs', 'validFromNowMs', 'minIssueIntervalMs', 'retryInMs'])
      assert.ok(key in fields, `log line has ${key}`);
    assert.equal(DOMAIN, 'web.tailnet-test.ts.net');
  });
});
