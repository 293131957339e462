// Time is injected everywhere so renewals and backoff can be tested in seconds, not days.
export interface Clock {
  /** Milliseconds since the epoch. */
  now(): number;
  /** Resolves after `ms`, or rejects with the signal's reason when it aborts first. */
  sleep(ms: number, signal?: AbortSignal): Promise<void>;
}

export const systemClock: Clock = {
  now: () => Date.now(),
  sleep: (ms, signal) =>
    new Promise<void>((resolve, reject) => {
      if (signal?.aborted) return reject(signal.reason);
      // setTimeout's limit is 2^31-1 ms (24.8 days); a longer wait is clamped and the caller re-checks.
      const timer = setTimeout(done, Math.min(Math.max(0, ms), 2 ** 31 - 1));
      function done(): void {
        signal?.removeEventListener('abort', onAbort);
        resolve();
      }
      function onAbort(): void {
        clearTimeout(timer);
        reject(signal!.reason);
      }
      signal?.addEventListener('abort', onAbort, { once: true });
    }),
};

/** A time as log lines and messages give it: ISO 8601, UTC. */
export function iso(ms: number): string {
  return new Date(ms).toISOString();
}
