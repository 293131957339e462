// Leaving rotation, once: asked by the stop, or by the proxy's preStop hook (GET /leave-rotation with
// --leave-token). The Services are withdrawn first (the served rotation), then their failover waited out
// while the Kubernetes side (the readiness condition) goes False.
import type { Clock } from '../core/ports/clock.ts';
import type { Logger } from '../core/ports/logger.ts';
import type { StoreBackend } from '../store/store-backend.ts';
import type { HttpServerDeps } from './http-server.ts';

/** What the shutdown bound keeps back from the Services' failover wait for the rest of the stop (readiness, Lease). */
const AFTER_FAILOVER_RESERVE_MS = 3000;
/** GET /leave-rotation's question to the apiserver (is the Pod terminating?): well inside a preStop hook's time. */
const TERMINATING_CHECK_TIMEOUT_MS = 5000;

/** --leave-token (undefined: no GET /leave-rotation), the Services' failover wait, and the drain delay a preStop call waits out. */
export interface LeaveSettings {
  token: string | undefined;
  failoverMs: number;
  drainDelayMs: number;
}

interface RotationExitDeps {
  clock: Clock;
  logger: Logger;
  backend: Pick<StoreBackend, 'leaveRotation' | 'podTerminating'>;
  /**
   * The served rotation's leave (served/served-rotation.ts), with --served-check: the Services withdrawn, then
   * their failover waited out `alongside` the Kubernetes side; undefined: the Kubernetes side alone.
   */
  served: { leave(failoverMs: number, signal: AbortSignal, alongside: () => Promise<void>): Promise<void> } | undefined;
}

/**
 * `leaveRotation(withinMs)`: the one exit, within `withinMs` (the shutdown bound when the stop asks; a preStop
 * call's wait is bounded by the Pod's grace period). `route`: GET /leave-rotation, with --leave-token only.
 */
export function rotationExit(
  settings: LeaveSettings,
  deps: RotationExitDeps,
): { leaveRotation: (withinMs: number) => Promise<void>; route: Pick<HttpServerDeps, 'leaveRotation'> } {
  const { backend, served } = deps;
  let leaving: Promise<void> | undefined;
  const leaveRotation = (withinMs: number): Promise<void> =>
    (leaving ??= (async () => {
      const failoverMs = Math.min(settings.failoverMs, Math.max(0, withinMs - AFTER_FAILOVER_RESERVE_MS));
      const bound = AbortSignal.timeout(Math.max(1, withinMs - AFTER_FAILOVER_RESERVE_MS));
      const kubernetesSide = async (): Promise<void> => backend.leaveRotation?.(bound);
      await (served ? served.leave(failoverMs, bound, kubernetesSide) : kubernetesSide());
    })());
  return { leaveRotation, route: leaveRoute(settings, deps, leaveRotation) };
}

/**
 * --leave-token: GET /leave-rotation leaves rotation once the Pod is terminating, then answers once the drain
 * delay has passed too. Without a Pod to ask (no Kubernetes store), it never acts.
 */
function leaveRoute(
  settings: LeaveSettings,
  deps: RotationExitDeps,
  leaveRotation: (withinMs: number) => Promise<void>,
): Pick<HttpServerDeps, 'leaveRotation'> {
  const { token } = settings;
  if (!token) return {};
  const { clock, logger, backend } = deps;
  const terminating = async (): Promise<boolean> => {
    const answer = (await backend.podTerminating?.(AbortSignal.timeout(TERMINATING_CHECK_TIMEOUT_MS))) ?? false;
    if (!answer) logger.warn({ code: 'CERTSHARE_NOT_TERMINATING' }, 'GET /leave-rotation refused: the Pod is not terminating');
    return answer;
  };
  const leave = async (): Promise<void> => {
    const start = clock.now();
    logger.info({}, 'asked to leave rotation (GET /leave-rotation)');
    await leaveRotation(settings.failoverMs + AFTER_FAILOVER_RESERVE_MS);
    // The caller (the proxy's preStop hook) keeps the proxy serving until the endpoints drained.
    await clock.sleep(Math.max(0, settings.drainDelayMs - (clock.now() - start)));
  };
  return { leaveRotation: { token, terminating, leave } };
}
