// Every command's --help: sections by task in the declared order, the requirement stated, one line of help
// per flag (the detail is docs/configuration.md's), and an example that the command itself accepts.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { COMMANDS } from '../../scripts/lib/configuration-page.ts';
import { daemonConfigFrom, RUN_FLAGS } from '../../src/config/run-options.ts';
import { commandUsage, groupsOf, parseFlags, requirementsOf, usage } from '../../src/flags/flags.ts';

/** A shell-like split of an example command line: words, single quotes kept together. */
function words(line: string): string[] {
  return [...line.matchAll(/'([^']*)'|(\S+)/g)].map((m) => m[1] ?? m[2]!);
}

describe('--help', () => {
  for (const command of COMMANDS) {
    describe(`certshare ${command.command}`, () => {
      const text = commandUsage(command);

      it('prints its flags in sections by task, each flag once, in the declared order', () => {
        const headings = text.split('\n').filter((l) => /^\S.*:$/.test(l) && !l.startsWith('Usage') && l !== 'Example:');
        const groups = groupsOf(command.flags, command.groups).map(([g]) => `${g}:`);
        assert.deepEqual(headings, groups);
        assert.ok(groups.length >= 2, 'more than one section');
        for (const declared of command.groups ?? []) assert.ok(groups.includes(`${declared}:`), `${declared} has flags`);
        for (const spec of command.flags) assert.equal(text.split(`  --${spec.name} `).length + text.split(`  --${spec.name}\n`).length - 2, 1, spec.name);
      });

      it('keeps each help text to one line a person reads, at most 100 columns as printed', () => {
        for (const spec of command.flags) assert.doesNotMatch(spec.help, /\n/, spec.name);
        for (const line of text.split('\n').filter((l) => l.startsWith('      ')))
          assert.ok(line.length <= 100, `${line.length} columns: ${line.trim()}; move the rest to detail`);
      });

      it('prints no empty default', () => {
        assert.doesNotMatch(text, /default[\],]/);
      });

      it('states what is required', () => {
        for (const requirement of requirementsOf(command.flags)) assert.ok(text.includes(`Required: ${requirement}`), requirement);
      });

      it('ends with an example the command accepts', () => {
        const last = text.trimEnd().split('\n');
        assert.equal(last.at(-2), 'Example:');
        assert.equal(last.at(-1), `  ${command.example}`);
        const [program, name, ...rest] = words(command.example);
        assert.deepEqual([program, name], ['certshare', command.command.split(' ')[0]]);
        // A command's positional arguments (renew's domain) come before its flags.
        const args = rest.slice(command.command.split(' ').length - 1);
        const values = parseFlags(command.flags, args, {});
        if (command.command === 'run') assert.ok(daemonConfigFrom(parseFlags(RUN_FLAGS, args, {}), {}));
        assert.equal(values.help, undefined);
      });
    });
  }

  it('run --help gives delivery to the proxy a section of its own', () => {
    const run = COMMANDS.find((c) => c.command === 'run')!;
    const section = groupsOf(run.flags, run.groups).find(([g]) => g === 'delivery to the proxy');
    const names = section?.[1].map((s) => s.name);
    assert.deepEqual(names, ['reload-command', 'reload-timeout', 'reload-signal', 'reload-pidfile', 'haproxy-crt-dir', 'haproxy-socket', 'out-dir']);
  });

  it('run --help says one of --domain or --serve-config is needed', () => {
    const run = COMMANDS.find((c) => c.command === 'run')!;
    assert.match(commandUsage(run), /Required: one of --domain or --serve-config\./);
    assert.match(commandUsage(run), /--domain FQDN \(repeatable, required: see above\)/);
  });

  it('lists flags without a group under one heading (the scripts)', () => {
    assert.match(usage('', 'x', [{ name: 'json', group: '', boolean: true, help: 'JSON.' }], { invocation: 'x', fromEnv: false }), /\nFlags:\n {2}--json\n/);
  });
});
