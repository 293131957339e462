// The bench's goals (issue 42) and their verdicts. A goal is either a fixed limit or a margin over a floor
// measured in the same run (a bare fastify, the injector's packages alone): on a shared machine only
// figures of one run compare, so a goal that follows its floor misses only on what certshare adds.

/** A figure's goal: `op` (at most / at least) `limit`, or `floor`'s figure in the same run plus `margin`. */
export type Goal = { op: '<=' | '>='; limit: number; floor?: undefined } | { op: '<=' | '>='; floor: string; margin: number };

/** A figure, its floor and goal from the same run, and whether it holds (null: the figure was not measured). */
export interface Verdict {
  value: number | null;
  /** The floor's figure name and value in this run, when the goal follows one. */
  floor: { figure: string; value: number | null } | null;
  op: '<=' | '>=';
  /** The figure the value must be at most / at least: the limit, or the floor plus the margin. */
  goal: number | null;
  holds: boolean | null;
}

type Figures = Record<string, number | null | undefined>;

/**
 * The goals of issue 42 (API requests: issue 11). A floor is what the fixed choices cost in the same run:
 * fastify bundled as dist/ is (bench/fastify-hello.ts), the injector's packages used once
 * (bench/injector-packages.ts). Start-up is judged by the CPU time a start uses until its first answer over
 * the bare fastify's started beside it, the median of those pairs' differences: on a shared machine a start's
 * wall time holds the neighbours' time as well (reported, without a goal), and starts measured apart differ by
 * the load of their moment. The advertise agent (one per advertising replica): its idle RSS over a Node that loads
 * only node:http and node:fs, and its CPU time at rest (docs/performance.md, the advertise agent).
 * --tiny reports no verdicts: its figures are one quick sample each.
 */
export const BENCH_GOALS: Record<string, Goal> = {
  rssKubeReaderMB: { op: '<=', limit: 75 },
  rssStandaloneMB: { op: '<=', floor: 'rssFastifyHelloMB', margin: 5 },
  healthzVsBareFastify: { op: '>=', limit: 0.95 },
  propagationP99Ms: { op: '<=', limit: 50 },
  startupCpuOverFastifyMs: { op: '<=', limit: 40 },
  apiRequestsPerReplicaHour: { op: '<=', limit: 10 },
  rssInjectorMB: { op: '<=', floor: 'rssInjectorPackagesMB', margin: 5 },
  rssAdvertiseAgentMB: { op: '<=', floor: 'rssNodeHttpFsMB', margin: 6 },
  advertiseAgentRestCpuMsPerHour: { op: '<=', limit: 2000 },
};

/** How the bench's table names a floor's figure. */
export const FLOOR_NAMES: Record<string, string> = {
  rssFastifyHelloMB: 'bare fastify',
  rssInjectorPackagesMB: 'its packages',
  rssNodeHttpFsMB: 'node with node:http and node:fs',
};

/** Each goal's verdict on `figures`: the floor read from the same figures. */
export function judge(figures: Figures, goals: Record<string, Goal>): Record<string, Verdict> {
  const verdicts: Record<string, Verdict> = {};
  for (const [name, g] of Object.entries(goals)) {
    const value = measured(figures[name]);
    const floorValue = g.floor === undefined ? null : measured(figures[g.floor]);
    const goal = g.floor === undefined ? g.limit : floorValue === null ? null : round2(floorValue + g.margin);
    const holds = value === null || goal === null ? null : g.op === '<=' ? value <= goal : value >= goal;
    verdicts[name] = { value, floor: g.floor === undefined ? null : { figure: g.floor, value: floorValue }, op: g.op, goal, holds };
  }
  return verdicts;
}

/** What `--check` fails on: every goal missed, one line each ("rssStandaloneMB 68 > 63.1 (rssFastifyHelloMB 58.1 + 5)"). */
export function misses(verdicts: Record<string, Verdict>, goals: Record<string, Goal>): string[] {
  const lines: string[] = [];
  for (const [name, v] of Object.entries(verdicts)) {
    if (v.holds !== false) continue;
    const g = goals[name]!;
    const over = v.op === '<=' ? '>' : '<';
    lines.push(`${name} ${v.value} ${over} ${v.goal}${g.floor === undefined ? '' : ` (${g.floor} ${v.floor?.value} + ${g.margin})`}`);
  }
  return lines;
}

/** "PASS", "MISS", or "-" (not measured, or no verdicts asked for). */
export function verdictLabel(v: Verdict | undefined): 'PASS' | 'MISS' | '-' {
  return v?.holds === true ? 'PASS' : v?.holds === false ? 'MISS' : '-';
}

/** "goal <= 63.1 (bare fastify 58.1 + 5)" or "goal <= 75", for the table. */
export function describeGoal(v: Verdict | undefined, g: Goal | undefined, floorName?: string): string {
  if (!v || !g) return 'no goal';
  if (g.floor === undefined) return `goal ${g.op} ${g.limit}`;
  return `goal ${g.op} ${v.goal ?? '?'} (${floorName ?? g.floor} ${v.floor?.value ?? '?'} + ${g.margin})`;
}

function measured(v: number | null | undefined): number | null {
  return v === null || v === undefined || Number.isNaN(v) ? null : v;
}

function round2(v: number): number {
  return Math.round(v * 100) / 100;
}
