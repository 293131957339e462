// The bench's verdicts (issue 42): each goal judged against its floor from the same figures, and what
// `npm run bench -- --check` fails on. Computed from fixed figures: nothing is measured here.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { BENCH_GOALS, type Goal, judge, misses, verdictLabel } from '../../bench/lib/goals.ts';

const GOALS: Record<string, Goal> = {
  rssKubeReaderMB: { op: '<=', limit: 75 },
  rssStandaloneMB: { op: '<=', floor: 'rssFastifyHelloMB', margin: 5 },
  healthzVsBareFastify: { op: '>=', limit: 0.95 },
};

describe('bench goals', () => {
  it('reads a floor from the same run and adds its margin', () => {
    const v = judge({ rssKubeReaderMB: 72, rssStandaloneMB: 62, rssFastifyHelloMB: 58.1, healthzVsBareFastify: 0.97 }, GOALS);
    assert.deepEqual(v.rssStandaloneMB, { value: 62, floor: { figure: 'rssFastifyHelloMB', value: 58.1 }, op: '<=', goal: 63.1, holds: true });
    assert.deepEqual(v.rssKubeReaderMB, { value: 72, floor: null, op: '<=', goal: 75, holds: true });
    assert.equal(v.healthzVsBareFastify!.holds, true);
    assert.deepEqual(misses(v, GOALS), []);
  });

  it('a figure over its floor plus the margin misses, whatever the fixed limit was', () => {
    const v = judge({ rssKubeReaderMB: 79.2, rssStandaloneMB: 60, rssFastifyHelloMB: 54, healthzVsBareFastify: 0.94 }, GOALS);
    assert.equal(v.rssStandaloneMB!.goal, 59);
    assert.equal(verdictLabel(v.rssStandaloneMB), 'MISS');
    assert.deepEqual(misses(v, GOALS), ['rssKubeReaderMB 79.2 > 75', 'rssStandaloneMB 60 > 59 (rssFastifyHelloMB 54 + 5)', 'healthzVsBareFastify 0.94 < 0.95']);
  });

  it('a figure or a floor not measured (a skipped phase) is no verdict and no miss', () => {
    const v = judge({ rssKubeReaderMB: null, rssStandaloneMB: 62 }, GOALS);
    assert.equal(v.rssKubeReaderMB!.holds, null);
    assert.deepEqual(v.rssStandaloneMB, { value: 62, floor: { figure: 'rssFastifyHelloMB', value: null }, op: '<=', goal: null, holds: null });
    assert.equal(verdictLabel(v.rssStandaloneMB), '-');
    assert.deepEqual(misses(v, GOALS), []);
  });

  it("start-up is judged by the CPU time until healthy over the bare fastify's started beside it; its wall time has no goal", () => {
    assert.deepEqual(BENCH_GOALS.startupCpuOverFastifyMs, { op: '<=', limit: 40 });
    assert.equal(BENCH_GOALS.startupToHealthyMs, undefined, 'wall time on a shared machine holds the neighbours: reported, not judged');
    assert.equal(BENCH_GOALS.startupCpuMs, undefined, 'the medians of starts taken apart: reported, judged only paired');
    // A quiet run: wall 212 ms against 115 (a miss by wall time) while the pairs' CPU differed by 17.4 ms.
    const v = judge({ startupToHealthyMs: 212, startupFastifyHelloMs: 115, startupCpuMs: 123.4, startupCpuOverFastifyMs: 17.4 }, BENCH_GOALS);
    assert.deepEqual(v.startupCpuOverFastifyMs, { value: 17.4, floor: null, op: '<=', goal: 40, holds: true });
    assert.equal(v.startupToHealthyMs, undefined);
    const slow = judge({ startupCpuOverFastifyMs: 95.1 }, BENCH_GOALS);
    assert.deepEqual(misses(slow, BENCH_GOALS), ['startupCpuOverFastifyMs 95.1 > 40']);
  });
});
