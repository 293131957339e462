// The proxies people run, each as its example in manifests/ deploys it, on a real single-node cluster of
// its own (test/cluster/), side by side in three namespaces:
//   - nginx:       manifests/example, the per-handshake configuration (a variable in the certificate path);
//   - nginx-stock: manifests/example-nginx-stock, a plain ssl_certificate path, reloaded by certshare with
//                  SIGHUP to nginx's master through the Pod's shared process namespace;
//   - haproxy:     manifests/example-haproxy, Debian's HAProxy 2.6 starting from the PEM certshare writes,
//                  each renewal pushed through its runtime API.
// Certificates live 40 s here (renewed every 20 s). For each proxy, a client connects through its Service
// every 50 ms while certshare renews 3 times: each renewal served by every replica within 2 s of the
// Secret holding it, no failed handshake, no container restarted.
// Then, on the same cluster, manifests/example-tailscale-service: 3 replicas advertising the Tailscale Service
// svc:proxy, as control sees it (the node's Hostinfo and its answer to control's c2n fetch), through a rolling
// restart and the renewals meanwhile, a client connecting through the Kubernetes Service all the while: never
// no replica advertising (the fewest reported), each old Pod's withdrawal seen by control before its proxy stopped, no failed
// handshake. Meanwhile a tailnet client (a tailscaled outside the cluster) connects through the Service's VIP, which
// control (tsenv --service-vips) routes to one advertising replica: never a leaf expired, for another name or not the
// group's, and a failed connection only as control moves the VIP (./vip-client.ts).
// Then tailscaled as Tailscale's operator runs it (./proxies/config-file): the real containerboot from the operator's
// config file in a Secret, changed during the run; the file's owner alone advertises (configFileOwner).
// With CERTSHARE_E2E_PROXIES_FIGURES=<file> the proxies' figures are written there as JSON (npm run e2e -- --json
// puts them under `proxies`), and with CERTSHARE_E2E_ADVERTISE_FIGURES=<file> the advertisement's.
import assert from 'node:assert/strict';
import { type ChildProcess, spawn } from 'node:child_process';
import { X509Certificate } from 'node:crypto';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import type { V1Pod } from '../../../src/kube/transport/client-node.ts';
import { CLUSTER_ROOT } from '../cluster.ts';
import { type E2eCluster, startE2eCluster, type TailnetClient } from '../e2e-cluster.ts';
import { servicesControlSees } from '../../harness/tailscale.ts';
import { E2E_AUTH_KEY, explainPods, installInjector, prepareExampleNamespace } from './setup.ts';
import { loopThroughVip, reachVip, type VipAttempt } from './vip-client.ts';

const REPO = fileURLToPath(new URL('../../../', import.meta.url));
const PROBE = join(REPO, 'test/cluster/e2e/tls-probe.ts');
const DOMAIN = 'proxy.tailnet-0000.ts.net';
const KINDS = ['nginx', 'nginx-stock', 'haproxy'] as const;
type Kind = (typeof KINDS)[number];
const RENEWALS = 3;
const CERT_VALIDITY = '40s';
const CA_FILE = join(CLUSTER_ROOT, 'e2e-proxies-ca.pem');
/** The kubelet's Pods directory (its --root-dir is CLUSTER_ROOT/kubelet): each Pod's emptyDir volumes lie under it. */
const KUBELET_PODS_DIR = join(CLUSTER_ROOT, 'kubelet', 'pods');
/** How long the client goes on after the last renewal counted: a replica still serving the old certificate shows in it. */
const SETTLE_MS = 5000;

interface ProxyFigures {
  renewalsServed: number;
  failedHandshakes: number;
  /** The slowest renewal: from the Secret holding it to every replica serving it (the last old handshake). */
  servedWithinMs: number;
  /** Each renewal's, in order. */
  servedWithinMsEach: number[];
  handshakes: number;
  containerRestarts: number;
}

const figures: Partial<Record<Kind, ProxyFigures>> = {};

const SERVICE_NS = 'tailscale-service';
const SERVICE = 'svc:proxy';
const SERVICE_REPLICAS = 3;
/** The larger group rolled by `npm run e2e` only (CERTSHARE_E2E_LARGE_GROUP=1): its rollout alone takes minutes. */
const LARGE_GROUP = 10;
const largeGroup = process.env.CERTSHARE_E2E_LARGE_GROUP === '1';
const SAMPLER = join(REPO, 'test/cluster/e2e/advertise-sampler.ts');
/** How often the sampler reads every replica's prefs and probes its proxy. */
const PREFS_SAMPLE_MS = 100;

interface AdvertiseFigures {
  replicas: number;
  /** Samples of every replica's prefs (every 100 ms) from all replicas advertising to the end of the phase. */
  prefsSamples: number;
  /** The longest time between two of those samples (a loaded machine stretches the 100 ms). */
  prefsSampleMaxGapMs: number;
  /** The fewest replicas whose prefs advertised the Service in any sample (at least 1; the target 2). */
  advertisersMin: number;
  /** Runs of prefs samples in which no replica advertised the Service (0). */
  advertisedGaps: number;
  /** Time a replica advertised while its proxy did not serve a valid certificate for the domain: samples x 100 ms (0). */
  advertisedUnserved: number;
  /** Samples of control's view (every ~250 ms) over the same phase. */
  controlSamples: number;
  /** Runs of control's samples in which no node advertised the Service (0). */
  controlGaps: number;
  /** The fewest nodes advertising in any of control's samples. */
  controlMin: number;
  /** Withdrawals control saw while the node was still connected (3: one per old Pod). */
  withdrawals: number;
  /** Old Pods whose withdrawal came before their proxy stopped (3). */
  withdrawnBeforeStop: number;
  /** Per old Pod: from control seeing the withdrawal to the kubelet's record of its proxy's exit. */
  withdrawLeadMs: number[];
  /** Nodes that went offline still advertising (0). */
  leftAdvertising: number;
  renewalsDuring: number;
  handshakes: number;
  failedHandshakes: number;
  rolloutSeconds: number;
  /** The tailnet client's connections through the Service's VIP over the rollout (every 50 ms). */
  tailnetHandshakes: number;
  /** Leaves it got that were expired, untrusted, for another name, or never the group Secret's (0). */
  tailnetBadCertificates: number;
  /** Connections without a handshake. */
  tailnetFailed: number;
  /** Each failed connection's start, in ms from the nearest move of the VIP in the client's netmap (negative: before it). */
  tailnetFailedFromMoveMs: number[];
  /** Times the VIP moved to another replica in the client's netmap. */
  vipMoves: number;
  /** Samples of the client's netmap in which no replica carried the VIP (0). */
  vipUnrouted: number;
  /** Certificates (serials) the client got through the VIP, in order (a renewal among them). */
  tailnetSerials: number;
}

let advertiseFigures: Partial<AdvertiseFigures> & { rollout10?: AdvertiseFigures } = {};

const CONFIG_NS = 'config-file';
/**
 * The file the operator writes for a ProxyGroup Pod in 1.102.5 (cap-<its minimum capability version, 106>):
 * containerboot takes the highest cap-<N> up to its own (142).
 */
const CONFIG_KEY = 'cap-106.hujson';
/** The config file's Services: the owner's, not the one certshare manages a certificate for (svc:proxy's rollout counts nodes advertising that). */
const OWNED = 'svc:owned';
const OWNED_LATER = [OWNED, 'svc:api'].sort();

interface ConfigFileFigures {
  /** The sampler's ticks (every 100 ms) from the Pod's first prefs read to the Pod gone. */
  prefsSamples: number;
  /** Distinct AdvertiseServices lists while tailscaled answered, from the file's first (3: the file's, its change, containerboot's withdrawal). */
  listsSeen: number;
  /** From the Secret's update to the prefs holding the changed list (the kubelet's swap, containerboot's reload). */
  fileToPrefsMs: number;
  /** At the deletion: from containerboot's withdrawal in the prefs to tailscaled gone (its wait for control's failover). */
  withdrawnBeforeStopMs: number | null;
  /** Samples advertised by the owner while the proxy served no valid certificate, before the Pod was Ready (the owner's choice). */
  ownerAdvertisedUnservedBeforeReady: number;
  /** The same from Ready until the Pod's deletion began (0). */
  advertisedUnserved: number;
  certshareRestarts: number;
}

let configFileFigures: ConfigFileFigures | undefined;

type NodeState = 'advertising' | 'withdrawn' | 'offline' | 'changing';

/** One look at control: each node's state for SERVICE, by node ID. */
async function controlView(env: E2eCluster): Promise<{ at: number; nodes: Map<number, NodeState> }> {
  const nodes = new Map<number, NodeState>();
  for (const node of await env.vipServices('1s')) {
    const seen = servicesControlSees(node);
    nodes.set(node.ID, !node.Online ? 'offline' : seen === undefined ? 'changing' : seen.includes(SERVICE) ? 'advertising' : 'withdrawn');
  }
  return { at: Date.now(), nodes };
}

const advertising = (view: { nodes: Map<number, NodeState> }) => [...view.nodes.values()].filter((s) => s === 'advertising').length;

/**
 * A watch of the Pods' proxy containers: each status change (the kubelet's record of the proxy's exit, whole
 * seconds, lasts only until the Pod is gone: a poll can miss it).
 */
function proxyExitWatch(env: E2eCluster, ns: string): { exits(): Map<string, number>; lines(): string[]; stop(): void } {
  const watch = kubectlWatch(env, [
    'get',
    'pods',
    '-n',
    ns,
    '--watch',
    '-o',
    'jsonpath={.metadata.uid}|{.status.containerStatuses[?(@.name=="proxy")].state.terminated.finishedAt}|{.metadata.name}|{.status.podIP}' +
      '|{.status.conditions[?(@.type=="Ready")].status}|{.status.conditions[?(@.type=="certshare.io/certificates")].reason}' +
      '|{.metadata.deletionTimestamp}{"\\n"}',
  ]);
  return {
    lines: () => watch.lines.map(({ at, text }) => `${new Date(at).toISOString()} ${text}`),
    exits() {
      const exits = new Map<string, number>();
      for (const { text } of watch.lines) {
        const [uid = '', finishedAt = ''] = text.trim().split('|');
        if (finishedAt !== '' && !exits.has(uid)) exits.set(uid, Date.parse(finishedAt));
      }
      return exits;
    },
    stop: () => watch.child.kill('SIGKILL'),
  };
}

/** A command inside the cluster's namespace, its output lines with the time each arrived. */
function watchLines(
  env: E2eCluster,
  command: string[],
  stdin: 'pipe' | 'ignore' = 'ignore',
): { child: ChildProcess; lines: Array<{ at: number; text: string }> } {
  const c = env.cluster;
  const child = spawn(c.enter[0]!, [...c.enter.slice(1), ...command], { stdio: [stdin, 'pipe', 'pipe'] });
  const lines: Array<{ at: number; text: string }> = [];
  let partial = '';
  child.stdout!.setEncoding('utf8').on('data', (chunk: string) => {
    const parts = (partial + chunk).split('\n');
    partial = parts.pop() ?? '';
    for (const text of parts) if (text.trim()) lines.push({ at: Date.now(), text });
  });
  child.stderr!.resume();
  return { child, lines };
}

/**
 * ./advertise-sampler.ts over the namespace's Pods until its stdin ends: every replica's prefs every 100 ms, and its
 * proxy's certificate while it advertises `service`.
 */
const samplePrefs = (env: E2eCluster, ns: string, service: string) =>
  watchLines(
    env,
    [
      process.execPath,
      SAMPLER,
      `--kubectl=${join(env.cluster.binDir, 'kubectl')}`,
      `--kubeconfig=${env.cluster.adminKubeconfigPath}`,
      `--namespace=${ns}`,
      `--pods-dir=${KUBELET_PODS_DIR}`,
      '--socket-volume=tailscale-socket',
      `--service=${service}`,
      `--ca=${CA_FILE}`,
      `--sni=${DOMAIN}`,
      `--interval-ms=${PREFS_SAMPLE_MS}`,
    ],
    'pipe',
  );

/** The sampler's last line, once it closed (its stdin ended: ./advertise-sampler.ts). */
async function samplerResult(sampler: ReturnType<typeof watchLines>): Promise<{
  ticks: Array<[at: number, advertisers: number]>;
  unserved: Array<{ pod: string; at: number; error: string }>;
  changes: Array<{ pod: string; at: number; advertises: boolean }>;
  lists: Array<{ pod: string; at: number; services: string[] | null }>;
  neverRead: Array<{ pod: string; error?: string }>;
}> {
  await new Promise((resolve) => (sampler.child.exitCode !== null ? resolve(undefined) : sampler.child.once('close', resolve)));
  return JSON.parse(sampler.lines.at(-1)!.text);
}

/** `kubectl <args>` (a --watch) inside the cluster's namespace, as the admin, its lines timed as they come. */
const kubectlWatch = (env: E2eCluster, args: string[]) =>
  watchLines(env, [join(env.cluster.binDir, 'kubectl'), `--kubeconfig=${env.cluster.adminKubeconfigPath}`, ...args]);

const serialOf = (base64Pem: string): string => new X509Certificate(Buffer.from(base64Pem, 'base64').toString('utf8')).serialNumber.toUpperCase();

async function poll<T>(what: string, timeoutMs: number, check: () => Promise<T | undefined>): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check().catch(() => undefined);
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`${what}: not within ${timeoutMs} ms`);
    await sleep(1000);
  }
}

interface PodState {
  ready: boolean;
  restarts: number;
}

/** Until a verified handshake through the Service's address succeeds: kube-proxy routes it to a Pod. */
async function handshakeThrough(env: E2eCluster, service: string, ns: string): Promise<void> {
  await poll(`${ns}: a handshake through the Service`, 60_000, async () => {
    const once = await env.cluster.exec([process.execPath, PROBE, 'once', '--ca', CA_FILE, '--sni', DOMAIN, `${service}:443`], { timeoutMs: 30_000 });
    return (JSON.parse(once.stdout) as Array<{ error?: string }>).every((p) => p.error === undefined) ? true : undefined;
  });
}

async function podStates(env: E2eCluster, ns: string): Promise<PodState[]> {
  const list = JSON.parse(await env.cluster.kubectlOk(['get', 'pods', '-n', ns, '-l', 'app.kubernetes.io/name=proxy', '-o', 'json'])) as {
    items: Array<{
      status: {
        conditions?: Array<{ type: string; status: string }>;
        containerStatuses?: Array<{ restartCount: number }>;
        initContainerStatuses?: Array<{ restartCount: number }>;
      };
    }>;
  };
  return list.items.map(({ status }) => ({
    ready: status.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') ?? false,
    restarts: [...(status.containerStatuses ?? []), ...(status.initContainerStatuses ?? [])].reduce((n, c) => n + c.restartCount, 0),
  }));
}

const skip = process.getuid?.() !== 0 ? 'the real-cluster tier needs root (network namespace, cgroups, mounts)' : false;

describe('renewals reach the proxies people run, on a real single-node cluster', { skip }, () => {
  let env: E2eCluster;
  let tailnet: TailnetClient;

  before(
    async () => {
      env = await startE2eCluster({
        certValidity: CERT_VALIDITY,
        serviceVips: true,
        log: (line) => process.stderr.write(`e2e proxies: ${line}\n`),
      });
      await writeFile(CA_FILE, env.tsenv.bundlePem);
      tailnet = await env.startTailnetClient('tailnet-client');
      await installInjector(env, ['test/cluster/e2e/injector/values.yaml', 'test/cluster/e2e/proxies/values.yaml']);
      await prepareExampleNamespace(env, SERVICE_NS, 'proxy', CA_FILE);
      for (const ns of KINDS) {
        await prepareExampleNamespace(env, ns, 'proxy', CA_FILE);
        await env.cluster.kubectlOk(['apply', '-k', join(REPO, 'test/cluster/e2e/proxies', ns), '-n', ns], { timeoutMs: 120_000 });
      }
    },
    { timeout: 60 * 60_000 },
  );

  after(
    async () => {
      await env?.stop();
      process.stderr.write(`e2e proxies figures: ${JSON.stringify(figures)}\n`);
      const file = process.env.CERTSHARE_E2E_PROXIES_FIGURES;
      if (file) await writeFile(file, JSON.stringify(figures));
      const advertisement = { ...advertiseFigures, ...(configFileFigures ? { configFile: configFileFigures } : {}) };
      process.stderr.write(`e2e advertisement figures: ${JSON.stringify(advertisement)}\n`);
      const advertiseFile = process.env.CERTSHARE_E2E_ADVERTISE_FIGURES;
      if (advertiseFile) await writeFile(advertiseFile, JSON.stringify(advertisement));
    },
    { timeout: 120_000 },
  );

  it(`each proxy serves ${RENEWALS} renewals within 2 s on every replica, with no failed handshake and no restart`, { timeout: 600_000 }, async () => {
    await Promise.all(
      KINDS.map((ns) =>
        poll(`${ns}: every proxy Pod Ready`, 300_000, async () => {
          const states = await podStates(env, ns);
          return states.length === 2 && states.every((p) => p.ready) ? states : undefined;
        }).catch(async (err: unknown) => {
          await explainPods(env, ns, ['certshare'], 'e2e proxies');
          throw err;
        }),
      ),
    );
    const runs = await Promise.all(
      KINDS.map(async (ns) => {
        const service = (await env.cluster.kubectlOk(['get', 'service', 'proxy', '-n', ns, '-o', 'jsonpath={.spec.clusterIP}'])).trim();
        // When the Secret held each certificate: the writer stored it; every replica projects it from there.
        const secret = kubectlWatch(env, [
          'get',
          'secrets',
          '-n',
          ns,
          '--field-selector',
          `metadata.name=${DOMAIN}`,
          '--watch',
          '-o',
          'jsonpath={.data.tls\\.crt}{"\\n"}',
        ]);
        // Ready does not say kube-proxy routes the Service to the Pods yet (no routing check here): the client
        // starts once a handshake through the Service succeeds.
        await handshakeThrough(env, service, ns);
        const client = watchLines(env, [process.execPath, PROBE, 'loop', '--ca', CA_FILE, '--sni', DOMAIN, '--interval-ms', '50', `${service}:443`], 'pipe');
        return { ns, secret, client };
      }),
    );
    const held = (run: (typeof runs)[number]): Array<{ serial: string; at: number }> => {
      const out: Array<{ serial: string; at: number }> = [];
      for (const { at, text } of run.secret.lines) {
        const serial = serialOf(text.trim());
        if (!out.some((h) => h.serial === serial)) out.push({ serial, at });
      }
      return out;
    };
    try {
      // The first line is the Secret as the watch found it; each later serial a renewal.
      await poll(`${RENEWALS} renewals held in every namespace`, 400_000, async () => (runs.every((r) => held(r).length > RENEWALS) ? true : undefined));
      await sleep(SETTLE_MS);
    } finally {
      for (const r of runs) {
        r.secret.child.kill('SIGKILL');
        r.client.child.stdin!.end();
      }
    }
    for (const run of runs) {
      await new Promise((resolve) => (run.client.child.exitCode !== null ? resolve(undefined) : run.client.child.once('close', resolve)));
      const result = JSON.parse(run.client.lines.at(-1)!.text) as {
        attempts: number;
        failures: Array<{ at: string; error: string }>;
        seen: Record<string, { first: number; last: number }>;
      };
      const certificates = held(run);
      // The first certificate the watch found and the renewals counted (a later one may still be on its way).
      const renewals = certificates.slice(1, RENEWALS + 1).map((renewal, i) => {
        const previous = result.seen[certificates[i]!.serial];
        const mine = result.seen[renewal.serial];
        // Served by every replica from the later of its first handshake and the last with the one before.
        return mine === undefined ? undefined : Math.max(0, Math.max(mine.first, previous?.last ?? 0) - renewal.at);
      });
      const served = renewals.filter((ms): ms is number => ms !== undefined);
      const restarts = (await podStates(env, run.ns)).reduce((n, p) => n + p.restarts, 0);
      figures[run.ns] = {
        renewalsServed: served.length,
        failedHandshakes: result.failures.length,
        servedWithinMs: Math.max(...served),
        servedWithinMsEach: served,
        handshakes: result.attempts,
        containerRestarts: restarts,
      };
      if (result.failures.length > 0) process.stderr.write(`e2e proxies: ${run.ns}: failed handshakes ${JSON.stringify(result.failures)}\n`);
    }
    for (const ns of KINDS) {
      const f = figures[ns]!;
      assert.ok(f.renewalsServed >= RENEWALS, `${ns}: ${f.renewalsServed} renewals served`);
      assert.equal(f.failedHandshakes, 0, `${ns}: no failed handshake out of ${f.handshakes}`);
      for (const ms of f.servedWithinMsEach) assert.ok(ms <= 2000, `${ns}: a renewal served ${ms} ms after the Secret held it`);
      assert.equal(f.containerRestarts, 0, `${ns}: no container restarted`);
    }
  });

  it('3 replicas advertise svc:proxy through a rolling restart and renewals: never none, each withdrawn before its proxy stops', {
    timeout: 900_000,
  }, async () => {
    await env.cluster.kubectlOk(['apply', '-k', join(REPO, 'test/cluster/e2e/proxies', SERVICE_NS), '-n', SERVICE_NS], { timeoutMs: 120_000 });
    await rollOut(env, tailnet, SERVICE_REPLICAS, (f) => (advertiseFigures = { ...advertiseFigures, ...f }));
  });

  it("containerboot from the operator's config file: AdvertiseServices only the file's, through its change, certshare's stop, the Pod's deletion", {
    timeout: 600_000,
  }, async () => {
    configFileFigures = await configFileOwner(env);
  });

  it(`${LARGE_GROUP} replicas advertise svc:proxy through a rolling restart: never none, never one advertising unserved`, {
    skip: largeGroup ? false : 'npm run e2e only (CERTSHARE_E2E_LARGE_GROUP=1): about 8 minutes more',
    timeout: 2_400_000,
  }, async () => {
    // The node has 2 CPUs: 10 replicas request 1.6 of them (certshare 100m, nginx 50m, the agent 10m). The proxies'
    // phase is over: their Pods make room.
    for (const ns of KINDS) await env.cluster.kubectlOk(['scale', 'statefulset/proxy', '-n', ns, '--replicas=0']);
    await env.cluster.kubectlOk(['scale', 'statefulset/proxy', '-n', SERVICE_NS, `--replicas=${LARGE_GROUP}`]);
    await rollOut(env, tailnet, LARGE_GROUP, (f) => (advertiseFigures.rollout10 = f));
  });
});

/**
 * A rolling restart of the StatefulSet's `replicas` Pods once each advertises (as control and their prefs
 * see it), sampled from control every ~250 ms and from every replica's prefs and proxy every 100 ms
 * (./advertise-sampler.ts), a client connecting through the Kubernetes Service every 50 ms and a tailnet client through
 * the Service's VIP every 50 ms (./vip-client.ts): asserts what docs/tailscale-services.md promises and returns the figures.
 */
async function rollOut(env: E2eCluster, tailnet: TailnetClient, replicas: number, record: (figures: AdvertiseFigures) => void): Promise<void> {
  const views: Array<Awaited<ReturnType<typeof controlView>>> = [];
  const exitWatch = proxyExitWatch(env, SERVICE_NS);
  const prefsSampler = samplePrefs(env, SERVICE_NS, SERVICE);
  let sampling = true;
  const sampler = (async () => {
    while (sampling) {
      const next = Date.now() + 250;
      const view = await controlView(env).catch(() => undefined);
      if (view) views.push(view);
      await sleep(Math.max(0, next - Date.now()));
    }
  })();
  const allAdvertise = (what: string) =>
    poll(what, Math.max(300_000, 60_000 * replicas), async () => (views.length > 0 && advertising(views.at(-1)!) >= replicas ? true : undefined));
  let client: ReturnType<typeof watchLines> | undefined;
  let viaVip: ReturnType<typeof loopThroughVip> | undefined;
  let throughVip: Awaited<ReturnType<ReturnType<typeof loopThroughVip>['stop']>> = { attempts: [], carriers: [] };
  // Every certificate the group's Secret held over the phase: the only leaves a client may get.
  const secret = kubectlWatch(env, [
    'get',
    'secrets',
    '-n',
    SERVICE_NS,
    '--field-selector',
    `metadata.name=${DOMAIN}`,
    '--watch',
    '-o',
    'jsonpath={.data.tls\\.crt}{"\\n"}',
  ]);
  let rolloutSeconds = 0;
  let oldUids: string[] = [];
  let fullFrom = 0;
  try {
    await allAdvertise('every replica advertising svc:proxy, as control sees it').catch(async (err: unknown) => {
      process.stderr.write(`e2e advertise: last view ${JSON.stringify([...(views.at(-1)?.nodes ?? [])])}\n`);
      await explainPods(env, SERVICE_NS, ['certshare', 'tailscale'], 'e2e advertise');
      throw err;
    });
    fullFrom = views.length - 1;
    oldUids = JSON.parse(await env.cluster.kubectlOk(['get', 'pods', '-n', SERVICE_NS, '-o', 'json'])).items.map(
      (p: { metadata: { uid: string } }) => p.metadata.uid,
    );
    const service = (await env.cluster.kubectlOk(['get', 'service', 'proxy', '-n', SERVICE_NS, '-o', 'jsonpath={.spec.clusterIP}'])).trim();
    // Advertised does not wait for the Kubernetes Service to route to the Pod (Ready does): the client
    // through that Service starts once every Pod is Ready and a handshake through it succeeds.
    await poll('every replica Ready', 120_000, async () => {
      const states = await podStates(env, SERVICE_NS);
      return states.length === replicas && states.every((p) => p.ready) ? true : undefined;
    });
    await handshakeThrough(env, service, SERVICE_NS);
    // The tailnet client starts once control routes the Service's VIP and a handshake through it succeeds.
    const vip = await poll(
      "control routes svc:proxy's VIP",
      60_000,
      async () => (await env.serviceVips()).find((v) => v.Service === SERVICE && v.Primary)?.Addrs[0],
    );
    await reachVip(tailnet, vip, DOMAIN, env.tsenv.bundlePem, 60_000);
    viaVip = loopThroughVip(tailnet, vip, DOMAIN, env.tsenv.bundlePem, 50);
    client = watchLines(env, [process.execPath, PROBE, 'loop', '--ca', CA_FILE, '--sni', DOMAIN, '--interval-ms', '50', `${service}:443`], 'pipe');
    const started = Date.now();
    await env.cluster.kubectlOk(['rollout', 'restart', 'statefulset/proxy', '-n', SERVICE_NS]);
    // About 40 s a Pod here: the preStop's failover (20 s), the drain, the start, minReadySeconds.
    const rolloutLimitS = 120 * replicas;
    await env.cluster.kubectlOk(['rollout', 'status', 'statefulset/proxy', '-n', SERVICE_NS, `--timeout=${rolloutLimitS}s`], {
      timeoutMs: (rolloutLimitS + 20) * 1000,
    });
    await allAdvertise('every new replica advertising svc:proxy');
    rolloutSeconds = (Date.now() - started) / 1000;
    await sleep(SETTLE_MS);
  } finally {
    sampling = false;
    await sampler;
    exitWatch.stop();
    client?.child.stdin?.end();
    prefsSampler.child.stdin!.end();
    if (viaVip) throughVip = await viaVip.stop();
    secret.child.kill('SIGKILL');
  }
  await new Promise((resolve) => (client!.child.exitCode !== null ? resolve(undefined) : client!.child.once('close', resolve)));
  const result = JSON.parse(client!.lines.at(-1)!.text) as {
    attempts: number;
    failures: Array<{ at: string; error: string }>;
    serials: string[];
    seen: Record<string, { first: number; last: number }>;
  };

  // Each node's state as control holds it: while the node's Hostinfo lags what it lists ('changing'), control
  // still goes by the earlier list; a node silent for one look but answering later was busy, not gone (on a
  // loaded machine a c2n answer can take over the second). A withdrawal is advertising -> withdrawn while
  // connected; advertising -> offline for good is a node that left still advertising.
  const sampled = views.slice(fullFrom);
  const lastOnline = new Map<number, number>();
  for (const [i, view] of sampled.entries()) for (const [id, state] of view.nodes) if (state !== 'offline') lastOnline.set(id, i);
  const last = new Map<number, NodeState>();
  const withdrawals: number[] = [];
  let leftAdvertising = 0;
  const counts = sampled.map((view, i) => {
    for (const [id, state] of view.nodes) {
      if (state === 'changing' || (state === 'offline' && (lastOnline.get(id) ?? -1) > i)) continue;
      if (last.get(id) === 'advertising' && state === 'withdrawn') withdrawals.push(view.at);
      if (last.get(id) === 'advertising' && state === 'offline') leftAdvertising++;
      last.set(id, state);
    }
    return [...last.values()].filter((s) => s === 'advertising').length;
  });
  const gaps = counts.filter((n, i) => n === 0 && (i === 0 || counts[i - 1] !== 0)).length;
  // The rollout replaces one Pod at a time: the i-th withdrawal belongs to the i-th proxy to stop.
  const exits = exitWatch.exits();
  const stops = oldUids
    .map((uid) => exits.get(uid))
    .filter((at): at is number => at !== undefined)
    .sort((a, b) => a - b);
  const leads = stops.map((stop, i) => (withdrawals[i] === undefined ? Number.NaN : stop - withdrawals[i]!));

  // Every replica's prefs over the same phase: from control seeing all advertise (their prefs did before).
  const prefs = await samplerResult(prefsSampler);
  if (prefs.neverRead.length > 0) process.stderr.write(`e2e advertise: Pods whose prefs were never read ${JSON.stringify(prefs.neverRead)}\n`);
  const from = sampled[0]!.at;
  const ticks = prefs.ticks.filter(([at]) => at >= from);
  const advertisers = ticks.map(([, n]) => n);
  const prefsGaps = advertisers.filter((n, i) => n === 0 && (i === 0 || advertisers[i - 1] !== 0)).length;
  const unserved = prefs.unserved.filter(({ at }) => at >= from);
  const vip = vipFigures(throughVip, new Set(secret.lines.map(({ text }) => serialOf(text.trim()))));
  const figures: AdvertiseFigures = {
    replicas,
    prefsSamples: ticks.length,
    prefsSampleMaxGapMs: Math.max(0, ...ticks.slice(1).map(([at], i) => at - ticks[i]![0])),
    advertisersMin: Math.min(...advertisers),
    advertisedGaps: prefsGaps,
    advertisedUnserved: unserved.length * PREFS_SAMPLE_MS,
    controlSamples: counts.length,
    controlGaps: gaps,
    controlMin: Math.min(...counts),
    withdrawals: withdrawals.length,
    withdrawnBeforeStop: leads.filter((ms) => ms > 0).length,
    withdrawLeadMs: leads,
    leftAdvertising,
    renewalsDuring: result.serials.length - 1,
    handshakes: result.attempts,
    failedHandshakes: result.failures.length,
    rolloutSeconds: Number(rolloutSeconds.toFixed(1)),
    ...vip.figures,
  };
  record(figures);
  if (unserved.length > 0) process.stderr.write(`e2e advertise: advertised while not served ${JSON.stringify(unserved)}\n`);
  for (const [at] of ticks.filter(([, n], i) => n === 0 && (i === 0 || advertisers[i - 1] !== 0))) {
    const near = prefs.changes.filter((c) => Math.abs(c.at - at) < 5000).map((c) => ({ ...c, at: new Date(c.at).toISOString() }));
    process.stderr.write(`e2e advertise: no replica's prefs advertising at ${new Date(at).toISOString()}; changes within 5 s: ${JSON.stringify(near)}\n`);
  }
  if (result.failures.length > 0)
    process.stderr.write(`e2e advertise: failed handshakes ${JSON.stringify(result.failures)}\nthe Pods meanwhile:\n${exitWatch.lines().join('\n')}\n`);
  assert.ok(ticks.length > 0, 'the prefs sampled over the phase');
  assert.equal(prefsGaps, 0, `never no replica's prefs advertising (${ticks.length} samples, fewest ${figures.advertisersMin})`);
  assert.ok(figures.advertisersMin >= 1, `at least one replica advertising at every sample: ${figures.advertisersMin}`);
  assert.equal(figures.advertisedUnserved, 0, 'no replica advertised while its proxy did not serve a valid certificate');
  assert.equal(gaps, 0, `never no replica advertising as control sees it (${counts.length} samples, fewest ${Math.min(...counts)})`);
  assert.equal(stops.length, replicas, 'every old proxy seen stopped');
  assert.equal(withdrawals.length, replicas, `one withdrawal per old Pod, seen by control while connected: ${withdrawals.length}`);
  for (const [i, ms] of leads.entries()) assert.ok(ms > 0, `old Pod ${i + 1}: withdrawn ${-ms} ms after its proxy stopped`);
  assert.equal(leftAdvertising, 0, 'no node left the tailnet still advertising');
  assert.equal(result.failures.length, 0, `no failed handshake of ${result.attempts}`);
  assert.ok(result.serials.length >= 2, `a renewal served during the phase (${result.serials.length} certificates seen)`);
  // Through the Service's VIP: what a tailnet client gets.
  process.stderr.write(`e2e advertise: through the VIP ${JSON.stringify(vip.details)}\n`);
  assert.ok(figures.tailnetHandshakes > 0, 'the tailnet client connected through the VIP');
  assert.deepEqual(vip.bad, [], 'no leaf through the VIP expired, untrusted, for another name or not the group Secret’s');
  assert.equal(figures.vipUnrouted, 0, 'a replica carried the VIP in every look at the client’s netmap');
  assert.ok(figures.vipMoves >= 1, `the VIP moved off a replica being replaced (${figures.vipMoves} moves)`);
  for (const ms of figures.tailnetFailedFromMoveMs)
    assert.ok(Math.abs(ms) <= VIP_MOVE_WINDOW_MS, `a connection through the VIP failed ${ms} ms from a move of the VIP`);
  assert.ok(figures.tailnetSerials >= 2, `a renewal served through the VIP (${figures.tailnetSerials} certificates seen)`);
}

/** How far from a move of the VIP (in the client's netmap, looked at every 250 ms) a connection in flight may fail. */
const VIP_MOVE_WINDOW_MS = 2000;

/** The tailnet client's connections against the certificates the group's Secret held and the VIP's moves. */
function vipFigures(
  run: { attempts: VipAttempt[]; carriers: Array<{ at: number; carriers: string[] }> },
  held: Set<string>,
): {
  figures: Pick<
    AdvertiseFigures,
    'tailnetHandshakes' | 'tailnetBadCertificates' | 'tailnetFailed' | 'tailnetFailedFromMoveMs' | 'vipMoves' | 'vipUnrouted' | 'tailnetSerials'
  >;
  bad: VipAttempt[];
  details: unknown;
} {
  const { attempts, carriers } = run;
  const bad = attempts.filter(
    (a) => a.serial !== undefined && (a.authorizationError !== undefined || !a.nameOk || a.start < a.notBefore! || a.end > a.notAfter! || !held.has(a.serial)),
  );
  const moves = carriers.slice(1).map((c) => c.at);
  const failed = attempts.filter((a) => a.error !== undefined);
  const fromMove = failed.map((a) => moves.map((m) => a.start - m).reduce((best, d) => (Math.abs(d) < Math.abs(best) ? d : best), Number.POSITIVE_INFINITY));
  const iso = (ms: number) => new Date(ms).toISOString();
  return {
    figures: {
      tailnetHandshakes: attempts.length,
      tailnetBadCertificates: bad.length,
      tailnetFailed: failed.length,
      tailnetFailedFromMoveMs: fromMove,
      vipMoves: moves.length,
      vipUnrouted: carriers.filter((c) => c.carriers.length === 0).length,
      tailnetSerials: new Set(attempts.flatMap((a) => (a.serial ? [a.serial] : []))).size,
    },
    bad,
    details: {
      failed: failed.map((a) => ({ start: iso(a.start), ms: a.end - a.start, error: a.error })),
      bad: bad.map((a) => ({ ...a, start: iso(a.start) })),
      carriers: carriers.map((c) => ({ at: iso(c.at), carriers: c.carriers.map((k) => k.slice(0, 16)) })),
    },
  };
}

/**
 * tailscaled as Tailscale's operator runs it in a ProxyGroup Pod: the real containerboot starting it from the
 * operator's config file, a Secret the kubelet mounts (./proxies/config-file), certshare injected beside it and
 * nginx. The Pod asks certshare to advertise (manifests/example-tailscale-service); the injector sees
 * TS_EXPERIMENTAL_VERSIONED_CONFIG_DIR and leaves the advertisement to the file's owner, saying so on the Pod. Then
 * the owner changes the file (the Secret updated: the kubelet swaps `..data`, containerboot reloads it), certshare
 * is stopped (SIGTERM; the kubelet starts it again) and the Pod is deleted, its prefs sampled every 100 ms
 * throughout: AdvertiseServices is the file's, then the changed file's, then none by containerboot's own withdrawal
 * at the deletion, and nothing else; tailscaled's one prefs edit is that withdrawal; the proxy serves the certificate.
 */
async function configFileOwner(env: E2eCluster): Promise<ConfigFileFigures> {
  const k = (args: string[]) => env.cluster.kubectlOk(['-n', CONFIG_NS, ...args], { timeoutMs: 120_000 });
  // As the operator writes it (pgTailscaledConfig): login server, auth key, hostname and Services in the file.
  const config = (services: string[]) =>
    JSON.stringify({
      Version: 'alpha0',
      Locked: false,
      AcceptDNS: false,
      AcceptRoutes: false,
      ServerURL: env.tsenv.control,
      AuthKey: E2E_AUTH_KEY,
      Hostname: DOMAIN.split('.')[0],
      AdvertiseServices: services,
    });
  await prepareExampleNamespace(env, CONFIG_NS, 'proxy', CA_FILE);
  await k(['create', 'secret', 'generic', 'tailscale-config', `--from-literal=${CONFIG_KEY}=${config([OWNED])}`]);
  const sampler = samplePrefs(env, CONFIG_NS, OWNED);
  let readyAt = 0;
  let changedAt = 0;
  let deletingAt = 0;
  let certshareRestarts = 0;
  let uid = '';
  let tailscaledToEnd: ReturnType<typeof kubectlWatch> | undefined;
  try {
    await env.cluster.kubectlOk(['apply', '-k', join(REPO, 'test/cluster/e2e/proxies', CONFIG_NS), '-n', CONFIG_NS], { timeoutMs: 120_000 });
    const pod = await poll('the config-file Pod created', 60_000, async () => JSON.parse(await k(['get', 'pod', 'proxy-0', '-o', 'json'])) as V1Pod);
    uid = pod.metadata!.uid!;
    // The injector's choice, on the Pod as admitted: no advertisement for certshare (what the Pod asked for is left to
    // the file, said once), no agent, the owner named.
    const certshare = pod.spec!.initContainers!.find((c) => c.name === 'certshare')!;
    assert.deepEqual(
      (certshare.env ?? []).filter((e) => e.name.startsWith('CERTSHARE_ADVERTISE') || e.name === 'CERTSHARE_LEAVE_TOKEN'),
      [{ name: 'CERTSHARE_ADVERTISE_LEFT_TO_FILE', value: 'svc:proxy' }],
      'certshare told not to advertise',
    );
    assert.deepEqual(
      pod.spec!.containers.map((c) => c.name),
      ['proxy', 'tailscale'],
      'no advertise agent',
    );
    assert.match(pod.metadata!.annotations!['certshare.io/advertise-owner'] ?? '', /^config-file: container tailscale /);
    const podIp = await poll('the config-file Pod Ready', 300_000, async () => {
      const [ready, ip] = (await k(['get', 'pod', 'proxy-0', '-o', 'jsonpath={.status.conditions[?(@.type=="Ready")].status} {.status.podIP}'])).split(' ');
      return ready === 'True' ? ip : undefined;
    }).catch(async (err: unknown) => {
      await explainPods(env, CONFIG_NS, ['certshare', 'tailscale'], 'e2e config-file');
      throw err;
    });
    readyAt = Date.now();
    const served = await env.cluster.exec([process.execPath, PROBE, 'once', '--ca', CA_FILE, '--sni', DOMAIN, `${podIp}:8443`], { timeoutMs: 30_000 });
    assert.deepEqual(
      (JSON.parse(served.stdout) as Array<{ error?: string }>).map((p) => p.error),
      [undefined],
      `the proxy serves a valid certificate for ${DOMAIN}`,
    );

    // The owner changes the file; the kubelet's sync swaps the mounted Secret, containerboot's watcher reloads it.
    // containerboot starts that watcher only after tailscaled first ran, and reads the file then: a change before it
    // is never reloaded (seen in CI, the Pod Ready first). Its "Startup complete" line comes after the watcher's start.
    const tailscaledLog = () => k(['logs', 'proxy-0', '-c', 'tailscale']);
    await poll('containerboot watching the file', 120_000, async () =>
      (await tailscaledLog()).includes('Startup complete, waiting for shutdown signal') ? true : undefined,
    );
    changedAt = Date.now();
    await k(['patch', 'secret', 'tailscale-config', '--type=merge', '-p', JSON.stringify({ stringData: { [CONFIG_KEY]: config(OWNED_LATER) } })]);
    await poll('containerboot reloaded the changed file', 180_000, async () =>
      (await tailscaledLog()).includes('tailscaled config watch: config was reloaded') ? true : undefined,
    ).catch(async (err: unknown) => {
      process.stderr.write(`e2e config-file: the tailscale container's log, end:\n${(await tailscaledLog()).split('\n').slice(-40).join('\n')}\n`);
      throw err;
    });

    // certshare stops (as on a crash or an update of its own) and the kubelet starts it again.
    await env.cluster.signalContainer(
      await k(['get', 'pod', 'proxy-0', '-o', 'jsonpath={.status.initContainerStatuses[?(@.name=="certshare")].containerID}']),
      'SIGTERM',
    );
    certshareRestarts = await poll('certshare started again and the Pod Ready', 180_000, async () => {
      const [restarts = '0', ready] = (
        await k([
          'get',
          'pod',
          'proxy-0',
          '-o',
          'jsonpath={.status.initContainerStatuses[?(@.name=="certshare")].restartCount} {.status.conditions[?(@.type=="Ready")].status}',
        ])
      ).split(' ');
      return Number(restarts) >= 1 && ready === 'True' ? Number(restarts) : undefined;
    });
    const edits = (await tailscaledLog()).split('\n').filter((l) => l.includes('EditPrefs'));
    assert.deepEqual(edits, [], 'tailscaled logged no prefs edit');
    for (const previous of [true, false]) {
      const lines = (await k(['logs', 'proxy-0', '-c', 'certshare', ...(previous ? ['--previous'] : [])])).split('\n');
      const advertiseLines = lines.filter((l) => l.includes('CERTSHARE_ADVERTISE'));
      assert.equal(advertiseLines.length, 1, `certshare (${previous ? 'stopped' : 'started again'}) said once whose the advertisement is: ${advertiseLines}`);
      assert.match(advertiseLines[0]!, /"code":"CERTSHARE_ADVERTISE_CONFIG_FILE".*svc:proxy left to the file's owner/);
    }

    // The Pod deleted: the StatefulSet scaled to none. containerboot, sent SIGTERM, withdraws the file's Services
    // itself (EnsureServicesNotAdvertised: one prefs edit), waits 20 s for control's failover, then stops tailscaled;
    // its log, followed to the end, shows who edited.
    tailscaledToEnd = kubectlWatch(env, ['logs', '--follow', 'proxy-0', '-c', 'tailscale', '-n', CONFIG_NS]);
    await poll('the tailscale container’s log followed', 30_000, async () => (tailscaledToEnd!.lines.length > 0 ? true : undefined));
    deletingAt = Date.now();
    await k(['scale', 'statefulset/proxy', '--replicas=0']);
    await k(['wait', '--for=delete', 'pod/proxy-0', '--timeout=120s']);
  } finally {
    sampler.child.stdin!.end();
    tailscaledToEnd?.child.kill('SIGKILL');
  }
  const prefs = await samplerResult(sampler);
  const lists = prefs.lists.filter((l) => l.pod === uid);
  process.stderr.write(`e2e config-file: AdvertiseServices over time ${JSON.stringify(lists.map((l) => ({ ...l, at: new Date(l.at).toISOString() })))}\n`);
  // Before tailscaled took the file (not started: null) nothing of certshare's or the owner's shows; from then on
  // each change of the list is counted, a stopped tailscaled (null) only at the end.
  const first = lists.findIndex((l) => JSON.stringify(l.services) === JSON.stringify([OWNED]));
  assert.ok(first >= 0, `the file's Services in the prefs: ${JSON.stringify(lists)}`);
  assert.deepEqual(
    lists.slice(0, first).filter((l) => l.services !== null),
    [],
    'no list before the file’s',
  );
  const fromFile = lists.slice(first);
  const whileRunning = fromFile.at(-1)?.services === null ? fromFile.slice(0, -1) : fromFile;
  assert.deepEqual(
    whileRunning.map((l) => l.services),
    [[OWNED], OWNED_LATER, []],
    'only the owner’s: the file, its change, containerboot’s withdrawal at the deletion; nothing at certshare’s stop',
  );
  assert.ok(whileRunning[1]!.at > changedAt, 'the change came with the file’s');
  assert.ok(whileRunning[2]!.at > deletingAt, 'the withdrawal came with the deletion');
  const lastLines = tailscaledToEnd!.lines.map((l) => l.text);
  assert.equal(lastLines.filter((l) => l.includes('unadvertising services: [svc:api svc:owned]')).length, 1, 'containerboot withdrew the file’s Services');
  assert.equal(lastLines.filter((l) => l.includes('EditPrefs')).length, 1, 'tailscaled’s one prefs edit: containerboot’s withdrawal');
  const unservedBetween = (from: number, to: number) => prefs.unserved.filter(({ at }) => at >= from && at < to).length;
  const figures: ConfigFileFigures = {
    prefsSamples: prefs.ticks.length,
    listsSeen: whileRunning.length,
    fileToPrefsMs: whileRunning[1]!.at - changedAt,
    withdrawnBeforeStopMs: fromFile.length > whileRunning.length ? fromFile.at(-1)!.at - whileRunning[2]!.at : null,
    ownerAdvertisedUnservedBeforeReady: unservedBetween(0, readyAt),
    advertisedUnserved: unservedBetween(readyAt, deletingAt),
    certshareRestarts,
  };
  if (figures.advertisedUnserved > 0) process.stderr.write(`e2e config-file: advertised while not served ${JSON.stringify(prefs.unserved)}\n`);
  assert.equal(figures.advertisedUnserved, 0, 'from Ready on, the proxy served a valid certificate whenever the file advertised');
  return figures;
}
