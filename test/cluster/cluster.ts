// A real single-node Kubernetes for the end-to-end tier: etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler, kube-proxy, a kubelet and containerd, with dnsmasq as the cluster DNS, all inside a
// network namespace of their own (loopback, a veth carrying the node IP, the CNI bridge; no route out).
// Pods, Services, readiness gates, SIGTERM order and RBAC are then the kubelet's and the controllers'
// own, not assumed. ../../../shared/KUBELET.md has the facts each setting below comes from.
//
// Needs root (network namespace, cgroups, mounts) and the Debian packages of ./install.sh. One cluster
// per machine at a time: a lock (flock) serialises starts, and a start first cleans what a crashed run
// left (processes, mounts, cgroups, the namespace, the kernel settings the kubelet changed), found by
// fixed paths: the kubelet and containerd touch fixed host paths whatever their flags.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import { mkdir, readdir, readFile, readlink, rename, rm, rmdir, unlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { type CommandResult, k8sBinDir, ManagedProcess, runCommand, yamlKubeconfig } from '../harness/control-plane.ts';
import { createControlPlanePki } from '../harness/pki.ts';

/** Fixed, so that a start finds what a crashed run left. */
export const CLUSTER_ROOT = '/var/lib/certshare-cluster';
const LOCK_FILE = `${CLUSTER_ROOT}.lock`;
/** The host's kernel settings before the kubelet changed them, and the fixed paths that did not exist. */
const HOST_STATE_FILE = `${CLUSTER_ROOT}.host.json`;
export const NETNS = 'certshare-k8s';
export const NODE_NAME = 'certshare-node';
export const NODE_IP = '10.200.0.1';
export const POD_CIDR = '10.201.0.0/24';
export const SERVICE_CIDR = '10.0.0.0/24';
const API_PORT = 6443;
/** The kubelet sets these (global, not per namespace): put back on stop. */
const KUBELET_SYSCTLS = ['vm/overcommit_memory', 'kernel/panic', 'kernel/panic_on_oops'];
/** Host paths the kubelet or containerd create whatever their flags; removed on stop when a run created them. */
const FIXED_PATHS = ['/var/lib/kubelet', '/var/log/containers', '/var/log/pods', '/run/containerd', '/var/lib/cni'];
const CGROUP_ROOT = '/sys/fs/cgroup';
/** Pinned: containerd's config below is format version 2, read by 1.6 and 1.7. */
const CONTAINERD_VERSIONS = /^1\.(6|7)\./;
const INSTALL_SCRIPT = new URL('./install.sh', import.meta.url).pathname;

export interface ClusterOptions {
  /** Directory holding the Kubernetes binaries. Default: test/k8s-binaries/build.sh (builds once). */
  binDir?: string;
  /** Stream every component's output to stderr. Default: env CERTSHARE_CLUSTER_VERBOSE=1. */
  verbose?: boolean;
  /** Bound on the node becoming Ready, excluding the binary build. Default 180 s. */
  readyTimeoutMs?: number;
  /** OCI archives to import into containerd before the kubelet starts (`pinned` for the sandbox image). */
  images?: Array<{ ref: string; archive: string; pinned?: boolean }>;
  /** The sandbox ("pause") image's ref, one of `images`. */
  sandboxImage: string;
  /** Progress lines (start phases with their times). */
  log?: (line: string) => void;
}

export interface ClusterTimings {
  /** From start() until the apiserver's /readyz, the node Ready, and the default ServiceAccount. */
  apiServerReadyMs: number;
  nodeReadyMs: number;
  schedulableMs: number;
}

export interface Cluster {
  readonly nodeIp: string;
  /** `https://<node IP>:6443`, reachable inside the namespace only. */
  readonly server: string;
  readonly adminKubeconfigPath: string;
  readonly caPem: string;
  readonly binDir: string;
  readonly timings: ClusterTimings;
  /** The prefix that runs a command inside the cluster's network namespace. */
  readonly enter: string[];
  /** kubectl (admin) inside the namespace. Never rejects on a non-zero exit. */
  kubectl(args: string[], options?: { input?: string; timeoutMs?: number; kubeconfig?: string }): Promise<CommandResult>;
  /** kubectl that must succeed: its stdout, or an error with its stderr. */
  kubectlOk(args: string[], options?: { input?: string; timeoutMs?: number }): Promise<string>;
  /** Any command inside the namespace. */
  exec(command: string[], options?: { input?: string; timeoutMs?: number; env?: Record<string, string> }): Promise<CommandResult>;
  /** A long-running command inside the namespace (killed on stop()). */
  spawnInside(name: string, command: string[], env?: Record<string, string>): ManagedProcess;
  /** Imports an OCI archive into containerd's k8s.io namespace. */
  importImage(archive: string, ref: string, pinned?: boolean): Promise<void>;
  /**
   * Sends a signal to a container's task through containerd (`containerd://<id>` from the Pod's status), as the
   * node's root: a process stopped without kubectl exec (refused into certshare's container by its policy).
   */
  signalContainer(containerId: string, signal: string): Promise<void>;
  /** Last lines of a component's output (kubelet, containerd, kube-apiserver, ...). */
  logs(component: string): string;
  /** Stops everything and restores the host: no process, mount, cgroup or namespace left. Idempotent. */
  stop(): Promise<void>;
}

// ---------------------------------------------------------------------------------------------------
// Host commands

function runSync(command: string[], input?: string): { status: number | null; stdout: string; stderr: string } {
  const res = spawnSync(command[0]!, command.slice(1), { encoding: 'utf8', input, timeout: 60_000 });
  return { status: res.status, stdout: res.stdout ?? '', stderr: res.stderr ?? String(res.error ?? '') };
}

function mustRun(command: string[]): string {
  const res = runSync(command);
  if (res.status !== 0) throw new Error(`${command.join(' ')} failed (${res.status}): ${res.stderr.trim()}`);
  return res.stdout;
}

function alive(pid: number): boolean {
  try {
    // A zombie counts as stopped: PID 1 here reaps them about 2 s late.
    return !/^State:\s+Z/m.test(readFileSync(`/proc/${pid}/status`, 'utf8'));
  } catch {
    return false;
  }
}

/** Pids whose command line mentions the cluster's root (its components, containerd's shims). */
async function processesUsingRoot(): Promise<number[]> {
  const pids: number[] = [];
  for (const name of await readdir('/proc')) {
    const pid = Number(name);
    if (!Number.isInteger(pid) || pid === process.pid) continue;
    try {
      const cmdline = (await readFile(`/proc/${pid}/cmdline`, 'utf8')).split('\0').join(' ');
      if (cmdline.includes(`${CLUSTER_ROOT}/`)) pids.push(pid);
    } catch {
      // gone meanwhile
    }
  }
  return pids;
}

/** Every kubepods cgroup directory, deepest first, in each cgroup v1 hierarchy (and v2 if mounted). */
async function kubepodsCgroups(): Promise<string[]> {
  const dirs: string[] = [];
  const walk = async (dir: string) => {
    let entries: string[];
    try {
      entries = (await readdir(dir, { withFileTypes: true })).filter((e) => e.isDirectory()).map((e) => e.name);
    } catch {
      return;
    }
    for (const entry of entries) await walk(join(dir, entry));
    dirs.push(dir);
  };
  for (const hierarchy of await readdir(CGROUP_ROOT).catch(() => [] as string[])) {
    for (const top of ['kubepods', 'kubepods.slice']) await walk(join(CGROUP_ROOT, hierarchy, top));
  }
  return dirs;
}

async function podProcesses(): Promise<number[]> {
  const pids = new Set<number>();
  for (const dir of await kubepodsCgroups()) {
    const text = await readFile(join(dir, 'cgroup.procs'), 'utf8').catch(() => '');
    for (const line of text.split('\n')) if (line.trim()) pids.add(Number(line));
  }
  return [...pids];
}

async function killAll(find: () => Promise<number[]>, what: string): Promise<void> {
  const deadline = performance.now() + 15_000;
  for (;;) {
    const pids = (await find()).filter(alive);
    if (pids.length === 0) return;
    if (performance.now() > deadline) throw new Error(`cluster: ${what} still running after SIGKILL: ${pids.join(', ')}`);
    for (const pid of pids) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // gone meanwhile
      }
    }
    await sleep(100);
  }
}

/** Unmounts everything mounted under the cluster's root or the namespace's file, deepest first. */
function unmountAll(): void {
  for (let round = 0; round < 5; round++) {
    const targets = readFileSync('/proc/self/mounts', 'utf8')
      .split('\n')
      .map((line) => line.split(' ')[1]?.replace(/\\040/g, ' '))
      .filter((t): t is string => !!t && (t.startsWith(`${CLUSTER_ROOT}/`) || t === `/run/netns/${NETNS}` || t.startsWith('/run/containerd/')))
      .sort((a, b) => b.length - a.length);
    if (targets.length === 0) return;
    for (const target of targets) runSync(['umount', '--lazy', target]);
  }
}

function readSysctl(name: string): string {
  return readFileSync(`/proc/sys/${name}`, 'utf8').trim();
}

interface HostState {
  sysctls: Record<string, string>;
  createdPaths: string[];
}

/** Puts the host back as a run found it: also what a crashed run left. Safe to call when nothing is there. */
async function restoreHost(): Promise<void> {
  await killAll(podProcesses, 'Pod processes');
  await killAll(processesUsingRoot, 'cluster processes');
  unmountAll();
  for (const dir of await kubepodsCgroups()) await rmdir(dir).catch(() => {});
  if (existsSync(`/run/netns/${NETNS}`)) runSync(['ip', 'netns', 'delete', NETNS]);
  const state = JSON.parse(await readFile(HOST_STATE_FILE, 'utf8').catch(() => 'null')) as HostState | null;
  if (state) {
    for (const [name, value] of Object.entries(state.sysctls)) await writeFile(`/proc/sys/${name}`, value).catch(() => {});
    for (const path of state.createdPaths) await rm(path, { recursive: true, force: true }).catch(() => {});
  }
  // Symlinks the kubelet made to our Pods' logs in a pre-existing /var/log/containers.
  for (const name of await readdir('/var/log/containers').catch(() => [] as string[])) {
    const link = join('/var/log/containers', name);
    if ((await readlink(link).catch(() => '')).startsWith(`${CLUSTER_ROOT}/`)) await unlink(link).catch(() => {});
  }
  await rm(CLUSTER_ROOT, { recursive: true, force: true, maxRetries: 3 });
  await rm(HOST_STATE_FILE, { force: true });
}

async function saveHostState(): Promise<void> {
  const state: HostState = {
    sysctls: Object.fromEntries(KUBELET_SYSCTLS.map((name) => [name, readSysctl(name)])),
    createdPaths: FIXED_PATHS.filter((path) => !existsSync(path)),
  };
  await writeFile(`${HOST_STATE_FILE}.tmp`, JSON.stringify(state));
  await rename(`${HOST_STATE_FILE}.tmp`, HOST_STATE_FILE);
}

function checkHost(): void {
  if (process.getuid?.() !== 0) throw new Error('cluster: the real-cluster tier needs root (network namespace, cgroups, mounts)');
  const install = runSync(['bash', INSTALL_SCRIPT]);
  if (install.status !== 0) throw new Error(`cluster: ${INSTALL_SCRIPT} failed:\n${install.stderr}`);
  const containerd = /containerd\s+\S+\s+v?(\S+)/.exec(mustRun(['containerd', '--version']))?.[1] ?? '?';
  if (!CONTAINERD_VERSIONS.test(containerd)) {
    throw new Error(`cluster: containerd ${containerd} found; this harness writes a config for containerd 1.6/1.7 (Debian 12 has 1.6.20)`);
  }
}

// ---------------------------------------------------------------------------------------------------
// Configuration files

function containerdConfig(dirs: { root: string; state: string; socket: string; runc: string; cniConf: string }, sandboxImage: string): string {
  const cri = 'plugins."io.containerd.grpc.v1.cri"';
  return `version = 2
root = "${dirs.root}"
state = "${dirs.state}"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "${dirs.socket}"

[${cri}]
  sandbox_image = "${sandboxImage}"
  # The kubelet asks for oom_score_adj -998; this VM's root lacks CAP_SYS_RESOURCE, and runc then fails
  # every sandbox with "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [${cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [${cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [${cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "${dirs.runc}"
  [${cri}.cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "${dirs.cniConf}"
`;
}

function cniConfig(ipamDir: string): string {
  return JSON.stringify({
    cniVersion: '0.4.0',
    name: 'certshare',
    plugins: [
      {
        type: 'bridge',
        bridge: 'cni0',
        isGateway: true,
        // No masquerade: nothing leaves the namespace. Hairpin: a Pod reaching a Service that routes back to
        // itself (certshare's routing check).
        ipMasq: false,
        hairpinMode: true,
        ipam: { type: 'host-local', ranges: [[{ subnet: POD_CIDR }]], routes: [{ dst: '0.0.0.0/0' }], dataDir: ipamDir },
      },
      { type: 'portmap', capabilities: { portMappings: true } },
    ],
  });
}

function kubeletConfig(p: { socket: string; podLogs: string; volumePlugins: string; resolvConf: string; caFile: string }): string {
  return JSON.stringify({
    apiVersion: 'kubelet.config.k8s.io/v1beta1',
    kind: 'KubeletConfiguration',
    failCgroupV1: false, // 1.35+ refuses cgroup v1 otherwise
    cgroupDriver: 'cgroupfs',
    failSwapOn: false,
    containerRuntimeEndpoint: `unix://${p.socket}`,
    podLogsDir: p.podLogs,
    volumePluginDir: p.volumePlugins,
    resolvConf: p.resolvConf,
    clusterDNS: [NODE_IP],
    clusterDomain: 'cluster.local',
    address: NODE_IP,
    readOnlyPort: 0,
    authentication: { anonymous: { enabled: false }, webhook: { enabled: true }, x509: { clientCAFile: p.caFile } },
    authorization: { mode: 'Webhook' },
    // Our images exist only locally: never collect them. Disk-pressure evictions off for a test node.
    imageGCHighThresholdPercent: 100,
    imageGCLowThresholdPercent: 99,
    evictionHard: { 'memory.available': '100Mi', 'nodefs.available': '1%', 'imagefs.available': '1%', 'nodefs.inodesFree': '1%' },
    serializeImagePulls: false,
    nodeStatusUpdateFrequency: '2s',
    // A projected token or ConfigMap change reaches Pods sooner (the default is 1 minute).
    syncFrequency: '10s',
  });
}

function kubeProxyConfig(kubeconfig: string): string {
  return JSON.stringify({
    apiVersion: 'kubeproxy.config.k8s.io/v1alpha1',
    kind: 'KubeProxyConfiguration',
    clientConnection: { kubeconfig },
    mode: 'iptables',
    clusterCIDR: POD_CIDR,
    hostnameOverride: NODE_NAME,
    // 0: kube-proxy leaves the machine's global conntrack sysctls alone.
    conntrack: { maxPerCore: 0, min: 0, tcpEstablishedTimeout: '0s', tcpCloseWaitTimeout: '0s' },
    metricsBindAddress: '127.0.0.1:10249',
    healthzBindAddress: '127.0.0.1:10256',
  });
}

// ---------------------------------------------------------------------------------------------------

class ClusterImpl implements Cluster {
  readonly nodeIp = NODE_IP;
  readonly server = `https://${NODE_IP}:${API_PORT}`;
  readonly enter = ['nsenter', `--net=/run/netns/${NETNS}`, '--'];
  readonly binDir: string;
  readonly options: ClusterOptions;
  readonly verbose: boolean;
  adminKubeconfigPath = join(CLUSTER_ROOT, 'admin.kubeconfig');
  caPem = '';
  timings: ClusterTimings = { apiServerReadyMs: 0, nodeReadyMs: 0, schedulableMs: 0 };
  private readonly processes = new Map<string, ManagedProcess>();
  private readonly extra: ManagedProcess[] = [];
  private lock: ManagedProcess | undefined;
  private stopped = false;
  private dnsWatch: Promise<void> | undefined;

  constructor(binDir: string, options: ClusterOptions) {
    this.binDir = binDir;
    this.options = options;
    this.verbose = options.verbose ?? process.env.CERTSHARE_CLUSTER_VERBOSE === '1';
  }

  private log(line: string): void {
    this.options.log?.(line);
    if (this.verbose) process.stderr.write(`cluster: ${line}\n`);
  }

  private path(...parts: string[]): string {
    return join(CLUSTER_ROOT, ...parts);
  }

  private get readyTimeoutMs(): number {
    return this.options.readyTimeoutMs ?? 180_000;
  }

  /** flock held by a child for the cluster's lifetime: the kernel releases it if we die. */
  private async acquireLock(): Promise<void> {
    // One process holds the lock's file description (the shell execs sleep): killing it frees the lock.
    const script = `exec 9>'${LOCK_FILE}' && flock --wait 3600 9 && echo locked && exec sleep infinity`;
    const holder = new ManagedProcess('lock', 'sh', ['-c', script], this.verbose);
    this.lock = holder;
    const started = performance.now();
    let warned = false;
    while (!holder.lines.includes('locked')) {
      if (holder.exitInfo) throw new Error(`cluster: could not take ${LOCK_FILE}: ${holder.tail()}`);
      if (!warned && performance.now() - started > 2000) {
        warned = true;
        this.log(`waiting for another cluster on this machine to stop (${LOCK_FILE})`);
      }
      await sleep(50);
    }
  }

  async start(): Promise<void> {
    const t0 = performance.now();
    const since = () => Math.round(performance.now() - t0);
    await this.acquireLock();
    await restoreHost(); // what a crashed run left
    await saveHostState();
    await mkdir(CLUSTER_ROOT, { recursive: true, mode: 0o700 });

    await this.writePki();
    this.setUpNetwork();
    this.startEtcd();
    await this.startApiServer();
    this.timings.apiServerReadyMs = since();
    this.log(`kube-apiserver ready at ${this.server} after ${this.timings.apiServerReadyMs} ms`);
    this.startDns();
    await this.startContainerd();
    for (const image of this.options.images ?? []) await this.importImage(image.archive, image.ref, image.pinned);
    await this.startControllers();
    await this.startKubelet();
    await this.waitUntil('node Ready', async () => {
      const res = await this.kubectl(['get', 'node', NODE_NAME, '-o', 'jsonpath={.status.conditions[?(@.type=="Ready")].status}']);
      return res.code === 0 && res.stdout.trim() === 'True';
    });
    this.timings.nodeReadyMs = since();
    this.log(`node Ready after ${this.timings.nodeReadyMs} ms`);
    // Pods can be placed once the controller manager lifted the not-ready taint and made the default
    // ServiceAccount.
    await this.waitUntil('node schedulable and default ServiceAccount', async () => {
      const taints = await this.kubectl(['get', 'node', NODE_NAME, '-o', 'jsonpath={.spec.taints}']);
      const sa = await this.kubectl(['get', 'serviceaccount', 'default', '-n', 'default', '-o', 'name']);
      return taints.code === 0 && !taints.stdout.includes('not-ready') && sa.code === 0;
    });
    this.timings.schedulableMs = since();
    this.log(`schedulable after ${this.timings.schedulableMs} ms`);
  }

  private async writePki(): Promise<void> {
    const pki = await createControlPlanePki({
      extraIps: [NODE_IP],
      clients: { node: `CN=system:node:${NODE_NAME}, O=system:nodes` },
      validityMs: 2 * 24 * 3600_000,
    });
    this.caPem = pki.ca.certPem;
    const files: Record<string, string> = {
      'ca.crt': pki.ca.certPem,
      'ca.key': pki.ca.keyPem,
      'apiserver.crt': pki.serving.certPem,
      'apiserver.key': pki.serving.keyPem,
      'admin.crt': pki.admin.certPem,
      'admin.key': pki.admin.keyPem,
      'sa.key': pki.serviceAccount.privateKeyPem,
      'sa.pub': pki.serviceAccount.publicKeyPem,
    };
    await mkdir(this.path('pki'), { mode: 0o700 });
    for (const [name, content] of Object.entries(files)) await writeFile(this.path('pki', name), content, { mode: 0o600 });
    const kubeconfig = (userName: string, cert: { certPem: string; keyPem: string }) =>
      yamlKubeconfig({
        server: this.server,
        caPem: pki.ca.certPem,
        userName,
        user: { 'client-certificate-data': cert.certPem, 'client-key-data': cert.keyPem },
        namespace: 'default',
      });
    await writeFile(this.adminKubeconfigPath, kubeconfig('admin', pki.admin), { mode: 0o600 });
    await writeFile(this.path('node.kubeconfig'), kubeconfig(`system:node:${NODE_NAME}`, pki.clients.node!), { mode: 0o600 });
  }

  private setUpNetwork(): void {
    mustRun(['ip', 'netns', 'add', NETNS]);
    const inside = (...command: string[]) => mustRun([...this.enter, ...command]);
    inside('ip', 'link', 'set', 'lo', 'up');
    // The node's address on one end of a veth pair whose other end stays in the namespace too: `dummy`
    // links do not exist on this kernel, and nothing may be routed out.
    inside('ip', 'link', 'add', 'node0', 'type', 'veth', 'peer', 'name', 'node0-peer');
    inside('ip', 'addr', 'add', `${NODE_IP}/24`, 'dev', 'node0');
    inside('ip', 'link', 'set', 'node0', 'up');
    inside('ip', 'link', 'set', 'node0-peer', 'up');
    // A connection from the node to a Service address needs a route before kube-proxy's DNAT rewrites it.
    inside('ip', 'route', 'add', SERVICE_CIDR, 'dev', 'node0');
    // Per namespace: forwarding between Pods, bridged traffic through iptables (Service replies), and
    // kube-proxy's localhost NodePorts.
    inside('sysctl', '-q', '-w', 'net.ipv4.ip_forward=1', 'net.ipv4.conf.all.route_localnet=1');
    inside('ip', 'link', 'add', 'cni0', 'type', 'bridge');
    inside('sysctl', '-q', '-w', 'net.bridge.bridge-nf-call-iptables=1');
  }

  /** A cluster component: waited on, stopped in order. */
  private launch(name: string, command: string[], env: Record<string, string> = {}): ManagedProcess {
    const proc = this.spawnProcess(name, command, env);
    this.processes.set(name, proc);
    return proc;
  }

  spawnInside(name: string, command: string[], env: Record<string, string> = {}): ManagedProcess {
    const proc = this.spawnProcess(name, command, env);
    this.extra.push(proc);
    return proc;
  }

  private spawnProcess(name: string, command: string[], env: Record<string, string>): ManagedProcess {
    const [first, ...rest] = this.enter;
    const envArgs = Object.entries(env).map(([k, v]) => `${k}=${v}`);
    return new ManagedProcess(name, first!, [...rest, 'env', ...envArgs, ...command], this.verbose);
  }

  /** No wait of its own: the apiserver retries etcd until it answers, and its /readyz covers both. */
  private startEtcd(): void {
    this.launch('etcd', [
      join(this.binDir, 'etcd'),
      '--name=certshare',
      `--data-dir=${this.path('etcd')}`,
      '--listen-client-urls=http://127.0.0.1:2379',
      '--advertise-client-urls=http://127.0.0.1:2379',
      '--listen-peer-urls=http://127.0.0.1:2380',
      '--initial-advertise-peer-urls=http://127.0.0.1:2380',
      '--initial-cluster=certshare=http://127.0.0.1:2380',
      '--unsafe-no-fsync=true',
      '--heartbeat-interval=50',
      '--election-timeout=500',
      '--log-level=warn',
    ]);
  }

  private async startApiServer(): Promise<void> {
    const pki = (name: string) => this.path('pki', name);
    const proc = this.launch('kube-apiserver', [
      join(this.binDir, 'kube-apiserver'),
      '--etcd-servers=http://127.0.0.1:2379',
      `--secure-port=${API_PORT}`,
      '--bind-address=0.0.0.0',
      `--advertise-address=${NODE_IP}`,
      `--cert-dir=${this.path('apiserver-certs')}`,
      `--tls-cert-file=${pki('apiserver.crt')}`,
      `--tls-private-key-file=${pki('apiserver.key')}`,
      `--client-ca-file=${pki('ca.crt')}`,
      '--authorization-mode=Node,RBAC',
      '--enable-admission-plugins=NodeRestriction',
      `--service-cluster-ip-range=${SERVICE_CIDR}`,
      '--allow-privileged=true',
      '--service-account-issuer=https://kubernetes.default.svc.cluster.local',
      `--service-account-key-file=${pki('sa.pub')}`,
      `--service-account-signing-key-file=${pki('sa.key')}`,
      // The apiserver reaches the kubelet (logs, exec) by the node's InternalIP, not a DNS name.
      `--kubelet-client-certificate=${pki('admin.crt')}`,
      `--kubelet-client-key=${pki('admin.key')}`,
      '--kubelet-preferred-address-types=InternalIP',
      // Webhooks called through a Service: the apiserver picks an endpoint itself.
      '--enable-aggregator-routing=true',
      '--profiling=false',
    ]);
    let last = '';
    await proc.waitReady(
      'kube-apiserver',
      performance.now(),
      this.readyTimeoutMs,
      async () => {
        const res = await this.kubectl(['get', '--raw', '/readyz'], { timeoutMs: 5000 });
        last = res.stdout + res.stderr;
        return res.code === 0 && res.stdout.trim() === 'ok';
      },
      () => `last /readyz: ${last}`,
    );
  }

  /**
   * dnsmasq on the node's address answers `<service>.<namespace>.svc.cluster.local` from a hosts file
   * kept from a watch of every Service (the example's routing check calls `proxy-health` by its short
   * name). It has no upstream: any other name is answered locally or refused, never forwarded.
   */
  private startDns(): void {
    const hostsDir = this.path('dns');
    mkdirSync(hostsDir, { recursive: true });
    this.launch('dnsmasq', [
      'dnsmasq',
      '--keep-in-foreground',
      '--conf-file=/dev/null',
      '--no-resolv',
      '--no-hosts',
      '--no-poll',
      '--user=root',
      `--listen-address=${NODE_IP}`,
      '--bind-interfaces',
      `--hostsdir=${hostsDir}`,
      '--local=/cluster.local/',
      '--local=/ts.net/',
      '--log-facility=-',
    ]);
    const services = new Map<string, string>();
    // One write at a time: two overlapping ones renamed the same temporary file, the second failing with
    // ENOENT; a write that fails once the cluster is stopping (its directory going) is expected.
    let writing = Promise.resolve();
    const write = () => {
      const lines = [...services].map(([name, ip]) => `${ip} ${name}`).sort();
      writing = writing
        .then(async () => {
          await writeFile(join(hostsDir, 'services.tmp'), `${lines.join('\n')}\n`);
          await rename(join(hostsDir, 'services.tmp'), join(hostsDir, 'services'));
        })
        .catch((err: unknown) => {
          if (!this.stopped) this.log(`dns: writing the hosts file failed: ${err instanceof Error ? err.message : err}`);
        });
    };
    const watchOnce = () =>
      new Promise<void>((resolveWatch) => {
        const proc = this.spawnInside('services watch', [
          join(this.binDir, 'kubectl'),
          `--kubeconfig=${this.adminKubeconfigPath}`,
          'get',
          'services',
          '--all-namespaces',
          '--watch',
          '--output-watch-events',
          '-o',
          'jsonpath={.type} {.object.metadata.name}.{.object.metadata.namespace}.svc.cluster.local {.object.spec.clusterIP}{"\\n"}',
        ]);
        let seen = 0;
        const timer = setInterval(() => {
          let changed = false;
          for (const line of proc.lines.slice(seen)) {
            const [type, name, ip] = line.trim().split(' ');
            if (!type || !name) continue;
            if (type === 'DELETED') changed = services.delete(name) || changed;
            else if (ip && ip !== 'None' && services.get(name) !== ip) {
              services.set(name, ip);
              changed = true;
            }
          }
          seen = proc.lines.length;
          if (changed) write();
        }, 100);
        void proc.exited.then(() => {
          clearInterval(timer);
          resolveWatch();
        });
      });
    this.dnsWatch = (async () => {
      while (!this.stopped) {
        await watchOnce();
        if (!this.stopped) await sleep(500);
      }
    })();
  }

  private async startContainerd(): Promise<void> {
    const dirs = {
      root: this.path('containerd', 'root'),
      state: this.path('containerd', 'state'),
      socket: this.path('containerd', 'containerd.sock'),
      runc: this.path('runc'),
      cniConf: this.path('cni', 'net.d'),
    };
    await mkdir(dirs.cniConf, { recursive: true });
    await mkdir(dirs.root, { recursive: true });
    await writeFile(join(dirs.cniConf, '10-certshare.conflist'), cniConfig(this.path('cni', 'ipam')));
    await writeFile(this.path('containerd', 'config.toml'), containerdConfig(dirs, this.options.sandboxImage));
    const proc = this.launch('containerd', ['containerd', `--config=${this.path('containerd', 'config.toml')}`]);
    await proc.waitReady('containerd', performance.now(), this.readyTimeoutMs, async () => {
      const res = await runCommand(['ctr', `--address=${dirs.socket}`, 'version'], { timeoutMs: 5000 });
      return res.code === 0;
    });
  }

  /** ctr on the cluster's containerd, in the kubelet's namespace. */
  private get ctr(): string[] {
    return ['ctr', `--address=${this.path('containerd', 'containerd.sock')}`, '--namespace=k8s.io'];
  }

  async signalContainer(containerId: string, signal: string): Promise<void> {
    const res = await runCommand([...this.ctr, 'tasks', 'kill', `--signal=${signal}`, containerId.replace(/^containerd:\/\//, '')], { timeoutMs: 30_000 });
    if (res.code !== 0) throw new Error(`ctr tasks kill ${containerId}: ${res.stderr}`);
  }

  async importImage(archive: string, ref: string, pinned = false): Promise<void> {
    const ctr = this.ctr;
    const res = await runCommand([...ctr, 'images', 'import', '--no-unpack=false', archive], { timeoutMs: 300_000 });
    if (res.code !== 0) throw new Error(`ctr images import ${archive}: ${res.stderr}`);
    const listed = await runCommand([...ctr, 'images', 'list', '--quiet'], { timeoutMs: 30_000 });
    const full = ref.includes('/') && ref.split('/')[0]!.includes('.') ? ref : `docker.io/${ref}`;
    if (!listed.stdout.split('\n').includes(full)) throw new Error(`${archive} imported, but containerd lists no ${full}:\n${listed.stdout}`);
    if (pinned) {
      const label = await runCommand([...ctr, 'images', 'label', full, 'io.cri-containerd.pinned=pinned']);
      if (label.code !== 0) throw new Error(`ctr images label ${full}: ${label.stderr}`);
    }
  }

  private async startControllers(): Promise<void> {
    const admin = this.adminKubeconfigPath;
    const pki = (name: string) => this.path('pki', name);
    const common = [`--kubeconfig=${admin}`, `--authentication-kubeconfig=${admin}`, `--authorization-kubeconfig=${admin}`, '--leader-elect=false'];
    this.launch('kube-controller-manager', [
      join(this.binDir, 'kube-controller-manager'),
      ...common,
      `--cert-dir=${this.path('kcm-certs')}`,
      '--use-service-account-credentials',
      `--service-account-private-key-file=${pki('sa.key')}`,
      // The kube-root-ca.crt ConfigMap in every namespace (the example's projected token takes ca.crt from it).
      `--root-ca-file=${pki('ca.crt')}`,
      `--cluster-signing-cert-file=${pki('ca.crt')}`,
      `--cluster-signing-key-file=${pki('ca.key')}`,
      '--node-monitor-period=1s',
    ]);
    this.launch('kube-scheduler', [join(this.binDir, 'kube-scheduler'), ...common]);
    await writeFile(this.path('kube-proxy.json'), kubeProxyConfig(admin));
    this.launch('kube-proxy', [join(this.binDir, 'kube-proxy'), `--config=${this.path('kube-proxy.json')}`]);
  }

  private async startKubelet(): Promise<void> {
    const config = kubeletConfig({
      socket: this.path('containerd', 'containerd.sock'),
      podLogs: this.path('pod-logs'),
      volumePlugins: this.path('volume-plugins'),
      resolvConf: this.path('resolv.conf'),
      caFile: this.path('pki', 'ca.crt'),
    });
    await writeFile(this.path('kubelet.json'), config);
    await writeFile(this.path('resolv.conf'), `nameserver ${NODE_IP}\n`);
    this.launch('kubelet', [
      join(this.binDir, 'kubelet'),
      `--config=${this.path('kubelet.json')}`,
      `--kubeconfig=${this.path('node.kubeconfig')}`,
      `--root-dir=${this.path('kubelet')}`,
      `--cert-dir=${this.path('kubelet-pki')}`,
      `--node-ip=${NODE_IP}`,
      `--hostname-override=${NODE_NAME}`,
    ]);
  }

  private async waitUntil(what: string, ready: () => Promise<boolean>): Promise<void> {
    const deadline = performance.now() + this.readyTimeoutMs;
    for (;;) {
      for (const [name, proc] of this.processes) {
        if (proc.exitInfo) throw new Error(`cluster: ${name} exited (${JSON.stringify(proc.exitInfo)}) while waiting for ${what}:\n${proc.tail()}`);
      }
      if (await ready()) return;
      if (performance.now() > deadline) {
        const tails = ['kubelet', 'containerd', 'kube-controller-manager'].map((n) => `--- ${n}\n${this.logs(n)}`).join('\n');
        throw new Error(`cluster: ${what} not reached in ${this.readyTimeoutMs} ms\n${tails}`);
      }
      await sleep(200);
    }
  }

  exec(command: string[], options: { input?: string; timeoutMs?: number; env?: Record<string, string> } = {}): Promise<CommandResult> {
    return runCommand([...this.enter, ...command], options);
  }

  kubectl(args: string[], options: { input?: string; timeoutMs?: number; kubeconfig?: string } = {}): Promise<CommandResult> {
    return this.exec([join(this.binDir, 'kubectl'), `--kubeconfig=${options.kubeconfig ?? this.adminKubeconfigPath}`, ...args], options);
  }

  async kubectlOk(args: string[], options: { input?: string; timeoutMs?: number } = {}): Promise<string> {
    const res = await this.kubectl(args, options);
    if (res.code !== 0) throw new Error(`kubectl ${args.join(' ')} failed (${res.code}):\n${res.stderr}${res.stdout}`);
    return res.stdout;
  }

  logs(component: string): string {
    return this.processes.get(component)?.tail(60) ?? `(no ${component})`;
  }

  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    const keepAlive = setInterval(() => {}, 1000);
    try {
      // The kubelet first, so that it restarts nothing; then the Pods' processes; then the rest.
      await this.processes.get('kubelet')?.terminate(5000);
      await killAll(podProcesses, 'Pod processes').catch(() => {});
      for (const proc of this.extra) await proc.terminate(0);
      for (const name of ['kube-proxy', 'kube-scheduler', 'kube-controller-manager', 'dnsmasq', 'containerd', 'kube-apiserver', 'etcd']) {
        await this.processes.get(name)?.terminate(5000);
      }
      await this.dnsWatch;
      await restoreHost();
    } finally {
      clearInterval(keepAlive);
      await this.lock?.terminate(0);
    }
  }
}

/**
 * Starts the whole single-node cluster and resolves once Pods can be scheduled. The first call may build
 * the Kubernetes binaries (tens of minutes cold): give the hook a long timeout.
 */
export async function startCluster(options: ClusterOptions): Promise<Cluster> {
  checkHost();
  const binDir = options.binDir ?? (await k8sBinDir());
  const cluster = new ClusterImpl(binDir, options);
  try {
    await cluster.start();
  } catch (err) {
    await cluster.stop().catch(() => {});
    throw err;
  }
  return cluster;
}
