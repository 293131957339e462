// The writer's ARI schedule (src/acme/ari-checker.ts) with a fake CA and a fake clock: only the writer
// asks, a new certificate is asked about at once and its predecessor's answer never handed out for it,
// Retry-After and --ari-interval pace the checks, failures only count, stop ends everything.
import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { describe, it } from 'node:test';
import type { AriCheck } from '../../src/acme/renewal-info-client.ts';
import { AriChecker } from '../../src/acme/ari-checker.ts';
import { inspectCertPair } from '../../src/core/certificates/certificate.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import { ariVerdict, type AriCertificate } from '../../src/core/renewal/renewal-info.ts';
import type { StoredCert } from '../../src/core/ports/store.ts';
import { makePair } from '../support/certs.ts';
import { FakeClock } from '../support/fake-clock.ts';
import { onEvent, until } from '../support/wait.ts';

const D = 'web.tailnet-test.ts.net';
const H = 3_600_000;

async function cert(clock: FakeClock): Promise<StoredCert> {
  const pair = await makePair(D, clock.now() - 60_000, 90 * 24 * H);
  return { pair, info: inspectCertPair(pair, D), obtainedAt: clock.now() };
}

function setup(answer: (c: AriCertificate) => AriCheck, quietMs?: number) {
  const clock = new FakeClock(Date.now());
  const events = new EventEmitter();
  const asked: AriCertificate[] = [];
  const outcomes: string[] = [];
  const woken: string[] = [];
  const role = { writer: false, listeners: new Set<() => void>() };
  const checker = new AriChecker({
    client: {
      check: async (c) => {
        asked.push(c);
        events.emit('asked');
        return answer(c);
      },
    },
    role: {
      canIssue: () => role.writer,
      onChange: (l) => {
        role.listeners.add(l);
        return () => role.listeners.delete(l);
      },
    },
    clock,
    logger: silentLogger,
    intervalMs: 6 * H,
    random: () => 0.5,
    metrics: { ariWindow: () => {}, ariCheck: (o) => outcomes.push(o) },
    wake: (d) => woken.push(d),
    describe: () => {},
    ...(quietMs === undefined ? {} : { quietUntil: clock.now() + quietMs }),
  });
  const becomeWriter = (writer: boolean): void => {
    role.writer = writer;
    for (const l of role.listeners) l();
  };
  const askedTimes = (n: number): Promise<void> => until(`${n} ARI checks`, () => asked.length >= n, [onEvent(events, 'asked')]);
  return { clock, checker, asked, outcomes, woken, becomeWriter, askedTimes };
}

const windowAt = (start: number, end: number, certId: string, fetchedAt: number, retryAfterMs?: number): AriCheck => ({
  outcome: 'ok',
  info: { certId, window: { start, end }, fetchedAt },
  retryAfterMs,
});

describe('AriChecker: the writer asks the CA about the certificates it holds', () => {
  it('asks only as the writer, at once for a certificate, then after Retry-After within the interval', async () => {
    const t0 = Date.now();
    const t = setup((c) => windowAt(t0 - 2 * H, t0 - H, c.certId, t.clock.now(), H));
    const held = await cert(t.clock);
    t.checker.certificate(D, held);
    await new Promise((resolve) => setImmediate(resolve));
    assert.equal(t.asked.length, 0, 'a reader never asks');
    assert.equal(t.checker.stateFor(D, held.info.serial), undefined);

    t.becomeWriter(true);
    await t.askedTimes(1);
    await t.clock.waitForSleepers(1);
    const state = t.checker.stateFor(D, held.info.serial);
    assert.ok(state?.answer, 'the answer is kept for the certificate held');
    assert.equal(ariVerdict(state, t.clock.now(), 0).kind, 'order', 'a window in the past: order now');
    assert.deepEqual(t.woken, [D], 'the loop is woken by the new answer');
    assert.deepEqual(t.clock.pendingDurations(), [H], "the next check after the CA's Retry-After");

    await t.clock.advance(H);
    await t.askedTimes(2);
    await t.clock.waitForSleepers(1);
    assert.deepEqual(t.woken, [D], 'the same window again: the loop keeps its plan');
    t.becomeWriter(false);
    await t.clock.advance(7 * H);
    assert.equal(t.asked.length, 2, 'no check after the role is lost');
    await t.checker.stop();
  });

  it("never hands out the previous certificate's answer for a new one; renewalDone silences the one renewed", async () => {
    const t = setup((c) => windowAt(t.clock.now() - 2 * H, t.clock.now() - H, c.certId, t.clock.now()));
    t.becomeWriter(true);
    const first = await cert(t.clock);
    t.checker.certificate(D, first);
    await t.askedTimes(1);
    await t.clock.waitForSleepers(1);
    assert.ok(t.checker.stateFor(D, first.info.serial)?.answer);
    t.checker.renewalDone(D, first.info.serial);
    assert.deepEqual(ariVerdict(t.checker.stateFor(D, first.info.serial)!, t.clock.now(), 0), { kind: 'silent', why: 'already_renewed' });

    const second = await cert(t.clock);
    t.checker.certificate(D, second);
    assert.equal(t.checker.stateFor(D, second.info.serial), undefined, 'nothing known for the new certificate before its ID');
    await t.askedTimes(2);
    await t.clock.waitForSleepers(1);
    assert.equal(t.checker.stateFor(D, first.info.serial), undefined, 'the previous certificate is no longer held');
    const state = t.checker.stateFor(D, second.info.serial);
    assert.ok(state?.answer && state.answer.certId === t.asked[1]!.certId && state.answer.certId !== t.asked[0]!.certId);
    assert.equal(ariVerdict(state, t.clock.now(), 0).kind, 'order', 'its own answer, fetched after it was held');
    assert.deepEqual(t.clock.pendingDurations(), [6 * H], 'without Retry-After: the interval');

    t.checker.retain([]);
    assert.equal(t.checker.stateFor(D, second.info.serial), undefined);
    await t.checker.stop();
  });

  it('a failed check only counts; the next one waits for the interval', async () => {
    const t = setup(() => ({ outcome: 'unavailable', code: 'CERTSHARE_ARI_UNAVAILABLE', message: 'HTTP 500', retryAfterMs: undefined }));
    t.becomeWriter(true);
    const held = await cert(t.clock);
    t.checker.certificate(D, held);
    await t.askedTimes(1);
    await t.clock.waitForSleepers(1);
    assert.deepEqual(t.outcomes, ['unavailable']);
    assert.equal(t.checker.stateFor(D, held.info.serial)?.answer, undefined);
    assert.deepEqual(t.woken, []);
    assert.deepEqual(t.clock.pendingDurations(), [6 * H]);
    await t.checker.stop();
    assert.equal(t.clock.pendingSleeps(), 0, 'stop ends the schedule');
  });

  it('does nothing during the quiet start, not even the certificate ID; then asks at once', async () => {
    const t = setup((c) => windowAt(t.clock.now() + H, t.clock.now() + 2 * H, c.certId, t.clock.now()), 1000);
    t.becomeWriter(true);
    const held = await cert(t.clock);
    t.checker.certificate(D, held);
    await t.clock.waitForSleepers(1);
    assert.deepEqual(t.clock.pendingDurations(), [1000], 'waits for the end of the quiet start');
    assert.equal(t.checker.stateFor(D, held.info.serial), undefined, 'no ID computed yet');
    assert.equal(t.asked.length, 0);
    await t.clock.advance(999);
    assert.equal(t.asked.length, 0, 'nothing before its end');
    await t.clock.advance(1);
    await t.askedTimes(1);
    await t.clock.waitForSleepers(1);
    assert.ok(t.checker.stateFor(D, held.info.serial)?.answer, 'asked at its end');
    await t.checker.stop();
  });
});
