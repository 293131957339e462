// certshare as a process of its own (`certshare run` from the sources), as a container runs it: with an
// environment of its own, which is how NODE_EXTRA_CA_CERTS (read once, at start) reaches it. Its JSON
// log lines are parsed and kept; each one is an event tests wait on (wait.ts until), with its metrics.
import { resolve } from 'node:path';
import { ManagedProcess } from './control-plane.ts';
import { onEvent, until } from '../support/wait.ts';

// The sources, not bin/certshare.js: that prefers dist/ when a build exists, which may be stale.
const MAIN = resolve(import.meta.dirname, '../../src/cli/main.ts');

/** One JSON log line (pino's fields, level as its label). */
export interface LogLine {
  level: string;
  time: string;
  msg: string;
  [field: string]: unknown;
}

export class CertshareProcess {
  readonly proc: ManagedProcess;
  /** Every log line so far, in order. */
  readonly logs: LogLine[] = [];
  /** Output lines that were not JSON (a crash's stack trace): kept for the failure message. */
  readonly other: string[] = [];
  #address: string | undefined;

  /**
   * Starts `certshare run ARGS` with exactly `env` (plus PATH) as its environment, JSON logs on stdout;
   * resolves once it logged "certshare started" (listening).
   */
  static async start(name: string, args: string[], env: Record<string, string>, timeoutMs = 30_000): Promise<CertshareProcess> {
    const p = new CertshareProcess(name, args, env);
    const started = await p.logged('"certshare started"', (l) => l.msg === 'certshare started', timeoutMs);
    p.#address = String(started.address);
    return p;
  }

  private constructor(name: string, args: string[], env: Record<string, string>) {
    const verbose = process.env.CERTSHARE_TS_VERBOSE === '1';
    this.proc = new ManagedProcess(name, process.execPath, [MAIN, 'run', '--log-format', 'json', ...args], verbose, {
      PATH: process.env.PATH ?? '/usr/bin:/bin',
      ...env,
    });
    this.proc.events.on('line', (line: string) => {
      try {
        this.logs.push(JSON.parse(line) as LogLine);
      } catch {
        this.other.push(line);
      }
    });
  }

  /** Its /healthz and /metrics base URL. */
  get address(): string {
    if (!this.#address) throw new Error('certshare has not started');
    return this.#address;
  }

  /**
   * The first log line from line `from` on (default the very first, so none is missed) that satisfies
   * `predicate`; fails when the process exits first or after `timeoutMs`.
   */
  async logged(what: string, predicate: (line: LogLine) => boolean, timeoutMs = 30_000, from = 0): Promise<LogLine> {
    let found: LogLine | undefined;
    await until(
      `certshare ${this.proc.name} to log ${what}`,
      () => {
        found = this.logs.slice(from).find(predicate);
        if (!found && this.proc.exitInfo) {
          throw new Error(`certshare ${this.proc.name} exited (${JSON.stringify(this.proc.exitInfo)}) before logging ${what}:\n${this.tail()}`);
        }
        return found !== undefined;
      },
      [onEvent(this.proc.events, 'line'), onEvent(this.proc.events, 'exit')],
      timeoutMs,
    ).catch((err: Error) => {
      throw new Error(`${err.message}\nlast output:\n${this.tail()}`);
    });
    return found!;
  }

  /**
   * One scrape of /metrics: a function giving the sum of the samples of metric `name` whose labels include
   * every one of `labels` (so that figures compared with each other are read at one moment).
   */
  async metrics(): Promise<(name: string, labels?: Record<string, string>) => number> {
    const text = await (await fetch(`${this.address}/metrics`, { signal: AbortSignal.timeout(10_000) })).text();
    return (name, labels = {}) => {
      let sum = 0;
      for (const m of text.matchAll(new RegExp(`^${name}(?:\\{([^}]*)\\})? (\\S+)$`, 'gm'))) {
        const have = m[1] ?? '';
        if (Object.entries(labels).every(([k, v]) => have.includes(`${k}="${v}"`))) sum += Number(m[2]);
      }
      return sum;
    };
  }

  tail(n = 30): string {
    return [...this.other.slice(-5), ...this.logs.slice(-n).map((l) => JSON.stringify(l))].join('\n');
  }

  /** SIGTERM (SIGKILL after 10 s); resolves once it exited. */
  async stop(): Promise<void> {
    await this.proc.terminate(10_000);
  }
}
