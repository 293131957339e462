import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { DOMAIN, emulatorIn, useTempDir } from '../support/standalone.ts';

const BIN = fileURLToPath(new URL('../../bin/certshare.js', import.meta.url));

function cli(args: string[], env: NodeJS.ProcessEnv = {}) {
  return spawnSync(process.execPath, [BIN, ...args], { encoding: 'utf8', env: { PATH: process.env.PATH, ...env }, timeout: 30_000 });
}

describe('certshare command line', () => {
  it('describes every run flag in --help, with its environment variable', () => {
    const res = cli(['run', '--help']);
    assert.equal(res.status, 0);
    for (const flag of [
      '--localapi',
      '--domain',
      '--serve-config',
      '--store',
      '--listen',
      '--reload-command',
      '--check-interval',
      '--first-retry',
      '--retry-cap',
      '--renew-fraction',
      '--cert-timeout',
    ]) {
      assert.ok(res.stdout.includes(flag), `${flag} documented`);
    }
    assert.match(res.stdout, /CERTSHARE_LOCALAPI/);
    assert.equal(cli(['emulator', '--help']).status, 0);
    assert.equal(cli(['--help']).status, 0);
  });

  it('refuses bad flags and values with one clear line and a non-zero exit', () => {
    for (const [args, pattern] of [
      [['run', '--bogus'], /Unknown option '--bogus'/],
      [['run', '--domain', 'a.example.com', '--check-interval', 'soon'], /--check-interval: invalid duration "soon"/],
      [['run'], /--domain: give at least one, or a --serve-config/],
      [['run', '--domain', 'not a domain'], /not a fully qualified domain name/],
      [['run', '--domain', 'a.example.com', '--store', 's3:bucket'], /--store: must be dir:PATH or kube/],
      [['run', '--domain', 'a.example.com', '--log-format', 'yaml'], /--log-format: must be json, pretty, auto, got "yaml"/],
      [['frobnicate'], /command: unknown "frobnicate"/],
    ] as const) {
      const res = cli([...args]);
      assert.equal(res.status, 2, `${args.join(' ')} exits 2`);
      assert.match(res.stderr, pattern);
      assert.equal(res.stderr.trim().split('\n').length, 1, `one line for ${args.join(' ')}: ${res.stderr}`);
    }
  });

  it('reads flags from CERTSHARE_* variables, flags winning', () => {
    const res = cli(['run', '--check-interval', 'soon'], { CERTSHARE_DOMAIN: 'a.example.com,b.example.com', CERTSHARE_CHECK_INTERVAL: '1h' });
    assert.match(res.stderr, /--check-interval: invalid duration "soon"/);
  });

  describe('a running daemon', () => {
    const dir = useTempDir();

    it('logs readable lines with CERTSHARE_LOG_FORMAT=pretty, JSON lines by default on a pipe', { timeout: 30_000 }, async () => {
      const firstLine = async (env: NodeJS.ProcessEnv): Promise<string> => {
        const args = ['run', '--localapi', join(dir(), 'absent.sock'), '--domain', DOMAIN, '--store', `dir:${join(dir(), 'certs')}`, '--listen', '127.0.0.1:0'];
        const child = spawn(process.execPath, [BIN, ...args], {
          env: { PATH: process.env.PATH, CERTSHARE_ACME_DIRECTORY: 'none', ...env },
          stdio: ['ignore', 'pipe', 'inherit'],
        });
        try {
          const [line] = (await once(createInterface(child.stdout!), 'line')) as [string];
          return line;
        } finally {
          child.kill('SIGKILL');
        }
      };
      assert.match(await firstLine({ CERTSHARE_LOG_FORMAT: 'pretty' }), /^\d\d:\d\d:\d\d\.\d{3} INFO {2}certshare started address=http:\/\/127\.0\.0\.1:\d+ /);
      assert.equal((JSON.parse(await firstLine({})) as { msg: string }).msg, 'certshare started');
    });

    it('turns healthy, then exits 0 promptly on SIGTERM, running the reload command once', async () => {
      const emulator = await emulatorIn(dir());
      const marker = join(dir(), 'reloaded');
      const child = spawn(
        process.execPath,
        [
          BIN,
          'run',
          '--localapi',
          emulator.address,
          '--domain',
          DOMAIN,
          '--store',
          `dir:${join(dir(), 'certs')}`,
          '--listen',
          '127.0.0.1:0',
          '--reload-command',
          `echo "$CERTSHARE_DOMAINS" >> ${marker}`,
        ],
        {
          // No ACME Renewal Information request to Let's Encrypt (the default directory) from a test.
          env: { PATH: process.env.PATH, CERTSHARE_ACME_DIRECTORY: 'none' },
          stdio: ['ignore', 'pipe', 'inherit'],
        },
      );
      try {
        const lines = createInterface(child.stdout!);
        const logs: Array<{ msg: string }> = [];
        for await (const line of lines) {
          const entry = JSON.parse(line) as { msg: string };
          logs.push(entry);
          assert.doesNotMatch(line, /PRIVATE KEY/);
          if (entry.msg === 'reload command succeeded') break;
        }
        const exited = once(child, 'exit');
        const signalledAt = performance.now();
        child.kill('SIGTERM');
        const [code] = await exited;
        assert.equal(code, 0);
        assert.ok(performance.now() - signalledAt < 5000, 'exits within the bound');
        assert.ok(logs.some((l) => l.msg === 'healthy'));
        const { readFile } = await import('node:fs/promises');
        assert.equal((await readFile(marker, 'utf8')).trim(), DOMAIN);
      } finally {
        child.kill('SIGKILL');
        await emulator.close();
      }
    });
  });
});
