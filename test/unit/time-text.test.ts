// Times written as text without Date's toISOString / toUTCString: on their first call V8 looks up the host's
// time zone through ICU, which pages ICU's time zone data into the process (about 0.8 MB of every
// injector's and daemon's RSS, docs/performance.md). The texts stay exactly Date's.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { httpDate, iso } from '../../src/core/ports/clock.ts';
import { MicroTime } from '../../src/kube/lease-elector.ts';
import { V1MicroTime } from '../../src/kube/transport/client-node.ts';
import { createLogger } from '../../src/logging/pino-logger.ts';

/** Edge times (epoch, leap days, year and range ends, fractions, NaN) and a fixed pseudo-random spread over years 0-9999. */
function sampleTimes(): number[] {
  const times = [0, -1, 1, -0.5, 0.9, -1.5, 951_782_400_000, 951_868_799_999, 4_107_542_400_000, -62_167_219_200_000, -62_167_219_200_001];
  times.push(253_402_300_799_999, 253_402_300_800_000, 8.64e15, -8.64e15, Number.NaN, 1_795_954_657_919);
  let x = 12_345;
  for (let i = 0; i < 20_000; i++) {
    x = (x * 1_103_515_245 + 12_345) % 2 ** 31;
    times.push(Math.floor((x / 2 ** 31) * 315_569_520_000_000) - 62_167_219_200_000);
  }
  return times;
}

/** What `write` returns, or the name of the error it throws. */
function textOrError(write: () => string): string {
  try {
    return write();
  } catch (err) {
    return (err as Error).name;
  }
}

/** Runs `fn` with Date's toISOString and toUTCString throwing: the code under test must not call them. */
function withoutDateTexts<T>(fn: () => T): T {
  const { toISOString, toUTCString } = Date.prototype;
  const refuse = (): never => {
    throw new Error("Date's text functions were called");
  };
  Date.prototype.toISOString = refuse;
  Date.prototype.toUTCString = refuse;
  try {
    return fn();
  } finally {
    Date.prototype.toISOString = toISOString;
    Date.prototype.toUTCString = toUTCString;
  }
}

describe('times as text without Date', () => {
  it("iso() and httpDate() write Date's toISOString and toUTCString texts, and refuse what they refuse", () => {
    for (const t of sampleTimes()) {
      assert.equal(
        textOrError(() => iso(t)),
        textOrError(() => new Date(t).toISOString()),
        `iso(${t})`,
      );
      assert.equal(
        textOrError(() => httpDate(t)),
        textOrError(() => new Date(t).toUTCString()),
        `httpDate(${t})`,
      );
    }
    assert.equal(
      withoutDateTexts(() => iso(1_795_954_657_919)),
      '2026-11-29T12:17:37.919Z',
    );
    assert.equal(
      withoutDateTexts(() => httpDate(1_795_954_657_919)),
      'Sun, 29 Nov 2026 12:17:37 GMT',
    );
  });

  it("a log line's time is pino's isoTime text, written without Date's", () => {
    const writes: string[] = [];
    const before = Date.now();
    withoutDateTexts(() => createLogger('info', 'certshare', 'json', { write: (text: string) => writes.push(text) }).info({}, 'a line'));
    const time = (JSON.parse(writes[0]!) as { time: string }).time;
    assert.match(time, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    assert.ok(Date.parse(time) >= before && Date.parse(time) <= Date.now(), time);
  });

  it("a Lease's MicroTime is client-node's text, written without Date's", () => {
    const at = 1_795_954_657_919;
    const expected = JSON.stringify({ renewTime: new V1MicroTime(at) });
    assert.equal(expected, '{"renewTime":"2026-11-29T12:17:37.919000Z"}');
    assert.equal(
      withoutDateTexts(() => JSON.stringify({ renewTime: new MicroTime(at) })),
      expected,
    );
  });
});
