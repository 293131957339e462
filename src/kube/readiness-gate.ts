import { setHeaderOptions, PatchStrategy } from './transport/client-node.ts';
import { doubling } from '../core/issuance/backoff.ts';
import { iso, type Clock } from '../core/ports/clock.ts';
import { errorMessage } from '../core/errors.ts';
import type { HealthState, ValidityEnd } from '../core/loop/health.ts';
import type { Logger } from '../core/ports/logger.ts';
import { apiErrorCode, apiErrorText, type KubeConnection } from './connection.ts';
import { withSignal } from './transport/https-transport.ts';
import type { RoutingVerdict } from './routing-check.ts';
import type { RoutingProofSource } from '../core/ports/routing-proof-source.ts';
import { readinessRouting } from './readiness-routing.ts';

/** --readiness-gate with --routing-check and --routing-attempts (`ownIPv4` from POD_IPS), and when a certificate leaves rotation. */
export interface ReadinessGateSettings {
  conditionType: string;
  routingChecks: string[];
  routingAttempts: number;
  ownIPv4: string | undefined;
  /** The condition turns False a little before a certificate expires (renewal.ts rotationExitTime). */
  validityEnd: ValidityEnd;
}

/** --readiness-gate: the Pod's own condition, with the routing check of --routing-check when given. */
export function podReadinessGate(
  settings: ReadinessGateSettings,
  connection: KubeConnection,
  podName: string,
  deps: Pick<ReadinessGateOptions, 'health' | 'clock' | 'logger' | 'settled' | 'onPatched'> & { proofs: RoutingProofSource | undefined },
): ReadinessGate {
  const { proofs, logger, ...rest } = deps;
  const urls = settings.routingChecks;
  return new ReadinessGate({
    ...rest,
    connection,
    podName,
    conditionType: settings.conditionType,
    validityEnd: settings.validityEnd,
    logger: logger.child({ component: 'readiness-gate' }),
    ...(urls.length > 0 ? { routing: readinessRouting({ urls, ownIPv4: settings.ownIPv4, attempts: settings.routingAttempts, proofs, logger }) } : {}),
  });
}

interface ReadinessGateOptions {
  connection: KubeConnection;
  podName: string;
  conditionType: string;
  health: HealthState;
  clock: Clock;
  logger: Logger;
  /** Verifies the Services route to this Pod before the condition turns True (`detail`: how, for the message); none: skip. */
  routing?: (signal: AbortSignal) => Promise<{ verdict: RoutingVerdict; detail: string }>;
  /** Resolves when what the proxy serves reflects the certificates (the --out-dir projection written). */
  settled?: () => Promise<void>;
  /**
   * Where a certificate stops counting for readiness (core/renewal/renewal.ts rotationExitTime: a little before it
   * expires, so the Pod has left the endpoints by then); default its notAfter.
   */
  validityEnd?: ValidityEnd;
  /** First retry of a failed patch to True, doubling up to maxRetryMs (default 1 s). */
  firstRetryMs?: number;
  /** First retry of a failed patch to False, doubling: sooner, since the certificate is about to expire (default 200 ms). */
  leaveFirstRetryMs?: number;
  maxRetryMs?: number;
  /** The condition was written: its status, reason and message. */
  onPatched?: (status: 'True' | 'False', reason: string, message: string) => void;
}

/**
 * How often a False condition is sent again as it was written: certshare never reads its Pod, and a True that the
 * Pod's own token wrote over it (a proxy sharing the process namespace reads that token) held the Pod Ready with no
 * valid certificate until certshare's own verdict changed, long after that token expired. Sent unchanged, it is a
 * no-op for the apiserver (nothing stored) while the condition stands.
 */
const RESEND_FALSE_MS = 60_000;

/** A condition as sent: its patch's body, and when. */
interface Sent {
  body: { status: { conditions: Array<Record<string, string>> } };
  at: number;
}

interface Desired {
  status: 'True' | 'False';
  reason: string;
  message: string;
}

/**
 * Keeps the Pod's own readiness-gate condition in step with its certificates. Written with a strategic
 * merge patch on pods/status: conditions merge by type, so the kubelet's conditions are left alone
 * (a JSON merge patch would replace the whole array). Patches only on a change of status or reason.
 */
export class ReadinessGate {
  readonly #o: ReadinessGateOptions;
  readonly #stop = new AbortController();
  #wake = new AbortController();
  #written: 'True' | 'False' | undefined;
  #writtenReason: string | undefined;
  #sent: Sent | undefined;
  #routed = false;
  /** When the certificates were first seen valid since they last were not: where "held to Ready" starts. */
  #healthySince: number | undefined;
  #leaving = false;
  #done: Promise<void> | undefined;
  #unsubscribe: (() => void) | undefined;

  constructor(options: ReadinessGateOptions) {
    this.#o = options;
  }

  get status(): 'True' | 'False' | undefined {
    return this.#written;
  }

  start(): void {
    this.#unsubscribe = this.#o.health.onChange(() => this.#wake.abort());
    this.#done ??= this.#run();
  }

  /**
   * SIGTERM's first step: condition False, whatever the certificates say, and keep it so. Stopping the
   * loop cuts its request in flight (a patch to True that has not been answered is abandoned before the
   * False one is sent). Best effort: given up when `signal` aborts (the shutdown budget).
   */
  leaveRotation(signal?: AbortSignal): Promise<void> {
    // Once: a preStop hook's leave and the stop both ask.
    this.#left ??= this.#leaveRotation(signal);
    return this.#left;
  }

  #left: Promise<void> | undefined;

  async #leaveRotation(signal?: AbortSignal): Promise<void> {
    this.#leaving = true;
    this.#stop.abort();
    await this.#done;
    await this.#patch({ status: 'False', reason: 'Terminating', message: 'certshare is shutting down' }, signal).catch((err: unknown) => {
      this.#o.logger.error({ err: errorMessage(err), code: apiErrorCode(err) }, 'could not take the Pod out of rotation');
    });
  }

  async stop(): Promise<void> {
    this.#stop.abort();
    this.#unsubscribe?.();
    await this.#done;
  }

  async #run(): Promise<void> {
    const { clock, logger, health, validityEnd } = this.#o;
    let failures = 0;
    while (!this.#stop.signal.aborted) {
      let waitMs: number;
      let desired: Desired | undefined;
      // The next exit from rotation as it stands before this pass awaits anything, on a timer of its own.
      const exit = this.#exitTimer(health.nextExpiry(clock.now(), validityEnd));
      try {
        desired = await this.#desired(exit.signal);
        if (this.#stop.signal.aborted) break;
        // On a change of status, or of reason (e.g. CertificateExpiring to CertificateNotValid): not on every message.
        if (desired.status !== this.#written || desired.reason !== this.#writtenReason) {
          await this.#patch(desired, desired.status === 'True' ? exit.signal : this.#stop.signal);
        } else if (desired.status === 'False' && this.#sent && clock.now() >= this.#sent.at + RESEND_FALSE_MS) {
          await this.#send(this.#sent.body, this.#stop.signal);
        }
        failures = 0;
        // The next change of what the gate says: a certificate's exit from rotation (False, expiring), or its
        // notAfter past that (expired), which no health change announces.
        const expiry = earliest(health.nextExpiry(clock.now(), validityEnd), health.nextExpiry(clock.now()));
        // Not routed yet: look again later; otherwise sleep until a certificate leaves rotation or health changes.
        waitMs = desired.reason === 'NotRouted' ? this.#retryDelay(1) : expiry === undefined ? 3_600_000 : Math.max(0, expiry - clock.now());
        // An exit point passed while this pass awaited (its patch to True answered late): look again now. The
        // look after the pass would skip it (nextExpiry names later ones only) and sleep until a health change,
        // which the loops send only from their turns, held up to --cert-timeout by a CertPair call that hangs.
        if (exit.passed()) waitMs = 0;
        if (desired.status === 'False' && this.#sent) waitMs = Math.min(waitMs, Math.max(0, this.#sent.at + RESEND_FALSE_MS - clock.now()));
      } catch (err) {
        if (this.#stop.signal.aborted) break;
        if (exit.passed()) {
          waitMs = 0; // cut at the exit point (#exitTimer): no failure, decide again at once
        } else {
          failures++;
          waitMs = desired?.status === 'False' ? this.#retryDelay(failures, this.#o.leaveFirstRetryMs ?? 200) : this.#retryDelay(failures);
          logger.warn({ err: apiErrorText(err), code: apiErrorCode(err), retryInMs: waitMs }, 'could not update the readiness condition');
        }
      } finally {
        exit.cancel();
      }
      await clock.sleep(waitMs, AbortSignal.any([this.#stop.signal, this.#wake.signal])).catch(() => {});
      if (this.#wake.signal.aborted) this.#wake = new AbortController();
    }
  }

  /**
   * A timer to `at` (a certificate's exit from rotation; undefined: none) on the injectable clock, independent
   * of what the pass awaits: `signal` aborts there (and on stop), cutting a routing check or a patch to True
   * still under way, so the pass ends and the next says False at the exit point, not when that call ends.
   */
  #exitTimer(at: number | undefined): { signal: AbortSignal; passed(): boolean; cancel(): void } {
    const { clock } = this.#o;
    const cancelled = new AbortController();
    const reached = new AbortController();
    if (at !== undefined) {
      clock.sleep(at - clock.now(), AbortSignal.any([this.#stop.signal, cancelled.signal])).then(
        () => reached.abort(),
        () => {},
      );
    }
    return {
      signal: AbortSignal.any([this.#stop.signal, reached.signal]),
      passed: () => at !== undefined && clock.now() >= at,
      cancel: () => cancelled.abort(),
    };
  }

  /**
   * Whether `settled` resolved before the next certificate's exit from rotation (true without `settled`, or on
   * stop). `signal`: the pass's (#exitTimer), which also ends the wait at the exit point the pass began with,
   * one the clock may have passed since the pass looked (no later exit then: the wait would have no end).
   */
  async #settledBeforeExit(signal: AbortSignal): Promise<boolean> {
    const { settled, health, clock, validityEnd } = this.#o;
    if (!settled) return true;
    const exit = health.nextExpiry(clock.now(), validityEnd);
    const done = new AbortController();
    const cut = AbortSignal.any([signal, done.signal]);
    try {
      return await Promise.race([
        settled().then(() => true),
        new Promise<boolean>((resolve) => {
          const atExit = (): void => resolve(this.#stop.signal.aborted);
          cut.addEventListener('abort', atExit, { once: true });
          if (exit !== undefined) clock.sleep(exit - clock.now(), cut).then(atExit, () => {});
        }),
      ]);
    } finally {
      done.abort();
    }
  }

  #retryDelay(failures: number, firstMs = this.#o.firstRetryMs ?? 1000): number {
    return doubling(firstMs, failures, this.#o.maxRetryMs ?? 30_000);
  }

  /** `signal`: the pass's (#exitTimer), which ends a routing check at the exit point. */
  async #desired(signal: AbortSignal): Promise<Desired> {
    const verdict = this.#o.health.evaluate(this.#o.clock.now(), this.#o.validityEnd);
    if (!verdict.healthy) {
      this.#routed = false;
      this.#healthySince = undefined;
      return { status: 'False', reason: verdict.expiring ? 'CertificateExpiring' : 'CertificateNotValid', message: verdict.reason };
    }
    this.#healthySince ??= this.#o.clock.now();
    const healthySince = this.#healthySince;
    let routingNote = '';
    if (this.#o.routing && !this.#routed) {
      const checkedFrom = this.#o.clock.now();
      const routing = await this.#o.routing(signal);
      this.#routed = routing.verdict !== 'not-routed';
      if (!this.#routed) return { status: 'False', reason: 'NotRouted', message: `the Service does not route to this Pod yet (${routing.detail})` };
      routingNote = ` (routing check ${Math.round(this.#o.clock.now() - checkedFrom)} ms: ${routing.detail})`;
    }
    // What the proxy serves not settled before a certificate leaves rotation (a projection write stalled on a
    // loaded disk): look again, which then says False; a stalled write never holds the Pod in rotation.
    if (!(await this.#settledBeforeExit(signal))) return this.#desired(signal);
    // Settling may have changed the verdict (a projection write that failed holds health at unhealthy): ask again.
    if (!this.#o.health.evaluate(this.#o.clock.now(), this.#o.validityEnd).healthy) return this.#desired(signal);
    // How long Ready took once the certificates were held (routing check included, and on its own): in the
    // condition, so `kubectl describe` shows it and the real-cluster tier takes percentiles of it across Pod starts.
    const heldToReadyMs = Math.round(this.#o.clock.now() - healthySince);
    return {
      status: 'True',
      reason: 'CertificatesValid',
      message: `every domain has a valid certificate; Ready ${heldToReadyMs} ms after it was held${routingNote}`,
    };
  }

  async #patch(desired: Desired, signal: AbortSignal | undefined): Promise<void> {
    if (this.#leaving && desired.status === 'True') return;
    const { conditionType, clock, logger } = this.#o;
    const body = {
      status: {
        conditions: [
          {
            type: conditionType,
            status: desired.status,
            reason: desired.reason,
            message: desired.message,
            lastTransitionTime: iso(clock.now()),
          },
        ],
      },
    };
    await this.#send(body, signal);
    this.#written = desired.status;
    this.#writtenReason = desired.reason;
    logger.info({ condition: conditionType, status: desired.status, reason: desired.reason, message: desired.message }, 'readiness condition updated');
    this.#o.onPatched?.(desired.status, desired.reason, desired.message);
  }

  async #send(body: Sent['body'], signal: AbortSignal | undefined): Promise<void> {
    const { connection, podName, clock } = this.#o;
    const at = clock.now();
    try {
      await connection.core.patchNamespacedPodStatus(
        { name: podName, namespace: connection.namespace, body },
        withSignal(signal, setHeaderOptions('Content-Type', PatchStrategy.StrategicMergePatch)),
      );
    } catch (err) {
      // Sent and not answered (cut at the exit point, a timeout, a reset): the API server may have applied
      // it, so what the condition says is unknown, and the next pass patches what it wants whatever that is.
      this.#written = undefined;
      this.#writtenReason = undefined;
      this.#sent = undefined;
      throw err;
    }
    this.#sent = { body, at };
  }
}

const earliest = (a: number | undefined, b: number | undefined): number | undefined => (a === undefined ? b : b === undefined ? a : Math.min(a, b));
