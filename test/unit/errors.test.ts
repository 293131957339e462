// The error-code table is the one place codes are declared: none used that is not declared, none
// declared that nothing uses.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { CertshareError, ERROR_CODES, errorText } from '../../src/core/errors.ts';
import { LocalApiError } from '../../src/core/ports/localapi.ts';

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

describe('the code table', () => {
  it('gives every code a meaning, a message template with slots and an exit status; only a bad flag exits 2', () => {
    for (const [code, spec] of Object.entries(ERROR_CODES)) {
      assert.ok(spec.means.length > 0, `${code} says what it means`);
      assert.match(spec.message, /\{\w+\}/, `${code}'s template has a slot`);
      assert.equal(spec.exit, code === 'CERTSHARE_BAD_FLAG' ? 2 : 1, code);
    }
  });

  it('fills a template: the sentence for {problem}, each slot by name otherwise', () => {
    assert.equal(errorText('CERTSHARE_BAD_FLAG', '--listen: no port'), '--listen: no port');
    assert.equal(errorText('CERTSHARE_BUS_BAD_LINE', 'line of 3 bytes is not valid JSON'), 'IPN bus line of 3 bytes is not valid JSON');
    assert.equal(errorText('CERTSHARE_KUBE_HTTP', { what: 'watch /api/v1/secrets', status: 410, body: 'Gone' }), 'watch /api/v1/secrets: HTTP 410 Gone');
    const err = new CertshareError('CERTSHARE_BAD_ANNOTATION', { annotation: 'certshare.io/mode', problem: '"writer" is not rw, ro or auto' });
    assert.equal(err.message, 'certshare.io/mode: "writer" is not rw, ro or auto');
  });

  it('has one family: a failed LocalAPI call is a CertshareError whose code its fields imply', () => {
    const cases: Array<[ConstructorParameters<typeof LocalApiError>[1], string]> = [
      [{}, 'CERTSHARE_LOCALAPI_UNREACHABLE'],
      [{ timedOut: true }, 'CERTSHARE_LOCALAPI_TIMEOUT'],
      [{ status: 403, body: 'access denied' }, 'CERTSHARE_LOCALAPI_REFUSED'],
      [{ status: 429 }, 'CERTSHARE_LOCALAPI_HTTP'],
      [{ status: 500 }, 'CERTSHARE_LOCALAPI_HTTP'],
      [{ code: 'CERTSHARE_LOCALAPI_BAD_RESPONSE' }, 'CERTSHARE_LOCALAPI_BAD_RESPONSE'],
    ];
    for (const [fields, code] of cases) {
      const err = new LocalApiError('GET /localapi/v0/cert/x', fields);
      assert.ok(err instanceof CertshareError);
      assert.equal(err.code, code, JSON.stringify(fields));
    }
  });
});
