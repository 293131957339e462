// The README's first command: `npm run demo` (certshare demo) must start, serve a certificate, and stop
// cleanly on Ctrl-C. Run as the CLI, as a user runs it.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';

const BIN = fileURLToPath(new URL('../../bin/certshare.js', import.meta.url));

describe('certshare demo', () => {
  it('gets a certificate from its emulated tailscaled, answers /healthz 200, and exits 0 on SIGINT', { timeout: 60_000 }, async () => {
    const child = spawn(process.execPath, [BIN, 'demo', '--listen', '127.0.0.1:0', '--domain-delay', '200ms'], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => (stderr += d));
    const exited = once(child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>;
    try {
      const healthy = await new Promise<{ status: number; msFromDomainToCertificate?: number }>((resolve, reject) => {
        createInterface(child.stdout).on('line', (line) => {
          const entry = JSON.parse(line) as { msg?: string; status?: number; msFromDomainToCertificate?: number };
          if (entry.msg?.startsWith('demo: GET /healthz answers'))
            resolve({ status: entry.status!, msFromDomainToCertificate: entry.msFromDomainToCertificate });
        });
        void exited.then(([code]) => reject(new Error(`demo exited (${code}) before it was healthy: ${stderr.trim()}`)));
      });
      assert.equal(healthy.status, 200);
      assert.ok(healthy.msFromDomainToCertificate !== undefined);
      child.kill('SIGINT');
      const [code] = await exited;
      assert.equal(code, 0, stderr);
    } finally {
      if (child.exitCode === null) child.kill('SIGKILL');
    }
  });

  it('prints readable lines with --log-format pretty: time, level, message, key=value; no JSON', { timeout: 60_000 }, async () => {
    const child = spawn(process.execPath, [BIN, 'demo', '--listen', '127.0.0.1:0', '--domain-delay', '200ms', '--log-format', 'pretty'], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => (stderr += d));
    const exited = once(child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>;
    try {
      const lines: string[] = [];
      // The line that ends the wait: more (ARI's first check) may follow before the assertions run.
      let healthzLine = '';
      await new Promise<void>((resolve, reject) => {
        createInterface(child.stdout).on('line', (line) => {
          lines.push(line);
          if (line.includes('demo: GET /healthz answers') && !healthzLine) {
            healthzLine = line;
            resolve();
          }
        });
        void exited.then(([code]) => reject(new Error(`demo exited (${code}) before it was healthy: ${stderr.trim()}`)));
      });
      for (const line of lines) assert.match(line, /^\d\d:\d\d:\d\d\.\d{3} (DEBUG|INFO |WARN |ERROR) \S/, line);
      assert.ok(
        lines.some((l) => /INFO {2}certificate issued and stored domain=demo\.\S+ serial=[0-9A-F]+ notAfter=\S+Z/.test(l)),
        lines.join('\n'),
      );
      assert.match(healthzLine, /INFO {2}demo: GET \/healthz answers 200; .* status=200 /);
      assert.ok(lines.every((l) => !l.includes('{"level"') && !l.includes('"pid"')));
      child.kill('SIGINT');
      const [code] = await exited;
      assert.equal(code, 0, stderr);
    } finally {
      if (child.exitCode === null) child.kill('SIGKILL');
    }
  });
});
