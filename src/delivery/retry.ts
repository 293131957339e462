import { doubling } from '../core/issuance/backoff.ts';
import type { Clock } from '../core/ports/clock.ts';

/** The first retry of a failed delivery, doubling up to a minute. */
const FIRST_RETRY_MS = 1000;
const RETRY_CAP_MS = 60_000;

/**
 * The retry of a failed delivery to the proxy (its files written, a HAProxy push, a reload): per key, from 1 s doubling
 * to a minute, until one lands or `stop` aborts. Left alone, a failure would stand until the next renewal (days) while
 * the proxy serves the certificate before, one the CA may have revoked. Whether a retry still has anything to do (a
 * newer certificate, or a newer reload, may have taken its place) is for its `again` to decide.
 */
export class DeliveryRetry<K> {
  readonly #clock: Clock;
  readonly #stop: AbortSignal;
  /** Failures in a row per key (the next wait). */
  readonly #failures = new Map<K, number>();

  constructor(clock: Clock, stop: AbortSignal) {
    this.#clock = clock;
    this.#stop = stop;
  }

  /** `key` failed once more: `again` runs after the wait returned, unless `stop` aborts first. */
  failed(key: K, again: () => void): number {
    const failures = (this.#failures.get(key) ?? 0) + 1;
    this.#failures.set(key, failures);
    const waitMs = doubling(FIRST_RETRY_MS, failures, RETRY_CAP_MS);
    this.#clock.sleep(waitMs, this.#stop).then(
      () => {
        if (!this.#stop.aborted) again();
      },
      () => {},
    );
    return waitMs;
  }

  /** `key` landed: its next failure waits the first delay again. True when it had failed before. */
  landed(key: K): boolean {
    return this.#failures.delete(key);
  }
}
