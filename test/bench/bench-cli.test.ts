// The bench scripts' command lines: --help prints the usage, a wrong flag one line saying so (exit 2), never
// a stack trace. Nothing is measured or started.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';

const script = (name: string): string => fileURLToPath(new URL(`../../bench/${name}.ts`, import.meta.url));
const run = (name: string, args: string[]) => spawnSync(process.execPath, [script(name), ...args], { encoding: 'utf8', timeout: 30_000 });

describe('bench command lines', () => {
  for (const name of ['main', 'heap-by-domain', 'startup-failures', 'snapshot/compare']) {
    it(`${name} --help: the usage on stdout, exit 0`, () => {
      const r = run(name, ['--help']);
      assert.equal(r.status, 0, r.stderr);
      assert.match(r.stdout, /^Usage: /);
      assert.match(r.stdout, /\n {2}--\w/, 'lists the flags');
    });

    it(`${name} with an unknown flag: one line naming it and the way to --help, exit 2`, () => {
      const r = run(name, ['--no-such-flag']);
      assert.equal(r.status, 2);
      assert.match(r.stderr, /Unknown option '--no-such-flag'/);
      assert.match(r.stderr, /--help" for the flags/);
      assert.doesNotMatch(r.stderr, /\n\s+at /, 'no stack trace');
    });
  }

  it('main: a value it cannot use is a usage error too', () => {
    const r = run('main', ['--renewals', '0']);
    assert.equal(r.status, 2);
    assert.match(r.stderr, /^bench: --renewals wants a whole number, at least 1, got "0"/);
  });

  it('main --check judges a full run only: with --tiny it is a usage error', () => {
    const r = run('main', ['--check', '--tiny']);
    assert.equal(r.status, 2);
    assert.match(r.stderr, /^bench: --check judges a full run of the phases/);
  });

  it('main --federation: a lease duration it cannot use, or --domains beside it, is a usage error', () => {
    const durations = run('main', ['--federation', '--lease-durations', '10,0']);
    assert.equal(durations.status, 2);
    assert.match(durations.stderr, /^bench: --lease-durations wants whole seconds from 1 to 3600/);
    const both = run('main', ['--federation', '--domains', '1']);
    assert.equal(both.status, 2);
    assert.match(both.stderr, /^bench: --federation and --domains are two runs/);
  });
});
