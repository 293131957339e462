// The advertise agent's logger (src/logging/line-logger.ts) writes the lines certshare's pino logger writes
// (src/logging/pino-logger.ts): the same fields in the same order, the same levels kept, the same redaction, the same
// readable lines; only the time differs between two calls.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { Logger } from '../../src/core/ports/logger.ts';
import { createLineLogger } from '../../src/logging/line-logger.ts';
import { createLogger } from '../../src/logging/pino-logger.ts';

function capture(make: (sink: { write(text: string): void }) => Logger): { logger: Logger; lines: string[] } {
  const lines: string[] = [];
  return { logger: make({ write: (text) => void lines.push(text) }), lines };
}

/** Each call on both loggers. */
function both(level: string, format: 'json' | 'pretty', calls: (logger: Logger) => void): [string[], string[]] {
  const pino = capture((sink) => createLogger(level, 'certshare-advertise-agent', format, sink));
  const line = capture((sink) => createLineLogger(level, 'certshare-advertise-agent', format, sink));
  calls(pino.logger);
  calls(line.logger);
  return [pino.lines, line.lines];
}

const withoutTime = (text: string): string => text.replace(/"time":"[^"]+"/, '"time":"T"').replace(/^\d\d:\d\d:\d\d\.\d\d\d /, 'T ');

describe("the advertise agent's logger", () => {
  const calls = (logger: Logger): void => {
    logger.info({ services: ['svc:web'], exchange: '/run/x', fromFile: false }, 'advertise agent started');
    logger.debug({ hidden: true }, 'below the level');
    logger.warn({ code: 'CERTSHARE_BAD_EXCHANGE', err: 'not JSON: "x"' }, 'advertise request refused: withdrawing every Service');
    logger.child({ component: 'advertiser' }).error({ n: 1, nested: { a: [1, null] } }, 'with bindings');
    logger.info({ keyPem: '-----BEGIN PRIVATE KEY-----', pair: { key: 'k' }, inner: { key: 'k', keyPem: 'x' } }, 'redacted');
    logger.info({ err: new TypeError('bad') });
  };

  it("writes pino's JSON lines, field for field", () => {
    const [pino, line] = both('info', 'json', calls);
    assert.equal(line.length, 5, line.join(''));
    assert.deepEqual(line.map(withoutTime).map(stripStack), pino.map(withoutTime).map(stripStack));
    assert.match(line[0]!, new RegExp(`^\\{"level":"info","time":"\\d{4}-\\d\\d-\\d\\dT[\\d:.]+Z","pid":${process.pid},"name":"certshare-advertise-agent",`));
  });

  it('and the same readable lines', () => {
    const [pino, line] = both('debug', 'pretty', calls);
    assert.equal(line.length, 6);
    assert.deepEqual(line.map(withoutTime), pino.map(withoutTime));
  });
});

/** An Error's stack names the line of each call: the rest of its fields must be the same. */
function stripStack(text: string): string {
  return text.replace(/"stack":"(?:[^"\\]|\\.)*"/, '"stack":"S"');
}
