import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { CertshareError } from '../../../src/core/errors.ts';
import type { Logger } from '../../../src/core/ports/logger.ts';
import { runEmulatorCli } from '../../../src/cli/emulator.ts';
import { emulatorUsage, parseEmulatorArgs } from '../../../src/emulator/options.ts';
import { certPath, get, getJson, testEnv } from '../../support/emulator.ts';

const RUN = new URL('../../fixtures/emulator/run-cli.ts', import.meta.url).pathname;

describe('emulator flags', () => {
  test('defaults', () => {
    const parsed = parseEmulatorArgs([]);
    assert.ok(!parsed.help);
    assert.deepEqual(parsed.options, {
      listen: './tailscaled.sock',
      domains: ['demo.tailnet-0000.ts.net'],
      faults: [],
    });
    assert.equal(parsed.logLevel, 'info');
  });

  test('--domain-count adds generated domains, alone or after --domain', () => {
    const alone = parseEmulatorArgs(['--domain-count', '3']);
    assert.ok(!alone.help);
    assert.deepEqual(alone.options.domains, ['host-0001.tailnet-0000.ts.net', 'host-0002.tailnet-0000.ts.net', 'host-0003.tailnet-0000.ts.net']);
    const both = parseEmulatorArgs(['--domain', 'a.tailnet-1.ts.net', '--domain-count', '1']);
    assert.ok(!both.help);
    assert.deepEqual(both.options.domains, ['a.tailnet-1.ts.net', 'host-0001.tailnet-0000.ts.net']);
    assert.throws(() => parseEmulatorArgs(['--domain-count', 'many']), /CERTSHARE_BAD_FLAG|--domain-count/);
  });

  test('every flag', () => {
    const parsed = parseEmulatorArgs([
      '--listen',
      '127.0.0.1:0',
      '--domain',
      'a.tailnet-1.ts.net',
      '--domain',
      'b.tailnet-1.ts.net',
      '--domain-delay',
      '10s',
      '--cert-lifetime',
      '6d',
      '--netmap-style',
      'resend',
      '--netmap-pad-bytes',
      '1048576',
      '--tailscaled-version',
      '1.90.0',
      '--ledger',
      '/tmp/ledger.jsonl',
      '--fault',
      'cert:rate_limit_429:retry_after=30:count=2',
      '--fault',
      'bus:disconnect',
      '--id',
      'emu-7',
      '--acme-listen',
      '127.0.0.1:14000',
      '--log-level',
      'warn',
    ]);
    assert.ok(!parsed.help);
    assert.deepEqual(parsed.options, {
      listen: '127.0.0.1:0',
      domains: ['a.tailnet-1.ts.net', 'b.tailnet-1.ts.net'],
      netmapStyle: 'resend',
      domainDelayMs: 10_000,
      certLifetimeMs: 6 * 86_400_000,
      netmapPadBytes: 1048576,
      tailscaledVersion: '1.90.0',
      ledgerPath: '/tmp/ledger.jsonl',
      faults: [
        { target: 'cert', kind: 'rate_limit_429', retryAfterSeconds: 30, count: 2 },
        { target: 'bus', kind: 'disconnect' },
      ],
      id: 'emu-7',
      acmeListen: '127.0.0.1:14000',
    });
    assert.equal(parsed.logLevel, 'warn');
    assert.deepEqual(parseEmulatorArgs(['--help']), { help: true });
    assert.deepEqual(parseEmulatorArgs(['-h']), { help: true });
    assert.match(emulatorUsage, /--fault SPEC/);
  });

  test('bad flags throw one clear line with CERTSHARE_BAD_FLAG', () => {
    const cases: Array<[string[], RegExp]> = [
      [['--bogus'], /bogus/],
      [['extra'], /positional|extra/i],
      [['--cert-lifetime', 'forever'], /--cert-lifetime: invalid duration "forever"/],
      [['--cert-lifetime', '0s'], /at least 1s/],
      [['--domain-delay', '5 minutes'], /--domain-delay/],
      [['--netmap-style', 'sometimes'], /--netmap-style: want selfchange or resend/],
      [['--tailscaled-version', 'latest'], /--tailscaled-version: want a release like 1\.104\.5, not "latest"/],
      [['--tailscaled-version', '1.104.5', '--netmap-style', 'resend'], /--netmap-style: resend contradicts --tailscaled-version 1\.104\.5/],
      [['--fault', 'cert:meteor'], /--fault: .*cert:meteor/],
      [['--domain', 'not a domain'], /--domain/],
      [['--listen', 'host:port'], /--listen/],
      [['--netmap-pad-bytes', 'big'], /--netmap-pad-bytes/],
      [['--log-level', 'loud'], /--log-level/],
      [['--domain'], /argument missing|--domain/],
      [['--acme-listen', '/tmp/acme.sock'], /--acme-listen: want HOST:PORT \(TCP\), not "\/tmp\/acme\.sock"/],
      [['--acme-listen', 'host:port'], /--acme-listen: /],
    ];
    for (const [argv, re] of cases) {
      assert.throws(
        () => parseEmulatorArgs(argv),
        (err: unknown) => err instanceof CertshareError && err.code === 'CERTSHARE_BAD_FLAG' && re.test(err.message) && !err.message.includes('\n'),
        argv.join(' '),
      );
    }
  });
});

describe('runEmulatorCli', () => {
  test('in process: runs until the signal aborts', async () => {
    const env = await testEnv();
    try {
      const lines: Array<{ msg?: string; [k: string]: unknown }> = [];
      let onListening!: (address: string) => void;
      const listening = new Promise<string>((r) => (onListening = r));
      const logger: Logger = {
        debug() {},
        info(obj, msg) {
          lines.push({ ...obj, msg });
          if (msg === 'emulator listening') onListening((obj as { address: string }).address);
        },
        warn() {},
        error() {},
        child() {
          return logger;
        },
      };
      const ac = new AbortController();
      const sock = join(env.dir, 'cli.sock');
      const running = runEmulatorCli(['--listen', sock, '--domain', 'x.tailnet-9.ts.net'], { signal: ac.signal, logger });
      const address = await listening;
      assert.equal(address, sock);
      assert.equal((await get(address, certPath('x.tailnet-9.ts.net'))).status, 200);
      ac.abort();
      await running;
      assert.ok(lines.some((l) => l.msg === 'issued certificate' && l.domain === 'x.tailnet-9.ts.net'));
      assert.ok(lines.some((l) => l.msg === 'emulator closed'));
    } finally {
      await env.cleanup();
    }
  });

  test('as a process: JSON log lines on stdout, no key material, faults from flags, clean exit on SIGTERM', async () => {
    const env = await testEnv();
    try {
      const sock = join(env.dir, 'proc.sock');
      const ledger = join(env.dir, 'ledger.jsonl');
      const child = spawn(
        process.execPath,
        [RUN, '--listen', sock, '--domain', 'p.tailnet-9.ts.net', '--fault', 'cert:rate_limit_429:retry_after=7', '--ledger', ledger, '--id', 'proc-emu'],
        { stdio: ['ignore', 'pipe', 'inherit'] },
      );
      const stdout: string[] = [];
      const rl = createInterface({ input: child.stdout });
      let onListening!: () => void;
      const listening = new Promise<void>((r) => (onListening = r));
      let onIssued!: () => void;
      const issuedLogged = new Promise<void>((r) => (onIssued = r));
      rl.on('line', (line) => {
        stdout.push(line);
        const msg = (JSON.parse(line) as { msg?: string }).msg;
        if (msg === 'emulator listening') onListening();
        if (msg === 'issued certificate') onIssued();
      });
      await listening;
      const limited = await get(sock, certPath('p.tailnet-9.ts.net'));
      assert.equal(limited.status, 429);
      assert.equal(limited.headers['retry-after'], '7');
      const ok = await get(sock, certPath('p.tailnet-9.ts.net'));
      assert.equal(ok.status, 200);
      await issuedLogged;
      const stats = await getJson<{ id: string; issuances: Record<string, number> }>(sock, '/certshare-emulator/v0/stats');
      assert.equal(stats.id, 'proc-emu');
      assert.deepEqual(stats.issuances, { 'p.tailnet-9.ts.net': 1 });

      child.kill('SIGTERM');
      const [code] = (await once(child, 'close')) as [number | null];
      assert.equal(code, 0);
      const all = stdout.join('\n');
      assert.ok(!all.includes('PRIVATE KEY'), 'never logs key material');
      const parsed = stdout.map((l) => JSON.parse(l) as Record<string, unknown>);
      const issued = parsed.find((l) => l.msg === 'issued certificate')!;
      assert.equal(issued.domain, 'p.tailnet-9.ts.net');
      assert.equal(typeof issued.notAfter, 'string');
      assert.ok(parsed.some((l) => l.msg === 'stopping emulator' && l.reason === 'SIGTERM'));
      const ledgerLines = (await readFile(ledger, 'utf8')).trim().split('\n');
      assert.equal(ledgerLines.length, 1);
      assert.equal(JSON.parse(ledgerLines[0]!).emulator, 'proc-emu');
    } finally {
      await env.cleanup();
    }
  });

  test('as a process: a bad flag exits with the one-line message', async () => {
    const child = spawn(process.execPath, [RUN, '--netmap-style', 'weekly'], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stderr = '';
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    const [code] = (await once(child, 'close')) as [number | null];
    assert.equal(code, 2);
    assert.equal(stderr.trim(), '--netmap-style: want selfchange or resend, not "weekly"');
  });
});
