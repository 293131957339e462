// scripts/check-bounds.ts counts what it should, and the tree holds the bounds (npm test also runs the
// script itself, which names the function or class over its bound).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { allSpans, boundOf, spansOf } from '../../scripts/check-bounds.ts';

describe('function and class bounds', () => {
  it('counts each function, method, arrow and class from its first line to its last', () => {
    const text = ['export function a() {', '  return 1;', '}', 'class B {', '  m() {', '    const f = () => {', '      return 2;', '    };', '  }', '}'].join(
      '\n',
    );
    const spans = spansOf('src/core/x.ts', text).map((s) => [s.name, s.kind, s.lines]);
    assert.deepEqual(spans, [
      ['a', 'function', 3],
      ['B', 'class', 7],
      ['B.m', 'function', 5],
      ['f', 'function', 3],
    ]);
  });

  it('holds 50 lines a function in src/core, 80 elsewhere in src, 350 a class', async () => {
    const over = (await allSpans()).filter((s) => s.lines > boundOf(s));
    assert.deepEqual(
      over.map((s) => `${s.file} ${s.name}: ${s.lines}`),
      [],
    );
  });
});
