import { constants } from 'node:fs';
import { lstat, open } from 'node:fs/promises';
import { CertshareError, errorMessage } from '../core/errors.ts';
import type { Logger } from '../core/ports/logger.ts';
import { CoalescedReload, type ReloadOutcome } from './reload-command.ts';

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

  constructor(
    signal: NodeJS.Signals,
    pidFile: string,
    options: { logger: Logger; onOutcome: (o: ReloadOutcome) => void; kill?: (pid: number, signal: NodeJS.Signals) => void },
  ) {
    super(options.onOutcome);
    this.#signal = signal;
    this.#pidFile = pidFile;
    this.#logger = options.logger;
    this.#kill = options.kill ?? ((pid, sig) => process.kill(pid, sig));
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
      this.#send(pid);
      this.#logger.info({ signal: this.#signal, pid, pidFile: this.#pidFile, domains }, 'reload signal sent');
      return outcome(true);
    } catch (err) {
      const code = err instanceof CertshareError ? err.code : 'CERTSHARE_RELOAD_FAILED';
      this.#logger.error({ code, signal: this.#signal, pid, pidFile: this.#pidFile, domains, err: errorMessage(err) }, 'reload signal failed');
      return outcome(false);
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
