// No export without an importer (scripts/check-exports.ts, `npm run check:exports`): the guard itself, and
// the repository as it stands.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { exportsOf, importsOf, unusedExports } from '../../scripts/check-exports.ts';

describe('exports', () => {
  it('every export of src/ is imported by another file', async () => {
    const { unused, testOnlyUntagged } = await unusedExports();
    assert.deepEqual(
      unused.map((e) => `${e.file}: ${e.name}`),
      [],
    );
    assert.deepEqual(
      testOnlyUntagged.map((e) => `${e.file}: ${e.name} (tests only, not tagged @forTests)`),
      [],
    );
  });

  it('reads declarations, export lists, static and dynamic imports', () => {
    const text = 'export const a = 1;\nexport function b() {}\n/** @forTests */\nexport interface C {}\nconst d = 2;\nexport { d };\n';
    assert.deepEqual(
      exportsOf('src/x.ts', text).map((e) => `${e.name}${e.forTests ? ' (tests)' : ''}`),
      ['a', 'b', 'C (tests)', 'd'],
    );
    const importer = "import { a, b as bee } from './x.ts';\nconst { d } = await import('./x.ts');\nexport * from './y.ts';\n";
    assert.deepEqual(importsOf('src/z.ts', importer, '/repo').sort(), ['src/x.ts:a', 'src/x.ts:b', 'src/x.ts:d', 'src/y.ts:*']);
  });
});
