import type { EventEmitter } from 'node:events';

/** Resolves with the first `name` event whose payload passes `match`; fails after `timeoutMs`. */
export function nextEvent<T = unknown>(emitter: EventEmitter, name: string, match: (payload: T) => boolean = () => true, timeoutMs = 15_000): Promise<T> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      emitter.off(name, listener);
      reject(new Error(`no "${name}" event within ${timeoutMs} ms`));
    }, timeoutMs);
    function listener(payload: T): void {
      if (!match(payload)) return;
      clearTimeout(timer);
      emitter.off(name, listener);
      resolve(payload);
    }
    emitter.on(name, listener);
  });
}

type Subscribe = (listener: () => void) => () => void;

/**
 * Resolves once `predicate` holds, re-checking whenever one of the subscribed sources reports a change
 * (no polling); fails with `what` after `timeoutMs`.
 */
export function until(what: string, predicate: () => boolean, sources: Subscribe[], timeoutMs = 15_000): Promise<void> {
  return new Promise((resolve, reject) => {
    const offs: Array<() => void> = [];
    const finish = (err?: Error): void => {
      clearTimeout(timer);
      for (const off of offs) off();
      if (err) reject(err);
      else resolve();
    };
    const timer = setTimeout(() => finish(new Error(`timed out after ${timeoutMs} ms waiting for: ${what}`)), timeoutMs);
    const check = (): void => {
      try {
        if (predicate()) finish();
      } catch (err) {
        finish(err as Error);
      }
    };
    for (const subscribe of sources) offs.push(subscribe(check));
    check();
  });
}

/** Adapts an EventEmitter event to a `Subscribe` source for `until`. */
export function onEvent(emitter: EventEmitter, name: string): Subscribe {
  return (listener) => {
    emitter.on(name, listener);
    return () => emitter.off(name, listener);
  };
}

/** A source for what has no change event (a process, a connection state): looked at every `ms`. */
export function every(ms: number): Subscribe {
  return (listener) => {
    const timer = setInterval(listener, ms);
    return () => clearInterval(timer);
  };
}
