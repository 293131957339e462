import assert from 'node:assert/strict';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { FakeClock } from '../support/fake-clock.ts';
import { recordingLogger, type LogEntry } from '../support/recording-logger.ts';
import { emulatorIn, standaloneDaemon, useTempDir } from '../support/standalone.ts';
import { onEvent, until } from '../support/wait.ts';

// A native sidecar starts before tailscaled: every Pod's first seconds find nothing listening on the
// LocalAPI socket. That is said at info in plain words for --startup-grace, and warned about after it;
// a tailscaled that answered once and then went away is trouble at once. The daemon runs on a fake clock
// (the grace and the watcher's backoff are clock time), its logs recorded.

const GRACE_MS = 5000;
const UNREACHABLE = 'CERTSHARE_LOCALAPI_UNREACHABLE';

const isWarning = (e: LogEntry): boolean => e.level === 'warn' || e.level === 'error';
const isUnreachableWarning = (e: LogEntry): boolean => e.level === 'warn' && e.code === UNREACHABLE && e.msg === 'IPN bus watch failed; reconnecting';

describe('start-up before tailscaled listens', () => {
  const dir = useTempDir();

  it('logs "waiting for tailscaled" at info and no warning within the grace, CERTSHARE_LOCALAPI_UNREACHABLE after it', async () => {
    const socket = join(dir(), 'late-tailscaled.sock');
    const { logger, entries, events } = recordingLogger();
    const clock = new FakeClock(Date.now());
    const startedAt = clock.now();
    const seenAt = new Map<LogEntry, number>();
    events.on('entry', (e: LogEntry) => seenAt.set(e, clock.now()));
    const logged = onEvent(events, 'entry');
    const waitingMessage = `waiting for tailscaled to listen on ${socket} (it starts after certshare)`;
    const waiting = (): LogEntry[] => entries.filter((e) => e.level === 'info' && e.msg === waitingMessage);

    const daemon = await standaloneDaemon({ address: socket }, join(dir(), 'late-certs'), ['--startup-grace', `${GRACE_MS}ms`], logger, clock);
    let emulator: Awaited<ReturnType<typeof emulatorIn>> | undefined;
    try {
      await until('the first attempt, said at info', () => waiting().length === 1, [logged]);
      // Every retry the watcher's backoff (1 s doubling, jittered) makes within the grace: info again.
      for (;;) {
        const due = clock.nextDueIn();
        assert.ok(due !== undefined, 'the watcher sleeps before its next attempt');
        if (clock.now() + due - startedAt >= GRACE_MS) break;
        const before = waiting().length;
        await clock.advance(due);
        await until(`attempt ${before + 1} within the grace`, () => waiting().length > before, [logged]);
      }
      assert.ok(waiting().length >= 2, `retried within the grace (${waiting().length} attempts)`);
      assert.deepEqual(entries.filter(isWarning), [], 'no warning within the grace');
      assert.equal(daemon.health.evaluate(clock.now()).healthy, false, 'health as before: no certificate yet');

      // The first attempt past the grace warns, with the code, as before this change.
      await clock.advance(clock.nextDueIn()!);
      await until('a warning past the grace', () => entries.some(isUnreachableWarning), [logged]);
      const warning = entries.find(isUnreachableWarning)!;
      assert.ok(seenAt.get(warning)! - startedAt >= GRACE_MS, 'warned only after the grace');
      assert.match(String(warning.err), /not reachable/);
      assert.equal(entries.filter((e) => isWarning(e) && e !== warning).length, 0, 'nothing else warned');

      // tailscaled comes up: the next attempt connects.
      emulator = await emulatorIn(dir(), { listen: socket });
      await clock.advance(clock.nextDueIn()!);
      await until('connected', () => entries.some((e) => e.msg === 'IPN bus connected'), [logged]);
    } finally {
      await daemon.stop();
      await emulator?.close();
    }
  });

  it('warns at once, within the grace, when a tailscaled that answered goes away', async () => {
    const socket = join(dir(), 'gone-tailscaled.sock');
    const emulator = await emulatorIn(dir(), { listen: socket });
    const { logger, entries, events } = recordingLogger();
    const logged = onEvent(events, 'entry');
    const clock = new FakeClock(Date.now());
    const daemon = await standaloneDaemon(emulator, join(dir(), 'gone-certs'), ['--startup-grace', '10m'], logger, clock);
    try {
      await until('issued', () => daemon.health.evaluate(clock.now()).healthy, [(l) => daemon.health.onChange(l)]);
      await emulator.close();
      await until('the watch ended', () => entries.some((e) => /^IPN bus (stream ended|watch failed)/.test(e.msg ?? '')), [logged]);
      await clock.advance(clock.nextDueIn()!);
      await until('a warning, long before the grace ends', () => entries.some((e) => isUnreachableWarning(e) && /not reachable/.test(String(e.err))), [logged]);
      assert.equal(entries.filter((e) => e.msg?.startsWith('waiting for tailscaled')).length, 0, 'never "waiting": tailscaled had answered');
    } finally {
      await daemon.stop();
      await emulator.close();
    }
  });
});
