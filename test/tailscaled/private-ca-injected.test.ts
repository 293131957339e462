// A private ACME CA trusted by an injected sidecar, end to end: the injector configured as its Deployment
// configures it (CERTSHARE_SIDECAR_CA_CONFIGMAP, and CERTSHARE_SIDECAR_FLAGS naming the CA's directory), the
// Pod it injects stored by the real kube-apiserver, the ConfigMap's key projected and the sidecar's
// environment resolved from the stored Pod as the kubelet does (paths moved under a temporary directory),
// and `certshare run` started as a process with exactly that environment beside a real tailscaled and
// pebble's ACME front, whose TLS certificate only the CA in the ConfigMap signs.
import assert from 'node:assert/strict';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { after, describe, it } from 'node:test';
import type { V1Pod } from '../../src/kube/transport/client-node.ts';
import { parseFlags } from '../../src/flags/flags.ts';
import { INJECTOR_FLAGS, injectorConfigFrom } from '../../src/config/injector-options.ts';
import { injectionFor } from '../../src/injector/mutate.ts';
import { CertshareProcess } from '../harness/certshare-process.ts';
import type { ControlPlane } from '../harness/control-plane.ts';
import { BUILD_AND_START_TIMEOUT_MS, useRealTailscaled } from '../harness/tailscale.ts';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { ariAnswers, ariFlags, assertOneIssuance, issuanceCount, NOTHING, nextStored } from '../support/ari-process.ts';
import { exampleNamespace, KUBE_DOMAIN, KUBE_DOMAIN_TAILSCALED, replicaKubeconfig } from '../support/kube.ts';
import { FAST_FLAGS, useTempDir } from '../support/standalone.ts';

const POD_IP = '10.0.0.10';

/**
 * `certshare run` flags as one `--sidecar-flags` value (`--name=value` each, the last of a flag winning):
 * the fast tier's timing, then ARI's; not --listen, which the injector sets (the container's port).
 */
function asSidecarFlags(args: string[]): string {
  const flags = new Map<string, string>();
  for (let i = 0; i < args.length; i += 2) flags.set(args[i]!, args[i + 1]!);
  flags.delete('--listen');
  return [...flags].map(([name, value]) => `${name}=${value}`).join(' ');
}

/**
 * The environment the kubelet gives container `name` of the stored `pod`, for a process on this machine:
 * its configMap volumes projected under `root` (each item's key to its path, a missing ConfigMap or key
 * failing as the kubelet's FailedMount does), field references resolved, and every value naming a path
 * under a mount moved to that mount's directory here (`root` + the mount path for a ConfigMap, `hostDirs`
 * for the others).
 */
async function kubeletEnv(cp: ControlPlane, pod: V1Pod, name: string, root: string, hostDirs: Record<string, string>): Promise<Record<string, string>> {
  const spec = pod.spec!;
  const container = [...(spec.initContainers ?? []), ...spec.containers].find((c) => c.name === name);
  assert.ok(container, `container ${name}`);
  const moved = new Map(Object.entries(hostDirs));
  for (const mount of container.volumeMounts ?? []) {
    const source = spec.volumes?.find((v) => v.name === mount.name)?.configMap;
    if (!source) continue;
    const res = await cp.adminRequest('GET', `/api/v1/namespaces/${pod.metadata!.namespace}/configmaps/${source.name}`);
    assert.equal(res.status, 200, `FailedMount: configmap "${source.name}" not found`);
    const data = (JSON.parse(res.body) as { data?: Record<string, string> }).data ?? {};
    const dir = join(root, mount.mountPath);
    await mkdir(dir, { recursive: true });
    for (const item of source.items ?? []) {
      assert.ok(item.key in data, `FailedMount: configmap references non-existent config key: ${item.key}`);
      await mkdir(dirname(join(dir, item.path)), { recursive: true });
      await writeFile(join(dir, item.path), data[item.key]!, { mode: 0o444 });
    }
    moved.set(mount.mountPath, dir);
  }
  const fields: Record<string, string> = {
    'metadata.name': pod.metadata!.name!,
    'metadata.namespace': pod.metadata!.namespace!,
    'metadata.uid': pod.metadata!.uid!,
    'status.podIPs': POD_IP,
  };
  const env: Record<string, string> = {};
  for (const e of container.env ?? []) {
    const fieldPath = e.valueFrom?.fieldRef?.fieldPath;
    const value = e.value ?? (fieldPath ? fields[fieldPath] : undefined);
    assert.ok(value !== undefined, `${e.name}: a value or a field this emulation knows`);
    const mountPath = [...moved.keys()].find((p) => value === p || value.startsWith(`${p}/`));
    env[e.name] = mountPath ? moved.get(mountPath)! + value.slice(mountPath.length) : value;
  }
  return env;
}

describe('a private ACME CA trusted by an injected sidecar (--sidecar-ca-configmap), as a process', { timeout: BUILD_AND_START_TIMEOUT_MS }, () => {
  const cp = useControlPlane();
  const dir = useTempDir();
  // The example's RBAC names the domain's Secret.
  const realTailscaled = useRealTailscaled(KUBE_DOMAIN_TAILSCALED);
  let sidecar: CertshareProcess | undefined;
  after(() => sidecar?.stop());

  it("issues, then reads the CA's renewal window over TLS trusted through the ConfigMap's certificate alone", async () => {
    const ts = realTailscaled();
    const directory = await ts.acmeDirectoryUrl();
    // The ACME front's TLS is the private CA's: nothing here trusts it by default.
    await assert.rejects(fetch(directory, { signal: AbortSignal.timeout(10_000) }), 'pebble is not trusted without the private CA');

    const ns = await exampleNamespace(cp());
    const bundle = await readFile(ts.acmeCaBundle, 'utf8');
    const configMap = { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'acme-ca' }, data: { 'root.pem': bundle } };
    assert.equal((await cp().adminRequest('POST', `/api/v1/namespaces/${ns}/configmaps`, { body: configMap })).status, 201);

    // The injector as its Deployment sets it up: flags as CERTSHARE_* variables.
    const injectorEnv = {
      CERTSHARE_SIDECAR_CA_CONFIGMAP: 'acme-ca:root.pem',
      CERTSHARE_SIDECAR_FLAGS: asSidecarFlags([...FAST_FLAGS, ...ariFlags(directory)]),
    };
    const { defaults } = injectorConfigFrom(parseFlags(INJECTOR_FLAGS, [], injectorEnv), {});
    const asked: V1Pod = {
      apiVersion: 'v1',
      kind: 'Pod',
      metadata: {
        name: 'proxy-0',
        namespace: ns,
        annotations: { 'certshare.io/inject': 'true', 'certshare.io/domains': KUBE_DOMAIN, 'certshare.io/mode': 'rw' },
      },
      spec: {
        serviceAccountName: 'certshare',
        containers: [
          { name: 'proxy', image: 'nginx' },
          { name: 'tailscale', image: 'tailscale/tailscale', volumeMounts: [{ name: 'tailscale-socket', mountPath: '/var/run/tailscale' }] },
        ],
        volumes: [{ name: 'tailscale-socket', emptyDir: {} }],
      },
    };
    const injection = injectionFor(asked, defaults);
    assert.equal(injection.kind, 'inject');
    const created = await cp().adminRequest('POST', `/api/v1/namespaces/${ns}/pods`, { body: injection.pod });
    assert.equal(created.status, 201, created.body);
    const stored = JSON.parse(created.body) as V1Pod;

    const root = join(dir(), 'proxy-0');
    const outDir = join(dir(), 'certs');
    const env = await kubeletEnv(cp(), stored, 'certshare', root, { '/certs': outDir, '/var/run/tailscale': dirname(ts.socket) });
    assert.equal(env.NODE_EXTRA_CA_CERTS, join(root, '/etc/certshare/ca/ca.crt'));
    assert.equal(await readFile(env.NODE_EXTRA_CA_CERTS, 'utf8'), bundle, "the ConfigMap's key, projected");
    assert.equal(env.CERTSHARE_LOCALAPI, ts.socket);
    // The container's port is the Pod's own; here, a free one on loopback. The token comes as a kubeconfig.
    env.CERTSHARE_LISTEN = '127.0.0.1:0';
    env.KUBECONFIG = await replicaKubeconfig(cp(), ns, 'proxy-0');

    sidecar = await CertshareProcess.start('proxy-0', [], env);
    await nextStored(sidecar, 0, 60_000);
    // In the Secret first, then projected into the out-dir.
    await sidecar.logged('certificate files written', (l) => l.msg === 'certificate files written');
    const certPem = await readFile(join(outDir, KUBE_DOMAIN, 'tls.crt'), 'utf8');
    const [answer] = await ariAnswers(sidecar, certPem, 1);
    assert.match(answer!.msg, /^CA suggests renewal /);
    const metric = await sidecar.metrics();
    assert.ok(metric('certshare_ari_checks_total', { outcome: 'ok' }) >= 1);
    assert.equal(metric('certshare_ari_checks_total'), metric('certshare_ari_checks_total', { outcome: 'ok' }), 'no failed check');
    assertOneIssuance(NOTHING, await issuanceCount(ts, sidecar));
  });
});
