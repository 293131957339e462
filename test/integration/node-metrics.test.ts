// The process and Node.js metrics certshare exports: prom-client's defaults without the misnamed totals and
// without the garbage collector's histogram, whose collector costs /healthz CPU (src/http/daemon-metrics.ts).
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { EVENT_LOOP_SAMPLE_MS, Metrics } from '../../src/http/daemon-metrics.ts';
import { FakeClock } from '../support/fake-clock.ts';

describe('Node metrics', () => {
  it("exports the process's and the heap's, not the garbage collector's durations nor the misnamed totals", async () => {
    const metrics = new Metrics(new FakeClock(), { renewFraction: 1 / 3, checkIntervalMs: 86_400_000 });
    const names = new Set((await metrics.registry.getMetricsAsJSON()).map((m) => m.name));
    for (const name of ['process_cpu_seconds_total', 'nodejs_heap_size_used_bytes', 'nodejs_eventloop_lag_seconds', 'nodejs_active_handles']) {
      assert.ok(names.has(name), name);
    }
    for (const name of ['nodejs_gc_duration_seconds', 'nodejs_active_handles_total']) assert.ok(!names.has(name), name);
  });
});

/** The window over which an idle child's wake-ups are counted: a measurement, not a wait for an event. */
const WINDOW_MS = 2000;

describe('an idle process exporting the Node metrics', () => {
  it('wakes about once a second, not every 10 ms for the event-loop delay histogram', async () => {
    // A child that only holds the Metrics (default metrics on) and waits; its main thread's voluntary context
    // switches over a window count its wake-ups. prom-client's default histogram resolution (10 ms) gives ~200
    // in 2 s, certshare's (EVENT_LOOP_SAMPLE_MS) ~2.
    const source = [
      `import { Metrics } from ${JSON.stringify(new URL('../../src/http/daemon-metrics.ts', import.meta.url).href)};`,
      `globalThis.metrics = new Metrics({ now: () => Date.now() }, { renewFraction: 1 / 3, checkIntervalMs: 86_400_000 });`,
      "process.stdout.write('ready\\n');",
      'setInterval(() => {}, 1 << 30);',
    ].join('\n');
    const child = spawn(process.execPath, ['--input-type=module', '-e', source], { stdio: ['ignore', 'pipe', 'inherit'] });
    try {
      await new Promise<void>((resolve, reject) => {
        child.stdout.on('data', (d: Buffer) => d.toString().includes('ready') && resolve());
        child.once('exit', (code) => reject(new Error(`child exited ${code}`)));
      });
      const switches = async (): Promise<number> =>
        Number(/voluntary_ctxt_switches:\s+(\d+)/.exec(await readFile(`/proc/${child.pid}/task/${child.pid}/status`, 'utf8'))![1]);
      const before = await switches();
      await sleep(WINDOW_MS);
      const wakeUps = (await switches()) - before;
      assert.ok(wakeUps < 20, `${wakeUps} wake-ups in ${WINDOW_MS} ms (EVENT_LOOP_SAMPLE_MS ${EVENT_LOOP_SAMPLE_MS})`);
    } finally {
      child.kill('SIGKILL');
    }
  });
});
