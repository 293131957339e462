import { CertLoop, type CertLoopDeps } from './cert-loop.ts';
import { errorMessage } from '../errors.ts';
import { DEFAULT_ISSUANCE_CONCURRENCY, IssuanceSlots } from '../issuance/issuance-slots.ts';

interface RunningLoop {
  loop: CertLoop;
  abort: AbortController;
  done: Promise<void>;
}

/** Store checks a stopping writer makes at once (verifyStored). */
const VERIFY_CONCURRENCY = 16;

/**
 * Supervises one CertLoop per managed domain: starts and stops them as domains come and go (without a
 * restart), and stops their issuing first when the daemon stops.
 */
export class LoopSupervisor {
  readonly #deps: CertLoopDeps;
  readonly #loops = new Map<string, RunningLoop>();
  /** Loops being stopped: a domain re-added meanwhile waits for its old loop, so CertPair never runs twice. */
  readonly #stopping = new Map<string, Promise<void>>();
  /** False once the daemon stops: no loop starts a CertPair call any more (see stopIssuing). */
  #issuing = true;

  /** The backend's role as given (not narrowed by stopIssuing). */
  readonly #role: CertLoopDeps['role'];

  constructor(deps: CertLoopDeps) {
    const { role } = deps;
    this.#role = role;
    this.#deps = {
      ...deps,
      // One bound for all of the process's domains (a loop alone issues one domain at a time anyway).
      issuanceSlots: deps.issuanceSlots ?? new IssuanceSlots(DEFAULT_ISSUANCE_CONCURRENCY),
      role: {
        identity: role.identity,
        canIssue: (domain) => this.#issuing && role.canIssue(domain),
        canWrite: (domain) => (role.canWrite ? role.canWrite(domain) : role.canIssue(domain)),
        ...(role.onChange ? { onChange: (listener: () => void) => role.onChange!(listener) } : {}),
      },
    };
    // A domain left the issuance budget's queue: the ones behind it look again now, not at their old turn.
    deps.budget?.onQueueShift((domains) => {
      for (const domain of domains) this.#loops.get(domain)?.loop.wake();
    });
  }

  /**
   * The first step of a graceful stop: from now on no loop starts a CertPair call, and the promise settles
   * once the calls already under way have ended and their certificates are stored. A writer that hands its
   * role over first would leave a certificate tailscaled issued for nobody, and its successor would issue
   * the domain again (found by the chaos run: most CertPair calls of a stopping writer started after it
   * logged "stopping"). Loops keep running (readers' work, restores) until stop().
   */
  stopIssuing(): Promise<void> {
    this.#issuing = false;
    return Promise.all([...this.#loops.values()].map(({ loop }) => loop.issuing)).then(() => {});
  }

  /**
   * A stopping writer's last step before it hands the role over (after stopIssuing settled): every
   * certificate held is checked against the store itself, a few domains at a time (hundreds of domains:
   * not hundreds of reads at once), and what a hand edit took since our watch last delivered is put back
   * while we still hold the role. `signal` bounds it (the shutdown budget).
   */
  async verifyStored(signal: AbortSignal): Promise<void> {
    // Only the holder of the role hands anything over (a candidate that may restore but does not issue has
    // nothing of its own that the store lacks).
    const loops = [...this.#loops.values()].map(({ loop }) => loop).filter((loop) => this.#role.canIssue(loop.domain));
    const verifyNext = async (): Promise<void> => {
      for (let loop = loops.shift(); loop && !signal.aborted; loop = loops.shift()) await loop.verifyStored(signal);
    };
    await Promise.all(Array.from({ length: VERIFY_CONCURRENCY }, verifyNext));
  }

  get domains(): string[] {
    return [...this.#loops.keys()].sort();
  }

  loop(domain: string): CertLoop | undefined {
    return this.#loops.get(domain)?.loop;
  }

  setDomains(domains: Iterable<string>): void {
    const wanted = new Set(domains);
    for (const domain of [...this.#loops.keys()]) if (!wanted.has(domain)) void this.#stop(domain);
    for (const domain of wanted) if (!this.#loops.has(domain)) this.#start(domain);
  }

  wakeAll(): void {
    for (const { loop } of this.#loops.values()) loop.wake();
  }

  async stop(): Promise<void> {
    await Promise.all([...this.#loops.keys()].map((d) => this.#stop(d)));
    await Promise.all(this.#stopping.values());
  }

  #start(domain: string): void {
    const loop = new CertLoop(domain, this.#deps);
    const abort = new AbortController();
    const previous = this.#stopping.get(domain) ?? Promise.resolve();
    const done = previous.then(() => this.#runUntilAborted(loop, abort.signal));
    this.#loops.set(domain, { loop, abort, done });
    this.#deps.budget?.track(domain);
    this.#deps.logger.info({ domain }, 'managing domain');
  }

  /** A loop that throws (a bug, not a failure it handles) is restarted after the first-retry delay. */
  async #runUntilAborted(loop: CertLoop, signal: AbortSignal): Promise<void> {
    while (!signal.aborted) {
      try {
        await loop.run(signal);
      } catch (err) {
        this.#deps.logger.error({ domain: loop.domain, err: errorMessage(err) }, 'certificate loop crashed; restarting it');
        await this.#deps.clock.sleep(this.#deps.backoff.firstRetryMs, signal).catch(() => {});
      }
    }
  }

  async #stop(domain: string): Promise<void> {
    const running = this.#loops.get(domain);
    if (!running) return;
    this.#loops.delete(domain);
    this.#deps.budget?.untrack(domain);
    running.abort.abort(new Error(`domain ${domain} no longer managed`));
    const done = running.done.finally(() => {
      if (this.#stopping.get(domain) === done) this.#stopping.delete(domain);
    });
    this.#stopping.set(domain, done);
    this.#deps.logger.info({ domain }, 'stopped managing domain');
    await done;
  }
}
