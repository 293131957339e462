import { mkdir, readFile } from 'node:fs/promises';
import { connect } from 'node:net';
import { join } from 'node:path';
import { CertshareError, errorMessage } from '../core/errors.ts';
import type { Clock } from '../core/ports/clock.ts';
import type { CertPair } from '../core/ports/localapi.ts';
import type { Logger } from '../core/ports/logger.ts';
import type { LoopObserver } from '../core/ports/observer.ts';
import type { StoredCert } from '../core/ports/store.ts';
import { safeName } from '../store/cert-directory.ts';
import { writeFileAtomically } from '../store/atomic-file.ts';
import type { ReloadOutcome } from './reload-command.ts';
import { DeliveryRetry } from './retry.ts';

/** HAProxy's answers are a line or two; more than this is not HAProxy's runtime API. */
const MAX_ANSWER_BYTES = 64 * 1024;

/**
 * Characters a path may not hold on HAProxy's command line: white space separates arguments, `;` separates
 * commands, `\` escapes, `#` starts a comment, and a newline would end the command.
 */
const UNSAFE_PATH = /[\s;\\#'"]/;

function apiError(command: string, socket: string, failure: string, cause?: unknown): CertshareError {
  return new CertshareError('CERTSHARE_HAPROXY_API', { command, socket, failure }, cause === undefined ? undefined : { cause });
}

/** A path usable as a certificate name on HAProxy's command line; CERTSHARE_BAD_FLAG otherwise. */
export function checkHaproxyPath(path: string): string | undefined {
  if (!path.startsWith('/')) return `must be an absolute path (HAProxy names certificates by the path it loaded them from), got "${path}"`;
  if (UNSAFE_PATH.test(path)) return `must not contain white space, quotes, ";", "\\" or "#" (HAProxy's command line), got ${JSON.stringify(path)}`;
  return undefined;
}

/**
 * The file HAProxy's `crt` loads: the chain, then the key, with no blank line (a blank line ends a
 * runtime API payload) and no carriage return.
 * @forTests
 */
export function combinedPem(pair: CertPair): string {
  const lines = `${pair.certPem}\n${pair.keyPem}`.split('\n').map((l) => l.replace(/\r$/, ''));
  return `${lines.filter((l) => l.trim() !== '').join('\n')}\n`;
}

/**
 * HAProxy's runtime API on a unix socket (`stats socket PATH level admin`), one command per connection
 * (its non-interactive mode: it answers, then closes). Every exchange is bounded by a timeout and by the
 * caller's signal; an answer that does not read like HAProxy's is an error, never trusted.
 */
export class HaproxyRuntimeApi {
  readonly #socket: string;
  readonly #timeoutMs: number;

  constructor(socket: string, timeoutMs: number) {
    this.#socket = socket;
    this.#timeoutMs = timeoutMs;
  }

  /** Sends one command (with its payload, if any) and returns the whole answer. */
  exchange(command: string, signal?: AbortSignal): Promise<string> {
    return new Promise((resolve, reject) => {
      const timeout = AbortSignal.timeout(this.#timeoutMs);
      const abort = signal ? AbortSignal.any([signal, timeout]) : timeout;
      const chunks: Buffer[] = [];
      let size = 0;
      let settled = false;
      const what = command.split('\n')[0]!.replace(/ <<$/, '');
      const finish = (err?: Error): void => {
        if (settled) return;
        settled = true;
        abort.removeEventListener('abort', onAbort);
        socket.destroy();
        if (err) reject(err);
        else resolve(Buffer.concat(chunks).toString('utf8'));
      };
      const onAbort = (): void => finish(apiError(what, this.#socket, timeout.aborted ? `no whole answer within ${this.#timeoutMs} ms` : 'cancelled'));
      const socket = connect(this.#socket);
      if (abort.aborted) return onAbort();
      abort.addEventListener('abort', onAbort);
      socket.on('connect', () => socket.write(command));
      socket.on('data', (chunk: Buffer) => {
        size += chunk.length;
        if (size > MAX_ANSWER_BYTES) return finish(apiError(what, this.#socket, `an answer over ${MAX_ANSWER_BYTES} bytes is not HAProxy's`));
        chunks.push(chunk);
      });
      socket.on('end', () => finish());
      socket.on('error', (err: NodeJS.ErrnoException) => finish(apiError(what, this.#socket, err.code ?? err.message, err)));
    });
  }

  /**
   * Replaces the certificate HAProxy loaded from `name` with `pem` (chain and key): `set ssl cert` opens a
   * transaction, `commit ssl cert` swaps it in for the next handshakes. On a failed commit the transaction
   * is aborted, so the next delivery starts clean.
   *
   * HAProxy holds one certificate transaction at a time. With one left open on another certificate (a `set ssl
   * cert` never committed: someone's, or a push cut short), HAProxy 2.6 puts `pem` into that transaction and
   * answers "Transaction updated for certificate <the other>": its commit would serve this key under the other's
   * name. That transaction is aborted (what it held is lost already) and the push fails; the retry finds none open.
   */
  async replaceCertificate(name: string, pem: string, signal?: AbortSignal): Promise<void> {
    const set = await this.exchange(`set ssl cert ${name} <<\n${pem}\n`, signal);
    const opened = /^Transaction (?:created|updated) for certificate (.*)!$/m.exec(set);
    if (!opened) throw apiError(`set ssl cert ${name}`, this.#socket, describeAnswer(set));
    if (opened[1] !== name) throw apiError(`set ssl cert ${name}`, this.#socket, await this.#abortOther(opened[1]!, signal));
    let commit: string;
    try {
      commit = await this.exchange(`commit ssl cert ${name}\n`, signal);
    } catch (err) {
      await this.exchange(`abort ssl cert ${name}\n`, signal).catch(() => {});
      throw err;
    }
    if (!/^Success!$/m.test(commit)) {
      await this.exchange(`abort ssl cert ${name}\n`, signal).catch(() => {});
      throw apiError(`commit ssl cert ${name}`, this.#socket, describeAnswer(commit));
    }
  }

  /** Aborts the transaction left open on `other` that HAProxy took a push into (a name only as HAProxy's command line takes one). */
  async #abortOther(other: string, signal: AbortSignal | undefined): Promise<string> {
    const safe = checkHaproxyPath(other) === undefined;
    const answer = safe ? await this.exchange(`abort ssl cert ${other}\n`, signal).catch(() => '') : '';
    const outcome = /^Transaction aborted/m.test(answer) ? 'aborted' : 'could not abort it';
    return `a transaction left open on ${JSON.stringify(other.slice(0, 200))} (a set ssl cert never committed) took this certificate; ${outcome}`;
  }
}

/** An answer for a log line: its first lines, printable only, bounded. */
function describeAnswer(answer: string): string {
  const text = answer
    .trim()
    .replace(/[^\x20-\x7e\n]/g, '?')
    .split('\n')
    .slice(0, 3)
    .join(' / ');
  return text === '' ? 'an empty answer (not HAProxy, or a socket below admin level)' : JSON.stringify(text.slice(0, 200));
}

function isMissing(err: unknown): boolean {
  return (err as NodeJS.ErrnoException)?.code === 'ENOENT';
}

/**
 * Delivers each domain's certificate to HAProxy: `<crtDir>/<domain>.pem` (chain and key in one file,
 * 0600, replaced atomically), the file HAProxy's `crt` loads at start; and, with a runtime API socket,
 * the same PEM pushed into the running HAProxy after every change, without a reload. A failed push is
 * logged and counted, and tried again (from 1 s, doubling to a minute) until it lands or a newer certificate
 * replaces it: HAProxy would otherwise serve the replaced leaf (a revoked one) until the next renewal. A HAProxy
 * that restarts reads the file.
 */
export class HaproxyDelivery implements LoopObserver {
  readonly #crtDir: string;
  readonly #api: HaproxyRuntimeApi | undefined;
  readonly #logger: Logger;
  readonly #onOutcome: (outcome: ReloadOutcome) => void;
  readonly #onWritten: (domain: string, path: string) => void;
  readonly #queues = new Map<string, Promise<void>>();
  /** The PEM last written per domain (or found there at the first look). */
  readonly #written = new Map<string, string>();
  readonly #stop = new AbortController();
  readonly #retry: DeliveryRetry<string>;
  /** HAProxy holds one certificate transaction at a time: pushes of different domains go one after another. */
  #pushes: Promise<unknown> = Promise.resolve();

  constructor(options: {
    crtDir: string;
    api?: HaproxyRuntimeApi;
    logger: Logger;
    clock: Clock;
    onOutcome: (o: ReloadOutcome) => void;
    /** A file changed on disk (as the dir store's and --out-dir's: a --reload-command runs after it too). */
    onWritten: (domain: string, path: string) => void;
  }) {
    this.#crtDir = options.crtDir;
    this.#api = options.api;
    this.#logger = options.logger;
    this.#retry = new DeliveryRetry(options.clock, this.#stop.signal);
    this.#onOutcome = options.onOutcome;
    this.#onWritten = options.onWritten;
  }

  /** The name HAProxy knows the domain's certificate by: the file it loaded (HAProxy and certshare mount the directory at the same path). */
  pathOf(domain: string): string {
    return join(this.#crtDir, `${safeName(domain)}.pem`);
  }

  certificate(domain: string, cert: StoredCert | undefined): void {
    // An expired certificate stays in the file and in HAProxy: removing it would fail every handshake.
    if (!cert || this.#stop.signal.aborted) return;
    const previous = this.#queues.get(domain) ?? Promise.resolve();
    const next = previous.then(() => this.#deliver(domain, cert.pair));
    this.#queues.set(domain, next);
  }

  /** Resolves when every queued delivery has finished. */
  async idle(): Promise<void> {
    await Promise.all(this.#queues.values());
  }

  /** Cancels exchanges under way and takes no more certificates. */
  async stop(): Promise<void> {
    this.#stop.abort();
    await this.idle();
  }

  async #deliver(domain: string, pair: CertPair): Promise<void> {
    const pem = combinedPem(pair);
    let path: string;
    let existed: boolean;
    try {
      path = this.pathOf(domain);
      if (this.#written.get(domain) === pem) return;
      const onDisk = this.#written.get(domain) ?? (await readFile(path, 'utf8').catch((err: unknown) => (isMissing(err) ? undefined : '')));
      existed = onDisk !== undefined;
      if (onDisk === pem) {
        // Already there (a restart of certshare): HAProxy loaded it or was given it.
        this.#written.set(domain, pem);
        return;
      }
      // The files are 0600; the directory only lists them (HAProxy reads it at start).
      if (!existed) await mkdir(this.#crtDir, { recursive: true, mode: 0o755 });
      await writeFileAtomically(this.#crtDir, `${safeName(domain)}.pem`, pem, 0o600);
      this.#written.set(domain, pem);
      this.#onWritten(domain, path);
    } catch (err) {
      this.#logger.error({ code: 'CERTSHARE_STORE_UNAVAILABLE', domain, err: errorMessage(err) }, 'could not write the HAProxy certificate file');
      return;
    }
    if (!this.#api) return;
    if (!existed) {
      // HAProxy knows a certificate by the file it loaded at start: a new file is read at its next start or reload.
      this.#logger.info({ domain, path }, 'new HAProxy certificate file: HAProxy loads it at its next start or reload');
      return;
    }
    await this.#push(domain, path, pem, this.#api);
  }

  /** Pushes `pem` into the running HAProxy; a failure is retried later unless a newer certificate comes first. */
  async #push(domain: string, path: string, pem: string, api: HaproxyRuntimeApi): Promise<void> {
    const started = Date.now();
    try {
      const push = this.#pushes.then(() => api.replaceCertificate(path, pem, this.#stop.signal));
      this.#pushes = push.catch(() => {});
      await push;
      this.#retry.landed(domain);
      this.#logger.info({ domain, path }, 'HAProxy serves the new certificate (runtime API)');
      this.#onOutcome({ method: 'haproxy', domains: [domain], ok: true, exitCode: null, durationMs: Date.now() - started });
    } catch (err) {
      const code = err instanceof CertshareError ? err.code : 'CERTSHARE_HAPROXY_API';
      const retryInMs = this.#retry.failed(domain, () => this.#again(domain, path, pem, api));
      this.#logger.error({ code, domain, path, err: errorMessage(err), retryInMs }, 'could not push the certificate to HAProxy; trying again');
      this.#onOutcome({ method: 'haproxy', domains: [domain], ok: false, exitCode: null, durationMs: Date.now() - started });
    }
  }

  /** A failed push again, in the domain's queue, unless a newer certificate was written since (it pushes itself). */
  #again(domain: string, path: string, pem: string, api: HaproxyRuntimeApi): void {
    const previous = this.#queues.get(domain) ?? Promise.resolve();
    this.#queues.set(
      domain,
      previous.then(() => (this.#written.get(domain) === pem && !this.#stop.signal.aborted ? this.#push(domain, path, pem, api) : undefined)),
    );
  }
}
