import { test } from 'node:test';
import assert from 'node:assert/strict';
import { FakeClock } from '../../support/fake-clock.ts';

test('sleepers wake in due order, ties in call order, with now() at their due time', async () => {
  const clock = new FakeClock(1000);
  const woke: [string, number][] = [];
  const sleep = (name: string, ms: number) => clock.sleep(ms).then(() => woke.push([name, clock.now()]));
  void sleep('c', 300);
  void sleep('a', 100);
  void sleep('b1', 200);
  void sleep('b2', 200);
  assert.equal(clock.pendingSleeps(), 4);
  assert.deepEqual(clock.pendingDurations(), [100, 200, 200, 300]);
  assert.equal(clock.nextDueIn(), 100);
  await clock.advance(250);
  assert.deepEqual(woke, [
    ['a', 1100],
    ['b1', 1200],
    ['b2', 1200],
  ]);
  assert.equal(clock.now(), 1250);
  assert.equal(clock.pendingSleeps(), 1);
  await clock.advanceToNext();
  assert.deepEqual(woke.at(-1), ['c', 1300]);
});

test('a sleep started by a woken sleeper inside the window is woken by the same advance', async () => {
  const clock = new FakeClock(0);
  const ticks: number[] = [];
  const loop = (async () => {
    for (let i = 0; i < 3; i++) {
      await clock.sleep(100);
      ticks.push(clock.now());
    }
  })();
  await clock.advance(250);
  assert.deepEqual(ticks, [100, 200]);
  await clock.advance(50);
  await loop;
  assert.deepEqual(ticks, [100, 200, 300]);
});

test('abort rejects with the reason and removes the sleeper; zero sleeps resolve at once', async () => {
  const clock = new FakeClock();
  const controller = new AbortController();
  const reason = new Error('stop');
  const sleeping = clock.sleep(1000, controller.signal);
  assert.equal(clock.pendingSleeps(), 1);
  controller.abort(reason);
  await assert.rejects(sleeping, (err: unknown) => err === reason);
  assert.equal(clock.pendingSleeps(), 0);
  await assert.rejects(clock.sleep(5, AbortSignal.abort(reason)), (err: unknown) => err === reason);
  await clock.sleep(0);
  assert.deepEqual(clock.sleepCalls, [1000, 5, 0]);
  await assert.rejects(clock.advance(-1), RangeError);
});

test('waitForSleepers resolves once enough sleeps are pending', async () => {
  const clock = new FakeClock();
  let reached = false;
  const waiting = clock.waitForSleepers(2).then(() => (reached = true));
  void clock.sleep(10);
  await new Promise((resolve) => setImmediate(resolve));
  assert.equal(reached, false);
  void clock.sleep(20);
  await waiting;
  assert.equal(reached, true);
  await clock.waitForSleepers(1); // already satisfied
});
