import assert from 'node:assert/strict';
import { once } from 'node:events';
import { readFile, rm, writeFile } from 'node:fs/promises';
import { createServer, type Socket } from 'node:net';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { silentLogger } from '../../src/core/ports/logger.ts';
import { commandLine, parseReloadCommand, ReloadCommand, type ReloadOutcome } from '../../src/delivery/reload-command.ts';
import { FakeClock } from '../support/fake-clock.ts';
import { useTempDir } from '../support/standalone.ts';

/** The first run's outcome (a failure's retry waits on a clock that never moves). */
function runOnce(spec: ReturnType<typeof parseReloadCommand>, timeoutMs: number): Promise<ReloadOutcome> {
  return new Promise((resolve) => {
    const reload = new ReloadCommand(spec, { timeoutMs, logger: silentLogger, onOutcome: resolve, clock: new FakeClock() });
    void reload.request('web.example.com');
  });
}

describe('reload command', () => {
  const dir = useTempDir();

  it('has one meaning for the JSON array form in every image: argv, no shell', () => {
    const spec = parseReloadCommand('["nginx", "-s", "reload"]');
    assert.deepEqual(spec, { argv: ['nginx', '-s', 'reload'] });
    assert.deepEqual(commandLine(spec, true), ['nginx', '-s', 'reload']);
    assert.deepEqual(commandLine(spec, false), ['nginx', '-s', 'reload']);
    // A plain string keeps its documented behaviour: the shell where there is one, split on spaces otherwise.
    assert.deepEqual(commandLine(parseReloadCommand('nginx -s reload'), true), ['/bin/sh', '-c', 'nginx -s reload']);
    assert.deepEqual(commandLine(parseReloadCommand('nginx -s reload'), false), ['nginx', '-s', 'reload']);
  });

  it("passes the JSON form's arguments literally (no shell expansion)", async () => {
    const marker = join(dir(), 'argv');
    const args = ['$HOME', 'a b', ';touch injected', '*'];
    const code = 'require("fs").writeFileSync(process.argv[1], JSON.stringify(process.argv.slice(2)))';
    const outcome = await runOnce(parseReloadCommand(JSON.stringify([process.execPath, '-e', code, marker, ...args])), 30_000);
    assert.equal(outcome.ok, true);
    assert.deepEqual(JSON.parse(await readFile(marker, 'utf8')), args);
  });

  it('runs a failed command again, from 1 s doubling, until it succeeds; none after stop', async () => {
    const marker = join(dir(), 'fixed');
    const clock = new FakeClock();
    const outcomes: ReloadOutcome[] = [];
    const code = 'process.exit(require("fs").existsSync(process.argv[1]) ? 0 : 3)';
    const reload = new ReloadCommand(parseReloadCommand(JSON.stringify([process.execPath, '-e', code, marker])), {
      timeoutMs: 30_000,
      logger: silentLogger,
      onOutcome: (o) => outcomes.push(o),
      clock,
    });
    try {
      await reload.request('web.example.com');
      assert.deepEqual(
        outcomes.map((o) => o.exitCode),
        [3],
      );
      assert.deepEqual(clock.pendingDurations(), [1000]);
      await clock.advance(1000);
      await reload.idle();
      assert.deepEqual(clock.pendingDurations(), [2000], 'failed again: next after 2 s');
      await writeFile(marker, '');
      await clock.advance(2000);
      await reload.idle();
      assert.deepEqual(
        outcomes.map((o) => [o.ok, o.domains]),
        [
          [false, ['web.example.com']],
          [false, ['web.example.com']],
          [true, ['web.example.com']],
        ],
      );
      assert.equal(clock.pendingSleeps(), 0, 'landed: no more runs');
      await rm(marker);
      await reload.request('web.example.com');
      assert.deepEqual(clock.pendingDurations(), [1000], 'a success starts the waits from 1 s again');
    } finally {
      await reload.stop();
    }
    assert.equal(clock.pendingSleeps(), 0, 'stopped: no retry');
    await reload.request('web.example.com');
    assert.equal(outcomes.length, 4, 'stopped: no run');
  });

  it('kills the whole process group on timeout, not only the shell', async () => {
    // The grandchild connects back and holds the connection: the connection closes only when it dies.
    const script = join(dir(), 'grandchild.cjs');
    await writeFile(
      script,
      'const s = require("net").connect(Number(process.argv[2]), "127.0.0.1", () => s.write(String(process.pid))); setInterval(() => {}, 1000);',
    );
    const server = createServer();
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    const port = (server.address() as { port: number }).port;
    const connected = once(server, 'connection') as Promise<[Socket]>;
    let grandchildPid: number | undefined;
    try {
      // The shell waits for its background child, so only a timeout ends it.
      const outcome = runOnce(parseReloadCommand(`"${process.execPath}" "${script}" ${port} & wait`), 4000);
      const [socket] = await connected;
      socket.on('data', (d) => (grandchildPid = Number(String(d))));
      const closed = once(socket, 'close');
      const result = await outcome;
      assert.equal(result.ok, false);
      const survived = await Promise.race([closed.then(() => false), new Promise<boolean>((r) => setTimeout(() => r(true), 10_000).unref())]);
      assert.equal(survived, false, 'the grandchild died with the shell');
    } finally {
      if (grandchildPid) {
        try {
          process.kill(grandchildPid, 'SIGKILL');
        } catch {
          // Gone, as it should be.
        }
      }
      server.close();
    }
  });
});
