// docs/security.md as a contract: every row of its tables names, in its last column ("proven by"), the tests
// that prove it, as backticked `test/...test.ts` paths, each optionally followed by test names in double quotes
// (a part of a name given to describe/it/test in that file). A row that names no test file, a file that does
// not exist, or a name that file does not give, fails here. The format is described at the top of the page.
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';

const REPO = new URL('../../', import.meta.url).pathname;
const PAGE = 'docs/security.md';
const PROVEN_BY = 'proven by';

/** The cells of a Markdown table row (no `|` inside a cell on this page). */
function cells(line: string): string[] {
  return line
    .trim()
    .replace(/^\||\|$/g, '')
    .split('|')
    .map((c) => c.trim());
}

/** The names given to describe/it/test in a test file's source, unescaped. */
export function testNames(source: string): string[] {
  const names: string[] = [];
  for (const m of source.matchAll(/\b(?:describe|it|test)\(\s*(['"`])((?:\\.|(?!\1)[^\\])*)\1/g)) names.push(m[2]!.replace(/\\(.)/g, '$1'));
  return names;
}

/** Every broken promise of the page's tables: a row without a test, a file that does not exist, a name not found. */
export async function contractProblems(markdown: string, sourceOf: (path: string) => Promise<string | undefined>): Promise<string[]> {
  const problems: string[] = [];
  const lines = markdown.split('\n');
  for (let i = 0; i < lines.length; i++) {
    if (!lines[i]!.startsWith('|') || !/^\|\s*-/.test(lines[i + 1] ?? '')) continue;
    const header = cells(lines[i]!);
    if (header.at(-1)?.toLowerCase() !== PROVEN_BY) problems.push(`line ${i + 1}: the table's last column is "${header.at(-1)}", not "${PROVEN_BY}"`);
    for (i += 2; i < lines.length && lines[i]!.startsWith('|'); i++) {
      const row = cells(lines[i]!);
      const where = `line ${i + 1} (${row[0]})`;
      const proof = row.at(-1) ?? '';
      const paths = [...proof.matchAll(/`(test\/[^`\s]+\.test\.ts)`/g)];
      if (paths.length === 0) problems.push(`${where}: names no test file (\`test/...test.ts\`)`);
      for (const [k, path] of paths.entries()) {
        const source = await sourceOf(path[1]!);
        if (source === undefined) {
          problems.push(`${where}: ${path[1]} does not exist`);
          continue;
        }
        const names = testNames(source);
        const until = paths[k + 1]?.index ?? proof.length;
        for (const quoted of proof.slice(path.index! + path[0].length, until).matchAll(/"([^"]+)"/g)) {
          if (!names.some((n) => n.includes(quoted[1]!))) problems.push(`${where}: ${path[1]} has no test named "${quoted[1]}"`);
        }
      }
    }
  }
  return problems;
}

async function repoSource(path: string): Promise<string | undefined> {
  return readFile(join(REPO, path), 'utf8').catch(() => undefined);
}

describe(`${PAGE} as a contract`, () => {
  it('every row of its tables names the tests that prove it, and each exists', async () => {
    const page = await readFile(join(REPO, PAGE), 'utf8');
    assert.ok(page.includes(`**${PROVEN_BY}**`), `${PAGE} says at its top how a row names its tests`);
    assert.deepEqual(await contractProblems(page, repoSource), []);
  });

  it('refuses a row without a test, a missing file, a name the file does not give, another last column', async () => {
    const table = (...rows: string[]) => ['| who | can | cannot | proven by |', '|---|---|---|---|', ...rows].join('\n');
    const sources: Record<string, string> = { 'test/x/a.test.ts': "describe('a', () => { it('refuses what isn\\'t its own', () => {}); });" };
    const sourceOf = async (path: string) => sources[path];
    assert.deepEqual(await contractProblems(table('| r | x | y | `test/x/a.test.ts` "refuses what isn\'t its own" |'), sourceOf), []);
    const cases: Array<[string, string, RegExp]> = [
      ['no test', table("| r | x | y | the kernel's rules |"), /names no test file/],
      ['a missing file', table('| r | x | y | `test/x/b.test.ts` |'), /test\/x\/b\.test\.ts does not exist/],
      ['a missing name', table('| r | x | y | `test/x/a.test.ts` "admits everything" |'), /has no test named "admits everything"/],
      ['another last column', '| who | can |\n|---|---|\n| r | `test/x/a.test.ts` |', /not "proven by"/],
    ];
    for (const [what, markdown, message] of cases) {
      const problems = await contractProblems(markdown, sourceOf);
      assert.equal(problems.length, 1, `${what}: ${problems.join('; ')}`);
      assert.match(problems[0]!, message, what);
    }
  });
});
