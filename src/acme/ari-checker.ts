// The writer's ACME Renewal Information checks (RFC 9773), one schedule per domain: the I/O around the
// pure decisions of core/renewal/renewal-info.ts. For the certificate a domain's loop holds (reported through
// LoopObserver.certificate) it computes the ARI certificate ID once, asks the CA's renewalInfo endpoint
// at once and then after the CA's Retry-After, at least a minute (or --ari-interval if shorter) and at most
// --ari-interval later, and keeps the answer in the domain's AriState, which the loop reads through
// AriStateSource when it decides. Checks run only while this replica is the writer of the domain and a
// certificate is held; a reader never asks (the writer's renewal reaches it through the store). Every
// check has the client's timeout and this checker's AbortSignal; whatever the CA answers, a failure only
// logs and counts (certshare_ari_checks_total{outcome}), and the expiry rule stays in force.
import { iso, type Clock } from '../core/ports/clock.ts';
import { errorMessage } from '../core/errors.ts';
import { ariCertificateId } from '../core/renewal/certificate-id.ts';
import type { Logger } from '../core/ports/logger.ts';
import type { LoopObserver } from '../core/ports/observer.ts';
import {
  describeAriAnswer,
  holding,
  NO_ARI_STATE,
  nextAriCheck,
  withAnswer,
  ariRenewalDone,
  type AriState,
  type AriStateSource,
  type SuggestedWindow,
} from '../core/renewal/renewal-info.ts';
import type { IssuanceRole, StoredCert } from '../core/ports/store.ts';
import type { AriCheckOutcome, RenewalInfoClient } from './renewal-info-client.ts';

/** The settings of ARI, and only those (DaemonConfig extends them). */
export interface AriSettings {
  /** The ACME directory whose renewalInfo URL the writer asks (RFC 9773); undefined: ARI off (--acme-directory none). */
  acmeDirectory: string | undefined;
  /** Longest wait between two ARI checks of a certificate; the CA's Retry-After may make it shorter. */
  ariIntervalMs: number;
}

/** How long after the daemon's start its first check waits (AriChecker quietUntil). */
const QUIET_START_MS = 1000;

/** The least wait between two checks of one certificate, unless --ari-interval is shorter. */
const CHECK_FLOOR_MS = 60_000;

interface AriCheckerDeps {
  client: Pick<RenewalInfoClient, 'check'>;
  /** Checks run for a domain only while this replica may issue it. */
  role: Pick<IssuanceRole, 'canIssue' | 'onChange'>;
  clock: Clock;
  logger: Logger;
  /** --ari-interval: the longest wait between two checks of a certificate. */
  intervalMs: number;
  /** [0, 1): where inside the CA's window the renewal time falls. Default Math.random. */
  random?: () => number;
  /** The window gauges and the checks counter (http/daemon-metrics.ts). */
  metrics: { ariWindow(domain: string, window: SuggestedWindow | undefined): void; ariCheck(outcome: AriCheckOutcome): void };
  /** The ARI state of `domain` changed: its loop decides again now (an order happens at once). */
  wake(domain: string): void;
  /** The line for /healthz?verbose and the logs (describeAriAnswer); undefined once no answer applies. */
  describe(domain: string, description: string | undefined): void;
  /**
   * No ARI work before this clock time (default: none). A daemon's start holds a stored certificate at
   * once, and its first check (the certificate ID parse with its ASN.1 chunks, node:https and a CA round
   * trip) would otherwise share the start's CPU with the first /healthz answers.
   */
  quietUntil?: number;
}

interface DomainChecks {
  /** The certificate the domain's loop holds now. */
  cert: StoredCert | undefined;
  /** The serial whose ARI ID `state` is about; `state` is handed out for this serial only. */
  serial: string | undefined;
  /** Undefined for a certificate without an ARI ID (no Authority Key Identifier): never checked. */
  certId: string | undefined;
  state: AriState;
  nextCheckAt: number;
  /** Cut short by a certificate change, a role change or stop. */
  wake: AbortController;
  stop: AbortController;
  done: Promise<void>;
}

export class AriChecker implements LoopObserver, AriStateSource {
  readonly #deps: AriCheckerDeps;
  readonly #log: Logger;
  readonly #domains = new Map<string, DomainChecks>();
  readonly #random: () => number;
  #unsubscribe: (() => void) | undefined;
  #stopped = false;

  constructor(deps: AriCheckerDeps) {
    this.#deps = deps;
    this.#log = deps.logger.child({ component: 'ari' });
    this.#random = deps.random ?? Math.random;
    this.#unsubscribe = deps.role.onChange?.(() => {
      for (const d of this.#domains.values()) d.wake.abort();
    });
  }

  /** LoopObserver: the certificate a domain's loop holds changed. */
  certificate(domain: string, cert: StoredCert | undefined): void {
    if (this.#stopped) return;
    let d = this.#domains.get(domain);
    if (!d) {
      if (!cert) return;
      d = this.#start(domain);
    }
    d.cert = cert;
    d.wake.abort();
  }

  /**
   * Ends the schedules of domains no longer managed (not on LoopObserver.stopped: a loop restarted after a
   * crash keeps its certificate and does not report it again).
   */
  retain(domains: Iterable<string>): void {
    const wanted = new Set(domains);
    for (const [domain, d] of this.#domains) {
      if (wanted.has(domain)) continue;
      this.#domains.delete(domain);
      d.stop.abort();
      this.#deps.metrics.ariWindow(domain, undefined);
      this.#deps.describe(domain, undefined);
    }
  }

  stateFor(domain: string, serial: string): AriState | undefined {
    const d = this.#domains.get(domain);
    return d && d.serial === serial && d.certId !== undefined ? d.state : undefined;
  }

  renewalDone(domain: string, serial: string): void {
    const d = this.#domains.get(domain);
    if (!d || d.serial !== serial || d.certId === undefined) return;
    d.state = ariRenewalDone(d.state);
  }

  /** Ends every schedule and the checks under way. */
  async stop(): Promise<void> {
    this.#stopped = true;
    this.#unsubscribe?.();
    const running = [...this.#domains.values()];
    this.#domains.clear();
    for (const d of running) d.stop.abort();
    await Promise.all(running.map((d) => d.done));
  }

  #start(domain: string): DomainChecks {
    const d: DomainChecks = {
      cert: undefined,
      serial: undefined,
      certId: undefined,
      state: NO_ARI_STATE,
      nextCheckAt: 0,
      wake: new AbortController(),
      stop: new AbortController(),
      done: Promise.resolve(),
    };
    this.#domains.set(domain, d);
    d.done = this.#run(domain, d).catch((err: unknown) => {
      if (!d.stop.signal.aborted) this.#log.error({ domain, err: errorMessage(err) }, 'ARI checks stopped by an unexpected error');
    });
    return d;
  }

  async #run(domain: string, d: DomainChecks): Promise<void> {
    const { clock, role } = this.#deps;
    const signal = d.stop.signal;
    while (!signal.aborted) {
      const cert = d.cert;
      if (!cert || !role.canIssue(domain)) {
        await this.#pause(d, undefined);
        continue;
      }
      const quietMs = (this.#deps.quietUntil ?? 0) - clock.now();
      if (quietMs > 0) {
        await this.#pause(d, quietMs);
        continue;
      }
      if (d.serial !== cert.info.serial) {
        await this.#identify(domain, d, cert);
        continue;
      }
      const now = clock.now();
      if (d.certId === undefined || now < d.nextCheckAt) {
        await this.#pause(d, d.certId === undefined ? undefined : d.nextCheckAt - now);
        continue;
      }
      await this.#check(domain, d, cert, d.certId);
    }
  }

  /** Computes the held certificate's ARI ID: a new certificate drops the previous one's answer (renewal-info.ts rule 1). */
  async #identify(domain: string, d: DomainChecks, cert: StoredCert): Promise<void> {
    let certId: string | undefined;
    try {
      certId = await ariCertificateId(cert.pair.certPem);
    } catch (err) {
      this.#log.warn(
        { domain, serial: cert.info.serial, err: errorMessage(err) },
        'no ARI certificate ID: this certificate is renewed by the expiry rule alone',
      );
    }
    if (d.cert !== cert) return; // replaced meanwhile: identify the new one
    const now = this.#deps.clock.now();
    d.serial = cert.info.serial;
    d.certId = certId;
    if (certId !== undefined) d.state = holding(d.state, certId, now);
    d.nextCheckAt = now;
    this.#deps.metrics.ariWindow(domain, undefined);
    this.#deps.describe(domain, undefined);
  }

  async #check(domain: string, d: DomainChecks, cert: StoredCert, certId: string): Promise<void> {
    const { client, clock, metrics, intervalMs } = this.#deps;
    const result = await client.check({ certId, notBefore: cert.info.notBefore, notAfter: cert.info.notAfter }, d.stop.signal);
    metrics.ariCheck(result.outcome);
    d.nextCheckAt = nextAriCheck(clock.now(), result.retryAfterMs, { floorMs: Math.min(CHECK_FLOOR_MS, intervalMs), capMs: intervalMs });
    const next = iso(d.nextCheckAt);
    if (result.outcome !== 'ok') {
      this.#log.warn({ domain, code: result.code, err: result.message, nextCheck: next }, 'ARI check failed; the expiry rule decides this renewal');
      return;
    }
    const before = d.state;
    d.state = withAnswer(d.state, result.info, this.#random);
    const answer = d.state.answer;
    if (d.state === before || !answer) return; // for a certificate no longer held
    const windowChanged = before.answer?.window.start !== answer.window.start || before.answer?.window.end !== answer.window.end;
    const description = describeAriAnswer(answer);
    if (windowChanged) this.#log.info({ domain, certId, nextCheck: next }, description);
    else this.#log.debug({ domain, certId, nextCheck: next }, description);
    metrics.ariWindow(domain, answer.window);
    this.#deps.describe(domain, description);
    // The same window again keeps the time chosen in it (withAnswer): the loop's plan stands.
    if (windowChanged) this.#deps.wake(domain);
  }

  /** Waits `ms` (undefined: until woken), or until a certificate or role change or stop. */
  async #pause(d: DomainChecks, ms: number | undefined): Promise<void> {
    if (d.wake.signal.aborted) {
      d.wake = new AbortController();
      return;
    }
    const signal = AbortSignal.any([d.stop.signal, d.wake.signal]);
    try {
      if (ms === undefined) await untilAborted(signal);
      else await this.#deps.clock.sleep(ms, signal);
    } catch {
      // woken or stopped: the loop looks again
    }
    if (d.wake.signal.aborted) d.wake = new AbortController();
  }
}

function untilAborted(signal: AbortSignal): Promise<void> {
  return new Promise((_resolve, reject) => {
    if (signal.aborted) reject(signal.reason);
    else signal.addEventListener('abort', () => reject(signal.reason), { once: true });
  });
}

/** ACME Renewal Information: the writer asks the CA at --acme-directory whether it wants a certificate replaced early. */
export async function ariChecker(
  settings: AriSettings & { acmeDirectory: string },
  deps: Pick<AriCheckerDeps, 'clock' | 'logger' | 'role' | 'metrics' | 'wake'> & { health: { renewalInfo(domain: string, line: string | undefined): void } },
): Promise<AriChecker> {
  // The client is a chunk of its own, loaded with this one only when ARI is on (docs/performance.md).
  const { RenewalInfoClient } = await import('./renewal-info-client.ts');
  const { clock, health, ...rest } = deps;
  return new AriChecker({
    ...rest,
    client: new RenewalInfoClient({ directoryUrl: settings.acmeDirectory, now: () => clock.now() }),
    clock,
    intervalMs: settings.ariIntervalMs,
    describe: (domain, line) => health.renewalInfo(domain, line),
    // The first check waits out the start: its ID parse and TLS connection would delay the first /healthz
    // answer (docs/performance.md). A revoked certificate held at start is replaced a second later.
    quietUntil: clock.now() + QUIET_START_MS,
  });
}
