// What Kubernetes mode counts: the series it sets, as narrow ports. The daemon's metrics (http/daemon-metrics.ts)
// name and register them; this mode knows only that it can set a gauge or count one more.
import type { UntrustedValue } from '../core/values/untrusted-values.ts';

interface Gauge {
  set(value: number): void;
}

/** A counter by labels. */
interface Count {
  inc(labels: Record<string, string>): void;
}

export interface KubeMetrics {
  /** certshare_writer: 1 while this replica may issue (rw mode, or holding the group Lease in auto mode). */
  writer: Gauge;
  /** certshare_home_writer: 1 while this replica holds its group's Lease at the federation home. */
  homeWriter: Gauge;
  /** certshare_events_dropped_total: Events not recorded (the queue full, the API refusing or silent). */
  eventsDropped: { inc(): void };
  /** certshare_store_errors_total, by `operation`. */
  storeErrors: Count;
  /** certshare_untrusted_certificates_total, by `domain` and `store` (home or local). */
  untrusted: Count;
  /** certshare_break_glass_issuances_total, by `domain`. */
  breakGlass: Count;
  /** certshare_home_takeovers_total: the home Lease taken over from a holder that renewed nothing by the safety point. */
  homeTakeovers: { inc(): void };
  /** A time read from an object another credential can write was out of its bound (certshare_out_of_bounds_values_total). */
  outOfBounds(where: string, value: UntrustedValue): void;
}
