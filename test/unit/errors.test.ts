// The error-code table is the one place codes are declared: none used that is not declared, none
// declared that nothing uses.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { ERROR_CODES } from '../../src/core/errors.ts';

const SRC = join(import.meta.dirname, '../../src');
const sources = readdirSync(SRC, { recursive: true, encoding: 'utf8' })
  .filter((f) => f.endsWith('.ts') && f !== join('core', 'errors.ts'))
  .map((f) => ({ file: f, text: readFileSync(join(SRC, f), 'utf8') }));

// A code is a quoted CERTSHARE_ name; environment variables (CERTSHARE_DOMAIN, …) appear unquoted in
// usage texts, through envName(), or as a container env entry's `name:`.
const CODE = /(?<!name: )['"`](CERTSHARE_[A-Z_]+)['"`]/g;

describe('error codes', () => {
  it('every code used in src/ is declared in ERROR_CODES', () => {
    for (const { file, text } of sources) {
      for (const [, code] of text.matchAll(CODE)) assert.ok(code! in ERROR_CODES, `${file} uses ${code}, which src/core/errors.ts does not declare`);
    }
  });

  it('every declared code is used somewhere in src/', () => {
    for (const code of Object.keys(ERROR_CODES)) {
      assert.ok(
        sources.some(({ text }) => text.includes(`'${code}'`) || text.includes(`"${code}"`)),
        `${code} is declared but never used`,
      );
    }
  });
});
