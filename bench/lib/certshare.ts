// The production build of certshare, run as separate processes: `dist/cli/main.js` (the bundle of
// scripts/build.ts, what the image runs) on the real Node binary (process.execPath). Type stripping of
// the .ts sources would add tens of MB of RSS that a deployed sidecar does not pay.
import { readFileSync, watch, type FSWatcher } from 'node:fs';
import { mkdir, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { buildDist as buildBundle, DIST } from '../../scripts/build.ts';
import { certshareContainer } from '../../src/injector/sidecar.ts';
import type { V1Container } from '../../src/kube/transport/client-node.ts';
import { imageEntrypoint } from '../../test/support/dockerfile.ts';
import { httpRequest } from './http.ts';
import { cleanEnv, Proc } from './proc.ts';

export const REPO = resolve(import.meta.dirname, '../..');
/** The bundle's entry point (buildDist chooses where): what every measured process runs. */
let distMain = join(DIST, 'cli/main.js');
export function bundleMain(): string {
  return distMain;
}
const IMAGE_ENTRYPOINT = imageEntrypoint(readFileSync(join(REPO, 'Dockerfile'), 'utf8'));
/** BENCH_NO_IMAGE_FLAGS=1: without them (to compare). */
export const IMAGE_NODE_FLAGS = process.env.BENCH_NO_IMAGE_FLAGS ? [] : IMAGE_ENTRYPOINT.flags;

/**
 * What the image's ENTRYPOINT starts, from the bench's dist/: `--snapshot-blob` and the start-up snapshot's blob,
 * or the bundle's entry. The standalone figures are this entry's; Kubernetes workloads name dist/cli/main.js
 * themselves (spawnDaemon).
 */
export function imageEntry(): string[] {
  const { blob } = IMAGE_ENTRYPOINT;
  if (!blob) return [distMain];
  if (!blob.startsWith('dist/')) throw new Error(`Dockerfile: the ENTRYPOINT's blob ${blob} is not under dist/`);
  return ['--snapshot-blob', join(dirname(dirname(distMain)), blob.slice('dist/'.length))];
}
/** `npm run build` without npm (so the bench works from a clean clone) into `outdir`, dist/ by default; the bench runs it from then on. Returns ms. */
export async function buildDist(outdir = DIST): Promise<number> {
  const started = performance.now();
  await buildBundle(outdir);
  distMain = join(outdir, 'cli/main.js');
  return performance.now() - started;
}

/**
 * src/ compiled module by module (tsc -p tsconfig.build.json) into `outdir`, for `--memory` only: what the
 * bundle saves is measured against it. Its imports of packages resolve through a link to the checkout's
 * node_modules. Returns its cli/main.js.
 */
export async function buildModules(outdir: string): Promise<string> {
  await rm(outdir, { recursive: true, force: true });
  const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
  const proc = new Proc('tsc', [tsc, '-p', join(REPO, 'tsconfig.build.json'), '--outDir', outdir], { cwd: REPO, env: cleanEnv() });
  const timer = setTimeout(() => proc.child.kill('SIGKILL'), 180_000);
  const exit = await proc.exited;
  clearTimeout(timer);
  if (exit.code !== 0) throw new Error(`tsc -p tsconfig.build.json failed (code ${exit.code}):\n${proc.tail(40)}`);
  await writeFile(join(outdir, 'package.json'), `${JSON.stringify({ type: 'module', private: true })}\n`);
  await symlink(join(REPO, 'node_modules'), join(outdir, 'node_modules'), 'dir');
  return join(outdir, 'cli/main.js');
}

export interface EmulatorProc {
  proc: Proc;
  socket: string;
  /** POST /certshare-emulator/v0/domains {"add":[domain]}. */
  addDomain(domain: string): Promise<void>;
  stats(): Promise<Record<string, unknown>>;
}

/** `certshare emulator` on a unix socket in `dir` (like tailscaled). */
export async function startEmulator(dir: string, name: string, args: string[]): Promise<EmulatorProc> {
  await mkdir(dir, { recursive: true });
  const socket = join(dir, `${name}.sock`);
  const proc = new Proc(`emulator ${name}`, [bundleMain(), 'emulator', '--listen', socket, '--id', name, '--log-level', 'info', ...args], { mustRun: true });
  await proc.waitForLog((e) => e.msg === 'emulator listening', 20_000, 'emulator listening');
  return {
    proc,
    socket,
    async addDomain(domain) {
      const res = await httpRequest({ socketPath: socket }, 'POST', '/certshare-emulator/v0/domains', { add: [domain] });
      if (res.status !== 200) throw new Error(`emulator ${name}: add domain: HTTP ${res.status} ${res.body}`);
    },
    async stats() {
      const res = await httpRequest({ socketPath: socket }, 'GET', '/certshare-emulator/v0/stats');
      return JSON.parse(res.body) as Record<string, unknown>;
    },
  };
}

/** certshare's container as the injector writes it (a Pod of one domain): the bench's kube replicas run as it says. */
export function injectedContainer(): V1Container {
  return certshareContainer({
    image: 'bench',
    domains: ['bench.example'],
    mode: 'auto',
    outDir: '/certs',
    readinessGate: undefined,
    socketVolume: 'socket',
    certsVolume: 'certs',
  });
}

/** The variables of the injected container besides certshare's settings (the C library's: GLIBC_TUNABLES). */
const INJECTED_RUNTIME_ENV: Record<string, string> = Object.fromEntries(
  (injectedContainer().env ?? []).filter((e) => e.value !== undefined && !e.name.startsWith('CERTSHARE_')).map((e) => [e.name, e.value!]),
);

/**
 * `certshare run ARGS` as a Kubernetes workload runs it (IMAGE_NODE_FLAGS, dist/cli/main.js: DIST_COMMAND; the
 * injected container's runtime variables) with a clean environment plus `env` (and Node flags `nodeArgs`); does
 * not wait for anything.
 */
export function spawnDaemon(name: string, args: string[], env: Record<string, string> = {}, nodeArgs: string[] = [], main = bundleMain()): Proc {
  return spawnRun(name, [...nodeArgs, main], args, { ...INJECTED_RUNTIME_ENV, ...env });
}

/** `certshare run ARGS` as the image's default entry starts it (imageEntry: the start-up snapshot). */
export function spawnImageEntry(name: string, args: string[], env: Record<string, string> = {}): Proc {
  return spawnRun(name, imageEntry(), args, env);
}

function spawnRun(name: string, entry: string[], args: string[], env: Record<string, string>): Proc {
  // The CA's limit per exact name (--name-limit, 5 per 168 h) off, as in the tests: the bench renews a name of
  // seconds-long certificates tens of times, and the limit would hold it back until its certificate expired.
  return new Proc(name, [...IMAGE_NODE_FLAGS, ...entry, 'run', '--name-limit', '0', ...args], { env: cleanEnv(env), mustRun: true });
}

/**
 * Follows `<root>/<domain>/tls.crt` with fs.watch on `root` (the daemon swaps `<root>/<domain>`, a
 * symlink, with a rename): records performance.now() each time the file's content changes.
 */
export class CertFileWatch {
  readonly root: string;
  readonly domain: string;
  /** Content changes seen, in order. */
  readonly changes: Array<{ at: number; pem: string }> = [];
  #watcher: FSWatcher | undefined;
  #last: string | undefined;
  #checking = Promise.resolve();
  readonly #waiters = new Set<() => void>();

  private constructor(root: string, domain: string) {
    this.root = root;
    this.domain = domain;
  }

  /** Creates `root` if needed and starts watching it. */
  static async start(root: string, domain: string): Promise<CertFileWatch> {
    await mkdir(root, { recursive: true });
    const w = new CertFileWatch(root, domain);
    w.#watcher = watch(root, () => w.#check(performance.now()));
    w.#last = await w.#read();
    return w;
  }

  get current(): string | undefined {
    return this.#last;
  }

  #read(): Promise<string | undefined> {
    return readFile(join(this.root, this.domain, 'tls.crt'), 'utf8').catch(() => undefined);
  }

  #check(at: number): void {
    // Serialised so that changes are recorded in order, each with the time of the event that revealed it.
    this.#checking = this.#checking.then(async () => {
      const pem = await this.#read();
      if (pem === undefined || pem === this.#last || !pem.includes('-----END CERTIFICATE-----')) return;
      this.#last = pem;
      this.changes.push({ at, pem });
      for (const w of this.#waiters) w();
    });
  }

  /** Resolves with the first recorded change at index >= `from` (default: the next one); rejects after `timeoutMs`. */
  next(timeoutMs: number, from = this.changes.length): Promise<{ at: number; pem: string }> {
    return new Promise((resolveNext, reject) => {
      const done = (): void => {
        const change = this.changes[from];
        if (!change) return;
        clearTimeout(timer);
        this.#waiters.delete(done);
        resolveNext(change);
      };
      const timer = setTimeout(() => {
        this.#waiters.delete(done);
        reject(new Error(`${join(this.root, this.domain)}: no certificate files within ${timeoutMs} ms`));
      }, timeoutMs);
      this.#waiters.add(done);
      done();
    });
  }

  close(): void {
    this.#watcher?.close();
  }
}

/**
 * Follows `<root>/<domain>/tls.crt` for many domains with one fs.watch on `root`: the daemon swaps the
 * `<domain>` symlink with a rename, and the event names it. Records performance.now() of each content change.
 */
export class CertTreeWatch {
  readonly root: string;
  /** Content changes per domain, in order. */
  readonly changes = new Map<string, Array<{ at: number; pem: string }>>();
  #watcher: FSWatcher | undefined;
  readonly #checking = new Map<string, Promise<void>>();
  readonly #waiters = new Set<() => void>();

  private constructor(root: string, domains: string[]) {
    this.root = root;
    for (const d of domains) this.changes.set(d, []);
  }

  static async start(root: string, domains: string[]): Promise<CertTreeWatch> {
    await mkdir(root, { recursive: true });
    const w = new CertTreeWatch(root, domains);
    w.#watcher = watch(root, (_event, name) => {
      const at = performance.now();
      // No name: the kernel's event queue overflowed; look at every domain.
      for (const domain of name ? [name] : w.changes.keys()) if (w.changes.has(domain)) w.#check(domain, at);
    });
    for (const domain of domains) w.#check(domain, performance.now());
    return w;
  }

  #check(domain: string, at: number): void {
    // Serialised per domain so that changes are recorded in order.
    const next = (this.#checking.get(domain) ?? Promise.resolve()).then(async () => {
      const pem = await readFile(join(this.root, domain, 'tls.crt'), 'utf8').catch(() => undefined);
      const seen = this.changes.get(domain)!;
      if (pem === undefined || pem === seen.at(-1)?.pem || !pem.includes('-----END CERTIFICATE-----')) return;
      seen.push({ at, pem });
      for (const w of this.#waiters) w();
    });
    this.#checking.set(domain, next);
  }

  /** Resolves once `done()` holds (checked after every change); rejects after `timeoutMs` with `what`. */
  until(done: () => boolean, timeoutMs: number, what: () => string): Promise<void> {
    return new Promise((resolveUntil, reject) => {
      const check = (): void => {
        if (!done()) return;
        clearTimeout(timer);
        this.#waiters.delete(check);
        resolveUntil();
      };
      const timer = setTimeout(() => {
        this.#waiters.delete(check);
        reject(new Error(`${this.root}: ${what()} within ${timeoutMs} ms`));
      }, timeoutMs);
      this.#waiters.add(check);
      check();
    });
  }

  close(): void {
    this.#watcher?.close();
  }
}
