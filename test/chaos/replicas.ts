// The replicas as separate processes: per replica one emulated tailscaled (started once, it outlives
// certshare restarts, like the real daemon) and one `certshare run` that the chaos kills and restarts.
// Output goes to files under the run directory; a few log messages are followed (start, writer role).
import { spawn, type ChildProcess } from 'node:child_process';
import { createWriteStream, type WriteStream } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import { request } from 'node:http';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import { deathSignalPrefix } from '../support/processes.ts';

// The sources, not bin/certshare.js: that prefers dist/ when a build exists, which may be stale.
const BIN = resolve(import.meta.dirname, '../../src/cli/main.ts');

/** One life of a certshare process. */
export interface Instance {
  replica: string;
  pid: number;
  startedAt: number;
  /** When it logged "certshare started" (listening, loops about to run). */
  readyAt?: number;
  /** Its /healthz and /metrics listener (host:port), from that line. */
  address?: string;
  exitedAt?: number;
  killedWith?: NodeJS.Signals;
  exit?: { code: number | null; signal: NodeJS.Signals | null };
}

export interface ReplicaSpec {
  name: string;
  namespace: string;
  /** The group's domains (each replica's emulated tailscaled serves them all). */
  domains: string[];
  group: string;
  kubeconfig: string;
  ledger: string;
  certLifetime: string;
  podIp: string;
  /** Extra `certshare run` flags (timing). */
  flags: string[];
  /** The emulator's --ca (a CA shared by every emulator: federated members trust it); default its own. */
  emulatorCa?: string | undefined;
  /** Extra `certshare emulator` flags (a skewed CA clock). */
  emulatorFlags?: string[] | undefined;
}

const live = new Set<ChildProcess>();
let hooked = false;
function track(child: ChildProcess): void {
  if (!hooked) {
    hooked = true;
    process.on('exit', () => {
      for (const c of live) c.kill('SIGKILL');
    });
  }
  live.add(child);
  child.on('exit', () => live.delete(child));
}

function cleanEnv(extra: Record<string, string>): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (k.startsWith('CERTSHARE_') || k.startsWith('TS_') || k === 'KUBECONFIG' || k.startsWith('POD_') || k === 'KUBERNETES_SERVICE_HOST') continue;
    env[k] = v;
  }
  return { ...env, ...extra };
}

function spawnNode(args: string[], env: NodeJS.ProcessEnv): ChildProcess {
  const prefix = deathSignalPrefix();
  const [cmd, ...rest] = [...prefix, process.execPath, ...args];
  const child = spawn(cmd!, rest, { stdio: ['ignore', 'pipe', 'pipe'], env });
  track(child);
  return child;
}

export type LogListener = (replica: string, line: Record<string, unknown>, at: number) => void;
export type ExitListener = (instance: Instance) => void;

export class Replica {
  readonly spec: ReplicaSpec;
  readonly dir: string;
  readonly outDir: string;
  readonly socket: string;
  readonly instances: Instance[] = [];
  #emulator: ChildProcess | undefined;
  #proc: ChildProcess | undefined;
  #current: Instance | undefined;
  #exited: Promise<void> = Promise.resolve();
  #log: WriteStream | undefined;
  #emuLog: WriteStream | undefined;
  #onLog: LogListener;
  #onExit: ExitListener;
  #stopping = false;
  /** Starts of certshare are counted, to tell lives apart in the log file. */
  #starts = 0;

  constructor(spec: ReplicaSpec, root: string, onLog: LogListener, onExit: ExitListener = () => {}) {
    this.spec = spec;
    this.dir = join(root, spec.name);
    this.outDir = join(this.dir, 'certs');
    this.socket = join(this.dir, 'tailscaled.sock');
    this.#onLog = onLog;
    this.#onExit = onExit;
  }

  /** True once stopAll() began: exits from then on are expected. */
  get stopping(): boolean {
    return this.#stopping;
  }

  get name(): string {
    return this.spec.name;
  }

  get running(): boolean {
    return this.#current !== undefined && this.#current.exitedAt === undefined;
  }

  get current(): Instance | undefined {
    return this.running ? this.#current : undefined;
  }

  async init(): Promise<void> {
    await mkdir(this.outDir, { recursive: true });
    this.#log = createWriteStream(join(this.dir, 'certshare.log'), { flags: 'a' });
    this.#emuLog = createWriteStream(join(this.dir, 'emulator.log'), { flags: 'a' });
  }

  async startEmulator(): Promise<void> {
    const { spec } = this;
    const child = spawnNode(
      [
        BIN,
        'emulator',
        '--listen',
        this.socket,
        ...spec.domains.flatMap((d) => ['--domain', d]),
        '--cert-lifetime',
        spec.certLifetime,
        '--ledger',
        spec.ledger,
        '--ledger-requests',
        '--id',
        spec.name,
        '--log-level',
        'info',
        ...(spec.emulatorCa ? ['--ca', spec.emulatorCa] : []),
        ...(spec.emulatorFlags ?? []),
      ],
      cleanEnv({}),
    );
    this.#emulator = child;
    child.stdout!.pipe(this.#emuLog!, { end: false });
    child.stderr!.pipe(this.#emuLog!, { end: false });
    const lines = createInterface({ input: child.stdout! });
    const listening = new Promise<void>((resolveListening, reject) => {
      lines.on('line', (line) => {
        if (line.includes('"emulator listening"')) resolveListening();
      });
      child.once('exit', (code, signal) => reject(new Error(`emulator ${spec.name} exited (${code ?? signal}) before listening`)));
    });
    await withTimeout(listening, 20_000, `emulator ${spec.name} did not start`);
  }

  start(): Instance {
    if (this.running) throw new Error(`${this.name} already running`);
    const { spec } = this;
    const args = [
      BIN,
      'run',
      // No ARI request to Let's Encrypt (the default directory) from a test.
      '--acme-directory',
      'none',
      '--mode',
      'auto',
      '--store',
      'kube',
      '--localapi',
      this.socket,
      ...spec.domains.flatMap((d) => ['--domain', d]),
      '--group',
      spec.group,
      '--out-dir',
      this.outDir,
      '--readiness-gate',
      'certshare.io/certificates',
      '--listen',
      '127.0.0.1:0',
      ...spec.flags,
    ];
    const env = cleanEnv({ KUBECONFIG: spec.kubeconfig, POD_NAME: spec.name, POD_NAMESPACE: spec.namespace, POD_IPS: spec.podIp });
    const child = spawnNode(args, env);
    const instance: Instance = { replica: spec.name, pid: child.pid ?? -1, startedAt: Date.now() };
    this.instances.push(instance);
    this.#proc = child;
    this.#current = instance;
    const n = ++this.#starts;
    this.#log!.write(`--- start #${n} pid ${instance.pid} at ${new Date(instance.startedAt).toISOString()}\n`);
    child.stderr!.pipe(this.#log!, { end: false });
    const lines = createInterface({ input: child.stdout! });
    lines.on('line', (text) => {
      this.#log!.write(`${text}\n`);
      const at = Date.now();
      let line: Record<string, unknown>;
      try {
        line = JSON.parse(text) as Record<string, unknown>;
      } catch {
        return;
      }
      if (line.msg === 'certshare started' && instance.readyAt === undefined) {
        instance.readyAt = at;
        if (typeof line.address === 'string') instance.address = line.address.replace(/^https?:\/\//, '');
      }
      this.#onLog(spec.name, line, at);
    });
    this.#exited = new Promise<void>((resolveExit) => {
      child.once('exit', (code, signal) => {
        instance.exitedAt = Date.now();
        instance.exit = { code, signal };
        this.#log!.write(`--- exit #${n} pid ${instance.pid} code ${code} signal ${signal} at ${new Date(instance.exitedAt).toISOString()}\n`);
        resolveExit();
        if (!this.#stopping) this.#onExit(instance);
      });
    });
    return instance;
  }

  /** Kills the running certshare; resolves once it exited (SIGKILL after `boundMs` if it lingers). */
  async kill(signal: NodeJS.Signals, boundMs = 8000): Promise<void> {
    const child = this.#proc;
    const instance = this.#current;
    if (!child || !instance || instance.exitedAt !== undefined) return;
    instance.killedWith = signal;
    child.kill(signal);
    const exited = this.#exited;
    const lingered = await Promise.race([exited.then(() => false), sleep(boundMs).then(() => true)]);
    if (lingered) {
      child.kill('SIGKILL');
      await exited;
    }
  }

  /** The instance that was running at `t` (or had just been killed), if any. */
  instanceAt(t: number): Instance | undefined {
    for (let i = this.instances.length - 1; i >= 0; i--) {
      const inst = this.instances[i]!;
      if (inst.startedAt <= t && (inst.exitedAt === undefined || t <= inst.exitedAt)) return inst;
    }
    return undefined;
  }

  /** A call to the emulator's control API (JSON in, JSON out). */
  control(method: string, path: string, body?: unknown): Promise<{ status: number; json: unknown }> {
    return new Promise((resolveCall, reject) => {
      const payload = body === undefined ? undefined : typeof body === 'string' ? JSON.stringify(body) : JSON.stringify(body);
      const req = request(
        {
          socketPath: this.socket,
          method,
          path: `/certshare-emulator/v0/${path}`,
          headers: { Host: 'local-tailscaled.sock', ...(payload ? { 'Content-Type': 'application/json' } : {}) },
          timeout: 5000,
        },
        (res) => {
          let text = '';
          res.setEncoding('utf8');
          res.on('data', (c: string) => (text += c));
          res.on('end', () => {
            let json: unknown;
            try {
              json = JSON.parse(text);
            } catch {
              json = text;
            }
            resolveCall({ status: res.statusCode ?? 0, json });
          });
        },
      );
      req.on('timeout', () => req.destroy(new Error(`emulator control ${path} timed out`)));
      req.on('error', reject);
      req.end(payload);
    });
  }

  /**
   * The running process's /healthz status code; throws when it does not answer within `timeoutMs` (a
   * process that is up but no longer serves is half dead).
   */
  healthz(timeoutMs: number): Promise<number> {
    const address = this.current?.address;
    if (!address) return Promise.reject(new Error(`${this.name} is not running or has not started listening`));
    return new Promise((resolveCall, reject) => {
      const req = request(`http://${address}/healthz`, { timeout: timeoutMs }, (res) => {
        res.resume();
        res.on('end', () => resolveCall(res.statusCode ?? 0));
      });
      req.on('timeout', () => req.destroy(new Error(`no answer from ${address}/healthz within ${timeoutMs} ms`)));
      req.on('error', reject);
      req.end();
    });
  }

  async stopAll(): Promise<void> {
    this.#stopping = true;
    await this.kill('SIGTERM', 5000);
    const emu = this.#emulator;
    if (emu && emu.exitCode === null && emu.signalCode === null) {
      const exited = new Promise<void>((r) => emu.once('exit', () => r()));
      emu.kill('SIGTERM');
      const lingered = await Promise.race([exited.then(() => false), sleep(5000).then(() => true)]);
      if (lingered) {
        emu.kill('SIGKILL');
        await exited;
      }
    }
    await Promise.all([this.#log, this.#emuLog].map((s) => new Promise<void>((r) => (s ? s.end(() => r()) : r()))));
  }
}

export async function withTimeout<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      promise,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`${what} within ${ms} ms`)), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}
