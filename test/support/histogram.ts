/**
 * Prometheus' histogram_quantile over cumulative bucket counts (upper bound in seconds -> count), e.g.
 * the increase between two scrapes: linear inside the bucket; the +Inf bucket answers its lower bound.
 */
export function histogramQuantile(q: number, buckets: Map<number, number>): number {
  const bounds = [...buckets.keys()].sort((a, b) => a - b);
  const counts = bounds.map((le) => buckets.get(le)!);
  const total = counts[counts.length - 1] ?? 0;
  if (total === 0) return NaN;
  const rank = q * total;
  for (let i = 0; i < bounds.length; i++) {
    if (counts[i]! < rank) continue;
    const lower = i === 0 ? 0 : bounds[i - 1]!;
    const below = i === 0 ? 0 : counts[i - 1]!;
    const upper = bounds[i]!;
    if (!Number.isFinite(upper)) return lower;
    return lower + ((upper - lower) * (rank - below)) / Math.max(1, counts[i]! - below);
  }
  return NaN;
}

/** Per-bound difference of two cumulative bucket maps (after - before). */
export function bucketIncrease(before: Map<number, number>, after: Map<number, number>): Map<number, number> {
  return new Map([...after].map(([le, count]) => [le, count - (before.get(le) ?? 0)]));
}
