// Child processes of the bench: every one is tracked and killed when the bench ends, however it ends
// (normal end, error, Ctrl-C, or the bench itself being killed: `setpriv --pdeathsig` where available).
import { spawn, type ChildProcess } from 'node:child_process';
import { readdir, readFile, readlink } from 'node:fs/promises';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import { deathSignalPrefix } from '../../test/support/processes.ts';

const live = new Set<ChildProcess>();
let hooked = false;
/** Set once the bench stops its processes (stopAll): their exits from then on are expected. */
let ending = false;
let onUnexpectedExit: ((err: UnexpectedExitError) => void) | undefined;

/** A process the bench needed exited on its own; the message holds its stderr. */
export class UnexpectedExitError extends Error {
  override name = 'UnexpectedExitError';
}

/**
 * Fail fast: from now on, a process started with `mustRun` that exits before the bench stopped it (a
 * daemon refusing its flags, a crash) calls `handler` at once with an error holding its stderr, instead
 * of letting the bench wait for it until some timeout. The bench's handler stops everything and exits.
 */
export function failOnUnexpectedExit(handler: (err: UnexpectedExitError) => void): void {
  onUnexpectedExit = handler;
}

function installHooks(): void {
  if (hooked) return;
  hooked = true;
  process.on('exit', () => {
    for (const child of live) {
      try {
        child.kill('SIGKILL');
      } catch {
        // gone already
      }
    }
  });
}

/** The environment of measured processes: no CERTSHARE_*, KUBECONFIG, POD_* or NODE_OPTIONS from the caller's shell. */
export function cleanEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (/^(CERTSHARE_|TS_|POD_|KUBERNETES_|NODE_)/.test(k) || k === 'KUBECONFIG') continue;
    env[k] = v;
  }
  return { ...env, ...extra };
}

export type LineListener = (line: string, at: number) => void;

/** A child process (always the real Node binary, `process.execPath`, unless `file` says otherwise). */
export class Proc {
  readonly name: string;
  readonly child: ChildProcess;
  /** performance.now() just before spawn(). */
  readonly spawnedAt: number;
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  exitInfo: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  readonly #tail: string[] = [];
  /** stderr alone: where a daemon that refuses to start says why (the tail mixes in its JSON log). */
  readonly #stderrTail: string[] = [];
  readonly #listeners = new Set<LineListener>();
  #stopping = false;

  /**
   * `mustRun`: the process runs until the bench stops it (a daemon, an emulator); exiting on its own ends
   * the bench at once (failOnUnexpectedExit).
   */
  constructor(name: string, args: string[], options: { env?: NodeJS.ProcessEnv; cwd?: string; file?: string; mustRun?: boolean } = {}) {
    installHooks();
    this.name = name;
    const [cmd, ...rest] = [...deathSignalPrefix(), options.file ?? process.execPath, ...args];
    this.spawnedAt = performance.now();
    this.child = spawn(cmd!, rest, { stdio: ['ignore', 'pipe', 'pipe'], env: options.env ?? cleanEnv(), cwd: options.cwd });
    live.add(this.child);
    this.exited = new Promise((resolve) => {
      this.child.once('error', (err) => {
        this.#push(this.#stderrTail, `spawn error: ${err.message}`);
        this.exitInfo = { code: -1, signal: null };
        live.delete(this.child);
        resolve(this.exitInfo);
      });
      this.child.once('exit', (code, signal) => {
        this.exitInfo = { code, signal };
        live.delete(this.child);
      });
      // 'close' comes after the exit and the end of both streams: whoever waits then has all of the output.
      this.child.once('close', (code, signal) => resolve(this.exitInfo ?? { code, signal }));
    });
    const streams = [this.child.stdout!, this.child.stderr!];
    for (const stream of streams) {
      const lines = createInterface({ input: stream, crlfDelay: Infinity });
      lines.on('error', () => {});
      lines.on('line', (line) => {
        const at = performance.now();
        this.#push(this.#tail, line);
        if (stream === this.child.stderr) this.#push(this.#stderrTail, line);
        for (const l of this.#listeners) l(line, at);
      });
    }
    // Called before anyone awaiting `exited` resumes: the bench reports this error, not a waiter's.
    if (options.mustRun) void this.exited.then((info) => this.#exitedOnItsOwn(info));
  }

  #exitedOnItsOwn(info: { code: number | null; signal: NodeJS.Signals | null }): void {
    if (this.#stopping || ending || !onUnexpectedExit) return;
    const stderr = this.#stderrTail.join('\n') || `(nothing on stderr; last output:)\n${this.tail()}`;
    onUnexpectedExit(
      new UnexpectedExitError(`${this.name} exited on its own (code ${info.code}, signal ${info.signal}) during the bench; its stderr:\n${stderr}`),
    );
  }

  get pid(): number {
    if (this.child.pid === undefined) throw new Error(`${this.name}: no pid (spawn failed)`);
    return this.child.pid;
  }

  #push(tail: string[], line: string): void {
    tail.push(line);
    if (tail.length > 60) tail.shift();
  }

  tail(n = 20): string {
    return this.#tail.slice(-n).join('\n');
  }

  onLine(listener: LineListener): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  /** Resolves with the first JSON log line (stdout or stderr) matching `predicate`; rejects on exit or timeout. */
  waitForLog(predicate: (entry: Record<string, unknown>) => boolean, timeoutMs: number, what: string): Promise<Record<string, unknown>> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => finish(new Error(`${this.name}: ${what} not seen within ${timeoutMs} ms; last output:\n${this.tail()}`)), timeoutMs);
      const off = this.onLine((line) => {
        let entry: Record<string, unknown>;
        try {
          entry = JSON.parse(line) as Record<string, unknown>;
        } catch {
          return;
        }
        if (predicate(entry)) finish(undefined, entry);
      });
      void this.exited.then((info) =>
        finish(new Error(`${this.name} exited (code ${info.code}, signal ${info.signal}) before ${what}; last output:\n${this.tail()}`)),
      );
      function finish(err?: Error, entry?: Record<string, unknown>): void {
        clearTimeout(timer);
        off();
        if (err) reject(err);
        else resolve(entry!);
      }
    });
  }

  /** SIGTERM, SIGKILL after `graceMs`; resolves once the process is gone. */
  async stop(graceMs = 10_000): Promise<void> {
    this.#stopping = true;
    if (this.exitInfo) return;
    this.child.kill('SIGTERM');
    const timer = setTimeout(() => this.child.kill('SIGKILL'), graceMs);
    await this.exited;
    clearTimeout(timer);
  }
}

/** Stops every tracked child that is still running (SIGTERM, then SIGKILL). */
export async function stopAll(graceMs = 5000): Promise<void> {
  ending = true;
  await Promise.all(
    [...live].map(async (child) => {
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), graceMs);
      await new Promise<void>((resolve) => {
        if (child.exitCode !== null || child.signalCode !== null) resolve();
        else child.once('exit', () => resolve());
      });
      clearTimeout(timer);
    }),
  );
}

/**
 * CPU time (user + system) a process has used so far, in ms: on a machine shared with other work, what a
 * server spends per request or a daemon until healthy, whatever the wall clock says. /proc counts in ticks
 * of USER_HZ, 100 per second on Linux: a 10 ms resolution.
 */
export async function cpuMs(pid: number): Promise<number> {
  const stat = await readFile(`/proc/${pid}/stat`, 'utf8');
  // Fields after the command name, which is in parentheses and may hold spaces: state is the first, utime the 12th.
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[11]) + Number(fields[12])) * 10;
}

/**
 * The same in ns resolution: the time every thread of the process has been on a CPU so far (the scheduler's
 * own count, /proc/PID/task/TID/schedstat), in ms. V8's compiler and GC threads included; a thread that
 * already exited is not.
 */
export async function threadsCpuMs(pid: number): Promise<number> {
  let ns = 0;
  for (const tid of await readdir(`/proc/${pid}/task`)) {
    const stat = await readFile(`/proc/${pid}/task/${tid}/schedstat`, 'utf8').catch(() => '0');
    ns += Number(stat.split(' ')[0]);
  }
  return ns / 1e6;
}

export interface MemStatus {
  /** VmRSS, RssAnon, RssFile in MB. */
  rss: number;
  anon: number;
  file: number;
}

export async function memStatus(pid: number): Promise<MemStatus> {
  const status = await readFile(`/proc/${pid}/status`, 'utf8');
  const kb = (key: string): number => Number(new RegExp(`^${key}:\\s+(\\d+)\\s+kB`, 'm').exec(status)?.[1] ?? NaN);
  return { rss: kb('VmRSS') / 1024, anon: kb('RssAnon') / 1024, file: kb('RssFile') / 1024 };
}

/**
 * Idle RSS: waits `idleMs`, then samples every `everyMs` for `spanMs` and keeps the maximum (VmRSS, with
 * the anonymous / file-backed split of that sample).
 */
export async function idleRss(pids: number[], options: { idleMs?: number; spanMs?: number; everyMs?: number } = {}): Promise<MemStatus[]> {
  const { idleMs = 3000, spanMs = 3000, everyMs = 500 } = options;
  await sleep(idleMs);
  const best: MemStatus[] = pids.map(() => ({ rss: 0, anon: 0, file: 0 }));
  for (let t = 0; t <= spanMs; t += everyMs) {
    const samples = await Promise.all(pids.map(memStatus));
    samples.forEach((s, i) => {
      if (s.rss > best[i]!.rss) best[i] = s;
    });
    if (t < spanMs) await sleep(everyMs);
  }
  return best;
}

/**
 * TCP connections of a process to `port` on the remote side, established (state 01): its socket inodes
 * (/proc/PID/fd) matched against the kernel's tables (/proc/PID/net/tcp, tcp6).
 */
export async function tcpConnectionsTo(pid: number, port: number): Promise<number> {
  const inodes = new Set<string>();
  for (const fd of await readdir(`/proc/${pid}/fd`).catch(() => [] as string[])) {
    const target = await readlink(`/proc/${pid}/fd/${fd}`).catch(() => '');
    const m = /^socket:\[(\d+)\]$/.exec(target);
    if (m) inodes.add(m[1]!);
  }
  let count = 0;
  for (const table of ['tcp', 'tcp6']) {
    const text = await readFile(`/proc/${pid}/net/${table}`, 'utf8').catch(() => '');
    for (const line of text.split('\n').slice(1)) {
      const cols = line.trim().split(/\s+/);
      // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
      if (cols.length < 10 || cols[3] !== '01' || !inodes.has(cols[9]!)) continue;
      if (Number.parseInt(cols[2]!.split(':')[1]!, 16) === port) count++;
    }
  }
  return count;
}
