// Kubernetes mode's part of the stop before the rest stops (the StoreBackend's beforeStop): out of rotation, the
// issuance under way settled, then the writer's role handed over, within the shutdown bound less a reserve.
import { errorMessage } from '../core/errors.ts';
import type { Logger } from '../core/ports/logger.ts';
import type { Federated } from './federation-home.ts';
import type { ReadinessGate } from './readiness-gate.ts';
import type { LeaseElector } from './lease-elector.ts';
import type { EventRecorder } from './event-recorder.ts';

/** What the shutdown bound keeps back, after leaving rotation and the drain delay, for stopping the rest. */
const STOP_RESERVE_MS = 1000;

/** The parts the hand-over takes out of rotation, settles and stops, each when it is there. */
interface HandOverParts {
  gate: ReadinessGate | undefined;
  federation: Federated | undefined;
  elector: LeaseElector | undefined;
  recorder: EventRecorder | undefined;
  logger: Logger;
}

export async function handOver(parts: HandOverParts, settleIssuance: (signal: AbortSignal) => Promise<void>, remainingMs: number): Promise<void> {
  const { gate, federation, elector, recorder, logger } = parts;
  // Out of rotation first; then hand the writer role over, so a successor renews at once. Both are
  // best effort against an API server that may not answer: together they get --shutdown-timeout less
  // a reserve, so the process still exits within it. No drain wait here: as a native sidecar certshare
  // gets SIGTERM only after the proxy has exited (docs/design.md); the drain is the proxy's preStop sleep.
  const budgetMs = Math.max(0, remainingMs - STOP_RESERVE_MS);
  const budget = AbortSignal.timeout(Math.round(budgetMs));
  await gate?.leaveRotation(budget);
  // A certificate being issued is stored, and one the store lost is put back, before the role goes:
  // else the successor issues the domain again.
  const settled = settleIssuance(budget).catch((err: unknown) => logger.warn({ err: errorMessage(err) }, 'could not settle issuance before handing over'));
  await Promise.race([settled, new Promise((resolve) => budget.addEventListener('abort', resolve, { once: true }))]);
  await federation?.stop(budget);
  await elector?.stop(budget);
  // What the shutdown recorded (NotReady, LostWriter) is sent within what is left of the budget.
  await recorder?.stop(budget);
}
