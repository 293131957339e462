// The user-facing pages stay short and readable: the README at most 200 lines, each docs/ page at most
// 300 with a heading at least every 60 lines, and no project history in them (no "issue N", no "round":
// that is what git is for).
import assert from 'node:assert/strict';
import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { ERROR_CODES } from '../../src/core/errors.ts';

const REPO = new URL('../../', import.meta.url).pathname;

async function pages(): Promise<string[]> {
  const docs = (await readdir(join(REPO, 'docs'))).filter((f) => f.endsWith('.md')).map((f) => join('docs', f));
  return ['README.md', ...docs.sort()];
}

/** Line numbers (1-based) of the Markdown headings outside code fences. */
function headingLines(text: string): number[] {
  const found: number[] = [];
  let fenced = false;
  text.split('\n').forEach((line, i) => {
    if (/^\s*(```|~~~)/.test(line)) fenced = !fenced;
    else if (!fenced && /^#{1,6} /.test(line)) found.push(i + 1);
  });
  return found;
}

function lineCount(text: string): number {
  return text.endsWith('\n') ? text.split('\n').length - 1 : text.split('\n').length;
}

describe('user-facing pages', () => {
  it('README.md is at most 200 lines, each docs page at most 300', async () => {
    for (const page of await pages()) {
      const lines = lineCount(await readFile(join(REPO, page), 'utf8'));
      assert.ok(lines <= (page === 'README.md' ? 200 : 300), `${page}: ${lines} lines`);
    }
  });

  it('has a heading at least every 60 lines', async () => {
    for (const page of await pages()) {
      const text = await readFile(join(REPO, page), 'utf8');
      const marks = [...headingLines(text), lineCount(text) + 1];
      assert.equal(marks[0], 1, `${page} opens with a heading`);
      for (let i = 1; i < marks.length; i++)
        assert.ok(marks[i]! - marks[i - 1]! <= 60, `${page}: ${marks[i]! - marks[i - 1]!} lines from line ${marks[i - 1]} without a heading`);
    }
  });

  it('says nothing of issues or rounds: history is in git', async () => {
    for (const page of await pages()) {
      const text = await readFile(join(REPO, page), 'utf8');
      text.split('\n').forEach((line, i) => {
        assert.doesNotMatch(line, /\bissues? #?\d+|\brounds?\b/i, `${page}:${i + 1}`);
      });
    }
  });

  it('counts headings outside code fences only', () => {
    assert.deepEqual(headingLines('# a\n```sh\n# a comment\n```\n## b\n'), [1, 5]);
  });

  it('links only to pages that exist (docs/security.md and docs/proxies.md are written on other branches)', async () => {
    const elsewhere = new Set(['docs/security.md', 'docs/proxies.md']);
    for (const page of await pages()) {
      const text = await readFile(join(REPO, page), 'utf8');
      const dir = page.includes('/') ? page.slice(0, page.lastIndexOf('/')) : '.';
      for (const [, target] of text.matchAll(/\]\(([^)#\s]+)(#[^)]*)?\)/g)) {
        if (/^[a-z]+:/.test(target!)) continue;
        const path = join(dir, target!);
        if (elsewhere.has(path)) continue;
        await assert.doesNotReject(readFile(join(REPO, path)), `${page} links to ${target}`);
      }
    }
  });

  it('docs/operations.md says what to do for every error code', async () => {
    const page = await readFile(join(REPO, 'docs', 'operations.md'), 'utf8');
    for (const code of Object.keys(ERROR_CODES)) assert.match(page, new RegExp(`^\\| \`${code}\` \\|`, 'm'), code);
  });
});
