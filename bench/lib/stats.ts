/** Nearest-rank percentile (p in 0..100) of the samples; NaN when there are none. */
export function percentile(samples: number[], p: number): number {
  if (samples.length === 0) return NaN;
  const sorted = [...samples].sort((a, b) => a - b);
  const rank = Math.max(1, Math.ceil((p / 100) * sorted.length));
  return sorted[Math.min(rank, sorted.length) - 1]!;
}

export function median(samples: number[]): number {
  return percentile(samples, 50);
}

export function round(value: number, digits = 1): number {
  const f = 10 ** digits;
  return Math.round(value * f) / f;
}

/** Progress on stderr: stdout carries only the table and (with --json) the JSON line. */
export function progress(message: string): void {
  process.stderr.write(`[bench ${new Date().toISOString().slice(11, 19)}] ${message}\n`);
}

/** Least-squares line through the points (x, y): slope and intercept; NaN slope with fewer than 2 distinct x. */
export function linearFit(points: Array<{ x: number; y: number }>): { slope: number; intercept: number } {
  const n = points.length;
  const mx = points.reduce((s, p) => s + p.x, 0) / n;
  const my = points.reduce((s, p) => s + p.y, 0) / n;
  let sxy = 0;
  let sxx = 0;
  for (const { x, y } of points) {
    sxy += (x - mx) * (y - my);
    sxx += (x - mx) ** 2;
  }
  const slope = sxx > 0 ? sxy / sxx : NaN;
  return { slope, intercept: my - slope * mx };
}

/** A figure's target: at most (`<=`) or at least (`>=`) `limit`. */
export interface Target {
  op: '<=' | '>=';
  limit: number;
}

/** PASS or MISS against the target; '-' without a target or a figure. */
export function verdictOf(t: Target | undefined, v: number | null | undefined): 'PASS' | 'MISS' | '-' {
  if (!t || v === null || v === undefined || Number.isNaN(v)) return '-';
  return (t.op === '<=' ? v <= t.limit : v >= t.limit) ? 'PASS' : 'MISS';
}
