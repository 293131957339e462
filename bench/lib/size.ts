// How much of each measurement the bench takes. `full` is what the figures come from; `tiny` (--tiny) runs
// every phase and every code path of the bench in seconds, for test/bench/bench-tiny.test.ts: its
// figures exist but mean little (one sample, no settling), so it reports them without targets.

export interface BenchSize {
  tiny: boolean;
  /** Idle RSS sampling (proc.ts idleRss): wait, then the maximum of samples over a span. */
  idle: { idleMs: number; spanMs: number; everyMs: number };
  /** Seconds of load per HTTP server before the measured rounds (the JIT warms up). */
  warmupSeconds: number;
  /** Standalone restarts timed to healthy, each paired with a bare fastify start; domains timed from the bus to the disk. */
  startupRuns: number;
  domainRuns: number;
  /** Runs of each --memory import step (the median is kept). */
  importRuns: number;
  /** Cap on the waits that let a process settle before --memory reads it (none at full size). */
  settleCapMs: number;
  /** Seconds of /healthz load on each V8-flags variant in --memory. */
  memoryLoadSeconds: number;
  /** --memory measures every variant (build, V8 flags), or only the first and last of each list. */
  allVariants: boolean;
}

export const FULL_SIZE: BenchSize = {
  tiny: false,
  idle: { idleMs: 3000, spanMs: 3000, everyMs: 500 },
  warmupSeconds: 2,
  startupRuns: 11,
  domainRuns: 5,
  importRuns: 3,
  settleCapMs: Number.POSITIVE_INFINITY,
  memoryLoadSeconds: 3,
  allVariants: true,
};

export const TINY_SIZE: BenchSize = {
  tiny: true,
  idle: { idleMs: 200, spanMs: 200, everyMs: 100 },
  warmupSeconds: 1,
  startupRuns: 1,
  domainRuns: 1,
  importRuns: 1,
  settleCapMs: 100,
  memoryLoadSeconds: 1,
  allVariants: false,
};

/** A settling wait of `ms` at full size, capped at this size. */
export function settle(size: BenchSize, ms: number): number {
  return Math.min(ms, size.settleCapMs);
}

/** The whole list (full size) or its first and last entries (tiny): the variants' code paths still run. */
export function variantsOf<T>(size: BenchSize, all: T[]): T[] {
  return size.allVariants || all.length <= 2 ? all : [all[0]!, all.at(-1)!];
}
