import { constants } from 'node:fs';
import { lstat, open, readFile } from 'node:fs/promises';
import { CertshareError, errorMessage } from '../core/errors.ts';
import { type Clock, systemClock } from '../core/ports/clock.ts';
import type { Logger } from '../core/ports/logger.ts';
import { CoalescedReload, type ReloadOptions, type ReloadOutcome } from './reload-command.ts';

/**
 * The signals --reload-signal may send: those a proxy takes as "reload" or "reopen" (nginx: HUP reloads its
 * configuration and certificates, USR1 reopens logs, USR2 upgrades the binary). Never one that stops a process.
 */
const RELOAD_SIGNALS: ReadonlySet<string> = new Set(['HUP', 'USR1', 'USR2']);

/** Linux's largest pid_max (2^22): a larger number is no pid. */
const MAX_PID = 4_194_304;

/** A pid file is a number and a newline; anything longer is not one (and is not read further). */
const MAX_PID_FILE_BYTES = 64;

/** `HUP` or `SIGHUP` (any case) to the signal's name; CERTSHARE_BAD_FLAG for anything outside the allow list. */
export function parseReloadSignal(text: string): NodeJS.Signals {
  const name = text.trim().toUpperCase().replace(/^SIG/, '');
  if (!RELOAD_SIGNALS.has(name)) {
    throw new CertshareError('CERTSHARE_BAD_FLAG', {
      flag: '--reload-signal',
      rule: `must be one of ${[...RELOAD_SIGNALS].join(', ')} (a signal that stops a process is refused), got "${text}"`,
    });
  }
  return `SIG${name}` as NodeJS.Signals;
}

async function exists(path: string): Promise<boolean> {
  return lstat(path).then(
    () => true,
    (err: NodeJS.ErrnoException) => err.code !== 'ENOENT',
  );
}

function failed(pidFile: string, failure: string, cause?: unknown): CertshareError {
  return new CertshareError('CERTSHARE_RELOAD_FAILED', { pidFile, failure }, cause === undefined ? undefined : { cause });
}

/**
 * The pid a pid file names: one positive integer (surrounding white space allowed), neither 1 (the Pod's
 * init, or the sandbox's pause: a HUP there means nothing good) nor this process. The file is opened
 * without blocking (a FIFO planted at the path cannot hang the daemon) and must be a regular file.
 * @forTests
 */
export async function readPidFile(path: string, ownPid = process.pid): Promise<number> {
  let text: string;
  try {
    const handle = await open(path, constants.O_RDONLY | constants.O_NONBLOCK);
    try {
      if (!(await handle.stat()).isFile()) throw failed(path, 'not a regular file');
      const buffer = Buffer.alloc(MAX_PID_FILE_BYTES + 1);
      const { bytesRead } = await handle.read(buffer, 0, buffer.length, 0);
      if (bytesRead > MAX_PID_FILE_BYTES) throw failed(path, `holds more than a pid (over ${MAX_PID_FILE_BYTES} bytes)`);
      text = buffer.subarray(0, bytesRead).toString('latin1');
    } finally {
      await handle.close();
    }
  } catch (err) {
    if (err instanceof CertshareError) throw err;
    throw failed(path, `cannot read it: ${errorMessage(err)}`, err);
  }
  const match = /^\s*(\d{1,7})\s*$/.exec(text);
  const pid = match ? Number(match[1]) : Number.NaN;
  if (!(pid >= 1 && pid <= MAX_PID)) throw failed(path, `does not hold one positive integer (a pid): ${JSON.stringify(text.slice(0, 20))}`);
  if (pid === 1) throw failed(path, "names pid 1 (the Pod's init process); refusing to signal it");
  if (pid === ownPid) throw failed(path, `names certshare's own pid ${pid}; refusing to signal it`);
  return pid;
}

/**
 * The worker processes of a master that accept connections: its children whose title says `worker process`, not
 * `worker process is shutting down` (the title nginx's old workers take once told to quit, as they close their
 * listening sockets). Undefined: the master's children are not readable here (no shared process namespace, or a
 * kernel without /proc/<pid>/task/<pid>/children).
 */
async function acceptingWorkers(master: number): Promise<number[] | undefined> {
  let children: number[];
  try {
    children = (await readFile(`/proc/${master}/task/${master}/children`, 'latin1')).split(' ').filter(Boolean).map(Number);
  } catch {
    return undefined;
  }
  const titles = await Promise.all(children.map((pid) => readFile(`/proc/${pid}/cmdline`, 'latin1').catch(() => '')));
  return children.filter((_, i) => {
    const title = titles[i]!.replaceAll('\0', ' ');
    return title.includes('worker process') && !title.includes('shutting down');
  });
}

/** How often the master's old workers are looked at after a reload signal, until none accepts. */
const SETTLE_POLL_MS = 10;
/**
 * The wait after a signal when the master's workers cannot be seen: nginx's master lets its old workers accept for
 * a fixed pause after the new ones start, then tells them to quit (docs/proxies.md has the measured window).
 */
const SETTLE_UNSEEN_MS = 300;

/**
 * Reloads a proxy that reads its certificate files at start and at reload (nginx with a plain
 * `ssl_certificate` path) by a signal to the process its pid file names, read afresh on every reload (the
 * proxy may have restarted). In a Pod this needs a shared process namespace and the same uid as the proxy's
 * master: without CAP_KILL, a process may signal only its own uid's processes (docs/proxies.md).
 */
export class SignalReload extends CoalescedReload {
  readonly #signal: NodeJS.Signals;
  readonly #pidFile: string;
  readonly #logger: Logger;
  readonly #kill: (pid: number, signal: NodeJS.Signals) => void;
  readonly #workers: (master: number) => Promise<number[] | undefined>;
  readonly #clock: Clock;
  readonly #settleTimeoutMs: number;

  /**
   * `settleTimeoutMs`: how long the master's workers from before the signal may still accept (the reload did not
   * take past it). `workers`: acceptingWorkers unless given (tests).
   */
  constructor(
    signal: NodeJS.Signals,
    pidFile: string,
    options: ReloadOptions & {
      logger: Logger;
      kill?: (pid: number, signal: NodeJS.Signals) => void;
      workers?: (master: number) => Promise<number[] | undefined>;
      settleTimeoutMs?: number;
    },
  ) {
    super(options);
    this.#signal = signal;
    this.#pidFile = pidFile;
    this.#logger = options.logger;
    this.#kill = options.kill ?? ((pid, sig) => process.kill(pid, sig));
    this.#workers = options.workers ?? acceptingWorkers;
    this.#clock = options.clock ?? systemClock;
    this.#settleTimeoutMs = options.settleTimeoutMs ?? 30_000;
  }

  protected async runOnce(domains: string[]): Promise<ReloadOutcome> {
    const started = Date.now();
    const outcome = (ok: boolean): ReloadOutcome => ({ method: 'signal', domains, ok, exitCode: null, durationMs: Date.now() - started });
    let pid: number | undefined;
    try {
      if (!(await exists(this.#pidFile))) {
        this.#logger.info({ pidFile: this.#pidFile, domains }, 'no pid file: the proxy has not started yet and reads the files when it does');
        return { ...outcome(true), skipped: true };
      }
      pid = await readPidFile(this.#pidFile);
      const before = await this.#workers(pid);
      this.#send(pid);
      this.#logger.info({ signal: this.#signal, pid, pidFile: this.#pidFile, domains }, 'reload signal sent');
      await this.#settled(pid, before);
      return outcome(true);
    } catch (err) {
      const code = err instanceof CertshareError ? err.code : 'CERTSHARE_RELOAD_FAILED';
      this.#logger.error({ code, signal: this.#signal, pid, pidFile: this.#pidFile, domains, err: errorMessage(err) }, 'reload signal failed; trying again');
      return outcome(false);
    }
  }

  /**
   * Returns once none of the master's workers from before the signal accepts any more: until then they serve the
   * replaced certificate to some new connections, beside the new workers (nginx lets both accept for a moment), so
   * the reload has not delivered yet. Throws CERTSHARE_RELOAD_FAILED when one still accepts after settleTimeoutMs.
   */
  async #settled(pid: number, before: number[] | undefined): Promise<void> {
    const clock = this.#clock;
    if (before === undefined) {
      this.#logger.debug({ pid }, "the proxy master's workers cannot be seen: waiting the reload's usual pause");
      await clock.sleep(SETTLE_UNSEEN_MS);
      return;
    }
    const deadline = clock.now() + this.#settleTimeoutMs;
    for (;;) {
      const now = await this.#workers(pid);
      const old = now === undefined ? [] : before.filter((w) => now.includes(w));
      if (old.length === 0) return;
      if (clock.now() >= deadline) {
        throw failed(
          this.#pidFile,
          `pid ${pid}'s workers from before ${this.#signal} (${old.join(', ')}) still accept connections ${this.#settleTimeoutMs} ms after it: ` +
            'the proxy did not take the reload (its error log says why) and still serves the replaced certificate',
        );
      }
      await clock.sleep(SETTLE_POLL_MS);
    }
  }

  #send(pid: number): void {
    try {
      this.#kill(pid, this.#signal);
    } catch (err) {
      const errno = (err as NodeJS.ErrnoException).code;
      if (errno === 'ESRCH') throw failed(this.#pidFile, `pid ${pid} is not running (a stale pid file, or no shared process namespace)`, err);
      if (errno === 'EPERM') {
        const uid = process.getuid?.();
        throw failed(
          this.#pidFile,
          `not permitted to send ${this.#signal} to pid ${pid}: without CAP_KILL a process signals only its own uid's ` +
            `processes; run the proxy's master as uid ${uid ?? 'of certshare'} (docs/proxies.md)`,
          err,
        );
      }
      throw failed(this.#pidFile, `sending ${this.#signal} to pid ${pid}: ${errorMessage(err)}`, err);
    }
  }
}
