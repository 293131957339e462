import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { CertshareError } from '../core/errors.ts';
import { type Clock, systemClock } from '../core/ports/clock.ts';
import type { Logger } from '../core/ports/logger.ts';
import { DeliveryRetry } from './retry.ts';

/**
 * What `--reload-command` asks for: an argv (the JSON array form, `["nginx","-s","reload"]`), run without
 * a shell in every image, or a plain string, run through `/bin/sh -c` where there is a shell and split on
 * white space where there is none (distroless).
 */
export type ReloadSpec = { argv: string[] } | { shell: string };

/** Parses the flag's text; a value starting with `[` must be a JSON array of non-empty strings. */
export function parseReloadCommand(text: string): ReloadSpec {
  if (!text.trim().startsWith('[')) {
    if (text.trim() === '') throw new CertshareError('CERTSHARE_BAD_FLAG', { flag: '--reload-command', rule: 'is empty' });
    return { shell: text };
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (err) {
    throw new CertshareError('CERTSHARE_BAD_FLAG', {
      flag: '--reload-command',
      rule: `a value starting with "[" must be a JSON array of strings (e.g. ["nginx","-s","reload"]): ${(err as Error).message}`,
    });
  }
  if (!Array.isArray(parsed) || parsed.length === 0 || !parsed.every((a) => typeof a === 'string') || parsed[0] === '') {
    throw new CertshareError('CERTSHARE_BAD_FLAG', {
      flag: '--reload-command',
      rule: 'the JSON form must be a non-empty array of strings, the program first (e.g. ["nginx","-s","reload"])',
    });
  }
  return { argv: parsed as string[] };
}

/** The argv to spawn for `spec` (see ReloadSpec). @forTests */
export function commandLine(spec: ReloadSpec, shellAvailable = existsSync('/bin/sh')): string[] {
  if ('argv' in spec) return spec.argv;
  return shellAvailable ? ['/bin/sh', '-c', spec.shell] : spec.shell.trim().split(/\s+/);
}

function describe(spec: ReloadSpec): string | string[] {
  return 'argv' in spec ? spec.argv : spec.shell;
}

/** How a reload reached the proxy: the command, a signal to its pid (reload-signal.ts), HAProxy's runtime API (haproxy.ts). @forTests */
export type ReloadMethod = 'command' | 'signal' | 'haproxy';

export interface ReloadOutcome {
  method: ReloadMethod;
  /** The domains whose change this reload delivers. */
  domains: string[];
  ok: boolean;
  /** Nothing to reload yet (the proxy has not started: it reads the files when it does). */
  skipped?: boolean;
  exitCode: number | null;
  durationMs: number;
}

/** What every reload takes: `onStart`, a run begins (what the proxy serves until its outcome is in between). */
export interface ReloadOptions {
  onOutcome: (outcome: ReloadOutcome) => void;
  onStart?: () => void;
  /** The retry's waits (the system clock unless given). */
  clock?: Clock;
}

/**
 * A reload of the proxy after certificate files changed. Runs are serialised and coalesced: changes that
 * arrive while a reload runs lead to exactly one more run. A failure is logged and reported, never fatal, and
 * tried again (retry.ts) until a reload lands: the proxy would otherwise serve the files before (a leaf the CA
 * revoked) until the next renewal. A newer reload, asked for meanwhile, takes the retry's place: it reads the
 * latest files, and its failure is retried in turn, for the domains of both.
 */
export abstract class CoalescedReload {
  readonly #onOutcome: (outcome: ReloadOutcome) => void;
  readonly #onStart: (() => void) | undefined;
  readonly #stop = new AbortController();
  readonly #retry: DeliveryRetry<'reload'>;
  #running: Promise<void> | undefined;
  #pending = new Set<string>();
  /** The domains of failed runs since the last that landed: a retry delivers them all. */
  readonly #undelivered = new Set<string>();
  /** Runs begun: a retry gives way to a run begun after the failed one. */
  #runs = 0;

  constructor(options: ReloadOptions) {
    this.#onOutcome = options.onOutcome;
    this.#onStart = options.onStart;
    this.#retry = new DeliveryRetry(options.clock ?? systemClock, this.#stop.signal);
  }

  /** Asks for a run; resolves when a run that started after this call has finished. */
  request(domain: string): Promise<void> {
    return this.#ask([domain]);
  }

  #ask(domains: Iterable<string>): Promise<void> {
    if (this.#stop.signal.aborted) return Promise.resolve();
    for (const domain of domains) this.#pending.add(domain);
    this.#running ??= this.#drain().finally(() => (this.#running = undefined));
    return this.#running;
  }

  /** Resolves once no reload is running or queued. */
  async idle(): Promise<void> {
    while (this.#running) await this.#running;
  }

  /** No more runs nor retries; resolves when the run under way has ended (for shutdown). */
  async stop(): Promise<void> {
    this.#stop.abort();
    await this.idle();
  }

  async #drain(): Promise<void> {
    while (this.#pending.size > 0 && !this.#stop.signal.aborted) {
      const domains = [...this.#pending];
      this.#pending.clear();
      const run = ++this.#runs;
      this.#onStart?.();
      const outcome = await this.runOnce(domains);
      if (outcome.ok) {
        this.#undelivered.clear();
        this.#retry.landed('reload');
      } else {
        for (const domain of domains) this.#undelivered.add(domain);
        this.#retry.failed('reload', () => {
          if (this.#runs === run) void this.#ask(this.#undelivered);
        });
      }
      this.#onOutcome(outcome);
    }
  }

  /** One reload for the domains whose files changed; never rejects (a failure is an outcome). */
  protected abstract runOnce(domains: string[]): Promise<ReloadOutcome>;
}

/** Runs the operator's reload command (e.g. `nginx -s reload`) after certificate files changed. */
export class ReloadCommand extends CoalescedReload {
  readonly #spec: ReloadSpec;
  readonly #timeoutMs: number;
  readonly #logger: Logger;

  constructor(spec: ReloadSpec, options: ReloadOptions & { timeoutMs: number; logger: Logger }) {
    super(options);
    this.#spec = spec;
    this.#timeoutMs = options.timeoutMs;
    this.#logger = options.logger;
  }

  protected runOnce(domains: string[]): Promise<ReloadOutcome> {
    const started = Date.now();
    const command = describe(this.#spec);
    return new Promise((resolve) => {
      const [file, ...args] = commandLine(this.#spec);
      // Its own process group, so that a timeout kills what the command started too (a shell's children,
      // a daemonising helper), not only the shell.
      const child = spawn(file!, args, {
        stdio: ['ignore', 'inherit', 'inherit'],
        env: { ...process.env, CERTSHARE_DOMAINS: domains.join(',') },
        detached: true,
      });
      let timedOut = false;
      const timer = setTimeout(() => {
        timedOut = true;
        try {
          if (child.pid !== undefined) process.kill(-child.pid, 'SIGKILL');
        } catch {
          child.kill('SIGKILL'); // the group is gone already: at most the leader is left
        }
      }, this.#timeoutMs);
      let finished = false;
      const finish = (exitCode: number | null, error?: string): void => {
        if (finished) return;
        finished = true;
        clearTimeout(timer);
        const outcome = { method: 'command' as const, domains, ok: exitCode === 0, exitCode, durationMs: Date.now() - started };
        if (outcome.ok) this.#logger.info({ command, domains, durationMs: outcome.durationMs }, 'reload command succeeded');
        else this.#logger.error({ code: 'CERTSHARE_RELOAD_FAILED', command, exitCode, error }, 'reload command failed; trying again');
        resolve(outcome);
      };
      child.once('error', (err) => finish(null, err.message));
      child.once('exit', (code, signal) =>
        finish(code, timedOut ? `timed out after ${this.#timeoutMs} ms; process group killed` : signal ? `killed by ${signal}` : undefined),
      );
    });
  }
}
