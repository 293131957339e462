import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { DEFAULT_STARTUP_GRACE_MS, StartupGrace, startupLevel, type StartupLevel, type StartupMoment } from '../../src/core/loop/startup-grace.ts';
import { FakeClock } from '../support/fake-clock.ts';

const START = Date.UTC(2026, 10, 25, 8, 0, 0);
const GRACE = 30_000;

describe('startupLevel: an expected start-up state is info within the grace, a warning after it or once it cleared', () => {
  const cases: Array<[name: string, moment: Omit<StartupMoment, 'startedAt'>, level: StartupLevel]> = [
    ['at the start', { graceMs: GRACE, now: START, clearedOnce: false }, 'info'],
    ['a moment before the grace ends', { graceMs: GRACE, now: START + GRACE - 1, clearedOnce: false }, 'info'],
    ['as the grace ends', { graceMs: GRACE, now: START + GRACE, clearedOnce: false }, 'warn'],
    ['long after the start', { graceMs: GRACE, now: START + 3_600_000, clearedOnce: false }, 'warn'],
    ['within the grace, but seen cleared once (tailscaled answered, then went away)', { graceMs: GRACE, now: START + 1000, clearedOnce: true }, 'warn'],
    ['at the start, cleared once', { graceMs: GRACE, now: START, clearedOnce: true }, 'warn'],
    ['no grace (--startup-grace 0)', { graceMs: 0, now: START, clearedOnce: false }, 'warn'],
  ];
  for (const [name, moment, level] of cases) {
    it(`${name}: ${level}`, () => {
      assert.equal(startupLevel({ startedAt: START, ...moment }), level);
    });
  }
});

describe('StartupGrace: the process start from the injected clock, one cleared flag per condition', () => {
  it('defaults to 30 s from the moment it is made', async () => {
    const clock = new FakeClock(START);
    const grace = new StartupGrace(clock);
    assert.equal(grace.graceMs, DEFAULT_STARTUP_GRACE_MS);
    assert.equal(grace.startedAt, START);
    const condition = grace.condition();
    await clock.advance(DEFAULT_STARTUP_GRACE_MS - 1);
    assert.equal(condition.level(), 'info');
    await clock.advance(1);
    assert.equal(condition.level(), 'warn');
  });

  it('clears one condition without the others: a domain that held a certificate says nothing of another', () => {
    const grace = new StartupGrace(new FakeClock(START), GRACE);
    const tailscaled = grace.condition();
    const firstCertificate = grace.condition();
    tailscaled.cleared();
    assert.equal(tailscaled.level(), 'warn');
    assert.equal(firstCertificate.level(), 'info');
  });
});
