// A real tailscaled for tests: tailscaled, Tailscale's test control server and the pebble ACME server
// (tsenv), built from Go modules by test/tailscale-binaries/build.sh, all inside a network namespace
// with only loopback. tailscaled looks up `_acme-challenge.<domain>` through the system resolver on
// every issuance: nothing of this may reach the machine's own network or DNS. Tests (and certshare)
// stay outside and reach tailscaled through its unix socket, tsenv through its admin socket, and the ACME
// front (for ACME Renewal Information) through a TCP relay on the host's loopback to tsenv's ACME socket.
import { spawnSync } from 'node:child_process';
import { request } from 'node:http';
import type { Socket } from 'node:net';
import { rmSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, readlink, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { after, before } from 'node:test';
import { buildOnce, ManagedProcess } from './control-plane.ts';
import { get, type ReqOptions, type Resp } from '../support/emulator.ts';
import { startTcpProxy, type TcpProxy } from '../support/tcp-proxy.ts';

const BUILD_SCRIPT = resolve(import.meta.dirname, '../tailscale-binaries/build.sh');
/** Bound on building the binaries (minutes on a cold cache) and starting everything. */
export const BUILD_AND_START_TIMEOUT_MS = 30 * 60_000;

/** The node's hostname and MagicDNS suffix tsenv's control server is given: the one cert domain. */
export const TS_HOSTNAME = 'web';
export const TS_MAGICDNS = 'tailnet-test.ts.net';
export const TS_DOMAIN = `${TS_HOSTNAME}.${TS_MAGICDNS}`;

export interface AcmeStats {
  /** New orders that reached pebble, by their comma-joined identifiers. */
  newOrders: Record<string, number>;
  /** Sum of newOrders. */
  orders: number;
  finalizes: number;
  /** New orders answered 429 rateLimited by the front (see rateLimitOrders). */
  rateLimited: number;
  /** renewalInfo GETs by ARI certificate ID (`<base64url AKI>.<base64url serial>`), whoever asked. */
  renewalInfo: Record<string, number>;
}

/** One node as control sees its Tailscale Services (tsenv GET /vip-services). */
export interface ControlVipServices {
  ID: number;
  Hostname: string;
  /** From the node's last Hostinfo: changes when its services change, and tells control to fetch them. */
  HostinfoServicesHash: string;
  /** The node answered control's c2n request within the timeout (connected to control). */
  Online: boolean;
  /** The node's answer to control's c2n GET /vip-services (tailcfg.C2NVIPServicesResponse); null when it did not answer. */
  C2N: { VIPServices: Array<{ Name: string; Active?: boolean }> | null; ServicesHash: string } | null;
}

/**
 * The Tailscale Services control would send clients to on this node: it is connected, its last Hostinfo
 * matches what it lists (control has fetched the list), and the Service is listed active.
 */
export function servicesControlSees(node: ControlVipServices): string[] | undefined {
  if (!node.Online || !node.C2N || node.HostinfoServicesHash !== node.C2N.ServicesHash) return undefined;
  return (node.C2N.VIPServices ?? [])
    .filter((s) => s.Active)
    .map((s) => s.Name)
    .sort();
}

/** A Tailscale Service as Tailscale's API represents it (its VIPService), stored by tsenv's stand-in (tailscaleApi). */
export interface ApiVipService {
  name: string;
  /** The VIP: IPv4, then IPv6, given at creation. */
  addrs?: string[];
  comment?: string;
  annotations?: Record<string, string>;
  ports?: string[];
  tags?: string[];
}

/** A Tailscale Service's VIP as tsenv's control hands it out (GET /service-vips, with serviceVips). */
export interface ServiceVip {
  Service: string;
  /** IPv4, then IPv6. */
  Addrs: string[];
  /** Hostnames of the nodes hosting it now, the oldest first. */
  Hosts: string[];
  /** The host whose AllowedIPs carry the VIP (where clients' connections go); '' with none. */
  Primary: string;
}

/** Another tailscaled logged in to the same control server, in the same namespace (RealTailscaled.addNode). */
export interface TailnetNode {
  readonly hostname: string;
  /** Its LocalAPI socket. */
  readonly socket: string;
  localApi(path: string, options?: ReqOptions): Promise<Resp>;
  /**
   * A TCP connection from this node through the tailnet (LocalAPI POST /localapi/v0/dial, what `tailscale nc`
   * uses): `host` a MagicDNS name (a Service's among them) or an address. Rejects when tailscaled has no
   * tailnet route to it (it answers Dial-Self: dial it yourself) or cannot dial.
   */
  dial(host: string, port: number): Promise<Socket>;
}

export interface RealTailscaledOptions {
  /** The cert domain is in the netmap from the start; otherwise it appears on enableCertDomains(). */
  certDomainsAtStart?: boolean;
  /** Lifetime of pebble's certificates, a Go duration (e.g. `120s`). Default 90 days. */
  certValidity?: string;
  /** Stream the processes' output to stderr. Default: env CERTSHARE_TS_VERBOSE=1. */
  verbose?: boolean;
  /** Bound on each process becoming ready, excluding the build. Default 60 s. */
  readyTimeoutMs?: number;
  /**
   * Control grants `<label>.<magicDnsDomain>` as a cert domain only while a node advertises `svc:<label>`
   * (tsenv --service-hosts-only), as real control grants a Service's domain only to its hosts.
   */
  serviceHostsOnly?: boolean;
  /** The node's hostname and MagicDNS suffix: the cert domain is `<hostname>.<magicDnsDomain>`. Default TS_DOMAIN's. */
  hostname?: string;
  magicDnsDomain?: string;
  /**
   * What tailscaled reads as /etc/passwd (bind-mounted in a mount namespace of its own; needs root): how a
   * Pod's passwd file lets tailscaled resolve its operator by name (src/injector/tailscale-operator.ts).
   */
  passwd?: string;
  /**
   * With `passwd`: a directory (a Pod's socket volume's mountPath) where tailscaled's mount namespace sees the
   * instance's dir, as tailscaled's container sees the volume; `socket` stays the path the other containers use.
   */
  socketVolumeAt?: string;
  /** `tailscale up --operator=<user>`, as containerboot's TS_EXTRA_ARGS passes it. */
  operator?: string;
  /** TS_PERMIT_CERT_UID: a uid that may fetch certificates (PermitCert) without being the operator. */
  permitCertUid?: string;
  /** Control routes each Tailscale Service's VIP to one of its hosts (tsenv --service-vips). */
  serviceVips?: boolean;
  /**
   * tsenv serves, on control's URL, the part of Tailscale's API that Tailscale's Kubernetes operator needs (tsenv
   * --tailscale-api: an OAuth token, auth keys, device deletions, Tailscale Services); apiCalls() lists the calls.
   */
  tailscaleApi?: boolean;
}

export interface RealTailscaled {
  /** tailscaled's LocalAPI socket (what certshare's --localapi takes). */
  readonly socket: string;
  /** The same socket, named as an emulator's (standaloneDaemon takes either). */
  readonly address: string;
  readonly domain: string;
  /** Temp dir of this instance (state, sockets, CA bundle); removed by stop(). */
  readonly dir: string;
  /** Directory holding tailscaled, tailscale and tsenv. */
  readonly binDir: string;
  /** PEM file with the CA of the ACME front's TLS certificate (and pebble's root): what NODE_EXTRA_CA_CERTS names. */
  readonly acmeCaBundle: string;
  /**
   * The ACME directory URL (https) as reached from this machine, outside the namespace: a loopback relay to
   * tsenv's ACME socket, started on the first call. What certshare's --acme-directory takes.
   */
  acmeDirectoryUrl(): Promise<string>;
  /**
   * pebble's management endpoint: renewalInfo answers `answer` (any text, used as is) for the certificate
   * `certPem` (the first PEM certificate counts) from now on.
   */
  setRenewalInfo(certPem: string, answer: string): Promise<void>;
  /** Revokes the certificate of a PEM pair (key and chain): ACME revokeCert signed with the certificate's own key. */
  revoke(pairPem: string): Promise<void>;
  /** Makes the control server send the cert domain (a netmap update reaches tailscaled). */
  enableCertDomains(): Promise<void>;
  /** What control knows of the nodes' Tailscale Services: the hash in their Hostinfo, and the list it fetches (c2n). */
  vipServices(): Promise<ControlVipServices[]>;
  /** Each Service's VIP, hosts and primary as control routes them (serviceVips). */
  serviceVips(): Promise<ServiceVip[]>;
  /** Starts another tailscaled (`hostname`) in the namespace and logs it in to the same control; stopped by stop(). */
  addNode(hostname: string): Promise<TailnetNode>;
  /** Control's URL, as reached inside the namespace (`tailscale up --login-server`, OPERATOR_LOGIN_SERVER). */
  readonly controlUrl: string;
  /** Every call to tsenv's Tailscale API stand-in so far (tailscaleApi), "METHOD path N", sorted. */
  apiCalls(): Promise<string[]>;
  /** The Tailscale Services created through that API stand-in, as Tailscale's API represents them, by name. */
  apiVipServices(): Promise<ApiVipService[]>;
  /** Runs `command` in the namespace with `env` added (only loopback there); stopped by stop(). */
  runInNamespace(name: string, command: string[], env?: Record<string, string>): ManagedProcess;
  acmeStats(): Promise<AcmeStats>;
  /** The next `orders` new orders are answered 429 rateLimited with Retry-After `retryAfterSeconds`. */
  rateLimitOrders(orders: number, retryAfterSeconds: number): Promise<void>;
  /** SIGTERM tailscaled (state kept in the state dir). */
  stopTailscaled(): Promise<void>;
  /**
   * Writes tailscaled's config file (ipn.ConfigVAlpha, as containerboot's operator writes it) and, the first
   * time, restarts tailscaled from it (`--config`, state kept); later calls only write it. Returns its path.
   */
  writeConfigFile(config: Record<string, unknown>): Promise<string>;
  /** Starts tailscaled again with the same state; resolves once its LocalAPI answers and it is Running. */
  startTailscaled(): Promise<void>;
  /**
   * Stops tailscaled and starts Tailscale's containerboot (the image's entrypoint, same version) in its place,
   * as a ProxyGroup Pod runs it: TS_EXPERIMENTAL_VERSIONED_CONFIG_DIR=`configDir`, so it starts `tailscaled
   * --config` from the cap-<N>.hujson there and reloads it whenever the directory's `..data` link changes (the
   * kubelet's swap of a mounted Secret); state kept. Resolves once the LocalAPI answers and it is Running. `env`
   * adds to its environment (the operator's TS_SERVE_CONFIG, TS_EXPERIMENTAL_SERVICE_AUTO_ADVERTISEMENT).
   */
  startContainerboot(configDir: string, env?: Record<string, string>): Promise<void>;
  /**
   * The same without a config file, as the example's Pods run it: containerboot logs in (`tailscale up`, the state
   * kept) and applies the ServeConfig file `serveConfig` (TS_SERVE_CONFIG), watching it; `env` adds to its environment.
   */
  startContainerbootServing(serveConfig: string, env?: Record<string, string>): Promise<void>;
  readonly tailscaledRunning: boolean;
  /** The pid of tailscaled (or containerboot, which runs it) while running: its mount namespace is the container's. */
  readonly tailscaledPid: number | undefined;
  /** Raw LocalAPI GET (status, headers, body as text). */
  localApi(path: string): Promise<Resp>;
  /** Last lines of each process's output, for diagnostics. */
  logs(): { tailscaled: string[]; tsenv: string[] };
  /** Stops everything and removes the temp dir. Idempotent. */
  stop(): Promise<void>;
}

/**
 * Directory holding tailscaled, tailscale and tsenv: the last stdout line of build.sh, which builds them
 * once (minutes cold; progress on stderr) and honours CERTSHARE_TAILSCALE_BIN. Memoised per process.
 */
export function tailscaleBinDir(): Promise<string> {
  return buildOnce(BUILD_SCRIPT, ['tailscaled', 'tailscale', 'tsenv']);
}

/**
 * How to make and join the namespace: as root a plain network namespace; otherwise a user namespace
 * mapping us to root inside it, which unprivileged users may create on most distributions.
 */
function namespaceCommands(): { create: string[]; enter: (pid: number) => string[] } {
  if (process.getuid?.() === 0) return { create: ['unshare', '--net', '--'], enter: (pid) => ['nsenter', '-t', String(pid), '--net', '--'] };
  return {
    create: ['unshare', '--map-root-user', '--net', '--'],
    enter: (pid) => ['nsenter', '-t', String(pid), '--user', '--net', '--preserve-credentials', '--'],
  };
}

interface TsenvReady {
  control: string;
  acme: string;
  bundle: string;
  admin: string;
  acmeSocket: string;
}

class RealTailscaledImpl implements RealTailscaled {
  readonly binDir: string;
  readonly dir: string;
  readonly domain: string;
  readonly hostname: string;
  readonly magicDnsDomain: string;
  readonly verbose: boolean;
  readonly readyTimeoutMs: number;
  readonly options: RealTailscaledOptions;
  private holder: ManagedProcess | undefined;
  private tsenv: ManagedProcess | undefined;
  private tailscaled: ManagedProcess | undefined;
  private lastTailscaledLines: string[] = [];
  private ready!: TsenvReady;
  private acmeRelay: Promise<TcpProxy> | undefined;
  private enter!: string[];
  private stopped = false;

  constructor(binDir: string, dir: string, options: RealTailscaledOptions) {
    this.binDir = binDir;
    this.dir = dir;
    this.options = options;
    this.verbose = options.verbose ?? process.env.CERTSHARE_TS_VERBOSE === '1';
    this.readyTimeoutMs = options.readyTimeoutMs ?? 60_000;
    this.hostname = options.hostname ?? TS_HOSTNAME;
    this.magicDnsDomain = options.magicDnsDomain ?? TS_MAGICDNS;
    this.domain = `${this.hostname}.${this.magicDnsDomain}`;
  }

  get socket(): string {
    return join(this.dir, 'tailscaled.sock');
  }
  get address(): string {
    return this.socket;
  }
  get tailscaledRunning(): boolean {
    return this.tailscaled !== undefined;
  }
  get tailscaledPid(): number | undefined {
    return this.tailscaled?.pid;
  }

  async init(): Promise<void> {
    const ns = namespaceCommands();
    // The holder keeps the namespace alive across tailscaled restarts; `unshare` execs it, so its pid
    // is the namespace's.
    const [unshare, ...createArgs] = ns.create;
    this.holder = new ManagedProcess('netns', unshare!, [...createArgs, 'sleep', 'infinity'], this.verbose);
    const holderPid = this.holder.pid;
    if (holderPid === undefined) throw new Error(`could not start ${ns.create.join(' ')}: ${this.holder.tail()}`);
    this.enter = ns.enter(holderPid);
    // The namespace exists once the holder runs in it: wait until `ip` in it sees only loopback.
    await this.poll('network namespace', this.holder, async () => {
      const res = this.run([...this.enter, 'ip', '-o', 'link', 'show']);
      return res.status === 0 && /^1: lo:/m.test(res.stdout) && !/^2: /m.test(res.stdout);
    });
    const up = this.run([...this.enter, 'ip', 'link', 'set', 'lo', 'up']);
    if (up.status !== 0) throw new Error(`ip link set lo up in the namespace failed: ${up.stderr}`);

    const tsenvArgs = ['--dir', this.dir, '--magicdns-domain', this.magicDnsDomain];
    if (this.options.certValidity) tsenvArgs.push('--validity', this.options.certValidity);
    if (this.options.certDomainsAtStart) tsenvArgs.push('--cert-domains');
    if (this.options.serviceHostsOnly) tsenvArgs.push('--service-hosts-only');
    if (this.options.serviceVips) tsenvArgs.push('--service-vips');
    if (this.options.tailscaleApi) tsenvArgs.push('--tailscale-api');
    if (this.verbose) tsenvArgs.push('-v');
    this.tsenv = this.inNamespace('tsenv', [join(this.binDir, 'tsenv'), ...tsenvArgs]);
    let line: string | undefined;
    await this.poll('tsenv', this.tsenv, async () => {
      line = this.tsenv!.lines.find((l) => l.startsWith('{"control"'));
      return line !== undefined;
    });
    this.ready = JSON.parse(line!) as TsenvReady;

    await this.startTailscaled();
    await this.login(this.socket, this.hostname, this.tailscaled!, this.options.operator ? [`--operator=${this.options.operator}`] : []);
  }

  /** `tailscale up` against tsenv's control for the tailscaled at `socket`. */
  private async login(socket: string, hostname: string, tailscaled: ManagedProcess, more: string[]): Promise<void> {
    const login = this.inNamespace('tailscale up', [
      join(this.binDir, 'tailscale'),
      `--socket=${socket}`,
      'up',
      `--login-server=${this.ready.control}`,
      `--hostname=${hostname}`,
      `--timeout=${Math.round(this.readyTimeoutMs / 1000)}s`,
      ...more,
    ]);
    const keepAlive = setInterval(() => {}, 1000); // ManagedProcess children are unreferenced
    const exit = await login.exited.finally(() => clearInterval(keepAlive));
    if (exit.code !== 0) throw new Error(`tailscale up failed (code ${exit.code}):\n${login.tail()}\ntailscaled:\n${tailscaled.tail()}`);
  }

  /** tailscaled's flags for a node of its own files (`dir`), and its environment: what every node here shares. */
  private tailscaledCommand(dir: string): { args: string[]; env: Record<string, string> } {
    return {
      args: [
        join(this.binDir, 'tailscaled'),
        '--tun=userspace-networking',
        `--socket=${join(dir, 'tailscaled.sock')}`,
        `--statedir=${join(dir, 'state')}`,
        '--port=0',
        '--no-logs-no-support',
      ],
      env: {
        TS_DEBUG_ACME_DIRECTORY_URL: this.ready.acme,
        SSL_CERT_FILE: this.ready.bundle,
        // With only loopback, tailscaled would otherwise wait for a network that never comes.
        TS_ASSUME_NETWORK_UP_FOR_TEST: '1',
      },
    };
  }

  private readonly nodes: Array<{ proc: ManagedProcess }> = [];

  async addNode(hostname: string): Promise<TailnetNode> {
    if (this.stopped) throw new Error('real tailscaled was stopped');
    const dir = join(this.dir, hostname);
    await mkdir(dir);
    const { args, env } = this.tailscaledCommand(dir);
    const proc = this.inNamespace(`tailscaled ${hostname}`, args, env);
    this.nodes.push({ proc });
    const socket = join(dir, 'tailscaled.sock');
    await this.poll(`tailscaled ${hostname}`, proc, async () => (await get(socket, '/localapi/v0/status?peers=false')).status === 200);
    await this.login(socket, hostname, proc, []);
    return {
      hostname,
      socket,
      localApi: (path, options) => get(socket, path, options),
      dial: (host, port) => dialThrough(socket, host, port),
    };
  }

  get controlUrl(): string {
    return this.ready.control;
  }

  async apiCalls(): Promise<string[]> {
    return JSON.parse((await this.admin('GET', '/api-calls')).body) as string[];
  }

  async apiVipServices(): Promise<ApiVipService[]> {
    return JSON.parse((await this.admin('GET', '/api-vip-services')).body) as ApiVipService[];
  }

  private readonly others: ManagedProcess[] = [];

  runInNamespace(name: string, command: string[], env: Record<string, string> = {}): ManagedProcess {
    if (this.stopped) throw new Error('real tailscaled was stopped');
    const proc = this.inNamespace(name, command, env);
    this.others.push(proc);
    return proc;
  }

  /** A command in the namespace, under the death-signal prefix (ManagedProcess adds it). */
  /**
   * SIGKILLs every process left in the namespace but its holder: a child whose parent was killed first (containerboot's
   * tailscaled) is reparented outside this harness's reach and outlives the run otherwise.
   */
  private async killNamespace(): Promise<void> {
    const holderPid = this.holder?.pid;
    if (holderPid === undefined) return;
    const namespace = await readlink(`/proc/${holderPid}/ns/net`).catch(() => undefined);
    // Never the test's own namespace (the holder already gone, its pid reused).
    if (namespace === undefined || namespace === (await readlink('/proc/self/ns/net'))) return;
    for (const entry of await readdir('/proc')) {
      if (!/^\d+$/.test(entry) || Number(entry) === holderPid) continue;
      if ((await readlink(`/proc/${entry}/ns/net`).catch(() => undefined)) !== namespace) continue;
      try {
        process.kill(Number(entry), 'SIGKILL');
      } catch {
        // Gone meanwhile.
      }
    }
  }

  private inNamespace(name: string, command: string[], env: Record<string, string> = {}): ManagedProcess {
    const [enter, ...enterArgs] = this.enter;
    const envArgs = Object.entries(env).map(([k, v]) => `${k}=${v}`);
    // `env` and `nsenter` exec: the pid is the program's own.
    return new ManagedProcess(name, enter!, [...enterArgs, 'env', ...envArgs, ...command], this.verbose);
  }

  private run(command: string[]): { status: number | null; stdout: string; stderr: string } {
    const res = spawnSync(command[0]!, command.slice(1), { encoding: 'utf8', timeout: 10_000 });
    return { status: res.status, stdout: res.stdout ?? '', stderr: res.stderr ?? String(res.error ?? '') };
  }

  /** Waits (polling) until `ready`, failing when the process exits first or after readyTimeoutMs. */
  private poll(name: string, proc: ManagedProcess, ready: () => Promise<boolean>): Promise<void> {
    return proc.waitReady(name, performance.now(), this.readyTimeoutMs, ready);
  }

  async startTailscaled(): Promise<void> {
    if (this.stopped) throw new Error('real tailscaled was stopped');
    if (this.tailscaled) return;
    let asPod: string[] = [];
    if (this.options.passwd !== undefined) {
      const passwd = join(this.dir, 'passwd');
      await writeFile(passwd, this.options.passwd, { mode: 0o644 });
      // A mount namespace of tailscaled's own, its /etc/passwd the file (and the dir at socketVolumeAt); `unshare` and
      // `sh` exec: the pid is tailscaled's.
      const script = 'mount --bind "$0" /etc/passwd && if [ -n "$1" ]; then mkdir -p "$1" && mount --bind "$2" "$1" || exit 1; fi; shift 2; exec "$@"';
      asPod = ['unshare', '--mount', '--propagation', 'private', '--', 'sh', '-c', script, passwd, this.options.socketVolumeAt ?? '', this.dir];
    }
    const own = this.tailscaledCommand(this.dir);
    const command = this.containerbootEnv ? [join(this.binDir, 'containerboot')] : [...own.args, ...(this.configPath ? [`--config=${this.configPath}`] : [])];
    // containerboot runs `tailscaled` from PATH with these flags (and `tailscale up`, but in config-file mode).
    const containerboot: Record<string, string> = this.containerbootEnv
      ? {
          PATH: `${this.binDir}:${process.env.PATH ?? '/usr/bin:/bin'}`,
          TS_SOCKET: this.socket,
          TS_STATE_DIR: join(this.dir, 'state'),
          TS_USERSPACE: 'true',
          TS_TAILSCALED_EXTRA_ARGS: '--port=0 --no-logs-no-support',
          ...this.containerbootEnv,
        }
      : {};
    const proc = this.inNamespace('tailscaled', [...asPod, ...command], {
      ...containerboot,
      ...own.env,
      ...(this.options.permitCertUid ? { TS_PERMIT_CERT_UID: this.options.permitCertUid } : {}),
    });
    this.tailscaled = proc;
    try {
      // Ready: the LocalAPI answers; after a restart with saved state, also back in Running. Under containerboot, also
      // its start-up done: it watches the config file only from then on, and reads the file as it is then.
      let startupComplete = !this.containerbootEnv;
      await this.poll('tailscaled', proc, async () => {
        startupComplete ||= proc.lines.some((l) => l.includes('Startup complete, waiting for shutdown signal'));
        if (!startupComplete) return false;
        const res = await this.localApi('/localapi/v0/status?peers=false');
        if (res.status !== 200) return false;
        return !this.loggedIn || (JSON.parse(res.body) as { BackendState?: string }).BackendState === 'Running';
      });
    } catch (err) {
      await proc.terminate(5000);
      this.lastTailscaledLines = proc.lines;
      this.tailscaled = undefined;
      throw err;
    }
    this.loggedIn = true;
  }

  /** Set once tailscaled first came up: every later start must reach Running from its saved state. */
  private loggedIn = false;

  /** containerboot runs tailscaled, with this environment of its own (startContainerboot, startContainerbootServing). */
  private containerbootEnv: Record<string, string> | undefined;

  async startContainerboot(configDir: string, env: Record<string, string> = {}): Promise<void> {
    await this.stopTailscaled();
    this.containerbootEnv = { TS_EXPERIMENTAL_VERSIONED_CONFIG_DIR: configDir, ...env };
    await this.startTailscaled();
  }

  async startContainerbootServing(serveConfig: string, env: Record<string, string> = {}): Promise<void> {
    await this.stopTailscaled();
    this.containerbootEnv = {
      TS_AUTHKEY: 'tskey-auth-test',
      TS_AUTH_ONCE: 'true',
      TS_HOSTNAME: this.hostname,
      TS_EXTRA_ARGS: `--login-server=${this.ready.control}`,
      TS_SERVE_CONFIG: serveConfig,
      ...env,
    };
    await this.startTailscaled();
  }

  /** tailscaled runs from this config file (writeConfigFile). */
  private configPath: string | undefined;

  async writeConfigFile(config: Record<string, unknown>): Promise<string> {
    const path = join(this.dir, 'tailscaled.hujson');
    await writeFile(path, JSON.stringify(config));
    if (this.configPath !== path) {
      this.configPath = path;
      await this.stopTailscaled();
      await this.startTailscaled();
    }
    return path;
  }

  async stopTailscaled(): Promise<void> {
    const proc = this.tailscaled;
    if (!proc) return;
    this.tailscaled = undefined;
    await proc.terminate(10_000);
    this.lastTailscaledLines = proc.lines;
  }

  localApi(path: string): Promise<Resp> {
    return get(this.socket, path);
  }

  get acmeCaBundle(): string {
    return this.ready.bundle;
  }

  acmeDirectoryUrl(): Promise<string> {
    this.acmeRelay ??= startTcpProxy({ path: this.ready.acmeSocket });
    return this.acmeRelay.then((relay) => `https://127.0.0.1:${relay.port}${new URL(this.ready.acme).pathname}`);
  }

  async setRenewalInfo(certPem: string, answer: string): Promise<void> {
    await this.admin('POST', '/set-renewal-info/', JSON.stringify({ Certificate: certPem, ARIResponse: answer }));
  }

  async revoke(pairPem: string): Promise<void> {
    await this.admin('POST', '/revoke', pairPem);
  }

  private async admin(method: string, path: string, body?: string): Promise<Resp> {
    // pebble's management endpoints refuse a request without a User-Agent.
    const res = await get(this.ready.admin, path, { method, headers: { 'user-agent': 'certshare-tests' }, ...(body === undefined ? {} : { body }) });
    if (res.status >= 300) throw new Error(`tsenv ${method} ${path}: HTTP ${res.status}: ${res.body}`);
    return res;
  }

  async vipServices(): Promise<ControlVipServices[]> {
    const res = await this.admin('GET', '/vip-services');
    return JSON.parse(res.body) as ControlVipServices[];
  }

  async serviceVips(): Promise<ServiceVip[]> {
    return JSON.parse((await this.admin('GET', '/service-vips')).body) as ServiceVip[];
  }

  async enableCertDomains(): Promise<void> {
    await this.admin('POST', '/cert-domains');
  }

  async acmeStats(): Promise<AcmeStats> {
    return JSON.parse((await this.admin('GET', '/stats')).body) as AcmeStats;
  }

  async rateLimitOrders(orders: number, retryAfterSeconds: number): Promise<void> {
    await this.admin('POST', `/rate-limit?orders=${orders}&retry-after=${retryAfterSeconds}`);
  }

  logs(): { tailscaled: string[]; tsenv: string[] } {
    return { tailscaled: [...(this.tailscaled?.lines ?? this.lastTailscaledLines)], tsenv: [...(this.tsenv?.lines ?? [])] };
  }

  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    await Promise.all([...this.others, ...this.nodes.map((n) => n.proc)].map((proc) => proc.terminate(10_000)));
    await this.stopTailscaled();
    await (await this.acmeRelay?.catch(() => undefined))?.close();
    await this.tsenv?.terminate(5000);
    await this.killNamespace();
    await this.holder?.terminate(0);
    await rm(this.dir, { recursive: true, force: true, maxRetries: 3 });
    liveDirs.delete(this.dir);
  }
}

/**
 * A real tailscaled for the enclosing describe block: started in before() (with the build's long
 * timeout), stopped in after(). Call the accessor in tests.
 */
export function useRealTailscaled(options: RealTailscaledOptions = {}): () => RealTailscaled {
  let ts: RealTailscaled | undefined;
  before(
    async () => {
      ts = await startRealTailscaled(options);
    },
    { timeout: BUILD_AND_START_TIMEOUT_MS },
  );
  after(() => ts?.stop());
  return () => {
    if (!ts) throw new Error('useRealTailscaled(): before() hook has not run');
    return ts;
  };
}

const liveDirs = new Set<string>();
let exitHookInstalled = false;

/**
 * Starts the namespace, tsenv and tailscaled, and logs tailscaled in (`tailscale up`); resolves once it
 * is Running. The first call may build the binaries (see tailscaleBinDir()): give the hook a long timeout.
 * Processes die with this Node process (ManagedProcess: exit hook and parent-death signal).
 */
export async function startRealTailscaled(options: RealTailscaledOptions = {}): Promise<RealTailscaled> {
  const binDir = await tailscaleBinDir();
  if (!exitHookInstalled) {
    exitHookInstalled = true;
    process.on('exit', () => {
      for (const dir of liveDirs) rmSync(dir, { recursive: true, force: true });
    });
  }
  // Short: unix socket paths are limited to 107 bytes.
  const dir = await mkdtemp(join(tmpdir(), 'certshare-ts-'));
  liveDirs.add(dir);
  const ts = new RealTailscaledImpl(binDir, dir, options);
  try {
    await ts.init();
  } catch (err) {
    await ts.stop().catch(() => {});
    throw err;
  }
  return ts;
}

/** TailnetNode.dial: LocalAPI POST /localapi/v0/dial, upgraded to the raw connection (`ts-dial`), through the tailscaled at `socket`. */
export function dialThrough(socket: string, host: string, port: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const req = request({
      socketPath: socket,
      path: '/localapi/v0/dial',
      method: 'POST',
      headers: { Host: 'local-tailscaled.sock', Connection: 'upgrade', Upgrade: 'ts-dial', 'Dial-Host': host, 'Dial-Port': String(port) },
      agent: false,
    });
    req.once('upgrade', (_res, conn, head) => {
      if (head.length > 0) conn.unshift(head);
      resolve(conn);
    });
    req.once('response', (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => {
        const self = res.headers['dial-self'] === 'true' ? ` (Dial-Self: no tailnet route to ${String(res.headers['dial-addr'])})` : '';
        reject(new Error(`dial ${host}:${port}: HTTP ${res.statusCode}${self} ${body.trim()}`));
      });
    });
    req.once('error', reject);
    req.end();
  });
}
