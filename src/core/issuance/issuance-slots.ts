// How many domains of one writer process issue at the same time. tailscaled runs one ACME operation at a
// time anyway (a process-wide mutex in ipn/ipnlocal/cert.go), so more calls in flight gain nothing: they
// only queue inside tailscaled, where their CertPair timeout runs, while each holds its socket, its
// response and its Secret writes in this process. 500 domains issued at once grew a writer's heap to that
// peak, and V8 keeps what it grew to.

/** The default of `--issuance-concurrency`. */
export const DEFAULT_ISSUANCE_CONCURRENCY = 4;

interface Waiter {
  grant(): void;
}

/**
 * A counting semaphore, first come first served. A waiter whose signal aborts leaves the queue at once
 * (rejecting with the signal's reason) and never takes a slot.
 */
export class IssuanceSlots {
  readonly limit: number;
  #inUse = 0;
  readonly #queue: Waiter[] = [];

  constructor(limit: number) {
    if (!(Number.isInteger(limit) && limit >= 1)) throw new RangeError(`issuance concurrency must be a positive integer, got ${limit}`);
    this.limit = limit;
  }

  /** Slots taken now. */
  get inUse(): number {
    return this.#inUse;
  }

  /** Callers waiting for a slot. */
  get waiting(): number {
    return this.#queue.length;
  }

  /** Resolves with the slot's release function (idempotent) once a slot is free; rejects when `signal` aborts first. */
  acquire(signal: AbortSignal): Promise<() => void> {
    if (signal.aborted) return Promise.reject(signal.reason);
    if (this.#inUse < this.limit) {
      this.#inUse++;
      return Promise.resolve(this.#releaser());
    }
    return new Promise((resolve, reject) => {
      const waiter: Waiter = {
        grant: () => {
          signal.removeEventListener('abort', onAbort);
          resolve(this.#releaser());
        },
      };
      const onAbort = (): void => {
        const index = this.#queue.indexOf(waiter);
        if (index >= 0) this.#queue.splice(index, 1);
        reject(signal.reason);
      };
      signal.addEventListener('abort', onAbort, { once: true });
      this.#queue.push(waiter);
    });
  }

  /** Runs `task` holding a slot. */
  async run<T>(signal: AbortSignal, task: () => Promise<T>): Promise<T> {
    const release = await this.acquire(signal);
    try {
      return await task();
    } finally {
      release();
    }
  }

  #releaser(): () => void {
    let released = false;
    return () => {
      if (released) return;
      released = true;
      // The slot passes straight to the next waiter: the count never drops below what is in use.
      const next = this.#queue.shift();
      if (next) next.grant();
      else this.#inUse--;
    };
  }
}
