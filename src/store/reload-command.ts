import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import type { Logger } from '../core/logger.ts';

/**
 * `/bin/sh -c CMD` where there is a shell; in a shell-less image (distroless) the command is split on
 * white space and run directly, so `kill -HUP 1`-style commands still work there without quoting.
 */
export function commandLine(command: string, shellAvailable = existsSync('/bin/sh')): string[] {
  return shellAvailable ? ['/bin/sh', '-c', command] : command.trim().split(/\s+/);
}

export interface ReloadOutcome {
  ok: boolean;
  exitCode: number | null;
  durationMs: number;
}

/**
 * Runs the operator's reload command (e.g. `nginx -s reload`) after certificate files changed. Runs are
 * serialised and coalesced: changes that arrive while a reload runs lead to exactly one more run.
 * A failure is logged and reported, never fatal.
 */
export class ReloadCommand {
  readonly #command: string;
  readonly #timeoutMs: number;
  readonly #logger: Logger;
  readonly #onOutcome: (outcome: ReloadOutcome) => void;
  #running: Promise<void> | undefined;
  #pending = new Set<string>();

  constructor(command: string, options: { timeoutMs: number; logger: Logger; onOutcome: (o: ReloadOutcome) => void }) {
    this.#command = command;
    this.#timeoutMs = options.timeoutMs;
    this.#logger = options.logger;
    this.#onOutcome = options.onOutcome;
  }

  /** Asks for a run; resolves when a run that started after this call has finished. */
  request(domain: string): Promise<void> {
    this.#pending.add(domain);
    this.#running ??= this.#drain().finally(() => (this.#running = undefined));
    return this.#running;
  }

  /** Resolves once no reload is running or queued (for shutdown). */
  async idle(): Promise<void> {
    while (this.#running) await this.#running;
  }

  async #drain(): Promise<void> {
    while (this.#pending.size > 0) {
      const domains = [...this.#pending];
      this.#pending.clear();
      this.#onOutcome(await this.#runOnce(domains));
    }
  }

  #runOnce(domains: string[]): Promise<ReloadOutcome> {
    const started = Date.now();
    return new Promise((resolve) => {
      const [file, ...args] = commandLine(this.#command);
      const child = spawn(file!, args, {
        stdio: ['ignore', 'inherit', 'inherit'],
        env: { ...process.env, CERTSHARE_DOMAINS: domains.join(',') },
        timeout: this.#timeoutMs,
        killSignal: 'SIGKILL',
      });
      const finish = (exitCode: number | null, error?: string): void => {
        const outcome = { ok: exitCode === 0, exitCode, durationMs: Date.now() - started };
        if (outcome.ok) this.#logger.info({ command: this.#command, domains, durationMs: outcome.durationMs }, 'reload command succeeded');
        else this.#logger.error({ code: 'CERTSHARE_RELOAD_FAILED', command: this.#command, exitCode, error }, 'reload command failed');
        resolve(outcome);
      };
      child.once('error', (err) => finish(null, err.message));
      child.once('exit', (code, signal) => finish(code, signal ? `killed by ${signal}` : undefined));
    });
  }
}
