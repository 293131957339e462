import type { Clock } from '../ports/clock.ts';

// Some conditions are part of every normal start and say nothing is wrong: tailscaled, a native sidecar
// started after certshare, is not listening yet; a reader finds its Secret still empty while the writer
// runs the first issuance. Logged as warnings they teach operators to ignore warnings. So while the process
// is young they log at info with a plain message, and as warnings (with their CERTSHARE_ code) once the
// grace has passed. A condition seen cleared once (tailscaled answered; a certificate was held) is no
// start-up state when it comes back: a tailscaled that goes away later is trouble, and warns at once.
// Only the log level depends on this: health and readiness do not.

/** The grace when --startup-grace is not given: tailscaled usually listens within seconds. @forTests */
export const DEFAULT_STARTUP_GRACE_MS = 30_000;

/** The longest --startup-grace accepted: a longer one would hide a tailscaled that never starts. */
export const MAX_STARTUP_GRACE_MS = 10 * 60_000;

/** @forTests */
export type StartupLevel = 'info' | 'warn';

/** @forTests */
export interface StartupMoment {
  /** When the process started (epoch ms, from the injected clock). */
  startedAt: number;
  graceMs: number;
  /** When the condition is seen (epoch ms). */
  now: number;
  /** The condition has been seen cleared since the start (tailscaled answered; a certificate was held). */
  clearedOnce: boolean;
}

/** The level of a condition expected at start-up: info within the grace, unless it was cleared once; warn after. @forTests */
export function startupLevel(m: StartupMoment): StartupLevel {
  return !m.clearedOnce && m.now - m.startedAt < m.graceMs ? 'info' : 'warn';
}

/** The process's start and its grace, shared by every condition that is expected while it starts. */
export class StartupGrace {
  readonly clock: Clock;
  readonly startedAt: number;
  readonly graceMs: number;

  constructor(clock: Clock, graceMs: number = DEFAULT_STARTUP_GRACE_MS, startedAt: number = clock.now()) {
    this.clock = clock;
    this.graceMs = graceMs;
    this.startedAt = startedAt;
  }

  /** One condition (tailscaled listening, one domain's first certificate): cleared on its own. */
  condition(): StartupCondition {
    return new StartupCondition(this);
  }
}

export class StartupCondition {
  readonly #grace: StartupGrace;
  #clearedOnce = false;

  constructor(grace: StartupGrace) {
    this.#grace = grace;
  }

  /** The condition is over: should it come back, it is trouble, not start-up. */
  cleared(): void {
    this.#clearedOnce = true;
  }

  /** The level to log the condition at, now. */
  level(): StartupLevel {
    const { startedAt, graceMs, clock } = this.#grace;
    return startupLevel({ startedAt, graceMs, now: clock.now(), clearedOnce: this.#clearedOnce });
  }
}
