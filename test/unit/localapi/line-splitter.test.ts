import { test } from 'node:test';
import assert from 'node:assert/strict';
import { LineSplitter } from '../../../src/localapi/line-splitter.ts';
import { CertshareError } from '../../../src/core/errors.ts';

const text = (lines: Buffer[]): string[] => lines.map((l) => l.toString('utf8'));

test('joins a line split across chunk boundaries', () => {
  const s = new LineSplitter();
  assert.deepEqual(text(s.push(Buffer.from('{"a":'))), []);
  assert.deepEqual(text(s.push(Buffer.from('1'))), []);
  assert.equal(s.pendingBytes, 6);
  assert.deepEqual(text(s.push(Buffer.from('}\n{"b"'))), ['{"a":1}']);
  assert.deepEqual(text(s.push(Buffer.from(':2}\n'))), ['{"b":2}']);
  assert.equal(s.pendingBytes, 0);
});

test('returns several lines from one chunk', () => {
  const s = new LineSplitter();
  assert.deepEqual(text(s.push(Buffer.from('one\ntwo\nthree\nfour'))), ['one', 'two', 'three']);
  assert.deepEqual(text(s.push(Buffer.from('\n'))), ['four']);
});

test('tolerates CRLF, also when the CR and LF land in different chunks', () => {
  const s = new LineSplitter();
  assert.deepEqual(text(s.push(Buffer.from('a\r\nb\r'))), ['a']);
  assert.deepEqual(text(s.push(Buffer.from('\nc\r\n'))), ['b', 'c']);
});

test('skips empty lines', () => {
  const s = new LineSplitter();
  assert.deepEqual(text(s.push(Buffer.from('\n\r\n\nx\n\n'))), ['x']);
});

test('a newline split from a multi-byte character keeps UTF-8 intact', () => {
  const s = new LineSplitter();
  const bytes = Buffer.from('{"n":"héllo ✓"}\n');
  const lines: Buffer[] = [];
  for (const b of bytes) lines.push(...s.push(Buffer.from([b])));
  assert.deepEqual(text(lines), ['{"n":"héllo ✓"}']);
});

test('accepts Uint8Array chunks', () => {
  const s = new LineSplitter();
  assert.deepEqual(text(s.push(new TextEncoder().encode('u8\n'))), ['u8']);
});

test('end() returns an unterminated last line', () => {
  const s = new LineSplitter();
  s.push(Buffer.from('done\npart'));
  s.push(Buffer.from('ial'));
  assert.equal(s.end()?.toString(), 'partial');
  assert.equal(s.end(), undefined);
});

test('a line over the limit sets CERTSHARE_BUS_LINE_TOO_LONG before its newline arrives', () => {
  const s = new LineSplitter(10);
  assert.deepEqual(text(s.push(Buffer.from('0123456789\n'))), ['0123456789']); // exactly the limit is fine
  s.push(Buffer.from('01234'));
  assert.deepEqual(text(s.push(Buffer.from('567890'))), []);
  assert.ok(s.error instanceof CertshareError);
  assert.equal(s.error.code, 'CERTSHARE_BUS_LINE_TOO_LONG');
  assert.equal(s.pendingBytes, 0, 'the held pieces are released');
  assert.throws(
    () => s.push(Buffer.from('\n')),
    (err: unknown) => err === s.error,
  );
  assert.throws(
    () => s.end(),
    (err: unknown) => err === s.error,
  );
});

test('lines completed before the overflowing one in the same chunk are still returned', () => {
  const s = new LineSplitter(10);
  assert.deepEqual(text(s.push(Buffer.from(`ok\nfine\n${'x'.repeat(11)}\nlost\n`))), ['ok', 'fine']);
  assert.match(s.error?.message ?? '', /longer than 10 bytes/);
});

test('a 5 MB line across many 64 KiB chunks comes out whole, and so does the next line', () => {
  const s = new LineSplitter(6 * 1024 * 1024);
  const big = JSON.stringify({ NetMap: { Peers: 'p'.repeat(5 * 1024 * 1024) } });
  const stream = Buffer.from(`${big}\n{"after":true}\n`);
  const lines: Buffer[] = [];
  const chunk = 64 * 1024;
  for (let i = 0; i < stream.length; i += chunk) lines.push(...s.push(stream.subarray(i, i + chunk)));
  assert.equal(lines.length, 2);
  assert.equal(lines[0]!.length, Buffer.byteLength(big));
  assert.equal(lines[0]!.toString(), big);
  assert.deepEqual(JSON.parse(lines[1]!.toString()), { after: true });
});

test('rejects a non-positive limit', () => {
  assert.throws(() => new LineSplitter(0), RangeError);
});
