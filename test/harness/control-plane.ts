// Test control plane: a real etcd + kube-apiserver on 127.0.0.1 (envtest style), no kubelet,
// no controller-manager, no scheduler. See startControlPlane().
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { EventEmitter, once } from 'node:events';
import { constants as fsConstants, rmSync } from 'node:fs';
import { access, mkdir, mkdtemp, readdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { request as httpRequest } from 'node:http';
import { request as httpsRequest } from 'node:https';
import type { Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { createControlPlanePki, type ControlPlanePki } from './pki.ts';
import { deathSignalPrefix, freePort } from '../support/processes.ts';

const BUILD_SCRIPT = resolve(import.meta.dirname, '../k8s-binaries/build.sh');
const LOG_LINES = 200;

export interface ControlPlaneOptions {
  /** Directory with etcd, kube-apiserver, kubectl. Default: `test/k8s-binaries/build.sh` (builds once; honours KUBEBUILDER_ASSETS). */
  binDir?: string;
  /** Bound on etcd + kube-apiserver readiness, excluding the binary build. Default 120 s. */
  readyTimeoutMs?: number;
  /** Bound on SIGTERM before SIGKILL when stopping a process. Default 10 s. */
  stopGraceMs?: number;
  /**
   * Run the ServiceAccount admission plugin (off by default, envtest style): Pods then get the
   * ServiceAccount's token mounted unless they opt out, as in a real cluster. Their ServiceAccount must
   * exist (no controller creates `default`).
   */
  serviceAccountAdmission?: boolean;
  /**
   * kube-apiserver's --goaway-chance: the probability (at most 0.02) that it answers a request with
   * HTTP/2 GOAWAY, so that clients must move to a new connection. Default off.
   */
  goawayChance?: number;
  /** Extra kube-apiserver flags, appended last (they win over the defaults). */
  extraApiServerArgs?: string[];
  /** Extra etcd flags, appended last. */
  extraEtcdArgs?: string[];
  /** Stream etcd/apiserver output and progress to stderr. Default: env CERTSHARE_CP_VERBOSE=1. */
  verbose?: boolean;
  /** Keep the temp dir (certs, etcd data) after stop(), for debugging. */
  keepTempDir?: boolean;
}

export interface CommandResult {
  stdout: string;
  stderr: string;
  /** Exit code; null when killed by a signal (e.g. the timeout). */
  code: number | null;
}

export interface KubectlOptions {
  /** Written to kubectl's stdin (e.g. a manifest for `apply -f -`). */
  input?: string;
  /** Use this kubeconfig instead of the admin one (e.g. from kubeconfigFor()). */
  kubeconfig?: string;
  /** Kill kubectl after this long. Default 60 s. */
  timeoutMs?: number;
}

export interface HttpResult {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

export interface AdminRequestOptions {
  /** Object bodies are sent as JSON (Content-Type application/json unless set in headers). */
  body?: unknown;
  headers?: Record<string, string>;
  timeoutMs?: number;
}

export interface ControlPlane {
  /** `https://127.0.0.1:<port>`; the port stays the same across stopApiServer()/startApiServer(). */
  readonly server: string;
  readonly port: number;
  /** CA that signed the serving certificate (and the admin client certificate). */
  readonly caPem: string;
  /** Admin client certificate/key (CN=admin, O=system:masters). */
  readonly adminCertPem: string;
  readonly adminKeyPem: string;
  /** Kubeconfig with embedded CA and admin client certificate data. */
  readonly adminKubeconfigPath: string;
  /** Directory holding etcd, kube-apiserver and kubectl. */
  readonly binDir: string;
  /** Temp dir of this control plane (certs, etcd data, kubeconfigs); removed by stop(). */
  readonly dir: string;
  /** etcd client URL (plain http on loopback). */
  readonly etcdUrl: string;
  /**
   * Creates a token for an existing ServiceAccount (TokenRequest API) and writes a kubeconfig using it as
   * bearer token, with `namespace` as the context namespace. Returns the file path. With `pod`, the
   * token is bound to that Pod (which must run under the ServiceAccount), as a projected token in the
   * Pod is: the apiserver then names the Pod in the user's extra (authentication.kubernetes.io/pod-name).
   */
  kubeconfigFor(namespace: string, serviceAccount: string, options?: { expirationSeconds?: number; pod?: string }): Promise<string>;
  /** Runs the built kubectl with the admin kubeconfig (or options.kubeconfig). Never rejects on a non-zero exit. */
  kubectl(args: string[], options?: KubectlOptions): Promise<CommandResult>;
  /** Raw request to the apiserver with the admin client certificate; a new connection each time. */
  adminRequest(method: string, path: string, options?: AdminRequestOptions): Promise<HttpResult>;
  /**
   * Stops only kube-apiserver (etcd keeps the data). Requests then fail with ECONNREFUSED.
   * Default SIGTERM (graceful: open watches end cleanly; SIGKILL after stopGraceMs); `signal: 'SIGKILL'`
   * simulates a crash (connections reset).
   */
  stopApiServer(options?: { signal?: 'SIGTERM' | 'SIGKILL' }): Promise<void>;
  /** Starts kube-apiserver again on the same port and waits until it is ready. No-op when running. */
  startApiServer(): Promise<void>;
  readonly apiServerRunning: boolean;
  /** GET /metrics as admin (Prometheus text, e.g. `apiserver_request_total`). */
  metrics(): Promise<string>;
  /** Resident memory (bytes, from /proc; undefined when unavailable) of kube-apiserver and etcd. */
  rss(): Promise<{ apiserver?: number; etcd?: number }>;
  /** Last lines of each process's output (stderr + stdout), for diagnostics. */
  logs(): { apiserver: string[]; etcd: string[] };
  /** SIGTERM both (SIGKILL after stopGraceMs), then removes the temp dir. Idempotent. */
  stop(): Promise<void>;
}

// ---------------------------------------------------------------------------------------------
// Process bookkeeping: children are killed when this Node process exits, even after a crash.
// ManagedProcess is also what the real-tailscaled harness (./tailscale.ts) runs its processes with.

const liveChildren = new Set<ChildProcess>();
const liveTempDirs = new Set<string>();
let exitHookInstalled = false;

function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.on('exit', () => {
    for (const child of liveChildren) {
      try {
        child.kill('SIGKILL');
      } catch {
        // already gone
      }
    }
    for (const dir of liveTempDirs) {
      try {
        rmSync(dir, { recursive: true, force: true, maxRetries: 3 });
      } catch {
        // best effort
      }
    }
  });
}

export interface ExitInfo {
  code: number | null;
  signal: NodeJS.Signals | null;
}

export class ManagedProcess {
  readonly name: string;
  readonly child: ChildProcess;
  readonly lines: string[] = [];
  /** 'line' (the line) for each line of output, 'exit' once it exited: sources for wait.ts's until(). */
  readonly events = new EventEmitter();
  readonly exited: Promise<ExitInfo>;
  exitInfo: ExitInfo | undefined;

  /** `env`: the whole environment of the process (default: this one's, without cluster settings). */
  constructor(name: string, file: string, args: string[], verbose: boolean, env: NodeJS.ProcessEnv = childEnv()) {
    this.name = name;
    const prefix = deathSignalPrefix();
    const [cmd, ...cmdArgs] = prefix.length > 0 ? [...prefix, file, ...args] : [file, ...args];
    installExitHook();
    this.child = spawn(cmd!, cmdArgs, { stdio: ['ignore', 'pipe', 'pipe'], env });
    liveChildren.add(this.child);
    // Unreferenced: a control plane that a test forgets to stop() cannot keep the test process alive;
    // the exit hook (and the parent-death signal) then kill it.
    this.child.unref();
    for (const stream of [this.child.stdout!, this.child.stderr!]) {
      let partial = '';
      (stream as Socket).unref();
      stream.setEncoding('utf8');
      stream.on('data', (chunk: string) => {
        const parts = (partial + chunk).split('\n');
        partial = parts.pop() ?? '';
        for (const line of parts) this.push(line, verbose);
      });
      stream.on('end', () => {
        if (partial) this.push(partial, verbose);
        partial = '';
      });
    }
    this.exited = new Promise<ExitInfo>((resolveExit) => {
      this.child.on('error', (err) => {
        this.push(`spawn error: ${err.message}`, verbose);
        this.exitInfo = { code: -1, signal: null };
        liveChildren.delete(this.child);
        resolveExit(this.exitInfo);
        this.events.emit('exit');
      });
      this.child.on('exit', (code, signal) => {
        this.exitInfo = { code, signal };
        liveChildren.delete(this.child);
        resolveExit(this.exitInfo);
        this.events.emit('exit');
      });
    });
  }

  private push(line: string, verbose: boolean): void {
    this.lines.push(line);
    if (this.lines.length > LOG_LINES) this.lines.splice(0, this.lines.length - LOG_LINES);
    if (verbose) process.stderr.write(`[${this.name}] ${line}\n`);
    this.events.emit('line', line);
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  tail(n = 40): string {
    return this.lines.slice(-n).join('\n');
  }

  addressInUse(): boolean {
    return this.lines.some((l) => /address already in use/i.test(l));
  }

  /**
   * Polls `ready` (short fixed interval: readiness of an external process) until true, this process
   * exits, or `timeoutMs` after `started` (performance.now()); `extra` adds details to the timeout error.
   */
  async waitReady(name: string, started: number, timeoutMs: number, ready: () => Promise<boolean>, extra: () => string = () => ''): Promise<void> {
    const deadline = started + timeoutMs;
    let lastError = '';
    for (;;) {
      if (this.exitInfo) {
        const { code, signal } = this.exitInfo;
        throw new Error(`${name} exited (code ${code}, signal ${signal}) before becoming ready; last output:\n${this.tail()}`);
      }
      try {
        if (await ready()) return;
        lastError = '';
      } catch (err) {
        lastError = err instanceof Error ? err.message : String(err);
      }
      if (performance.now() > deadline) {
        const details = [extra(), lastError && `last error: ${lastError}`].filter(Boolean).join('\n');
        throw new Error(`${name} not ready after ${timeoutMs} ms${details ? `\n${details}` : ''}\nlast output:\n${this.tail()}`);
      }
      await sleep(100);
    }
  }

  /** SIGTERM, then SIGKILL after graceMs (at once when graceMs is 0). */
  async terminate(graceMs: number): Promise<void> {
    if (this.exitInfo) return;
    const keepAlive = setInterval(() => {}, 1000); // the child is unreferenced: keep the loop alive meanwhile
    try {
      if (graceMs > 0) {
        this.child.kill('SIGTERM');
        let timer: NodeJS.Timeout | undefined;
        const timedOut = new Promise<'timeout'>((resolveTimeout) => {
          timer = setTimeout(() => resolveTimeout('timeout'), graceMs);
        });
        const first = await Promise.race([this.exited, timedOut]);
        clearTimeout(timer);
        if (first !== 'timeout') return;
      }
      this.child.kill('SIGKILL');
      await this.exited;
    } finally {
      clearInterval(keepAlive);
    }
  }
}

function childEnv(): NodeJS.ProcessEnv {
  const env = { ...process.env };
  // Keep the developer's own cluster settings out of the test processes.
  delete env.KUBECONFIG;
  delete env.ETCDCTL_API;
  for (const key of Object.keys(env)) if (key.startsWith('ETCD_')) delete env[key];
  return env;
}

/**
 * Runs a command to its end with the test processes' environment (childEnv, plus `env`): its stdout, stderr
 * and exit code (null when the timeout, default 60 s, killed it). Never rejects on a non-zero exit; killed
 * with this process (it is a live child until it ends).
 */
export function runCommand(command: string[], options: { input?: string; timeoutMs?: number; env?: Record<string, string> } = {}): Promise<CommandResult> {
  installExitHook();
  return new Promise<CommandResult>((resolveRun, reject) => {
    const child = spawn(command[0]!, command.slice(1), {
      stdio: ['pipe', 'pipe', 'pipe'],
      env: { ...childEnv(), ...options.env },
      timeout: options.timeoutMs ?? 60_000,
      killSignal: 'SIGKILL',
    });
    liveChildren.add(child);
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (c: string) => (stdout += c));
    child.stderr.setEncoding('utf8').on('data', (c: string) => (stderr += c));
    child.on('error', (err) => {
      liveChildren.delete(child);
      reject(err);
    });
    child.on('close', (code) => {
      liveChildren.delete(child);
      resolveRun({ stdout, stderr, code });
    });
    child.stdin.on('error', () => {}); // the command may exit before reading its input
    child.stdin.end(options.input ?? '');
  });
}

// ---------------------------------------------------------------------------------------------
// Binaries

/**
 * Directory holding etcd, kube-apiserver and kubectl (and the node's components, for the real-cluster
 * tier): the last stdout line of build.sh, which builds them once (tens of minutes cold; progress on stderr, no timeout here) and honours KUBEBUILDER_ASSETS.
 * Memoised per process; build.sh itself serialises concurrent builds with a lock.
 */
export function k8sBinDir(): Promise<string> {
  return buildOnce(BUILD_SCRIPT, ['etcd', 'kube-apiserver', 'kubectl', 'kubelet', 'kube-controller-manager', 'kube-scheduler', 'kube-proxy']);
}

const builds = new Map<string, Promise<string>>();

/**
 * The directory a build script prints as its last stdout line, with `bins` executables in it; the script
 * runs once per process (again after a failure). Also used for the tailscaled binaries.
 */
export function buildOnce(script: string, bins: string[]): Promise<string> {
  let build = builds.get(script);
  if (!build) {
    build = runBuildScript(script, bins).catch((err: unknown) => {
      builds.delete(script);
      throw err;
    });
    builds.set(script, build);
  }
  return build;
}

async function runBuildScript(script: string, bins: string[]): Promise<string> {
  const child = spawn('bash', [script], { stdio: ['ignore', 'pipe', 'inherit'] });
  let stdout = '';
  child.stdout.setEncoding('utf8');
  child.stdout.on('data', (chunk: string) => (stdout += chunk));
  // 'close', not 'exit': the output may still be in the pipe when the process has exited.
  const [code, signal] = (await once(child, 'close')) as [number | null, NodeJS.Signals | null];
  if (code !== 0) throw new Error(`${script} failed (code ${code}, signal ${signal}); its stderr is above`);
  const dir = stdout.trim().split('\n').at(-1)?.trim();
  if (!dir) throw new Error(`${script} printed no directory`);
  for (const bin of bins) {
    await access(join(dir, bin), fsConstants.X_OK).catch(() => {
      throw new Error(`${join(dir, bin)} is missing or not executable (from ${script})`);
    });
  }
  return dir;
}

// ---------------------------------------------------------------------------------------------
// Small helpers

export function yamlKubeconfig(p: { server: string; caPem: string; user: Record<string, string>; userName: string; namespace: string }): string {
  const b64 = (s: string) => Buffer.from(s).toString('base64');
  const q = (s: string) => JSON.stringify(s); // a JSON string is a valid YAML double-quoted scalar
  const userLines = Object.entries(p.user).map(([k, v]) => `    ${k}: ${q(k.endsWith('-data') ? b64(v) : v)}`);
  return [
    'apiVersion: v1',
    'kind: Config',
    'clusters:',
    '- name: certshare-test',
    '  cluster:',
    `    server: ${q(p.server)}`,
    `    certificate-authority-data: ${q(b64(p.caPem))}`,
    'users:',
    `- name: ${q(p.userName)}`,
    '  user:',
    ...userLines,
    'contexts:',
    '- name: certshare-test',
    '  context:',
    '    cluster: certshare-test',
    `    user: ${q(p.userName)}`,
    `    namespace: ${q(p.namespace)}`,
    'current-context: certshare-test',
    '',
  ].join('\n');
}

// ---------------------------------------------------------------------------------------------

class ControlPlaneImpl implements ControlPlane {
  readonly binDir: string;
  readonly dir: string;
  readonly options: ControlPlaneOptions;
  readonly verbose: boolean;
  pki!: ControlPlanePki;
  port = 0;
  etcdUrl = '';
  adminKubeconfigPath = '';
  private etcd: ManagedProcess | undefined;
  private apiserver: ManagedProcess | undefined;
  private lastEtcdLines: string[] = [];
  private lastApiServerLines: string[] = [];
  private stopped = false;
  private apiServerTransition: Promise<void> = Promise.resolve();

  constructor(binDir: string, dir: string, options: ControlPlaneOptions) {
    this.binDir = binDir;
    this.dir = dir;
    this.options = options;
    this.verbose = options.verbose ?? process.env.CERTSHARE_CP_VERBOSE === '1';
  }

  get server(): string {
    return `https://127.0.0.1:${this.port}`;
  }
  get caPem(): string {
    return this.pki.ca.certPem;
  }
  get adminCertPem(): string {
    return this.pki.admin.certPem;
  }
  get adminKeyPem(): string {
    return this.pki.admin.keyPem;
  }
  get apiServerRunning(): boolean {
    return this.apiserver !== undefined;
  }
  private get graceMs(): number {
    return this.options.stopGraceMs ?? 10_000;
  }
  private get readyTimeoutMs(): number {
    return this.options.readyTimeoutMs ?? 120_000;
  }

  progress(message: string): void {
    if (this.verbose) process.stderr.write(`control plane: ${message}\n`);
  }

  async init(): Promise<void> {
    this.pki = await createControlPlanePki();
    const files: Record<string, string> = {
      'ca.crt': this.pki.ca.certPem,
      'apiserver.crt': this.pki.serving.certPem,
      'apiserver.key': this.pki.serving.keyPem,
      'admin.crt': this.pki.admin.certPem,
      'admin.key': this.pki.admin.keyPem,
      'sa.key': this.pki.serviceAccount.privateKeyPem,
      'sa.pub': this.pki.serviceAccount.publicKeyPem,
    };
    await mkdir(join(this.dir, 'pki'), { mode: 0o700 });
    for (const [name, content] of Object.entries(files)) {
      await writeFile(join(this.dir, 'pki', name), content, { mode: 0o600 });
    }
    await this.startEtcd();
    await this.startApiServerOnFreePort();
    this.adminKubeconfigPath = join(this.dir, 'admin.kubeconfig');
    await writeFile(
      this.adminKubeconfigPath,
      yamlKubeconfig({
        server: this.server,
        caPem: this.caPem,
        userName: 'admin',
        user: { 'client-certificate-data': this.adminCertPem, 'client-key-data': this.adminKeyPem },
        namespace: 'default',
      }),
      { mode: 0o600 },
    );
  }

  // --- etcd -----------------------------------------------------------------------------------

  private async startEtcd(): Promise<void> {
    const started = performance.now();
    for (let attempt = 1; ; attempt++) {
      const clientPort = await freePort();
      let peerPort = await freePort();
      while (peerPort === clientPort) peerPort = await freePort();
      const client = `http://127.0.0.1:${clientPort}`;
      const peer = `http://127.0.0.1:${peerPort}`;
      const args = [
        '--name=certshare',
        `--data-dir=${join(this.dir, 'etcd')}`,
        `--listen-client-urls=${client}`,
        `--advertise-client-urls=${client}`,
        `--listen-peer-urls=${peer}`,
        `--initial-advertise-peer-urls=${peer}`,
        `--initial-cluster=certshare=${peer}`,
        '--initial-cluster-state=new',
        '--unsafe-no-fsync=true', // test data only: no fsync makes writes and start-up much faster
        // Single member on loopback: a shorter election timeout makes it leader sooner at start-up.
        '--heartbeat-interval=50',
        '--election-timeout=500',
        `--quota-backend-bytes=${512 * 1024 * 1024}`,
        '--log-level=warn',
        ...(this.options.extraEtcdArgs ?? []),
      ];
      const proc = new ManagedProcess('etcd', join(this.binDir, 'etcd'), args, this.verbose);
      this.etcd = proc;
      this.etcdUrl = client;
      try {
        await this.waitFor('etcd', proc, started, async () => {
          const res = await plainGet(`${client}/health`);
          return res.status === 200 && res.body.includes('"health":"true"');
        });
        this.progress(`etcd ready at ${client} in ${Math.round(performance.now() - started)} ms`);
        return;
      } catch (err) {
        await proc.terminate(1000);
        this.lastEtcdLines = proc.lines;
        this.etcd = undefined;
        if (proc.addressInUse() && attempt < 5) {
          await rm(join(this.dir, 'etcd'), { recursive: true, force: true });
          continue;
        }
        throw err;
      }
    }
  }

  // --- kube-apiserver ---------------------------------------------------------------------------

  private apiServerArgs(): string[] {
    const pki = (name: string) => join(this.dir, 'pki', name);
    return [
      `--etcd-servers=${this.etcdUrl}`,
      `--secure-port=${this.port}`,
      '--bind-address=127.0.0.1',
      '--advertise-address=127.0.0.1',
      `--cert-dir=${join(this.dir, 'apiserver-certs')}`,
      `--tls-cert-file=${pki('apiserver.crt')}`,
      `--tls-private-key-file=${pki('apiserver.key')}`,
      `--client-ca-file=${pki('ca.crt')}`,
      '--authorization-mode=Node,RBAC',
      // envtest style: without the ServiceAccount admission plugin, Pods need no `default` ServiceAccount
      // (no controller-manager runs to create it) and get no token volume.
      ...(this.options.serviceAccountAdmission ? [] : ['--disable-admission-plugins=ServiceAccount']),
      '--service-cluster-ip-range=10.0.0.0/24',
      '--allow-privileged=true',
      '--service-account-issuer=https://kubernetes.default.svc.cluster.local',
      `--service-account-key-file=${pki('sa.pub')}`,
      `--service-account-signing-key-file=${pki('sa.key')}`,
      // The endpoints reconciler rejects the loopback advertise address every 10 s (log noise only);
      // the `kubernetes` Service itself is still created.
      '--endpoint-reconciler-type=none',
      '--profiling=false',
      ...(this.options.goawayChance ? [`--goaway-chance=${this.options.goawayChance}`] : []),
      ...(this.options.extraApiServerArgs ?? []),
    ];
  }

  private async startApiServerOnFreePort(): Promise<void> {
    for (let attempt = 1; ; attempt++) {
      this.port = await freePort();
      try {
        await this.launchApiServer();
        return;
      } catch (err) {
        if (this.lastApiServerLines.some((l) => /address already in use/i.test(l)) && attempt < 5) continue;
        throw err;
      }
    }
  }

  private async launchApiServer(): Promise<void> {
    const started = performance.now();
    const proc = new ManagedProcess('kube-apiserver', join(this.binDir, 'kube-apiserver'), this.apiServerArgs(), this.verbose);
    this.apiserver = proc;
    let lastReadyz = '';
    try {
      await this.waitFor(
        'kube-apiserver',
        proc,
        started,
        async () => {
          const res = await this.adminRequest('GET', '/readyz', { timeoutMs: 5000 });
          lastReadyz = res.body;
          return res.status === 200;
        },
        () => (lastReadyz ? `last /readyz response:\n${lastReadyz}` : ''),
      );
      // Bootstrap objects that /readyz does not gate on everywhere: the system namespaces and RBAC roles.
      await this.waitFor('kube-apiserver', proc, started, async () => {
        for (const path of [
          '/api/v1/namespaces/default',
          '/api/v1/namespaces/kube-system',
          '/apis/rbac.authorization.k8s.io/v1/clusterroles/cluster-admin',
          '/apis/rbac.authorization.k8s.io/v1/clusterroles/system:basic-user',
          '/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/system:basic-user',
        ]) {
          if ((await this.adminRequest('GET', path, { timeoutMs: 5000 })).status !== 200) return false;
        }
        return true;
      });
      this.progress(`kube-apiserver ready at ${this.server} in ${Math.round(performance.now() - started)} ms`);
    } catch (err) {
      await proc.terminate(this.graceMs);
      this.lastApiServerLines = proc.lines;
      this.apiserver = undefined;
      throw err;
    }
  }

  private waitFor(name: string, proc: ManagedProcess, started: number, ready: () => Promise<boolean>, extra: () => string = () => ''): Promise<void> {
    return proc.waitReady(name, started, this.readyTimeoutMs, ready, extra);
  }

  stopApiServer(options: { signal?: 'SIGTERM' | 'SIGKILL' } = {}): Promise<void> {
    const next = this.apiServerTransition.then(async () => {
      const proc = this.apiserver;
      if (!proc) return;
      this.apiserver = undefined;
      await proc.terminate(options.signal === 'SIGKILL' ? 0 : this.graceMs);
      this.lastApiServerLines = proc.lines;
    });
    this.apiServerTransition = next.catch(() => {});
    return next;
  }

  startApiServer(): Promise<void> {
    const next = this.apiServerTransition.then(async () => {
      if (this.stopped) throw new Error('control plane was stopped');
      if (this.apiserver) return;
      // Same port: clients keep their URL. A just-closed listener can be reused at once (SO_REUSEADDR);
      // retry briefly anyway in case the previous process is still releasing it.
      for (let attempt = 1; ; attempt++) {
        try {
          await this.launchApiServer();
          return;
        } catch (err) {
          if (this.lastApiServerLines.some((l) => /address already in use/i.test(l)) && attempt < 10) {
            await sleep(500);
            continue;
          }
          throw err;
        }
      }
    });
    this.apiServerTransition = next.catch(() => {});
    return next;
  }

  // --- clients ----------------------------------------------------------------------------------

  adminRequest(method: string, path: string, options: AdminRequestOptions = {}): Promise<HttpResult> {
    const headers: Record<string, string> = { Accept: 'application/json, */*', ...options.headers };
    let payload: string | undefined;
    if (options.body !== undefined) {
      payload = typeof options.body === 'string' ? options.body : JSON.stringify(options.body);
      if (!Object.keys(headers).some((h) => h.toLowerCase() === 'content-type')) headers['Content-Type'] = 'application/json';
    }
    return new Promise<HttpResult>((resolveRequest, reject) => {
      const req = httpsRequest(
        new URL(path, this.server),
        {
          method,
          headers,
          ca: this.pki.ca.certPem,
          cert: this.pki.admin.certPem,
          key: this.pki.admin.keyPem,
          agent: false,
          timeout: options.timeoutMs ?? 30_000,
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () => resolveRequest({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }));
          res.on('error', reject);
        },
      );
      req.on('timeout', () => req.destroy(new Error(`${method} ${path} timed out`)));
      req.on('error', reject);
      req.end(payload);
    });
  }

  async metrics(): Promise<string> {
    const res = await this.adminRequest('GET', '/metrics', { headers: { Accept: 'text/plain' } });
    if (res.status !== 200) throw new Error(`GET /metrics: HTTP ${res.status}: ${res.body.slice(0, 500)}`);
    return res.body;
  }

  async kubeconfigFor(namespace: string, serviceAccount: string, options: { expirationSeconds?: number; pod?: string } = {}): Promise<string> {
    const path = `/api/v1/namespaces/${encodeURIComponent(namespace)}/serviceaccounts/${encodeURIComponent(serviceAccount)}/token`;
    const what = `${namespace}/${serviceAccount}${options.pod ? ` bound to Pod ${options.pod}` : ''}`;
    const res = await this.adminRequest('POST', path, {
      body: {
        apiVersion: 'authentication.k8s.io/v1',
        kind: 'TokenRequest',
        spec: {
          expirationSeconds: options.expirationSeconds ?? 24 * 3600,
          ...(options.pod ? { boundObjectRef: { apiVersion: 'v1', kind: 'Pod', name: options.pod } } : {}),
        },
      },
    });
    if (res.status !== 201 && res.status !== 200) {
      throw new Error(`TokenRequest for ${what}: HTTP ${res.status}: ${res.body.slice(0, 500)}`);
    }
    const token = (JSON.parse(res.body) as { status?: { token?: string } }).status?.token;
    if (!token) throw new Error(`TokenRequest for ${what} returned no token`);
    const file = join(this.dir, `sa-${namespace}-${serviceAccount}${options.pod ? `-pod-${options.pod}` : ''}.kubeconfig`);
    // Written aside and renamed: replicas started together ask for the same file, and one of them may
    // be reading it while another rewrites it (a truncated file reads as an empty kubeconfig).
    const partial = `${file}.${randomBytes(4).toString('hex')}.tmp`;
    await writeFile(
      partial,
      yamlKubeconfig({
        server: this.server,
        caPem: this.caPem,
        userName: `system:serviceaccount:${namespace}:${serviceAccount}`,
        user: { token },
        namespace,
      }),
      { mode: 0o600 },
    );
    await rename(partial, file);
    return file;
  }

  kubectl(args: string[], options: KubectlOptions = {}): Promise<CommandResult> {
    const kubeconfig = options.kubeconfig ?? this.adminKubeconfigPath;
    return runCommand([join(this.binDir, 'kubectl'), `--kubeconfig=${kubeconfig}`, ...args], options);
  }

  async rss(): Promise<{ apiserver?: number; etcd?: number }> {
    const read = async (pid: number | undefined): Promise<number | undefined> => {
      if (pid === undefined) return undefined;
      try {
        const status = await readFile(`/proc/${pid}/status`, 'utf8');
        const kb = /^VmRSS:\s+(\d+)\s+kB/m.exec(status)?.[1];
        return kb === undefined ? undefined : Number(kb) * 1024;
      } catch {
        return undefined;
      }
    };
    const result: { apiserver?: number; etcd?: number } = {};
    const apiserver = await read(this.apiserver?.pid);
    const etcd = await read(this.etcd?.pid);
    if (apiserver !== undefined) result.apiserver = apiserver;
    if (etcd !== undefined) result.etcd = etcd;
    return result;
  }

  logs(): { apiserver: string[]; etcd: string[] } {
    return {
      apiserver: [...(this.apiserver?.lines ?? this.lastApiServerLines)],
      etcd: [...(this.etcd?.lines ?? this.lastEtcdLines)],
    };
  }

  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    await this.apiServerTransition;
    const apiserver = this.apiserver;
    this.apiserver = undefined;
    if (apiserver) {
      await apiserver.terminate(this.graceMs);
      this.lastApiServerLines = apiserver.lines;
    }
    const etcd = this.etcd;
    this.etcd = undefined;
    if (etcd) {
      await etcd.terminate(this.graceMs);
      this.lastEtcdLines = etcd.lines;
    }
    if (!this.options.keepTempDir) {
      await rm(this.dir, { recursive: true, force: true, maxRetries: 3 });
      liveTempDirs.delete(this.dir);
    } else {
      liveTempDirs.delete(this.dir);
      process.stderr.write(`control plane: kept ${this.dir}\n`);
    }
  }
}

function plainGet(url: string): Promise<{ status: number; body: string }> {
  return new Promise((resolveGet, reject) => {
    const req = httpRequest(url, { agent: false, timeout: 2000 }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => resolveGet({ status: res.statusCode ?? 0, body }));
      res.on('error', reject);
    });
    req.on('timeout', () => req.destroy(new Error(`GET ${url} timed out`)));
    req.on('error', reject);
    req.end();
  });
}

const TEMP_PREFIX = 'certshare-cp-';

/** Removes temp dirs left by control planes whose Node process died without cleaning up (e.g. SIGKILL). */
async function sweepStaleTempDirs(): Promise<void> {
  let names: string[];
  try {
    names = (await readdir(tmpdir())).filter((n) => n.startsWith(TEMP_PREFIX));
  } catch {
    return;
  }
  for (const name of names) {
    const dir = join(tmpdir(), name);
    try {
      const pid = Number((await readFile(join(dir, 'owner.pid'), 'utf8')).trim());
      if (!Number.isInteger(pid) || pid <= 0) continue;
      try {
        process.kill(pid, 0);
        continue; // owner alive
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ESRCH') continue;
      }
      await rm(dir, { recursive: true, force: true });
    } catch {
      // not ours, unreadable or being removed: leave it
    }
  }
}

/**
 * Starts etcd and kube-apiserver on free loopback ports with fresh certificates in a temp dir, and
 * resolves once /readyz is 200 and the bootstrap namespaces/RBAC roles exist. The first call may build
 * the binaries (see k8sBinDir()): callers in node:test hooks should give the hook a long timeout
 * (useControlPlane() in ./use-control-plane.ts does).
 */
export async function startControlPlane(options: ControlPlaneOptions = {}): Promise<ControlPlane> {
  const binDir = options.binDir ?? (await k8sBinDir());
  installExitHook();
  await sweepStaleTempDirs();
  const dir = await mkdtemp(join(tmpdir(), TEMP_PREFIX));
  liveTempDirs.add(dir);
  await writeFile(join(dir, 'owner.pid'), `${process.pid}\n`);
  const cp = new ControlPlaneImpl(binDir, dir, options);
  try {
    await cp.init();
  } catch (err) {
    await cp.stop().catch(() => {});
    throw err;
  }
  return cp;
}
