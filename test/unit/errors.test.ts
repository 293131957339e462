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

  it('has no template that is a bare sentence: each says something of its own, or its table entry says why a slot is open', () => {
    for (const [code, spec] of Object.entries(ERROR_CODES)) {
      assert.notEqual(spec.message, '{problem}', `${code}'s template is the site's sentence`);
      const ownWords = spec.message.replace(/\{\w+\}/g, '').match(/[a-z]{2,}/gi) ?? [];
      const open = 'open' in spec ? spec.open : undefined;
      assert.ok(ownWords.length > 0 || (open !== undefined && open.length > 0), `${code}'s template '${spec.message}' has no word of its own and no open`);
    }
  });

  it("types each code's arguments by its template: tsc refuses a missing slot, an extra one, a bare sentence", () => {
    // These lines are checked by `tsc --noEmit` (npm test), which covers test/: each @ts-expect-error must
    // meet an error, or tsc fails. They run too, so the objects are built (and thrown away).
    // @ts-expect-error {rule} is missing
    assert.ok(new CertshareError('CERTSHARE_BAD_FLAG', { flag: '--wait' }));
    // @ts-expect-error {extra} is no slot of '{flag}: {rule}'
    assert.ok(new CertshareError('CERTSHARE_BAD_FLAG', { flag: '--wait', rule: 'from 0s to 1h', extra: 1 }));
    // @ts-expect-error a sentence of the site's own is no longer a message
    assert.ok(new CertshareError('CERTSHARE_STORE_UNAVAILABLE', 'cannot read Secret'));
    // @ts-expect-error {domain} is no slot of STORE_CONFLICT's template
    assert.ok(errorText('CERTSHARE_STORE_CONFLICT', { object: 'Secret a/b', domain: 'b' }));
  });

  it('fills a template, each slot by name (the sentence itself only for a template whose one slot is {problem})', () => {
    assert.equal(errorText('CERTSHARE_BAD_FLAG', { flag: '--listen', rule: 'no port' }), '--listen: no port');
    assert.equal(
      errorText('CERTSHARE_STORE_UNAVAILABLE', { action: 'read', object: 'Secret ns/web.example.com', cause: 'HTTP 403' }),
      'cannot read Secret ns/web.example.com: HTTP 403',
    );
    assert.equal(errorText('CERTSHARE_BUS_BAD_LINE', { what: 'line of 3 bytes', flaw: 'not valid JSON' }), 'IPN bus line of 3 bytes skipped: not valid JSON');
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
      const err = new LocalApiError({ request: 'GET /localapi/v0/cert/x', failure: 'failed' }, fields);
      assert.ok(err instanceof CertshareError);
      assert.equal(err.code, code, JSON.stringify(fields));
    }
  });
});
