// The injector on a ProxyGroup Pod that Tailscale's real operator builds, not one written by reading its source:
// tailscale.com/cmd/k8s-operator 1.102.5 (test/tailscale-operator/build.sh) runs against the real kube-apiserver with
// its CRDs, in the namespace `tailscale` that the injector's --proxygroup-namespaces lists. The operator's own tsnet node
// logs in to tsenv's control server before any reconciler starts (it waits for Running), and the operator calls
// Tailscale's API at the same URL (OPERATOR_LOGIN_SERVER): tsenv's stand-in (--tailscale-api) answers the OAuth token
// and the auth keys, for the operator's node and each replica. Both run in the real tailscaled's network namespace
// (only loopback: nothing reaches the machine's network); the operator reaches the apiserver through a relay, as admin
// (its RBAC is not under test here). A
// ProxyClass gives the replicas certshare's annotations; from the StatefulSet the operator writes for an ingress
// ProxyGroup of two replicas, a Pod is created as the StatefulSet controller would (there is none here), through the
// real apiserver and the injector's webhook; the template itself must equal the unit tier's copy (operatorProxyGroupPod).
// Then the replica's tailscaled runs as the Pod would run it, containerboot from the operator's config Secret (projected
// as the kubelet does), and logs in to control with the key the operator minted. Then an HA Ingress on the ProxyGroup:
// the operator calls the stand-in's Tailscale Services (vip-services) and writes the serve config and each replica's
// AdvertiseServices; the replica reloads its new file, control sees the Services, and the advertise agent of the Pod's
// flags says which of them it does not watch and withdraws its own at SIGTERM. The same Pod in a namespace not listed
// is not made a ProxyGroup Pod.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdir, readdir, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import type { V1Container, V1Pod, V1PodSpec } from '../../src/kube/transport/client-node.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import { parseFlags } from '../../src/flags/flags.ts';
import { startInjector, type Injector } from '../../src/injector/injector.ts';
import { INJECTOR_FLAGS, injectorConfigFrom } from '../../src/config/injector-options.ts';
import { ANNOTATION, STOP_FITTED_ANNOTATION } from '../../src/injector/mutate.ts';
import { ADVERTISE_OWNER_ANNOTATION, OPERATOR_HOOK, PROXY_GROUP_SOCKET } from '../../src/injector/tailscale-operator.ts';
import { buildOnce, ManagedProcess, yamlKubeconfig } from '../harness/control-plane.ts';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { BUILD_AND_START_TIMEOUT_MS, servicesControlSees, startRealTailscaled, type RealTailscaled } from '../harness/tailscale.ts';
import { watchPrefs } from '../support/advertising.ts';
import { must } from '../support/kube.ts';
import { relayIntoNamespace, type NamespaceRelay } from '../support/namespace-relay.ts';
import { freePort } from '../support/processes.ts';
import { injectorLoopbackFlags } from '../support/replica-flags.ts';
import { projectConfig } from '../support/projected-config.ts';
import { operatorProxyGroupPod } from '../support/proxy-group-pod.ts';
import { useTempDir } from '../support/standalone.ts';
import { DAY, makePair } from '../support/certs.ts';

const OPERATOR_BUILD = resolve(import.meta.dirname, '../tailscale-operator/build.sh');
const REPO = fileURLToPath(new URL('../../', import.meta.url));
const BIN = fileURLToPath(new URL('../../bin/certshare.js', import.meta.url));
/** The operator and tailscaled are built with Go: without it (and no prebuilt binaries named) there is nothing to run. */
const goFound =
  (process.env.CERTSHARE_TAILSCALE_OPERATOR_BIN !== undefined && process.env.CERTSHARE_TAILSCALE_BIN !== undefined) ||
  spawnSync('sh', ['-c', 'command -v go || test -x /usr/local/go/bin/go'], { stdio: 'ignore' }).status === 0;
const NS = 'tailscale';
const TENANT = 'tenant';
/** A namespace neither opted in nor listed: no webhook, no policy; the apiserver's defaults only. */
const PLAIN = 'plain';
/** The unit tier's stand-in for the operator's Pod, whose annotations the ProxyClass gives the real one. */
const FIXTURE = operatorProxyGroupPod();

/** What is read here of the StatefulSet the operator writes. */
interface StatefulSet {
  metadata: { name: string; uid: string };
  spec: { serviceName?: string; template: { metadata?: { labels?: Record<string, string>; annotations?: Record<string, string> }; spec: V1PodSpec } };
}

describe("a ProxyGroup Pod built by Tailscale's real operator 1.102.5, injected through the real apiserver", {
  timeout: BUILD_AND_START_TIMEOUT_MS,
  skip: !goFound && "needs Go to build Tailscale's operator and tailscaled (or CERTSHARE_TAILSCALE_OPERATOR_BIN and CERTSHARE_TAILSCALE_BIN)",
}, () => {
  const cp = useControlPlane();
  const dir = useTempDir();
  let ts: RealTailscaled;
  let relay: NamespaceRelay | undefined;
  let injector: Injector | undefined;
  let operator: ManagedProcess | undefined;

  before(
    async () => {
      const [operatorDir, started] = await Promise.all([buildOnce(OPERATOR_BUILD, ['k8s-operator']), startRealTailscaled({ tailscaleApi: true })]);
      ts = started;
      await must(cp().kubectl(['create', 'namespace', 'certshare']));
      await must(cp().kubectl(['apply', '-k', `${REPO}manifests/injector`]));
      const port = await freePort();
      const clientConfig = [{ op: 'replace', path: '/webhooks/0/clientConfig', value: { url: `https://127.0.0.1:${port}/mutate` } }];
      await must(cp().kubectl(['patch', 'mutatingwebhookconfiguration', 'certshare-injector', '--type=json', '-p', JSON.stringify(clientConfig)]));
      const env = { KUBECONFIG: await cp().kubeconfigFor('certshare', 'certshare-injector'), POD_NAMESPACE: 'certshare', POD_NAME: 'injector-0' };
      const flags = [...injectorLoopbackFlags(port), `--proxygroup-namespaces=${NS}`];
      injector = await startInjector(injectorConfigFrom(parseFlags(INJECTOR_FLAGS, flags, {}), env), { logger: silentLogger, env, defaultMetrics: false });
      for (const ns of [NS, TENANT, PLAIN]) await must(cp().kubectl(['create', 'namespace', ns]));
      for (const ns of [NS, TENANT]) await must(cp().kubectl(['label', 'namespace', ns, 'certshare.io/injection=enabled']));
      // The operator's proxies are privileged (docs/install.md): certshare-pods-off-the-node refuses them elsewhere.
      await must(cp().kubectl(['label', 'namespace', NS, 'pod-security.kubernetes.io/enforce=privileged']));
      const crds = join(operatorDir, 'crds');
      for (const file of await readdir(crds)) await must(cp().kubectl(['apply', '--server-side', '-f', join(crds, file)]));

      relay = await relayIntoNamespace(ts, cp().port, 'apiserver');
      const kubeconfig = join(dir(), 'operator.kubeconfig');
      const server = `https://127.0.0.1:${relay.port}`;
      const user = { 'client-certificate-data': cp().adminCertPem, 'client-key-data': cp().adminKeyPem };
      await writeFile(kubeconfig, yamlKubeconfig({ server, caPem: cp().caPem, user, userName: 'operator', namespace: NS }));
      await writeFile(join(dir(), 'client-id'), 'tsenv-client');
      await writeFile(join(dir(), 'client-secret'), 'tsenv-secret');
      operator = ts.runInNamespace('k8s-operator', [join(operatorDir, 'k8s-operator')], {
        KUBECONFIG: kubeconfig,
        OPERATOR_NAMESPACE: NS,
        OPERATOR_LOGIN_SERVER: ts.controlUrl,
        CLIENT_ID_FILE: join(dir(), 'client-id'),
        CLIENT_SECRET_FILE: join(dir(), 'client-secret'),
        PROXY_IMAGE: 'tailscale/tailscale:v1.102.5',
        // tsnet's state (os.UserConfigDir) in the test's directory; no log uploads; only loopback here.
        HOME: dir(),
        XDG_CONFIG_HOME: dir(),
        TS_NO_LOGS_NO_SUPPORT: 'true',
        TS_ASSUME_NETWORK_UP_FOR_TEST: '1',
      });
    },
    { timeout: BUILD_AND_START_TIMEOUT_MS },
  );
  after(async () => {
    await operator?.terminate(10_000);
    await injector?.stop();
    await relay?.close();
    await ts?.stop();
  });

  /** The operator's StatefulSet, once written. */
  async function statefulSet(name: string, timeoutMs = 120_000): Promise<StatefulSet> {
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      const r = await cp().kubectl(['get', 'statefulset', name, '-n', NS, '-o', 'json']);
      if (r.code === 0) return JSON.parse(r.stdout) as StatefulSet;
      if (performance.now() > deadline || operator?.exitInfo)
        throw new Error(`no StatefulSet ${name}: ${r.stderr}\noperator:\n${operator?.tail(80)}\napi calls: ${(await ts.apiCalls()).join(', ')}`);
      await new Promise((res) => setTimeout(res, 500));
    }
  }

  /** The Pod the operator's StatefulSet describes: its template, named as replica `ordinal`. */
  function templatePod(set: StatefulSet, ordinal: number): V1Pod {
    const template = set.spec.template;
    const metadata = { name: `${set.metadata.name}-${ordinal}`, labels: template.metadata?.labels, annotations: template.metadata?.annotations };
    return { apiVersion: 'v1', kind: 'Pod', metadata, spec: template.spec };
  }

  /** A replica's Pod as the StatefulSet controller makes it from the template (kube-controller-manager's pod_control). */
  function replicaPod(set: StatefulSet, ordinal: number): V1Pod {
    const pod = templatePod(set, ordinal);
    const name = pod.metadata!.name!;
    const owner = { apiVersion: 'apps/v1', kind: 'StatefulSet', name: set.metadata.name, uid: set.metadata.uid, controller: true, blockOwnerDeletion: true };
    return {
      ...pod,
      metadata: {
        ...pod.metadata,
        labels: { ...pod.metadata!.labels, 'statefulset.kubernetes.io/pod-name': name, 'apps.kubernetes.io/pod-index': String(ordinal) },
        ownerReferences: [owner],
      },
      spec: { ...pod.spec!, hostname: name, ...(set.spec.serviceName ? { subdomain: set.spec.serviceName } : {}) },
    };
  }

  /** `pod` as the apiserver would store it in a namespace of no webhook and no policy: defaulted, nothing added. */
  async function defaulted(pod: V1Pod): Promise<{ labels: unknown; annotations: unknown; spec: unknown }> {
    const r = await must(
      cp().kubectl(['create', '-n', PLAIN, '-f', '-', '--dry-run=server', '-o', 'json'], { input: JSON.stringify({ ...pod, apiVersion: 'v1', kind: 'Pod' }) }),
    );
    const { metadata, spec } = JSON.parse(r) as V1Pod;
    return { labels: metadata!.labels, annotations: metadata!.annotations, spec };
  }

  it('the operator writes the StatefulSet; its replica Pod gets the socket volume, TS_SOCKET, the hook, the agent and certshare', async () => {
    const proxyClass = {
      apiVersion: 'tailscale.com/v1alpha1',
      kind: 'ProxyClass',
      metadata: { name: 'certshare' },
      spec: { statefulSet: { pod: { annotations: FIXTURE.metadata!.annotations } } },
    };
    const proxyGroup = {
      apiVersion: 'tailscale.com/v1alpha1',
      kind: 'ProxyGroup',
      metadata: { name: 'ingress' },
      spec: { type: 'ingress', replicas: 2, proxyClass: 'certshare' },
    };
    await must(cp().kubectl(['apply', '-f', '-'], { input: JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [proxyClass, proxyGroup] }) }));
    const set = await statefulSet('ingress');
    // What the operator asked of Tailscale's API: a token, then a key for its own node and one per replica.
    assert.deepEqual(await ts.apiCalls(), ['POST /api/v2/oauth/token 1', 'POST /api/v2/tailnet/-/keys 3']);
    // The unit tier's Pod is the operator's, field for field.
    assert.deepEqual(await defaulted(templatePod(set, 0)), await defaulted(FIXTURE), "the unit tier's operatorProxyGroupPod is out of date");
    const pod = replicaPod(set, 0);
    await must(cp().kubectl(['create', '-n', NS, '-f', '-'], { input: JSON.stringify(pod) }));
    const stored = JSON.parse(await must(cp().kubectl(['get', 'pod', pod.metadata!.name!, '-n', NS, '-o', 'json']))) as V1Pod;
    const all = [...(stored.spec!.initContainers ?? []), ...stored.spec!.containers];
    const byName = (name: string): V1Container | undefined => all.find((c) => c.name === name);
    const tailscale = byName('tailscale')!;
    assert.deepEqual(tailscale.lifecycle?.postStart, { exec: { command: OPERATOR_HOOK } });
    assert.deepEqual(stored.spec!.volumes!.find((v) => v.name === 'tailscale-socket')?.emptyDir, {});
    assert.ok(tailscale.volumeMounts!.some((m) => m.name === 'tailscale-socket' && m.mountPath === '/var/run/tailscale'));
    assert.deepEqual(
      tailscale.env!.filter((e) => e.name === 'TS_SOCKET'),
      [{ name: 'TS_SOCKET', value: PROXY_GROUP_SOCKET }],
    );
    const agent = byName('certshare-advertise');
    const certshare = byName('certshare');
    assert.ok(agent && certshare, 'the agent and certshare');
    for (const c of [agent, certshare]) {
      assert.ok(
        c.volumeMounts!.some((m) => m.name === 'tailscale-socket' && m.mountPath === '/var/run/tailscale'),
        `${c.name} mounts the socket`,
      );
      assert.ok(
        c.env!.some((e) => e.name === 'CERTSHARE_LOCALAPI' && e.value === PROXY_GROUP_SOCKET),
        c.name,
      );
    }
    assert.equal(certshare.restartPolicy, 'Always', 'a native sidecar');
    assert.ok(
      certshare.env!.some((e) => e.name === 'CERTSHARE_ADVERTISE_AGENT'),
      'certshare asks the agent',
    );
    assert.match(stored.metadata!.annotations![ADVERTISE_OWNER_ANNOTATION]!, /the advertise agent only withdraws$/);
    assert.equal(stored.spec!.initContainers![0]!.name, 'sysctler', "the operator's init container first, as it was");
  });

  it("the operator's replicas keep the default grace of 30 s (a ProxyClass cannot set it): on certshare's defaults its stop is fitted into it", async () => {
    const set = await statefulSet('ingress');
    const pod = replicaPod(set, 1);
    const { spec } = (await defaulted(pod)) as { spec: V1PodSpec };
    assert.equal(spec.terminationGracePeriodSeconds, 30, 'the default: the operator sets none');
    pod.metadata!.annotations = { ...pod.metadata!.annotations, [ANNOTATION.flags]: '--served-check=127.0.0.1:8443 --advertise-services=svc:proxy' };
    const r = await cp().kubectl(['create', '-n', NS, '-f', '-', '--dry-run=server', '-o', 'json'], { input: JSON.stringify(pod) });
    assert.equal(r.code, 0, r.stderr);
    const created = JSON.parse(r.stdout) as V1Pod;
    const certshare = created.spec!.initContainers!.find((c) => c.name === 'certshare')!;
    assert.deepEqual(
      certshare.env!.filter((e) => e.name === 'CERTSHARE_SHUTDOWN_TIMEOUT'),
      [{ name: 'CERTSHARE_SHUTDOWN_TIMEOUT', value: '10s' }],
      "30 s less the preStop call's 20 s",
    );
    assert.match(
      created.metadata!.annotations![STOP_FITTED_ANNOTATION]!,
      /^--shutdown-timeout=10s: terminationGracePeriodSeconds 30 less 20s of --advertise-failover/,
    );
    // A value given that does not fit is refused as before.
    pod.metadata!.annotations![ANNOTATION.flags] += ' --shutdown-timeout=11s';
    const refused = await cp().kubectl(['create', '-n', NS, '-f', '-', '--dry-run=server'], { input: JSON.stringify(pod) });
    assert.notEqual(refused.code, 0, 'admitted');
    assert.match(refused.stderr, /--advertise-failover .*20s\) plus --shutdown-timeout .*11s\) must fit the Pod's terminationGracePeriodSeconds \(30\)/);
  });

  it("the replica's tailscaled, started by containerboot from the operator's config Secret, logs in to control with the key the operator minted", async () => {
    const secret = JSON.parse(await must(cp().kubectl(['get', 'secret', 'ingress-0-config', '-n', NS, '-o', 'json']))) as { data: Record<string, string> };
    const [file, ...others] = Object.keys(secret.data);
    assert.ok(file && others.length === 0 && /^cap-\d+\.hujson$/.test(file), `one config file: ${Object.keys(secret.data).join()}`);
    const config = JSON.parse(Buffer.from(secret.data[file]!, 'base64').toString()) as Record<string, unknown>;
    assert.equal(config.ServerURL, ts.controlUrl, 'the login server the operator was given');
    assert.equal(config.AuthKey, 'tskey-auth-tsenv2', "the replica's own key (the operator's node had the first)");
    assert.equal(config.Locked, false, 'prefs may be edited: the hook can name the agent operator');
    const configDir = join(dir(), 'tsconfig', 'ingress-0');
    await mkdir(configDir, { recursive: true });
    await projectConfig(configDir, 1, config, file);
    // The replica's environment as the Pod gives it, less what needs the cluster (a kube state Secret, the kubelet's
    // fieldRefs, the cert share through Secrets) or a TUN device, and the ConfigMap's files this ProxyGroup has none of yet.
    const tailscale = templatePod(await statefulSet('ingress'), 0).spec!.containers.find((c) => c.name === 'tailscale')!;
    const kept = ['TS_EXPERIMENTAL_SERVICE_AUTO_ADVERTISEMENT', 'TS_DEBUG_ACME_FORCE_RENEWAL', 'TS_INTERNAL_APP'];
    const env = Object.fromEntries(tailscale.env!.filter((e) => kept.includes(e.name)).map((e) => [e.name, e.value!]));
    assert.equal(Object.keys(env).length, kept.length, JSON.stringify(tailscale.env));
    await ts.startContainerboot(configDir, env);
    const status = JSON.parse((await ts.localApi('/localapi/v0/status?peers=false')).body) as { BackendState: string; Self: { HostName: string } };
    assert.equal(status.BackendState, 'Running');
    assert.equal(status.Self.HostName, 'ingress-0', "the operator's hostname for replica 0");
  });

  /** Polls `read` every 250 ms until it returns a value, or fails naming `what` with the operator's last lines. */
  async function eventually<T>(what: string, read: () => Promise<T | undefined>, timeoutMs = 60_000): Promise<T> {
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      const value = await read();
      if (value !== undefined) return value;
      if (performance.now() > deadline || operator?.exitInfo)
        throw new Error(`timed out waiting for ${what}\noperator:\n${operator?.tail(60)}\napi calls: ${(await ts.apiCalls()).join(', ')}`);
      await new Promise((res) => setTimeout(res, 250));
    }
  }

  async function getJson<T>(args: string[]): Promise<T | undefined> {
    const r = await cp().kubectl([...args, '-o', 'json']);
    return r.code === 0 ? (JSON.parse(r.stdout) as T) : undefined;
  }

  /** The AdvertiseServices of each replica's config file, as the operator writes it into ingress-<n>-config. */
  async function advertisedByFile(): Promise<Record<string, unknown>> {
    const out: Record<string, unknown> = {};
    for (const n of [0, 1]) {
      const secret = await getJson<{ data: Record<string, string> }>(['get', 'secret', `ingress-${n}-config`, '-n', NS]);
      for (const [file, data] of Object.entries(secret?.data ?? {}))
        out[`ingress-${n}/${file}`] = (JSON.parse(Buffer.from(data, 'base64').toString()) as { AdvertiseServices?: string[] }).AdvertiseServices ?? [];
    }
    return out;
  }

  it("an HA Ingress: the operator writes the serve config and advertises svc:proxy in the replicas' files, the Service certshare's agent watches", async () => {
    // What the operator reads of a replica to call its ProxyGroup Available and name a Service's domain
    // (proxygroup.go getRunningProxies, getNodeMetadata; svc-for-pg.go dnsNameForService): the replica's state Secret
    // ingress-0 with pod_uid (the running Pod's UID) and device_fqdn, which containerboot writes through the Kubernetes
    // API, device_ips, and tailscaled's kube state store's _current-profile naming a profile whose Config carries the
    // NodeID and UserProfile.LoginName (the node's MagicDNS name, as Tailscale's control gives a tagged node). Written
    // here as they would write it, from the real replica started above: its tailscaled here keeps its state in a file.
    const pod = JSON.parse(await must(cp().kubectl(['get', 'pod', 'ingress-0', '-n', NS, '-o', 'json']))) as V1Pod;
    const self = (JSON.parse((await ts.localApi('/localapi/v0/status?peers=false')).body) as { Self: { ID: string; DNSName: string; TailscaleIPs: string[] } })
      .Self;
    const fqdn = self.DNSName.replace(/\.$/, '');
    const profile = { Config: { NodeID: self.ID, UserProfile: { LoginName: fqdn } }, AdvertiseServices: [] };
    const stringData = {
      pod_uid: pod.metadata!.uid!,
      device_fqdn: self.DNSName,
      device_ips: JSON.stringify(self.TailscaleIPs),
      device_id: self.ID,
      '_current-profile': 'profile-c5e1',
      'profile-c5e1': JSON.stringify(profile),
    };
    await must(cp().kubectl(['patch', 'secret', 'ingress-0', '-n', NS, '--type=merge', '-p', JSON.stringify({ stringData })]));
    interface Condition {
      type: string;
      status: string;
    }
    const available = await eventually('the ProxyGroup Available', async () => {
      const pg = await getJson<{ status?: { conditions?: Condition[]; devices?: unknown[] } }>(['get', 'proxygroup', 'ingress']);
      const c = pg?.status?.conditions?.find((x) => x.type === 'ProxyGroupAvailable');
      return c?.status === 'True' ? pg!.status : undefined;
    });
    // testcontrol keeps the name the node first registered with (the harness's), not containerboot's HostName.
    const [nodeName, tailnet] = fqdn.split(/\.(.*)/) as [string, string];
    assert.deepEqual(available.devices, [{ hostname: nodeName, tailnetIPs: self.TailscaleIPs }]);

    // The Ingress, as Tailscale's docs give it for a ProxyGroup: the IngressClass of the operator's manifests, a backend.
    const ingressClass = {
      apiVersion: 'networking.k8s.io/v1',
      kind: 'IngressClass',
      metadata: { name: 'tailscale' },
      spec: { controller: 'tailscale.com/ts-ingress' },
    };
    const backend = {
      apiVersion: 'v1',
      kind: 'Service',
      metadata: { name: 'web', namespace: PLAIN },
      spec: { selector: { app: 'web' }, ports: [{ port: 80, targetPort: 8080 }] },
    };
    const ingress = {
      apiVersion: 'networking.k8s.io/v1',
      kind: 'Ingress',
      metadata: { name: 'web', namespace: PLAIN, annotations: { 'tailscale.com/proxy-group': 'ingress' } },
      spec: { ingressClassName: 'tailscale', defaultBackend: { service: { name: 'web', port: { number: 80 } } }, tls: [{ hosts: ['proxy'] }] },
    };
    await must(cp().kubectl(['apply', '-f', '-'], { input: JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [ingressClass, backend, ingress] }) }));
    const clusterIp = (JSON.parse(await must(cp().kubectl(['get', 'service', 'web', '-n', PLAIN, '-o', 'json']))) as { spec: { clusterIP: string } }).spec
      .clusterIP;

    const domain = `proxy.${tailnet}`;
    const serveConfig = await eventually('the serve config of svc:proxy', async () => {
      const cm = await getJson<{ binaryData?: Record<string, string> }>(['get', 'configmap', 'ingress-ingress-config', '-n', NS]);
      const raw = cm?.binaryData?.['serve-config.json'];
      const parsed = raw === undefined ? undefined : (JSON.parse(Buffer.from(raw, 'base64').toString()) as { Services?: Record<string, unknown> });
      return parsed?.Services?.['svc:proxy'] ? parsed : undefined;
    });
    assert.deepEqual(serveConfig, {
      Services: { 'svc:proxy': { TCP: { '443': { HTTPS: true } }, Web: { [`${domain}:443`]: { Handlers: { '/': { Proxy: `http://${clusterIp}:80/` } } } } } },
    });
    const [service, ...others] = await eventually('the Tailscale Service created', async () => {
      const services = await ts.apiVipServices();
      return services.length > 0 ? services : undefined;
    });
    assert.equal(others.length, 0);
    assert.equal(service!.name, 'svc:proxy');
    assert.deepEqual(service!.ports, ['tcp:443']);
    assert.deepEqual(service!.tags, ['tag:k8s']);
    assert.match(service!.annotations!['tailscale.com/owner-references']!, /^\{"ownerRefs":\[\{"operatorID":"[^"]+"\}\]\}$/);
    assert.equal(service!.addrs!.length, 2, 'a VIP given at creation');

    // The operator advertises an HTTPS-only Service once its certificate is in the Secret named by the domain (hasCerts),
    // which the replica holding the cert share fills; written here as it would.
    const pair = await makePair(domain, Date.now() - 60_000, 90 * DAY);
    const tls = { 'tls.crt': Buffer.from(pair.certPem).toString('base64'), 'tls.key': Buffer.from(pair.keyPem).toString('base64') };
    await eventually('the TLS Secret', () => getJson(['get', 'secret', domain, '-n', NS]));
    await must(cp().kubectl(['patch', 'secret', domain, '-n', NS, '--type=merge', '-p', JSON.stringify({ data: tls })]));
    const files = await eventually("svc:proxy in both replicas' files", async () => {
      const byFile = await advertisedByFile();
      return Object.values(byFile).every((v) => JSON.stringify(v) === '["svc:proxy"]') && Object.keys(byFile).length === 2 ? byFile : undefined;
    });
    assert.deepEqual(
      Object.keys(files).map((k) => k.replace(/cap-\d+/, 'cap-N')),
      ['ingress-0/cap-N.hujson', 'ingress-1/cap-N.hujson'],
    );
    // What the operator asked of Tailscale's API for it: nothing the stand-in does not serve (501).
    const calls = (await ts.apiCalls()).map((c) => c.replace(/ \d+$/, ''));
    assert.deepEqual(calls, [
      'GET /api/v2/tailnet/-/vip-services/{name}',
      'POST /api/v2/oauth/token',
      'POST /api/v2/tailnet/-/keys',
      'PUT /api/v2/tailnet/-/vip-services/{name}',
    ]);

    // What the injected replica holds: the operator's files through its mounts, the Services its agent may withdraw,
    // and certshare's domain.
    const all = [...(pod.spec!.initContainers ?? []), ...pod.spec!.containers];
    const tailscale = all.find((c) => c.name === 'tailscale')!;
    const env = (name: string, c: V1Container = tailscale): string | undefined => c.env?.find((e) => e.name === name)?.value;
    assert.equal(env('TS_SERVE_CONFIG'), '/etc/proxies/serve-config.json', 'the serve config: the ConfigMap ingress-ingress-config at /etc/proxies');
    assert.ok(tailscale.volumeMounts!.some((m) => m.name === 'ingress-ingress-config' && m.mountPath === '/etc/proxies'));
    assert.equal(env('TS_EXPERIMENTAL_VERSIONED_CONFIG_DIR'), '/etc/tsconfig/$(POD_NAME)', "AdvertiseServices: the replica's config Secret");
    assert.equal(env('TS_EXPERIMENTAL_CERT_SHARE'), 'true', "tailscaled's own certificate for the Service's domain, shared through the TLS Secret");
    assert.equal(
      env(
        'CERTSHARE_ADVERTISE_SERVICES',
        all.find((c) => c.name === 'certshare-advertise'),
      ),
      'svc:proxy',
      "the agent's allow list is the operator's Service",
    );
    assert.equal(
      pod.metadata!.annotations![ANNOTATION.domains]!.split('.')[0],
      'proxy',
      "certshare's domain has the Service's label (its tailnet: the ProxyClass's)",
    );
  });

  it("the replica reloads the operator's file: control sees its Services; the agent says which it does not watch, withdraws its own at SIGTERM", async () => {
    // A second HA Ingress on the ProxyGroup, of no TLS host (its Service named after it) and an HTTP endpoint (advertised
    // before any certificate): the ProxyClass's certshare flags name svc:proxy only.
    const other = {
      apiVersion: 'networking.k8s.io/v1',
      kind: 'Ingress',
      metadata: { name: 'other', namespace: PLAIN, annotations: { 'tailscale.com/proxy-group': 'ingress', 'tailscale.com/http-endpoint': 'enabled' } },
      spec: { ingressClassName: 'tailscale', defaultBackend: { service: { name: 'web', port: { number: 80 } } } },
    };
    await must(cp().kubectl(['apply', '-f', '-'], { input: JSON.stringify(other) }));
    const both = ['svc:proxy', `svc:${PLAIN}-other-ingress`];
    await eventually('both Services in the files', async () => {
      const byFile = await advertisedByFile();
      return Object.values(byFile).every((v) => JSON.stringify(v) === JSON.stringify(both)) ? byFile : undefined;
    });
    // The kubelet swaps the replica's projected Secret; containerboot reloads tailscaled's config from it.
    const secret = JSON.parse(await must(cp().kubectl(['get', 'secret', 'ingress-0-config', '-n', NS, '-o', 'json']))) as { data: Record<string, string> };
    const [file] = Object.keys(secret.data) as [string];
    const prefs = await watchPrefs(ts);
    const exchange = join(dir(), 'exchange');
    let agent: ManagedProcess | undefined;
    try {
      await projectConfig(
        join(dir(), 'tsconfig', 'ingress-0'),
        2,
        JSON.parse(Buffer.from(secret.data[file]!, 'base64').toString()) as Record<string, unknown>,
        file,
      );
      await eventually('the file’s list in the prefs', async () => (prefs.seen.at(-1)?.list === JSON.stringify(both) ? true : undefined));
      const seenByControl = async (): Promise<string[] | undefined> => {
        const nodes = await ts.vipServices();
        return nodes.map(servicesControlSees).find((services) => services !== undefined && services.length > 0);
      };
      assert.deepEqual(await eventually('control seeing the Services', seenByControl), [...both].sort());

      // The advertise agent, as the injector gives it to this replica (the Pod's --advertise-services), run as root
      // here (the operator right by the hook: proxy-group-agent.test.ts); certshare has written no request yet.
      await mkdir(join(exchange, 'request'), { recursive: true });
      await mkdir(join(exchange, 'status'));
      const pod = JSON.parse(await must(cp().kubectl(['get', 'pod', 'ingress-0', '-n', NS, '-o', 'json']))) as V1Pod;
      const agentContainer = [...(pod.spec!.initContainers ?? []), ...pod.spec!.containers].find((c) => c.name === 'certshare-advertise')!;
      const services = agentContainer.env!.find((e) => e.name === 'CERTSHARE_ADVERTISE_SERVICES')!.value!;
      const args = [BIN, 'advertise-agent', '--localapi', ts.socket, '--advertise-services', services, '--exchange', exchange, '--log-format', 'json'];
      agent = new ManagedProcess('advertise-agent', process.execPath, args, process.env.CERTSHARE_TS_VERBOSE === '1');
      await eventually('the agent saying what it does not watch', async () => agent!.lines.find((l) => l.includes('CERTSHARE_ADVERTISE_UNWATCHED'))).then(
        (line) => assert.match(line, new RegExp(`advertises svc:${PLAIN}-other-ingress, not in --advertise-services \\(svc:proxy\\)`)),
      );
      assert.equal(prefs.seen.at(-1)?.list, JSON.stringify(both), 'no request yet: the file’s word stands');
      const stopping = performance.now();
      await agent.terminate(15_000);
      const exitedMs = performance.now() - stopping;
      agent = undefined;
      assert.equal(prefs.seen.at(-1)?.list, JSON.stringify(both.slice(1)), 'svc:proxy withdrawn before the agent exited, the other Service kept');
      assert.deepEqual(
        await eventually('control seeing the withdrawal', async () => {
          const seen = await seenByControl();
          return seen?.length === 1 ? seen : undefined;
        }),
        both.slice(1),
      );
      process.stderr.write(`operator's HA Ingress replica: the agent withdrew svc:proxy and exited ${Math.round(exitedMs)} ms after SIGTERM\n`);
    } catch (err) {
      process.stderr.write(`on failure: the prefs' changes ${JSON.stringify(prefs.seen)}\nthe agent said:\n${agent?.lines.join('\n')}\n`);
      throw err;
    } finally {
      await agent?.terminate(15_000);
      await prefs.stop();
    }
  });

  it('the same Pod in a namespace not listed gets no socket volume and no hook: refused for lack of a socket, as any other', async () => {
    const pod = replicaPod(await statefulSet('ingress'), 1);
    const r = await cp().kubectl(['create', '-n', TENANT, '-f', '-', '--dry-run=server'], { input: JSON.stringify(pod) });
    assert.notEqual(r.code, 0, 'admitted');
    assert.match(r.stderr, /admission webhook "inject\.certshare\.io" denied the request: .*the Pod has no volume "tailscale-socket" for tailscaled's socket/);
  });
});
