// The process and Node.js metrics certshare exports: prom-client's defaults without the misnamed totals and
// without the garbage collector's histogram, whose collector costs /healthz CPU (src/server/metrics.ts).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Metrics } from '../../src/server/metrics.ts';
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
