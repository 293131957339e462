import { X509Certificate } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadAll } from 'js-yaml';
import { parseFlags } from '../../src/flags/flags.ts';
import { RUN_FLAGS, daemonConfigFrom } from '../../src/config/run-options.ts';
import { silentLogger, type Logger } from '../../src/core/ports/logger.ts';
import type { Clock } from '../../src/core/ports/clock.ts';
import { startDaemon, type Daemon } from '../../src/daemon/daemon.ts';
import { startEmulator, type Emulator, type EmulatorOptions } from '../../src/emulator/server.ts';
import type { ControlPlane } from '../harness/control-plane.ts';
import { stopAtFileEnd, stoppedOnItsOwn } from '../harness/left-running.ts';
import type { RealTailscaledOptions } from '../harness/tailscale.ts';
import { FAST_FLAGS } from './standalone.ts';
import { asAccount } from './token-request.ts';
import { onEvent, until } from './wait.ts';

/** The example's domain and group: manifests/example restricts RBAC to these names. */
export const KUBE_DOMAIN = 'proxy.tailnet-0000.ts.net';
export const GROUP = 'proxy';
/** A real tailscaled (useRealTailscaled) whose cert domain is KUBE_DOMAIN: `proxy` in the tailnet `tailnet-0000.ts.net`. */
export const KUBE_DOMAIN_TAILSCALED: RealTailscaledOptions = {
  certDomainsAtStart: true,
  hostname: KUBE_DOMAIN.split('.')[0]!,
  magicDnsDomain: KUBE_DOMAIN.split('.').slice(1).join('.'),
};
/** The example's readiness-gate condition type. */
export const GATE = 'certshare.io/certificates';
const EXAMPLE = fileURLToPath(new URL('../../manifests/example', import.meta.url));
const GROUP_SCOPE = fileURLToPath(new URL('../../manifests/group-scope', import.meta.url));
const BASE_POLICIES = fileURLToPath(new URL('../../manifests/base/admission-policy.yaml', import.meta.url));

let counter = 0;

/** A fresh namespace with the example manifests (ServiceAccounts, least-privilege RBAC) applied. */
export async function exampleNamespace(cp: ControlPlane, prefix = 'cs'): Promise<string> {
  const ns = `${prefix}-${process.pid}-${++counter}`;
  await must(cp.kubectl(['create', 'namespace', ns]));
  await must(cp.kubectl(['apply', '-k', EXAMPLE, '-n', ns]));
  return ns;
}

/** Widens the example's least-privilege Roles from its one domain Secret to every domain of the group. */
export async function allowDomains(cp: ControlPlane, ns: string, domains: string[]): Promise<void> {
  for (const [role, rule] of [
    ['certshare-reader', 0],
    ['certshare-writer', 1],
  ] as const) {
    const patch = [
      { op: 'test', path: `/rules/${rule}/resources`, value: ['secrets'] },
      { op: 'replace', path: `/rules/${rule}/resourceNames`, value: domains },
    ];
    await must(cp.kubectl(['-n', ns, 'patch', 'role', role, '--type', 'json', '-p', JSON.stringify(patch)]));
  }
}

/** Adds manifests/group-scope (list/watch of the namespace's Secrets, for --watch-scope group) to a namespace. */
export async function allowGroupScope(cp: ControlPlane, ns: string): Promise<void> {
  await must(cp.kubectl(['apply', '-k', GROUP_SCOPE, '-n', ns]));
}

export async function must(result: Promise<{ stdout: string; stderr: string; code: number | null }>): Promise<string> {
  const r = await result;
  if (r.code !== 0) throw new Error(`kubectl failed (${r.code}): ${r.stderr.trim()}`);
  return r.stdout;
}

/**
 * A tenant of `ns`: a ServiceAccount `name` with the rules of the default `admin` role (which holds `edit`'s), as a
 * namespace's owners have; its kubeconfig. No controller-manager runs here to aggregate `admin`, so the account
 * is bound to the bootstrap ClusterRoles `admin` is made of.
 */
/** The admission policy that keeps break-glass claims (manifests/base), and the label it selects them by. */
export const CLAIMS_POLICY = 'certshare-break-glass-claims';
export const CLAIM_LABEL = 'certshare.io/break-glass-claim';

/** Applies manifests/base's policy on break-glass claims (and its binding) alone, as a member's platform does. */
export async function applyClaimsPolicy(cp: ControlPlane): Promise<void> {
  const docs = (loadAll(await readFile(BASE_POLICIES, 'utf8')) as Array<{ kind: string; metadata: { name: string } }>).filter(
    (d) => d.metadata.name === CLAIMS_POLICY,
  );
  if (docs.length !== 2) throw new Error(`${CLAIMS_POLICY}: ${docs.length} documents in manifests/base, not a policy and its binding`);
  await must(cp.kubectl(['apply', '-f', '-'], { input: JSON.stringify({ apiVersion: 'v1', kind: 'List', items: docs }) }));
}

/**
 * Once the policy on break-glass claims is in force (the apiserver loads a policy a moment after it is applied):
 * `tenant`'s delete of a claim, a dry run, is refused. The probe claim is the admin's, removed after.
 */
export async function claimsPolicyInForce(cp: ControlPlane, ns: string, tenant: string): Promise<void> {
  const leases = `/apis/coordination.k8s.io/v1/namespaces/${ns}/leases`;
  const probe = {
    apiVersion: 'coordination.k8s.io/v1',
    kind: 'Lease',
    metadata: { name: `certshare-glass-${'0'.repeat(32)}`, labels: { [CLAIM_LABEL]: 'first' } },
  };
  const created = await cp.adminRequest('POST', leases, { body: probe });
  if (created.status !== 201) throw new Error(`creating the probe claim: HTTP ${created.status}: ${created.body.slice(0, 300)}`);
  const deadline = performance.now() + 30_000;
  while ((await asAccount(cp, tenant, 'DELETE', `${leases}/${probe.metadata.name}?dryRun=All`)).status !== 403) {
    if (performance.now() > deadline) throw new Error(`${CLAIMS_POLICY} never took effect`);
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  const removed = await cp.adminRequest('DELETE', `${leases}/${probe.metadata.name}`);
  if (removed.status !== 200) throw new Error(`the admin removes the probe claim: HTTP ${removed.status}: ${removed.body.slice(0, 300)}`);
}

export async function namespaceAdmin(cp: ControlPlane, ns: string, name: string): Promise<string> {
  await must(cp.kubectl(['-n', ns, 'create', 'serviceaccount', name]));
  for (const part of ['admin', 'edit', 'view'])
    await must(
      cp.kubectl(['-n', ns, 'create', 'rolebinding', `${name}-${part}`, `--clusterrole=system:aggregate-to-${part}`, `--serviceaccount=${ns}:${name}`]),
    );
  return cp.kubeconfigFor(ns, name);
}

/**
 * A ServiceAccount's token kubeconfig written to `path`, pointed at a relay or proxy in front of the API
 * server: `via.url` replaces the server; `via.caPem` (a TLS-terminating proxy's own CA) the trusted CA.
 */
export async function kubeconfigVia(
  cp: ControlPlane,
  ns: string,
  path: string,
  via: { url: string; caPem?: string },
  who: { serviceAccount?: string; pod?: string } = {},
): Promise<string> {
  const source = who.pod ? await replicaKubeconfig(cp, ns, who.pod, who.serviceAccount) : await cp.kubeconfigFor(ns, who.serviceAccount ?? 'certshare');
  let text = (await readFile(source, 'utf8')).replace(/server: .*/, `server: ${JSON.stringify(via.url)}`);
  if (via.caPem)
    text = text.replace(/certificate-authority-data: .*/, `certificate-authority-data: ${JSON.stringify(Buffer.from(via.caPem).toString('base64'))}`);
  if (!text.includes(via.url)) throw new Error('could not point the kubeconfig at the proxy');
  await writeFile(path, text, { mode: 0o600 });
  return path;
}

/** The Pod's uid, as the downward API gives it to certshare (POD_UID): `kubectl describe pod` lists the Events regarding it. */
export async function podUid(cp: ControlPlane, ns: string, name: string): Promise<string> {
  const res = await cp.adminRequest('GET', `/api/v1/namespaces/${ns}/pods/${name}`);
  return (JSON.parse(res.body) as { metadata: { uid: string } }).metadata.uid;
}

/** A Pod (never scheduled: there is no kubelet) with certshare's readiness gate, as the example's StatefulSet makes. */
export async function createGatedPod(cp: ControlPlane, ns: string, name: string): Promise<void> {
  const pod = {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name },
    // Under certshare's account: a replica's token is bound to this Pod (see replicaKubeconfig).
    spec: { serviceAccountName: 'certshare', readinessGates: [{ conditionType: GATE }], containers: [{ name: 'proxy', image: 'nginx' }] },
  };
  await must(cp.kubectl(['-n', ns, 'create', '-f', '-'], { input: JSON.stringify(pod) }));
  // Stand-ins for the kubelet's own conditions, which the gate must leave alone.
  const res = await cp.adminRequest('PATCH', `/api/v1/namespaces/${ns}/pods/${name}/status`, {
    headers: { 'content-type': 'application/strategic-merge-patch+json' },
    body: {
      status: {
        conditions: [
          { type: 'PodScheduled', status: 'True' },
          { type: 'example.com/other', status: 'True' },
        ],
      },
    },
  });
  if (res.status !== 200) throw new Error(`patching Pod ${name}'s status: HTTP ${res.status}: ${res.body.slice(0, 300)}`);
}

export interface Replica {
  name: string;
  daemon: Daemon;
  emulator: Emulator;
  outDir: string;
  stop(): Promise<void>;
}

/** The serial of the certificate a replica holds (and projects), if any. */
export const heldSerial = (r: Replica): string | undefined => r.daemon.manager.loop(KUBE_DOMAIN)?.current?.info.serial;
/** Whether the replica writes (holds the Lease, or --mode rw) for the example's domain. */
export const isWriter = (r: Replica): boolean => r.daemon.role.canIssue(KUBE_DOMAIN);
/** Subscribes to the replica's role changes (a source for until()). */
export const roleChange =
  (r: Replica) =>
  (listener: () => void): (() => void) =>
    r.daemon.role.onChange?.(listener) ?? (() => {});

/** A `until()` source: the replica wrote certificate files. */
export const filesWritten =
  (r: Replica) =>
  (listener: () => void): (() => void) => {
    r.daemon.events.on('filesWritten', listener);
    return () => r.daemon.events.off('filesWritten', listener);
  };

/**
 * Resolves once the files `r` projects hold the certificate `serial` (read again at each filesWritten: the
 * loop holds a certificate a moment before its files are written); fails after `timeoutMs`.
 */
export async function filesHold(r: Replica, serial: string, timeoutMs = 15_000): Promise<void> {
  const seen = new Set<string>();
  const changed = new EventEmitter();
  const read = (): void =>
    void readFile(join(r.outDir, KUBE_DOMAIN, 'tls.crt'), 'utf8').then(
      (pem) => {
        seen.add(new X509Certificate(pem).serialNumber);
        changed.emit('read');
      },
      () => {},
    );
  r.daemon.events.on('filesWritten', read);
  try {
    read();
    await until(`${r.name}'s files hold ${serial}`, () => seen.has(serial), [onEvent(changed, 'read')], timeoutMs);
  } finally {
    r.daemon.events.off('filesWritten', read);
  }
}

/**
 * The ServiceAccount's kubeconfig for replica `name`: when a Pod of that name exists, its token is bound
 * to it, as the projected token of a real Pod is (manifests/base/admission-policy.yaml admits a
 * readiness-gate patch only from the Pod's own token); an unbound token otherwise.
 */
export async function replicaKubeconfig(cp: ControlPlane, ns: string, name: string, serviceAccount = 'certshare'): Promise<string> {
  const pod = await cp.adminRequest('GET', `/api/v1/namespaces/${ns}/pods/${name}`);
  if (pod.status !== 200 && pod.status !== 404) throw new Error(`GET Pod ${ns}/${name}: HTTP ${pod.status}: ${pod.body.slice(0, 300)}`);
  return cp.kubeconfigFor(ns, serviceAccount, pod.status === 200 ? { pod: name } : {});
}

/** A plain Pod `name` (never scheduled: there is no kubelet) under `serviceAccount`, unless one exists. */
async function ensurePod(cp: ControlPlane, ns: string, name: string, serviceAccount: string): Promise<void> {
  const pod = {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name },
    spec: { serviceAccountName: serviceAccount, containers: [{ name: 'proxy', image: 'nginx' }] },
  };
  const res = await cp.adminRequest('POST', `/api/v1/namespaces/${ns}/pods`, { body: pod });
  if (res.status !== 201 && res.status !== 409) throw new Error(`creating Pod ${ns}/${name}: HTTP ${res.status}: ${res.body.slice(0, 300)}`);
}

/** `certshare run` flags of a replica of the example group in kube mode, timing scaled down (FAST_FLAGS). */
export function replicaArgs(localapi: string, outDir: string, mode: 'rw' | 'ro' | 'auto'): string[] {
  return ['--localapi', localapi, '--store', 'kube', '--domain', KUBE_DOMAIN, '--out-dir', outDir, '--group', GROUP, '--mode', mode, ...FAST_FLAGS];
}

/**
 * One replica in-process: its own emulated tailscaled, the daemon in kube mode under the
 * ServiceAccount's token (RBAC and the admission policy are real), certificates projected into `outDir`.
 */
export async function startReplica(
  cp: ControlPlane,
  ns: string,
  dir: string,
  name: string,
  options: {
    mode?: 'rw' | 'ro' | 'auto';
    serviceAccount?: string;
    flags?: string[];
    emulator?: EmulatorOptions;
    env?: NodeJS.ProcessEnv;
    logger?: Logger;
    /**
     * Keep the files a replica of this name left in `dir` (a container restarting in its Pod: the emptyDir
     * stays). Default: a new Pod, with empty files (certshare reads what its files hold at start).
     */
    keepFiles?: boolean;
    /** The daemon's and its emulator's clock (a JumpClock skips a certificate's days). Default: the system's. */
    clock?: Clock;
  } = {},
): Promise<Replica> {
  const replicaDir = join(dir, name);
  await mkdir(replicaDir, { recursive: true });
  // As in a cluster, the replica runs in a Pod of its name and its token is bound to it: the admission
  // policies admit the readiness condition and Events from the bound Pod's token only.
  await ensurePod(cp, ns, name, options.serviceAccount ?? 'certshare');
  const kubeconfig = await replicaKubeconfig(cp, ns, name, options.serviceAccount);
  const clock = options.clock ? { clock: options.clock } : {};
  const emulator = await startEmulator({ listen: join(replicaDir, 'tailscaled.sock'), domains: [KUBE_DOMAIN], id: name, ...clock, ...options.emulator });
  const outDir = join(replicaDir, 'certs');
  if (!options.keepFiles) await rm(outDir, { recursive: true, force: true });
  const values = parseFlags(RUN_FLAGS, [...replicaArgs(emulator.address, outDir, options.mode ?? 'rw'), ...(options.flags ?? [])], {});
  const env = { KUBECONFIG: kubeconfig, POD_NAME: name, POD_NAMESPACE: ns, POD_IPS: '10.0.0.10', ...options.env };
  const daemon = await startDaemon(daemonConfigFrom(values, env), { logger: options.logger ?? silentLogger, env, ...clock });
  let stopped: Promise<void> | undefined;
  const replica: Replica = {
    name,
    daemon,
    emulator,
    outDir,
    // Once, however often it is called: a test stops a replica where its story says and again in its `finally`.
    stop() {
      stopped ??= (async () => {
        stoppedOnItsOwn(replica);
        await daemon.stop();
        await emulator.close();
      })();
      return stopped;
    },
  };
  // A test that fails before its own stop leaves it running: useControlPlane's last hook stops it.
  return stopAtFileEnd(replica);
}

/** Several replicas started together; if one fails to start, the others are stopped before rejecting (no stray daemon keeps the test process alive). */
export async function startReplicas(
  cp: ControlPlane,
  ns: string,
  dir: string,
  names: string[],
  options: Parameters<typeof startReplica>[4] = {},
): Promise<Replica[]> {
  const results = await Promise.allSettled(names.map((name) => startReplica(cp, ns, dir, name, options)));
  const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (!failed) return results.map((r) => (r as PromiseFulfilledResult<Replica>).value);
  await Promise.all(results.map((r) => (r.status === 'fulfilled' ? r.value.stop() : undefined)));
  throw failed.reason;
}

export interface SecretObject {
  type?: string;
  metadata: { labels?: Record<string, string>; annotations?: Record<string, string>; resourceVersion?: string };
  data?: Record<string, string>;
}

/**
 * Resolves once the Secret satisfies `predicate` (undefined = absent), driven by a watch of it (no
 * polling); fails after `timeoutMs`.
 */
export async function secretSatisfies(
  cp: ControlPlane,
  ns: string,
  name: string,
  predicate: (s: SecretObject | undefined) => boolean,
  timeoutMs = 10_000,
): Promise<void> {
  // client-node's own Watch (undici): the test's view, independent of certshare's transport.
  const { KubeConfig, Watch } = await import('@kubernetes/client-node');
  const kc = new KubeConfig();
  kc.loadFromFile(cp.adminKubeconfigPath);
  const list = await cp.adminRequest('GET', `/api/v1/namespaces/${ns}/secrets?fieldSelector=metadata.name%3D${encodeURIComponent(name)}`);
  const parsed = JSON.parse(list.body) as { items: SecretObject[]; metadata: { resourceVersion: string } };
  if (predicate(parsed.items[0])) return;
  await new Promise<void>((resolve, reject) => {
    let controller: AbortController | undefined;
    const timer = setTimeout(() => finish(new Error(`Secret ${ns}/${name} did not reach the expected state within ${timeoutMs} ms`)), timeoutMs);
    function finish(err?: Error): void {
      clearTimeout(timer);
      controller?.abort();
      if (err) reject(err);
      else resolve();
    }
    void new Watch(kc)
      .watch(
        `/api/v1/namespaces/${ns}/secrets`,
        { fieldSelector: `metadata.name=${name}`, resourceVersion: parsed.metadata.resourceVersion },
        (type, obj: SecretObject) => {
          if (predicate(type === 'DELETED' ? undefined : obj)) finish();
        },
        (err: unknown) => err && finish(err as Error),
      )
      .then((c) => (controller = c));
  });
}

/**
 * A server-side dry run of an update (a raw PUT: `kubectl replace` would also rewrite its last-applied
 * annotation) of the MutatingWebhookConfiguration `name`, read and sent under `kubeconfig`, after `change`:
 * 'allowed', or the apiserver's refusal.
 */
export async function dryRunWebhookUpdate<T>(cp: ControlPlane, kubeconfig: string, name: string, change: (configuration: T) => void): Promise<string> {
  const path = `/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/${name}?dryRun=All`;
  for (let attempt = 1; ; attempt++) {
    const current = JSON.parse(await must(cp.kubectl(['get', 'mutatingwebhookconfiguration', name, '-o', 'json'], { kubeconfig }))) as T;
    change(current);
    const r = await cp.kubectl(['replace', '--raw', path, '-f', '-'], { kubeconfig, input: JSON.stringify(current) });
    if (r.code === 0) return 'allowed';
    // A running injector may write the caBundle between the read and the replace (409): read again.
    if (!/Conflict|the object has been modified/.test(r.stderr) || attempt === 5) return r.stderr;
  }
}

/**
 * dryRunWebhookUpdate until it is refused, for at most `timeoutMs`: the apiserver loads a new admission
 * policy through an informer, a moment after it was created. Each try is a round trip of its own.
 */
export async function refusedWebhookUpdate<T>(
  cp: ControlPlane,
  kubeconfig: string,
  name: string,
  change: (configuration: T) => void,
  timeoutMs = 30_000,
): Promise<string> {
  const deadline = performance.now() + timeoutMs;
  let answer = await dryRunWebhookUpdate(cp, kubeconfig, name, change);
  while (answer === 'allowed' && performance.now() < deadline) answer = await dryRunWebhookUpdate(cp, kubeconfig, name, change);
  return answer;
}

/** The Pod name in a Lease identity made by leaseIdentity() (`<pod>_<random>`; a Pod name has no `_`). */
export function leaseHolderPod(identity: string): string {
  return identity.split('_')[0]!;
}
