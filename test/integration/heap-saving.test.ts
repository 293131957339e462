import assert from 'node:assert/strict';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { heapSavingSwitch, optimizingCompilersAfterStart, smallBufferPool, withoutOptimizingCompilers } from '../../src/http/heap-saving.ts';
import { DOMAIN, emulatorIn, FAST_FLAGS, standaloneDaemon, useTempDir } from '../support/standalone.ts';
import { until } from '../support/wait.ts';

describe('the heap-saving switch', () => {
  it('sets --optimize-for-size once, when the managed domains reach the threshold', () => {
    const set: string[] = [];
    const told = heapSavingSwitch(3, (flags) => set.push(flags));
    assert.deepEqual([1, 2, 0].map(told), [false, false, false]);
    assert.deepEqual(set, [], 'a small daemon keeps V8 as it is');
    assert.equal(told(3), true);
    assert.deepEqual([4, 1, 500].map(told), [false, false, false], 'once on, it stays on: no flapping');
    assert.deepEqual(set, ['--optimize-for-size']);
  });
});

describe('V8 optimizing only after the start', () => {
  it('switches Maglev and TurboFan off, and back on once, when the start is over', () => {
    const set: string[] = [];
    const started = optimizingCompilersAfterStart((flags) => set.push(flags), ['--max-semi-space-size=1']);
    assert.deepEqual(set, ['--no-maglev', '--no-turbofan'], 'code run once while starting is never optimized');
    started();
    started();
    assert.deepEqual(set, ['--no-maglev', '--no-turbofan', '--maglev', '--turbofan'], 'from the start on, as always; once');
  });

  it('leaves the tiers a command line chose alone (a compiler turned on in a --jitless process crashes it)', () => {
    for (const nodeFlags of [['--jitless'], ['--max-semi-space-size=1', '--no-opt'], ['--lite-mode'], ['--no-turbofan']]) {
      const set: string[] = [];
      optimizingCompilersAfterStart((flags) => set.push(flags), nodeFlags)();
      assert.deepEqual(set, [], nodeFlags.join(' '));
    }
  });
});

describe('V8 without its optimizing compilers', () => {
  const dir = useTempDir();

  it('sets the flags that leave every function bytecode', () => {
    const set: string[] = [];
    withoutOptimizingCompilers((flags) => set.push(flags));
    assert.deepEqual(set, ['--no-sparkplug', '--no-maglev', '--no-turbofan', '--optimize-for-size']);
  });

  // A preload asks V8, as the process exits, to optimize a function at once (natives syntax): refused only
  // when TurboFan is off at run time.
  async function optimizedAtExit(signal: AbortSignal, args: string[], stopAfter?: string): Promise<boolean> {
    const status = await reportedAtExit(
      signal,
      dir(),
      '  function hot(x) { let s = 0; for (let i = 0; i < 10; i++) s += (x * i) % 7; return s; }\n' +
        '  %PrepareFunctionForOptimization(hot); hot(1); hot(2); %OptimizeFunctionOnNextCall(hot); hot(3);\n' +
        '  const report = (%GetOptimizationStatus(hot) & 16) !== 0;\n',
      args,
      stopAfter,
    );
    return status === 'true';
  }

  it('is how the injector runs, and not the daemon (its /healthz would cost 4-6 times the CPU)', async (t) => {
    assert.equal(await optimizedAtExit(t.signal, ['injector', '--help']), false, 'injector');
    assert.equal(await optimizedAtExit(t.signal, ['run', '--help']), true, 'run');
  });

  it('is how a daemon starts: TurboFan is back once it has started', async (t) => {
    const emulator = await emulatorIn(dir());
    try {
      const args = ['run', ...FAST_FLAGS, '--localapi', emulator.address, '--store', `dir:${join(dir(), 'certs')}`, '--domain', DOMAIN];
      // Stopped once healthy: its signal handlers are in place by then (a SIGTERM right at the start would kill it).
      assert.equal(await optimizedAtExit(t.signal, [...args, '--shutdown-timeout', '1s'], '"msg":"healthy"'), true);
    } finally {
      await emulator.close();
    }
  });
});

describe('a daemon and the heap-saving switch', () => {
  const dir = useTempDir();

  it('is told the managed domain count at start and as a ServeConfig grows', async () => {
    const file = join(dir(), 'serve.json');
    const serve = (n: number) => Object.fromEntries(Array.from({ length: n }, (_, i) => [`host${i}.tailnet-test.ts.net:443`, {}]));
    await writeFile(file, JSON.stringify({ Web: serve(2) }));
    const counts: number[] = [];
    const listeners = new Set<() => void>();
    const emulator = await emulatorIn(dir(), { domains: Array.from({ length: 60 }, (_, i) => `host${i}.tailnet-test.ts.net`) });
    const daemon = await standaloneDaemon(emulator, join(dir(), 'certs'), ['--serve-config', file], undefined, undefined, (n) => {
      counts.push(n);
      for (const l of listeners) l();
      return false;
    });
    try {
      assert.deepEqual(counts, [2], 'told once the start-up read is applied');
      await writeFile(file, JSON.stringify({ Web: serve(60) }));
      await until('the grown ServeConfig applied', () => counts.at(-1) === 60, [
        (l) => {
          listeners.add(l);
          return () => listeners.delete(l);
        },
      ]);
      assert.equal(daemon.manager.domains.length, 60);
    } finally {
      await daemon.stop();
      await emulator.close();
    }
  });
});

describe("Node's small Buffer pool", () => {
  const dir = useTempDir();

  it('sets 8 KiB', () => {
    const buffer = { poolSize: 64 * 1024 };
    smallBufferPool(buffer);
    assert.equal(buffer.poolSize, 8 * 1024);
  });

  it('is how the injector runs, and not the daemon', async (t) => {
    const poolSize = (args: string[]) => reportedAtExit(t.signal, dir(), "  const report = require('node:buffer').Buffer.poolSize;\n", args);
    assert.equal(await poolSize(['injector', '--help']), String(8 * 1024), 'injector');
    assert.equal(await poolSize(['run', '--help']), String(64 * 1024), 'run');
  });
});

/**
 * Runs src/cli/main.ts with `args` and a preload whose exit handler runs `body` (natives syntax allowed), which
 * sets `report`; answers what it reported. With `stopAfter`, the command gets SIGTERM once its stdout says so.
 * The child is killed when `signal` aborts (the test's: it timed out or was cancelled), not after a time of its
 * own: how long a node start takes is the machine's (a fixed bound killed starts at load before they reported).
 */
async function reportedAtExit(signal: AbortSignal, dir: string, body: string, args: string[], stopAfter?: string): Promise<string> {
  const preload = join(dir, 'report-at-exit.cjs');
  await writeFile(preload, `process.on('exit', () => {\n${body}  process.stderr.write('reported: ' + report + '\\n');\n});\n`);
  const main = join(import.meta.dirname, '../../src/cli/main.ts');
  const child = spawn(process.execPath, ['--allow-natives-syntax', '--require', preload, main, ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
    signal,
    killSignal: 'SIGKILL',
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => {
    stdout += d;
    if (stopAfter && stdout.includes(stopAfter)) child.kill('SIGTERM');
  });
  child.stderr.on('data', (d: Buffer) => (stderr += d));
  await once(child, 'close');
  const m = /reported: (\S+)/.exec(stderr);
  assert.ok(m, `nothing reported in: ${stderr}\n${stdout}`);
  return m[1]!;
}
