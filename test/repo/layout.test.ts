// docs/development.md's layout is the map of src/: every folder (two levels deep) and every file at the top
// of src/ has its line, and every line names a path that exists, so a move or a new folder updates the page.
// And no two files of src/ share a name, so a name alone says which file is meant.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { glob } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { basename, join } from 'node:path';
import { describe, it } from 'node:test';

const REPO = new URL('../../', import.meta.url).pathname;

/** The paths the layout block lists: the first word of each line that starts with `src/`. */
function layoutPaths(page: string): string[] {
  const section = page.slice(page.indexOf('## Layout'));
  const block = section.slice(section.indexOf('```text') + '```text'.length, section.indexOf('```', section.indexOf('```text') + 7));
  return block
    .split('\n')
    .filter((line) => line.startsWith('src/'))
    .map((line) => line.split(/\s+/)[0]!);
}

/** The folders of src/ two levels deep (with a trailing slash) and the files at its top. */
function srcPaths(): string[] {
  const found: string[] = [];
  for (const entry of readdirSync(join(REPO, 'src'), { withFileTypes: true })) {
    if (entry.isFile()) found.push(`src/${entry.name}`);
    if (!entry.isDirectory()) continue;
    found.push(`src/${entry.name}/`);
    for (const inner of readdirSync(join(REPO, 'src', entry.name), { withFileTypes: true })) {
      if (inner.isDirectory()) found.push(`src/${entry.name}/${inner.name}/`);
    }
  }
  return found.sort();
}

describe('docs/development.md layout', () => {
  it('lists every folder and top-level file of src/, and nothing else', () => {
    const listed = layoutPaths(readFileSync(join(REPO, 'docs', 'development.md'), 'utf8'));
    assert.deepEqual([...listed].sort(), srcPaths(), 'docs/development.md: the layout and src/ differ');
  });

  it('has no two files of src/ with the same name', async () => {
    const byName = new Map<string, string[]>();
    for await (const file of glob('src/**/*.ts', { cwd: REPO })) byName.set(basename(file), [...(byName.get(basename(file)) ?? []), file]);
    const shared = [...byName.values()].filter((files) => files.length > 1);
    assert.deepEqual(shared, [], 'a file name says which file it is: rename one of each pair');
  });

  it('gives every folder of src/ a floor in the import rules', () => {
    const rules = readFileSync(join(REPO, '.dependency-cruiser.cjs'), 'utf8');
    const floors = rules.slice(rules.indexOf('const FLOORS = ['), rules.indexOf('];', rules.indexOf('const FLOORS = [')));
    const placed = [...floors.matchAll(/'([a-z-]+)'/g)].map((m) => `src/${m[1]}/`).sort();
    assert.deepEqual(
      placed,
      srcPaths().filter((p) => p.endsWith('/') && p.split('/').length === 3),
      '.dependency-cruiser.cjs FLOORS',
    );
  });

  // npm run check:imports holds every import to a lower floor and refuses any circle; this holds how high the
  // house stands: at most seven floors, so the adapters stay side by side above core/ rather than stacked.
  it('stacks src/ on at most seven floors, with no import circle', () => {
    const { forbidden } = createRequire(import.meta.url)(join(REPO, '.dependency-cruiser.cjs')) as {
      forbidden: Array<{ name: string; severity: string; comment: string; to: { circular?: boolean } }>;
    };
    const floors = forbidden.filter((r) => r.name.startsWith('floors-')).map((r) => Number(/on floor (\d+)/.exec(r.comment)?.[1]));
    assert.ok(floors.length > 0 && floors.every((f) => f >= 1), '.dependency-cruiser.cjs: a floors-<folder> rule for each folder, its floor in its comment');
    assert.ok(Math.max(...floors) <= 7, `.dependency-cruiser.cjs FLOORS: ${Math.max(...floors)} floors, at most 7`);
    assert.ok(
      forbidden.some((r) => r.name === 'no-circular' && r.severity === 'error' && r.to.circular === true),
      '.dependency-cruiser.cjs: no-circular, an error',
    );
  });
});
