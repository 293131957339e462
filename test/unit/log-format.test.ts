// The readable log lines of a terminal (--log-format pretty): what a person sees, and what never shows.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { logFormatFrom, prettyLine, writesPretty } from '../../src/logging/log-format.ts';
import { createLogger } from '../../src/logging/pino-logger.ts';
import { CertshareError } from '../../src/core/errors.ts';

const KEY = '-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg\n-----END PRIVATE KEY-----\n';

/** A pretty logger writing into an array, one element per write. */
function capturedLogger(level = 'debug') {
  const writes: string[] = [];
  const logger = createLogger(level, 'certshare', 'pretty', { write: (text: string) => writes.push(text) });
  return { logger, writes };
}

describe('pretty log lines', () => {
  it('lead with the time of day, the level and the message, then the fields that matter first', () => {
    const line = prettyLine(
      JSON.stringify({
        level: 'info',
        time: '2026-11-25T08:45:52.141Z',
        pid: 4242,
        name: 'certshare',
        extra: 7,
        notAfter: '2026-11-25T08:55:52.000Z',
        serial: '672C8F',
        domain: 'demo.tailnet-0000.ts.net',
        msg: 'certificate issued and stored',
      }),
    );
    assert.equal(
      line,
      '08:45:52.141 INFO  certificate issued and stored domain=demo.tailnet-0000.ts.net serial=672C8F notAfter=2026-11-25T08:55:52.000Z extra=7\n',
    );
  });

  it('quote values with spaces, keep nested values compact JSON and cut long ones', () => {
    const line = prettyLine(
      JSON.stringify({
        level: 'info',
        time: '2026-11-25T08:00:00.000Z',
        msg: 'm',
        reason: 'no certificate yet',
        store: { kind: 'dir' },
        body: 'x'.repeat(500),
        empty: '',
      }),
    );
    assert.match(line, / reason="no certificate yet" /);
    assert.match(line, / store=\{"kind":"dir"\} /);
    assert.match(line, / body=x{119}… /);
    assert.match(line, / empty=""\n$/);
  });

  it('name every level in capitals, aligned', () => {
    const { logger, writes } = capturedLogger();
    logger.debug({}, 'd');
    logger.info({}, 'i');
    logger.warn({}, 'w');
    logger.error({}, 'e');
    assert.deepEqual(
      writes.map((w) => w.slice(13)),
      ['DEBUG d\n', 'INFO  i\n', 'WARN  w\n', 'ERROR e\n'],
    );
    assert.ok(writes.every((w) => /^\d\d:\d\d:\d\d\.\d{3} /.test(w)));
  });

  it('honour the level: below it nothing is written', () => {
    const { logger, writes } = capturedLogger('warn');
    logger.info({ domain: 'a.example.com' }, 'quiet');
    logger.warn({ domain: 'a.example.com' }, 'loud');
    assert.equal(writes.length, 1);
    assert.match(writes[0]!, /WARN {2}loud domain=a\.example\.com\n$/);
  });

  it('show an error as its code and message, without the stack', () => {
    const { logger, writes } = capturedLogger();
    logger.warn(
      {
        domain: 'a.example.com',
        err: new CertshareError('CERTSHARE_LOCALAPI_UNREACHABLE', { request: 'GET /x', failure: 'ENOENT /sock' }),
      },
      'issuance failed',
    );
    assert.match(writes[0]!, / err="CERTSHARE_LOCALAPI_UNREACHABLE: tailscaled LocalAPI unreachable for GET \/x: ENOENT \/sock"\n$/);
    assert.doesNotMatch(writes[0]!, /at .*\.ts:\d+/);
  });

  it('keep the redaction of the JSON format, and censor a private key under any other name too', () => {
    const { logger, writes } = capturedLogger();
    logger.info({ keyPem: KEY, pair: { certPem: 'c', keyPem: KEY }, domain: 'a.example.com' }, 'pair read');
    logger.info({ body: `oops ${KEY}` }, 'a key where none belongs');
    logger.info({}, `a message holding ${KEY}`);
    const text = writes.join('');
    assert.doesNotMatch(text, /PRIVATE KEY|MIGHAgEAMBMG/);
    assert.match(writes[0]!, / keyPem=\[redacted\] pair=\[redacted\]/);
    assert.match(writes[1]!, / body=\[redacted\]\n$/);
    assert.match(writes[2]!, /INFO {2}\[redacted\]\n$/);
  });

  it('write one line per entry, a message with newlines included', () => {
    const { logger, writes } = capturedLogger();
    logger.info({ domain: 'a.example.com' }, 'first\nsecond');
    logger.info({}, 'third');
    assert.equal(writes.length, 2);
    for (const w of writes) assert.equal(w.split('\n').length, 2, `one line: ${JSON.stringify(w)}`);
    assert.match(writes[0]!, /first\\nsecond domain=/);
  });

  it('pass a line that is not JSON through unchanged', () => {
    assert.equal(prettyLine('not json'), 'not json\n');
    assert.equal(prettyLine('42\n'), '42\n');
  });

  it('leave the JSON format as it was: one JSON object a line', () => {
    const writes: string[] = [];
    createLogger('info', 'certshare', 'json', { write: (text: string) => writes.push(text) }).info({ keyPem: KEY, domain: 'a.example.com' }, 'j');
    const entry = JSON.parse(writes[0]!) as Record<string, unknown>;
    assert.equal(entry.msg, 'j');
    assert.equal(entry.keyPem, '[redacted]');
    assert.equal(entry.level, 'info');
  });
});

describe('--log-format', () => {
  it('auto is pretty on a terminal only', () => {
    assert.equal(writesPretty('auto', true), true);
    assert.equal(writesPretty('auto', false), false);
    assert.equal(writesPretty('pretty', false), true);
    assert.equal(writesPretty('json', true), false);
  });

  it('accepts json, pretty and auto, and refuses anything else as a bad flag', () => {
    for (const format of ['json', 'pretty', 'auto']) assert.equal(logFormatFrom({ 'log-format': format }), format);
    assert.throws(
      () => logFormatFrom({ 'log-format': 'yaml' }),
      (err: unknown) => err instanceof CertshareError && err.code === 'CERTSHARE_BAD_FLAG' && /json, pretty, auto/.test(err.message),
    );
  });
});
