import type { Clock } from '../../src/core/ports/clock.ts';

interface Sleeper {
  at: number;
  wake(): void;
}

/**
 * Real time plus an offset the test moves forward: everything runs at the pace of real I/O (apiservers,
 * sockets), and a test skips days of a certificate's life with jump() instead of waiting for them. A sleep
 * ends when its real timer fires or when a jump carries the clock past its end, whichever comes first.
 */
export class JumpClock implements Clock {
  #offset = 0;
  /** Each jump: the wall time it was made at and the offset from then on, oldest first. */
  readonly #jumps: Array<{ wallMs: number; offset: number }> = [];
  readonly #sleepers = new Set<Sleeper>();

  now(): number {
    return Date.now() + this.#offset;
  }

  /** The clock's reading at a past wall-clock instant (an apiserver's timestamp): that instant plus the offset then. */
  atWallTime(wallMs: number): number {
    let offset = 0;
    for (const jump of this.#jumps) if (jump.wallMs <= wallMs) offset = jump.offset;
    return wallMs + offset;
  }

  sleep(ms: number, signal?: AbortSignal): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      if (signal?.aborted) return reject(signal.reason);
      const sleeper: Sleeper = { at: this.now() + Math.max(0, ms), wake: () => done() };
      const timer = setTimeout(() => done(), Math.min(Math.max(0, ms), 2 ** 31 - 1));
      const onAbort = (): void => {
        clearTimeout(timer);
        this.#sleepers.delete(sleeper);
        reject(signal!.reason);
      };
      const done = (): void => {
        clearTimeout(timer);
        this.#sleepers.delete(sleeper);
        signal?.removeEventListener('abort', onAbort);
        resolve();
      };
      this.#sleepers.add(sleeper);
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  /** Moves the clock `ms` forward and wakes every sleep that ends by then. */
  jump(ms: number): void {
    this.#offset += ms;
    this.#jumps.push({ wallMs: Date.now(), offset: this.#offset });
    const now = this.now();
    for (const sleeper of [...this.#sleepers]) if (sleeper.at <= now) sleeper.wake();
  }

  /** Moves the clock forward to `at` (epoch ms on this clock); never back. */
  jumpTo(at: number): void {
    this.jump(Math.max(0, at - this.now()));
  }
}
