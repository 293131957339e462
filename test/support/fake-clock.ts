import type { Clock } from '../../src/core/ports/clock.ts';

// A Clock whose time moves only when a test advances it. Sleepers wake in due-time order (ties in the
// order they started sleeping); between wake-ups the event loop gets a turn, so code that sleeps again
// right after waking is picked up by the same advance() when its new deadline falls inside the window.

interface Sleeper {
  due: number;
  seq: number;
  ms: number;
  resolve(): void;
  detach(): void;
}

export class FakeClock implements Clock {
  #now: number;
  #seq = 0;
  #sleepers: Sleeper[] = [];
  #countWaiters: { n: number; resolve(): void }[] = [];
  readonly #sleepListeners = new Set<() => void>();
  /** Every duration passed to sleep(), in call order (including aborted and zero sleeps). */
  readonly sleepCalls: number[] = [];

  constructor(startMs: number = Date.UTC(2026, 0, 1)) {
    this.#now = startMs;
  }

  now(): number {
    return this.#now;
  }

  /** Resolves once the clock is advanced by `ms` (at once for ms <= 0); rejects with the signal's reason. */
  sleep(ms: number, signal?: AbortSignal): Promise<void> {
    this.sleepCalls.push(ms);
    if (signal?.aborted) return Promise.reject(signal.reason);
    if (!(ms > 0)) return Promise.resolve();
    return new Promise<void>((resolve, reject) => {
      const onAbort = (): void => {
        this.#remove(sleeper);
        reject(signal!.reason);
      };
      const sleeper: Sleeper = {
        due: this.#now + ms,
        seq: this.#seq++,
        ms,
        resolve,
        detach: () => signal?.removeEventListener('abort', onAbort),
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      this.#sleepers.push(sleeper);
      this.#notifyCount();
      for (const listener of this.#sleepListeners) listener();
    });
  }

  /** Calls `listener` each time a sleep starts waiting for time to pass (a source for wait.ts `until`); returns its removal. */
  onSleep(listener: () => void): () => void {
    this.#sleepListeners.add(listener);
    return () => this.#sleepListeners.delete(listener);
  }

  /** Number of sleeps waiting for time to pass. */
  pendingSleeps(): number {
    return this.#sleepers.length;
  }

  /** Durations of the pending sleeps, earliest due first. */
  pendingDurations(): number[] {
    return this.#ordered().map((s) => s.ms);
  }

  /** When the pending sleeps end (clock time), earliest first. */
  pendingDues(): number[] {
    return this.#ordered().map((s) => s.due);
  }

  /** Milliseconds until the earliest pending sleep is due, or undefined when none is pending. */
  nextDueIn(): number | undefined {
    const first = this.#ordered()[0];
    return first === undefined ? undefined : first.due - this.#now;
  }

  /** Resolves once at least `n` sleeps are pending. */
  waitForSleepers(n: number = 1): Promise<void> {
    if (this.#sleepers.length >= n) return Promise.resolve();
    return new Promise<void>((resolve) => this.#countWaiters.push({ n, resolve }));
  }

  /**
   * Moves time forward by `ms`, waking due sleepers one at a time in due order, with the clock set to
   * each one's due time and an event-loop turn after each wake-up. Resolves at the end of the window.
   */
  async advance(ms: number): Promise<void> {
    if (!(ms >= 0)) throw new RangeError(`cannot advance a clock by ${ms} ms`);
    const target = this.#now + ms;
    for (;;) {
      const next = this.#ordered()[0];
      if (next === undefined || next.due > target) break;
      this.#remove(next);
      this.#now = Math.max(this.#now, next.due);
      next.detach();
      next.resolve();
      await settle();
    }
    this.#now = target;
    await settle();
  }

  /** Advances exactly to the earliest pending sleep and wakes it (and any due at the same time). Returns the ms advanced. */
  async advanceToNext(): Promise<number> {
    const due = this.nextDueIn();
    if (due === undefined) throw new Error('FakeClock.advanceToNext: no pending sleep');
    await this.advance(due);
    return due;
  }

  #ordered(): Sleeper[] {
    return [...this.#sleepers].sort((a, b) => a.due - b.due || a.seq - b.seq);
  }

  #remove(sleeper: Sleeper): void {
    const i = this.#sleepers.indexOf(sleeper);
    if (i !== -1) this.#sleepers.splice(i, 1);
  }

  #notifyCount(): void {
    const count = this.#sleepers.length;
    const ready = this.#countWaiters.filter((w) => w.n <= count);
    if (ready.length === 0) return;
    this.#countWaiters = this.#countWaiters.filter((w) => w.n > count);
    for (const w of ready) w.resolve();
  }
}

/** One macrotask turn: every queued promise reaction runs first. */
function settle(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}
