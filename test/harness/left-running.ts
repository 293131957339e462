// What a test started that must not outlive its file: a test that fails before its own stop leaves it running,
// and its timers and sockets would keep the file's process, and the whole run, waiting. useControlPlane's last
// hook stops what is left here before the control plane itself.

/** A running thing with an idempotent stop. */
export interface Stoppable {
  stop(): Promise<void>;
}

const running = new Set<Stoppable>();

/** Tracks `it` until its stop; returns it. */
export function stopAtFileEnd<T extends Stoppable>(it: T): T {
  running.add(it);
  return it;
}

/** `it` stopped on its own: no longer tracked. */
export function stoppedOnItsOwn(it: Stoppable): void {
  running.delete(it);
}

/** Stops whatever is still running. */
export async function stopLeftRunning(): Promise<void> {
  await Promise.all([...running].map((it) => it.stop()));
}
