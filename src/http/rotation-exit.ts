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
 * The one exit from rotation (leaveRotation), asked by the stop or by GET /leave-rotation (route, with
 * --leave-token only).
 */
export class RotationExit {
  readonly #settings: LeaveSettings;
  readonly #deps: RotationExitDeps;
  #leaving: Promise<void> | undefined;

  constructor(settings: LeaveSettings, deps: RotationExitDeps) {
    this.#settings = settings;
    this.#deps = deps;
  }

  /**
   * Leaves rotation once, within `withinMs` (the shutdown bound when the stop asks; a preStop call's wait is
   * bounded by the Pod's grace period); a second call waits for the first.
   */
  leaveRotation(withinMs: number): Promise<void> {
    this.#leaving ??= this.#leave(withinMs);
    return this.#leaving;
  }

  /**
   * --leave-token: GET /leave-rotation leaves rotation once the Pod is terminating, then answers once the drain
   * delay has passed too. Without a Pod to ask (no Kubernetes store), it never acts.
   */
  route(): Pick<HttpServerDeps, 'leaveRotation'> {
    const { token } = this.#settings;
    return token ? { leaveRotation: { token, terminating: () => this.#terminating(), leave: () => this.#leaveForPreStop() } } : {};
  }

  async #leave(withinMs: number): Promise<void> {
    const { backend, served } = this.#deps;
    const failoverMs = Math.min(this.#settings.failoverMs, Math.max(0, withinMs - AFTER_FAILOVER_RESERVE_MS));
    const bound = AbortSignal.timeout(Math.max(1, withinMs - AFTER_FAILOVER_RESERVE_MS));
    const kubernetesSide = async (): Promise<void> => backend.leaveRotation?.(bound);
    await (served ? served.leave(failoverMs, bound, kubernetesSide) : kubernetesSide());
  }

  async #terminating(): Promise<boolean> {
    const { backend, logger } = this.#deps;
    const answer = (await backend.podTerminating?.(AbortSignal.timeout(TERMINATING_CHECK_TIMEOUT_MS))) ?? false;
    if (!answer) logger.warn({ code: 'CERTSHARE_NOT_TERMINATING' }, 'GET /leave-rotation refused: the Pod is not terminating');
    return answer;
  }

  async #leaveForPreStop(): Promise<void> {
    const { clock, logger } = this.#deps;
    const start = clock.now();
    logger.info({}, 'asked to leave rotation (GET /leave-rotation)');
    await this.leaveRotation(this.#settings.failoverMs + AFTER_FAILOVER_RESERVE_MS);
    // The caller (the proxy's preStop hook) keeps the proxy serving until the endpoints drained.
    await clock.sleep(Math.max(0, this.#settings.drainDelayMs - (clock.now() - start)));
  }
}
