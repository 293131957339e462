// docs/configuration.md is generated from the flag definitions: a flag added, renamed or re-worded without
// `npm run docs` fails here, so the page never drifts from --help.
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { describe, it } from 'node:test';
import { configurationPage } from '../../scripts/lib/configuration-page.ts';

describe('docs/configuration.md', () => {
  it('is what `npm run docs` makes of the flag definitions', async () => {
    const onDisk = await readFile(new URL('../../docs/configuration.md', import.meta.url), 'utf8');
    assert.ok(onDisk === configurationPage(), 'docs/configuration.md is stale: run `npm run docs` and commit the page');
  });
});
