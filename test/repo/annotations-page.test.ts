// docs/install.md's annotation table is the list of Pod annotations the injector reads: an annotation added to
// the code without its row (or a row left for one removed) fails here.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { describe, it } from 'node:test';
import { ANNOTATION } from '../../src/injector/mutate.ts';
import { OPERATOR_ANNOTATION } from '../../src/injector/tailscale-operator.ts';

/** The first cell of each row of the table under "### Annotations". */
function documentedAnnotations(page: string): string[] {
  const section = page.slice(page.indexOf('### Annotations'));
  const rows = section.split('\n').filter((line) => line.startsWith('| `certshare.io/'));
  const table = section.slice(0, section.indexOf('\n\n', section.indexOf('| annotation')));
  return rows.filter((row) => table.includes(row)).map((row) => row.slice(3, row.indexOf('`', 3)));
}

describe('docs/install.md annotations', () => {
  it('has one row for each Pod annotation the injector reads', () => {
    const page = readFileSync(new URL('../../docs/install.md', import.meta.url), 'utf8');
    const read = [...Object.values(ANNOTATION), OPERATOR_ANNOTATION].sort();
    assert.deepEqual(documentedAnnotations(page).sort(), read);
  });
});
