// The deployable manifests against a real kube-apiserver (RBAC on): they apply, their RBAC allows exactly
// what certshare needs, the daemon runs under them with the example's own environment, every
// CERTSHARE_* variable is a real flag, and the alerts use only metric names the daemon exports.
import assert from 'node:assert/strict';
import { X509Certificate } from 'node:crypto';
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { createServer, type AddressInfo } from 'node:net';
import { request as httpsRequest } from 'node:https';
import { mkdir, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { loadAll } from 'js-yaml';
import { envName } from '../../src/flags/flags.ts';
import { RUN_FLAGS } from '../../src/config/run-options.ts';
import { leaseHolderPod } from '../support/kube.ts';
import { startEmulator, type Emulator } from '../../src/emulator/server.ts';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { SIDECAR_SECURITY_CONTEXT } from '../../src/injector/sidecar.ts';
import { injectTemplate } from '../support/injector-example.ts';
import { CLAIM_LABEL, CLAIMS_POLICY, claimsPolicyInForce, namespaceAdmin, replicaKubeconfig } from '../support/kube.ts';
import { breakGlassClaimNames } from '../../src/kube/break-glass-claim.ts';
import { emulatorIn, standaloneDaemon, tempDir } from '../support/standalone.ts';
import { until } from '../support/wait.ts';

const REPO = fileURLToPath(new URL('../../', import.meta.url));
const EXAMPLE = join(REPO, 'manifests/example');
const DOMAIN = 'proxy.tailnet-0000.ts.net';
const LEASE = 'certshare-proxy';
/** The group's issuance ledger ConfigMap (--issuance-budget). */
const LEDGER = 'certshare-proxy-ledger';
const GATE = 'certshare.io/certificates';
const PLACEHOLDER = 'example.tailnet-0000.ts.net';
const TOKEN_PATH = '/var/run/secrets/kubernetes.io/serviceaccount';

interface EnvVar {
  name: string;
  value?: string;
  valueFrom?: { fieldRef?: { fieldPath: string }; secretKeyRef?: { name: string; key: string } };
}
interface VolumeMount {
  name: string;
  mountPath: string;
  readOnly?: boolean;
}
interface Volume {
  name: string;
  projected?: { sources: Array<Record<string, Record<string, unknown>>> };
  [source: string]: unknown;
}
interface Container {
  name: string;
  image: string;
  volumeMounts?: VolumeMount[];
  restartPolicy?: string;
  env?: EnvVar[];
  ports?: Array<{ name?: string; containerPort: number }>;
  readinessProbe?: { httpGet?: { path: string; port: number | string }; tcpSocket?: unknown };
  livenessProbe?: { httpGet?: unknown; tcpSocket?: { port: number | string } };
  resources?: { requests?: Record<string, string>; limits?: Record<string, string> };
  securityContext?: Record<string, unknown>;
}
interface PodSpec {
  serviceAccountName?: string;
  automountServiceAccountToken?: boolean;
  volumes?: Volume[];
  terminationGracePeriodSeconds?: number;
  readinessGates?: Array<{ conditionType: string }>;
  securityContext?: { fsGroup?: number };
  initContainers?: Container[];
  containers: Container[];
}
interface K8sObject {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string> };
  spec?: Record<string, unknown>;
  rules?: Array<{ apiGroups: string[]; resources: string[]; resourceNames?: string[]; verbs: string[] }>;
}
interface StatefulSet extends K8sObject {
  spec: {
    replicas: number;
    serviceName: string;
    template: { metadata: { labels: Record<string, string>; annotations?: Record<string, string> }; spec: PodSpec };
  };
}

async function yamlDocs(path: string): Promise<K8sObject[]> {
  return (loadAll(await readFile(path, 'utf8')) as Array<K8sObject | null>).filter((d): d is K8sObject => d !== null);
}

const exampleStatefulSet = async (): Promise<StatefulSet> =>
  (await yamlDocs(join(EXAMPLE, 'statefulset.yaml'))).find((d) => d.kind === 'StatefulSet') as StatefulSet;
/** The example's Pods get certshare from the injector (manifests/injector): the template as it injects it. */
const injected = (sts: StatefulSet, injectorArgs: string[] = []): PodSpec => injectTemplate(sts.spec.template as never, injectorArgs) as unknown as PodSpec;
const sidecarOf = (spec: PodSpec): Container => {
  const sidecar = spec.initContainers?.find((c) => c.name === 'certshare');
  assert.ok(sidecar, 'certshare init container');
  return sidecar;
};

/**
 * Only certshare holds the ServiceAccount token: no automount, and the one volume at the standard path
 * is a projected token (with the CA and namespace client libraries read there) mounted by certshare alone.
 */
function assertTokenOnlyInCertshare(spec: PodSpec): void {
  assert.equal(spec.automountServiceAccountToken, false, 'automountServiceAccountToken: false');
  const mounting = [...(spec.initContainers ?? []), ...spec.containers].filter((c) =>
    c.volumeMounts?.some((m) => m.mountPath === TOKEN_PATH || m.mountPath.startsWith(`${TOKEN_PATH}/`)),
  );
  assert.deepEqual(
    mounting.map((c) => c.name),
    ['certshare'],
    'only certshare mounts the ServiceAccount token',
  );
  const mount = sidecarOf(spec).volumeMounts!.find((m) => m.mountPath === TOKEN_PATH)!;
  assert.equal(mount.readOnly, true);
  const volume = spec.volumes?.find((v) => v.name === mount.name);
  const sources = volume?.projected?.sources ?? [];
  assert.deepEqual(
    sources.map((src) => Object.keys(src)[0]),
    ['serviceAccountToken', 'configMap', 'downwardAPI'],
    `${mount.name}: a projected token volume`,
  );
  assert.equal(sources[0]!.serviceAccountToken!.path, 'token');
  assert.ok(Number(sources[0]!.serviceAccountToken!.expirationSeconds) <= 3600, 'a short-lived token');
  assert.deepEqual(sources[1]!.configMap, { name: 'kube-root-ca.crt', items: [{ key: 'ca.crt', path: 'ca.crt' }] });
  assert.deepEqual(sources[2]!.downwardAPI, { items: [{ path: 'namespace', fieldRef: { apiVersion: 'v1', fieldPath: 'metadata.namespace' } }] });
  const others = spec.volumes?.filter((v) => v.projected?.sources.some((src) => 'serviceAccountToken' in src) && v.name !== mount.name) ?? [];
  assert.deepEqual(
    others.map((v) => v.name),
    [],
    'no other token volume',
  );
}

describe('manifests/base', () => {
  it('leaves the namespace to the user and holds only placeholder names', async () => {
    const kustomization = (await yamlDocs(join(REPO, 'manifests/base/kustomization.yaml')))[0] as unknown as Record<string, unknown>;
    assert.equal(kustomization.namespace, undefined, 'no namespace: field (apply with -n)');
    const rbac = await yamlDocs(join(REPO, 'manifests/base/rbac.yaml'));
    const names = rbac.flatMap((d) => d.rules ?? []).flatMap((r) => r.resourceNames ?? []);
    assert.deepEqual([...new Set(names)].sort(), [LEASE, LEDGER, PLACEHOLDER].sort());
  });

  it('the admission policies cover every account the Roles are bound to: by the label the accounts carry, not by name', async () => {
    const rbac = await yamlDocs(join(REPO, 'manifests/base/rbac.yaml'));
    const bound = new Set(
      rbac
        .filter((d) => d.kind === 'RoleBinding')
        .flatMap((d) => (d as unknown as { subjects: Array<{ kind: string; name: string }> }).subjects)
        .filter((s) => s.kind === 'ServiceAccount')
        .map((s) => s.name),
    );
    assert.ok(bound.size >= 2);
    const accounts = new Map(
      (await yamlDocs(join(REPO, 'manifests/base/serviceaccounts.yaml'))).map((d) => [d.metadata.name, d.metadata.labels ?? {}] as const),
    );
    const docs = await yamlDocs(join(REPO, 'manifests/base/admission-policy.yaml'));
    const policies = docs.filter((d) => d.kind === 'ValidatingAdmissionPolicy' && d.metadata.name !== CLAIMS_POLICY);
    assert.ok(policies.length >= 2);
    for (const policy of policies) {
      const spec = policy.spec as {
        paramKind?: { apiVersion: string; kind: string };
        matchConditions: Array<{ expression: string }>;
        variables: Array<{ name: string; expression: string }>;
        validations: Array<{ expression: string }>;
      };
      const name = policy.metadata.name;
      assert.deepEqual(spec.paramKind, { apiVersion: 'v1', kind: 'ServiceAccount' }, `${name}: keyed on ServiceAccounts`);
      assert.doesNotMatch(JSON.stringify(spec.matchConditions ?? []), /certshare/, `${name}: no account name written in the policy`);
      if (name === 'certshare-pods-injected') {
        // About the Pods that run under the accounts, not about requests they make.
        assert.match(spec.variables.find((v) => v.name === 'podAccount')?.expression ?? '', /serviceAccountName.*== params\.metadata\.name/);
        for (const v of spec.validations) assert.match(v.expression, /^!variables\.podAccount \|\|/, `${name}: every rule is about such a Pod`);
      } else {
        assert.match(spec.variables.find((v) => v.name === 'caller')?.expression ?? '', /params\.metadata\.namespace.*params\.metadata\.name/);
        for (const v of spec.validations) assert.match(v.expression, /^!variables\.caller \|\|/, `${name}: every rule is about the caller`);
      }
      const bindings = docs.filter((d) => d.kind === 'ValidatingAdmissionPolicyBinding' && (d.spec as { policyName: string }).policyName === name);
      assert.equal(bindings.length, 1, `${name}: one binding`);
      const paramRef = (bindings[0]!.spec as { paramRef: { selector: { matchLabels: Record<string, string> }; parameterNotFoundAction: string } }).paramRef;
      assert.equal(paramRef.parameterNotFoundAction, 'Allow', "a namespace without certshare's accounts is not certshare's");
      for (const account of bound) {
        const labels = accounts.get(account);
        assert.ok(labels, `${account}: a RoleBinding names an account serviceaccounts.yaml does not define`);
        for (const [key, value] of Object.entries(paramRef.selector.matchLabels))
          assert.equal(labels[key], value, `${account} is bound to a certshare Role but lacks ${key}=${value}: ${name} would not cover it`);
      }
      if (name === 'certshare-own-pod-status')
        assert.match(spec.validations.map((v) => v.expression).join('\n'), /finalizers/, 'a status patch cannot add a finalizer');
    }
  });

  it("keeps break-glass claims from everyone's updates and deletes, by name and label, cluster administrators and the namespace's deletion aside", async () => {
    const docs = await yamlDocs(join(REPO, 'manifests/base/admission-policy.yaml'));
    const policy = docs.find((d) => d.kind === 'ValidatingAdmissionPolicy' && d.metadata.name === CLAIMS_POLICY);
    const spec = policy?.spec as {
      paramKind?: unknown;
      matchConstraints: { resourceRules: Array<{ operations: string[]; resources: string[] }>; objectSelector: unknown };
    };
    assert.equal(spec.paramKind, undefined, 'about every caller, not only certshare accounts');
    assert.deepEqual(
      spec.matchConstraints.resourceRules.map((r) => [r.resources, r.operations]),
      [[['leases'], ['UPDATE', 'DELETE']]],
    );
    assert.deepEqual(spec.matchConstraints.objectSelector, { matchExpressions: [{ key: CLAIM_LABEL, operator: 'Exists' }] });
    const bindings = docs.filter((d) => d.kind === 'ValidatingAdmissionPolicyBinding' && (d.spec as { policyName: string }).policyName === CLAIMS_POLICY);
    assert.deepEqual(
      bindings.map((b) => b.spec),
      [{ policyName: CLAIMS_POLICY, validationActions: ['Deny'] }],
    );
  });

  it('grants on Pods only what the readiness gate uses: patch of pods/status', async () => {
    const rules = (await yamlDocs(join(REPO, 'manifests/base/rbac.yaml')))
      .flatMap((d) => d.rules ?? [])
      .filter((r) => r.apiGroups.includes('') && r.resources.some((res) => res.startsWith('pods')));
    assert.deepEqual(rules, [{ apiGroups: [''], resources: ['pods/status'], verbs: ['patch'] }]);
  });

  it('grants on Events only what the event recorder uses: create and patch, in the Role both accounts are bound to', async () => {
    const docs = await yamlDocs(join(REPO, 'manifests/base/rbac.yaml'));
    const eventRules = docs.flatMap((d) => (d.rules ?? []).filter((r) => r.resources.includes('events')).map((r) => ({ role: d.metadata.name, ...r })));
    assert.deepEqual(eventRules, [{ role: 'certshare-reader', apiGroups: ['events.k8s.io'], resources: ['events'], verbs: ['create', 'patch'] }]);
    const subjects = (docs.find((d) => d.kind === 'RoleBinding' && d.metadata.name === 'certshare-reader') as unknown as { subjects: Array<{ name: string }> })
      .subjects;
    assert.deepEqual(subjects.map((s) => s.name).sort(), ['certshare', 'certshare-reader']);
  });
});

describe('the example StatefulSet environment', () => {
  it('uses only real flags: every CERTSHARE_* variable is the environment name of a run flag', async () => {
    const known = new Map(RUN_FLAGS.map((f) => [envName(f.name), f]));
    const env = sidecarOf(injected(await exampleStatefulSet())).env ?? [];
    const used = env.map((e) => e.name).filter((n) => n.startsWith('CERTSHARE_'));
    assert.ok(used.length >= 10, `CERTSHARE_* variables: ${used.join(', ')}`);
    for (const name of used) assert.ok(known.has(name), `${name} is not a flag of "certshare run" (known: ${[...known.keys()].join(', ')})`);
    const byName = Object.fromEntries(env.map((e) => [e.name, e]));
    assert.equal(byName.POD_NAME?.valueFrom?.fieldRef?.fieldPath, 'metadata.name');
    assert.equal(byName.POD_NAMESPACE?.valueFrom?.fieldRef?.fieldPath, 'metadata.namespace');
    assert.equal(byName.POD_IPS?.valueFrom?.fieldRef?.fieldPath, 'status.podIPs');
    const expected: Record<string, string> = {
      CERTSHARE_DOMAIN: DOMAIN,
      CERTSHARE_MODE: 'auto',
      CERTSHARE_STORE: 'kube',
      CERTSHARE_OUT_DIR: '/certs',
      CERTSHARE_READINESS_GATE: GATE,
      CERTSHARE_LOCALAPI: '/var/run/tailscale/tailscaled.sock',
      CERTSHARE_LISTEN: '[::]:9002',
      CERTSHARE_DRAIN_DELAY: '5s',
      CERTSHARE_SHUTDOWN_TIMEOUT: '25s',
    };
    for (const [name, value] of Object.entries(expected)) assert.equal(byName[name]?.value, value, name);
  });
});

describe('manifests/example on a real apiserver', () => {
  // With the ServiceAccount admission plugin, as in a real cluster: it would mount a token into every
  // container of a Pod that does not opt out.
  const cp = useControlPlane({ serviceAccountAdmission: true });
  const ns = `manifests-${process.pid}`;
  const sa = (name: string) => `system:serviceaccount:${ns}:${name}`;

  async function kubectl(
    args: string[],
    options: { input?: string; kubeconfig?: string } = {},
  ): Promise<{ stdout: string; stderr: string; code: number | null }> {
    return cp().kubectl(['-n', ns, ...args], options);
  }
  async function must(args: string[], options: { input?: string; kubeconfig?: string } = {}): Promise<string> {
    const r = await kubectl(args, options);
    assert.equal(r.code, 0, `kubectl ${args.join(' ')}: ${r.stderr}`);
    return r.stdout;
  }
  async function canI(serviceAccount: string, verb: string, resource: string, subresource?: string): Promise<boolean> {
    const r = await kubectl(['auth', 'can-i', verb, resource, `--as=${sa(serviceAccount)}`, ...(subresource ? [`--subresource=${subresource}`] : [])]);
    assert.ok(r.code === 0 || r.code === 1, `can-i ${verb} ${resource}: ${r.stderr}`);
    return r.stdout.trim() === 'yes';
  }
  /** A real request under the ServiceAccount's token: 'allowed' (whatever the outcome otherwise) or 'forbidden'. */
  async function as(kubeconfig: string, args: string[], input?: string): Promise<'allowed' | 'forbidden'> {
    const r = await kubectl(args, { kubeconfig, ...(input === undefined ? {} : { input }) });
    if (/forbidden/i.test(r.stderr)) return 'forbidden';
    assert.ok(r.code === 0 || /NotFound|not found/.test(r.stderr), `kubectl ${args.join(' ')}: unexpected ${r.stderr}`);
    return 'allowed';
  }
  const secretJson = (name: string) =>
    JSON.stringify({ apiVersion: 'v1', kind: 'Secret', metadata: { name }, type: 'Opaque', data: { probe: Buffer.from('x').toString('base64') } });
  const leaseJson = (name: string) =>
    JSON.stringify({ apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name }, spec: { holderIdentity: 'test' } });

  let readerKubeconfig: string;
  let writerKubeconfig: string;

  before(async () => {
    assert.equal((await cp().kubectl(['create', 'namespace', ns])).code, 0);
  });

  it('passes a server-side dry run, then applies', async () => {
    const dry = await kubectl(['apply', '-k', EXAMPLE, '--dry-run=server']);
    assert.equal(dry.code, 0, dry.stderr);
    assert.match(dry.stdout, /statefulset\.apps\/proxy created \(server dry run\)/);
    assert.equal((await kubectl(['get', 'statefulset', 'proxy'])).code, 1, 'a dry run creates nothing');
    const applied = await must(['apply', '-k', EXAMPLE]);
    for (const object of [
      'serviceaccount/certshare ',
      'serviceaccount/certshare-reader ',
      'role.rbac.authorization.k8s.io/certshare-reader',
      'role.rbac.authorization.k8s.io/certshare-writer',
      'rolebinding.rbac.authorization.k8s.io/certshare-reader',
      'rolebinding.rbac.authorization.k8s.io/certshare-writer',
      'statefulset.apps/proxy ',
      'service/proxy ',
      'service/proxy-health ',
      'validatingadmissionpolicy.admissionregistration.k8s.io/certshare-own-pod-status',
      'validatingadmissionpolicybinding.admissionregistration.k8s.io/certshare-own-pod-status',
      'validatingadmissionpolicy.admissionregistration.k8s.io/certshare-creates-own-objects',
      'validatingadmissionpolicybinding.admissionregistration.k8s.io/certshare-creates-own-objects',
      'validatingadmissionpolicy.admissionregistration.k8s.io/certshare-own-events',
      'validatingadmissionpolicybinding.admissionregistration.k8s.io/certshare-own-events',
      `validatingadmissionpolicy.admissionregistration.k8s.io/${CLAIMS_POLICY}`,
      `validatingadmissionpolicybinding.admissionregistration.k8s.io/${CLAIMS_POLICY}`,
    ]) {
      assert.ok(applied.includes(object), `${object.trim()} applied:\n${applied}`);
    }
    readerKubeconfig = await cp().kubeconfigFor(ns, 'certshare-reader');
    writerKubeconfig = await cp().kubeconfigFor(ns, 'certshare');
  });

  it('builds manifests/monitoring with kustomize (applying it needs the Prometheus Operator CRDs)', async () => {
    const built = await cp().kubectl(['kustomize', join(REPO, 'manifests/monitoring')]);
    assert.equal(built.code, 0, built.stderr);
    const kinds = (loadAll(built.stdout) as K8sObject[]).map((d) => `${d.apiVersion}/${d.kind}`).sort();
    assert.deepEqual(kinds, ['monitoring.coreos.com/v1/PodMonitor', 'monitoring.coreos.com/v1/PrometheusRule', 'v1/ConfigMap']);
  });

  it('stores the StatefulSet asking for certshare, injected as a native sidecar with its readiness gate, probes and limits', async () => {
    const sts = JSON.parse(await must(['get', 'statefulset', 'proxy', '-o', 'json'])) as StatefulSet;
    assert.equal(sts.spec.replicas, 3);
    assert.equal(sts.spec.serviceName, 'proxy');
    assert.equal(sts.spec.template.metadata.annotations?.['certshare.io/inject'], 'true', 'asks the injector for certshare');
    const pod = injected(sts);
    assert.equal(pod.serviceAccountName, 'certshare');
    assert.equal(pod.terminationGracePeriodSeconds, 30);
    assert.deepEqual(pod.readinessGates, [{ conditionType: GATE }]);
    assert.equal(pod.securityContext?.fsGroup, 65532);
    const sidecar = sidecarOf(pod);
    assert.equal(sidecar.restartPolicy, 'Always', 'native sidecar');
    assert.equal(sidecar.image, 'ghcr.io/certshare/certshare:0.1.0');
    assert.deepEqual(sidecar.readinessProbe?.httpGet && { path: sidecar.readinessProbe.httpGet.path, port: sidecar.readinessProbe.httpGet.port }, {
      path: '/healthz',
      port: 9002,
    });
    assert.equal(sidecar.livenessProbe?.httpGet, undefined, 'liveness must not depend on the certificate');
    assert.equal(sidecar.livenessProbe?.tcpSocket?.port, 9002);
    assert.deepEqual(sidecar.resources, { requests: { cpu: '100m', memory: '112Mi' }, limits: { memory: '192Mi' } });
    assert.deepEqual({ ...sidecar.securityContext }, SIDECAR_SECURITY_CONTEXT);
    assert.deepEqual(pod.containers.map((c) => c.name).sort(), ['proxy', 'tailscale']);
    assertTokenOnlyInCertshare(pod);
    const services = JSON.parse(await must(['get', 'services', '-o', 'json'])) as {
      items: Array<{ metadata: { name: string }; spec: { ports: Array<{ port: number }>; publishNotReadyAddresses?: boolean } }>;
    };
    const ports = Object.fromEntries(services.items.map((s) => [s.metadata.name, s.spec.ports.map((p) => p.port)]));
    assert.deepEqual(ports, { proxy: [443], 'proxy-health': [9002] });
    assert.equal(
      services.items.find((s) => s.metadata.name === 'proxy-health')?.spec.publishNotReadyAddresses,
      true,
      'the routing check reaches Pods that are not Ready yet',
    );
  });

  it("accepts Pods made from the injected template (kubelet-facing validation of the sidecar's spec); no other container gets a token", async () => {
    const sts = JSON.parse(await must(['get', 'statefulset', 'proxy', '-o', 'json'])) as StatefulSet;
    for (const name of ['proxy-0', 'proxy-1']) {
      const pod = {
        apiVersion: 'v1',
        kind: 'Pod',
        metadata: { name, labels: sts.spec.template.metadata.labels },
        spec: { ...injected(sts), hostname: name, subdomain: sts.spec.serviceName },
      };
      await must(['create', '-f', '-'], { input: JSON.stringify(pod) });
    }
    // A read-only consumer (e.g. a Deployment of proxies) under the reader account.
    const consumer = {
      apiVersion: 'v1',
      kind: 'Pod',
      metadata: { name: 'consumer-abc12' },
      spec: { ...injected(sts), serviceAccountName: 'certshare-reader' },
    };
    await must(['create', '-f', '-'], { input: JSON.stringify(consumer) });
    for (const name of ['proxy-0', 'proxy-1', 'consumer-abc12']) {
      const stored = JSON.parse(await must(['get', 'pod', name, '-o', 'json'])) as { spec: PodSpec };
      assertTokenOnlyInCertshare(stored.spec);
    }
    // The same Pod without automountServiceAccountToken: false: the plugin mounts a token into every
    // container (what the example used to do), which the assertion above would catch.
    const automounted = {
      apiVersion: 'v1',
      kind: 'Pod',
      metadata: { name: 'automounted' },
      spec: { ...injected(sts), automountServiceAccountToken: undefined },
    };
    await must(['create', '-f', '-', '--dry-run=server', '-o', 'json'], { input: JSON.stringify(automounted) }).then((out) => {
      const spec = (JSON.parse(out) as { spec: PodSpec }).spec;
      assert.throws(() => assertTokenOnlyInCertshare(spec), /mounts the ServiceAccount token|automountServiceAccountToken/);
      assert.deepEqual(
        spec.containers
          .filter((c) => c.volumeMounts?.some((m) => m.mountPath === TOKEN_PATH))
          .map((c) => c.name)
          .sort(),
        ['proxy', 'tailscale'],
      );
    });
  });

  it("admits the example's Pod with the platform's CA bundle (--sidecar-ca-configmap): one key, read-only, in certshare's container only", async () => {
    const sts = await exampleStatefulSet();
    const spec = injected(sts, ['--sidecar-ca-configmap', 'acme-ca:root.pem']);
    // Admission does not look for the ConfigMap (the kubelet does, and holds the Pod in FailedMount while
    // it is missing): the Pod is stored before it exists.
    const pod = { apiVersion: 'v1', kind: 'Pod', metadata: { name: 'private-ca' }, spec };
    await must(['create', '-f', '-'], { input: JSON.stringify(pod) });
    try {
      const stored = (JSON.parse(await must(['get', 'pod', 'private-ca', '-o', 'json'])) as { spec: PodSpec }).spec;
      const bundle = stored.volumes?.find((v) => v.name === 'certshare-ca');
      // The apiserver adds its default mode (0644); the rest is as injected.
      assert.deepEqual(bundle?.configMap, { name: 'acme-ca', items: [{ key: 'root.pem', path: 'ca.crt' }], optional: false, defaultMode: 0o644 });
      const sidecar = sidecarOf(stored);
      assert.deepEqual(
        sidecar.volumeMounts?.find((m) => m.name === 'certshare-ca'),
        { name: 'certshare-ca', mountPath: '/etc/certshare/ca', readOnly: true },
      );
      assert.equal(sidecar.env?.find((e) => e.name === 'NODE_EXTRA_CA_CERTS')?.value, '/etc/certshare/ca/ca.crt');
      const mounting = [...(stored.initContainers ?? []), ...stored.containers].filter((c) => c.volumeMounts?.some((m) => m.name === 'certshare-ca'));
      assert.deepEqual(
        mounting.map((c) => c.name),
        ['certshare'],
        'no other container trusts more',
      );
      assertTokenOnlyInCertshare(stored);
    } finally {
      await must(['delete', 'pod', 'private-ca', '--wait=false']);
    }
  });

  it('the reader account reads the domain Secret and nothing else, and writes no Secret', async () => {
    assert.equal(await as(readerKubeconfig, ['get', 'secret', DOMAIN]), 'allowed', 'get of the domain Secret (NotFound, not Forbidden)');
    await must(['create', '-f', '-'], { input: secretJson(DOMAIN) });
    await must(['create', '-f', '-'], { input: secretJson('other-name') });
    assert.equal(await as(readerKubeconfig, ['get', 'secret', DOMAIN]), 'allowed');
    assert.equal(await as(readerKubeconfig, ['get', 'secret', 'other-name']), 'forbidden');
    assert.equal(await as(readerKubeconfig, ['create', '-f', '-'], secretJson('new-secret')), 'forbidden');
    const current = await must(['get', 'secret', DOMAIN, '-o', 'json']);
    assert.equal(await as(readerKubeconfig, ['replace', '-f', '-'], current), 'forbidden', 'update');
    assert.equal(await as(readerKubeconfig, ['delete', 'secret', DOMAIN]), 'forbidden');
    assert.equal(await as(readerKubeconfig, ['create', '-f', '-'], leaseJson(LEASE)), 'forbidden', 'no Lease: readers never become the writer');
    for (const verb of ['get', 'list', 'watch']) assert.equal(await canI('certshare-reader', verb, `secrets/${DOMAIN}`), true, verb);
    for (const verb of ['create', 'update', 'patch', 'delete']) assert.equal(await canI('certshare-reader', verb, `secrets/${DOMAIN}`), false, verb);
    assert.equal(await canI('certshare-reader', 'get', 'secrets/other-name'), false);
    assert.equal(await canI('certshare-reader', 'update', `leases/${LEASE}`), false);
  });

  it('the certshare account updates the domain Secret and its Lease, and cannot read other Secrets', async () => {
    const current = await must(['get', 'secret', DOMAIN, '-o', 'json']);
    assert.equal(await as(writerKubeconfig, ['replace', '-f', '-'], current), 'allowed', 'update of the domain Secret');
    const frozen = JSON.stringify({ ...(JSON.parse(current) as object), immutable: true });
    assert.equal(await as(writerKubeconfig, ['replace', '-f', '-'], frozen), 'forbidden', 'the domain Secret made immutable (on 3d853d5 allowed)');
    assert.equal(await as(writerKubeconfig, ['get', 'secret', 'other-name']), 'forbidden');
    const other = await must(['get', 'secret', 'other-name', '-o', 'json']);
    assert.equal(await as(writerKubeconfig, ['replace', '-f', '-'], other), 'forbidden', 'update of another Secret');
    assert.equal(await as(writerKubeconfig, ['delete', 'secret', DOMAIN]), 'forbidden', 'nobody deletes the Secret');
    // create cannot be restricted by name in Kubernetes (see manifests/base/rbac.yaml)
    assert.equal(await canI('certshare', 'create', 'secrets'), true);
    assert.equal(await as(writerKubeconfig, ['create', '-f', '-'], leaseJson(LEASE)), 'allowed', 'create the group Lease');
    assert.equal(await as(writerKubeconfig, ['get', 'lease', LEASE]), 'allowed');
    const lease = await must(['get', 'lease', LEASE, '-o', 'json']);
    assert.equal(await as(writerKubeconfig, ['replace', '-f', '-'], lease), 'allowed', 'update the group Lease');
    assert.equal(await as(writerKubeconfig, ['get', 'lease', 'certshare-other']), 'forbidden');
    assert.equal(await canI('certshare', 'delete', `leases/${LEASE}`), false);
    assert.equal(await canI('certshare', 'patch', `secrets/${DOMAIN}`), false, 'update (compare-and-swap) only');
    await must(['delete', 'secret', DOMAIN, 'other-name']);
    await must(['delete', 'lease', LEASE]);
  });

  it("a break-glass claim: certshare's account creates it; neither it nor a namespace admin changes or deletes it, the namespace's deletion does", async () => {
    const tenant = await namespaceAdmin(cp(), ns, 'tenant');
    await claimsPolicyInForce(cp(), ns, tenant);
    const { first } = breakGlassClaimNames('proxy', DOMAIN, '0A1B2C');
    const claim = {
      apiVersion: 'coordination.k8s.io/v1',
      kind: 'Lease',
      metadata: { name: first, labels: { [CLAIM_LABEL]: 'first' } },
      spec: { holderIdentity: 'proxy-0' },
    };
    assert.equal(await as(writerKubeconfig, ['create', '-f', '-'], JSON.stringify(claim)), 'allowed', 'the writer creates the claim');
    assert.equal(await as(writerKubeconfig, ['get', 'leases', '-l', CLAIM_LABEL]), 'allowed', 'and lists the claims by their label');
    const path = `/apis/coordination.k8s.io/v1/namespaces/${ns}/leases/${first}`;
    const stored = JSON.parse(await must(['get', 'lease', first, '-o', 'json'])) as { metadata: { labels: Record<string, string> } };
    const unlabelled = { ...stored, metadata: { ...stored.metadata, labels: {} } };
    for (const [who, kubeconfig] of [
      ['certshare', writerKubeconfig],
      ['the tenant', tenant],
    ] as const) {
      assert.equal((await saRequest(kubeconfig, 'PUT', path, stored, JSON_TYPE)).status, 403, `${who}: update`);
      assert.equal((await saRequest(kubeconfig, 'PUT', path, unlabelled, JSON_TYPE)).status, 403, `${who}: an update dropping the label`);
      const patch = { metadata: { labels: { [CLAIM_LABEL]: null } } };
      assert.equal((await saRequest(kubeconfig, 'PATCH', path, patch, 'application/merge-patch+json')).status, 403, `${who}: patch`);
      assert.equal((await saRequest(kubeconfig, 'DELETE', path, undefined, JSON_TYPE)).status, 403, `${who}: delete`);
      const all = `/apis/coordination.k8s.io/v1/namespaces/${ns}/leases`;
      assert.equal((await saRequest(kubeconfig, 'DELETE', all, undefined, JSON_TYPE)).status, 403, `${who}: delete every Lease`);
    }
    assert.equal(await canI('tenant', 'delete', `leases/${first}`), true, "RBAC lets the namespace's roles delete Leases: the policy refuses it");
    assert.equal((await cp().adminRequest('GET', path)).status, 200, 'the claim stands');
    // The namespace controller empties a namespace being deleted: its deletion goes through.
    const controller = await kubectl(['delete', 'lease', first, '--as=system:serviceaccount:kube-system:namespace-controller']);
    assert.equal(controller.code, 0, controller.stderr);
  });

  it('both accounts record Events (create, then patch a series) and read none, nor more Secrets than before', async () => {
    const [proxy0, consumer] = [await replicaKubeconfig(cp(), ns, 'proxy-0'), await replicaKubeconfig(cp(), ns, 'consumer-abc12', 'certshare-reader')];
    await eventPolicyInEffect(proxy0);
    for (const [account, pod, kubeconfig] of [
      ['certshare', 'proxy-0', proxy0],
      ['certshare-reader', 'consumer-abc12', consumer],
    ] as const) {
      const name = `${pod}.${account}`;
      assert.equal(await as(kubeconfig, ['create', '-f', '-'], eventJson(name, pod)), 'allowed', `${account}: create an Event`);
      assert.equal((await patchEvent(kubeconfig, name, seriesPatch)).status, 200, `${account}: patch its series`);
      assert.equal(await as(kubeconfig, ['get', 'events.v1.events.k8s.io', name]), 'forbidden', `${account}: no read of Events`);
      assert.equal(await as(kubeconfig, ['delete', 'events.v1.events.k8s.io', name]), 'forbidden', `${account}: no delete of Events`);
      assert.equal(await canI(account, 'update', 'events.events.k8s.io'), false, `${account}: no update of Events`);
      assert.equal(await canI(account, 'create', 'events'), false, `${account}: no core/v1 Events`);
      assert.equal(await as(kubeconfig, ['get', 'secrets']), 'forbidden', `${account}: still no list of Secrets`);
      assert.equal(await as(kubeconfig, ['get', 'secret', 'other-name']), 'forbidden', `${account}: still no other Secret`);
    }
    const recorded = JSON.parse(await must(['get', 'events.v1.events.k8s.io', 'proxy-0.certshare', '-o', 'json'])) as { series?: { count: number } };
    assert.equal(recorded.series?.count, 2, 'the patch was applied');
  });

  it('a token records Events only about its own Pod, or a Secret with its Pod as related, and patches only their series', async () => {
    const [proxy0, proxy1] = [await replicaKubeconfig(cp(), ns, 'proxy-0'), await replicaKubeconfig(cp(), ns, 'proxy-1')];
    await eventPolicyInEffect(proxy0);
    const pod = (name: string) => ({ apiVersion: 'v1', kind: 'Pod', name, namespace: ns });
    const secret = { apiVersion: 'v1', kind: 'Secret', name: DOMAIN, namespace: ns };
    const create = async (kubeconfig: string, name: string, fields: Record<string, unknown>) =>
      (
        await saRequest(
          kubeconfig,
          'POST',
          `/apis/events.k8s.io/v1/namespaces/${ns}/events`,
          { ...JSON.parse(eventJson(name, 'proxy-0')), ...fields },
          JSON_TYPE,
        )
      ).status;
    // What certshare records: about its Pod; about the Secret it stored, its Pod as related.
    assert.equal(await create(proxy0, 'own.1', {}), 201, 'about its own Pod');
    assert.equal(await create(proxy0, 'stored.1', { action: 'Store', regarding: secret, related: pod('proxy-0') }), 201, 'about the Secret, related its Pod');
    // What a stolen token would like to record.
    const denied = await saRequest(
      proxy0,
      'POST',
      `/apis/events.k8s.io/v1/namespaces/${ns}/events`,
      { ...JSON.parse(eventJson('other.1', 'proxy-1')), reportingInstance: 'proxy-0' },
      JSON_TYPE,
    );
    assert.equal(denied.status, 403, 'about another Pod');
    assert.match(denied.body, /certshare-own-events.*only about its own Pod.*bound to Pod proxy-0/);
    const refused: Array<[string, Record<string, unknown>]> = [
      ['about a Secret without naming its Pod', { regarding: secret }],
      ['about a Secret naming another Pod', { regarding: secret, related: pod('proxy-1') }],
      ['about the ServiceAccount', { regarding: { apiVersion: 'v1', kind: 'ServiceAccount', name: 'certshare', namespace: ns } }],
      ['about its Pod with another Pod related', { related: pod('proxy-1') }],
      ['about its Pod in another namespace', { regarding: { ...pod('proxy-0'), namespace: 'kube-system' } }],
      ['as another controller', { reportingController: 'kubelet' }],
      ['as another instance', { reportingInstance: 'proxy-1' }],
    ];
    for (const [i, [what, fields]] of refused.entries()) {
      assert.equal(await create(proxy0, `denied.${i}`, fields), 403, what);
    }
    // An unbound token of the account records nothing.
    assert.equal(await create(writerKubeconfig, 'unbound.1', {}), 403, 'an unbound token');
    // Patches: the series of its own Events only; nothing else of them, nothing of anyone else's.
    assert.equal((await patchEvent(proxy0, 'own.1', seriesPatch)).status, 200, 'its own series');
    assert.equal((await patchEvent(proxy0, 'own.1', { metadata: { labels: { x: 'y' } } })).status, 403, 'a label on its own Event');
    assert.equal((await patchEvent(proxy0, 'own.1', { metadata: { finalizers: ['example.com/keep'] } })).status, 403, 'a finalizer');
    assert.equal((await patchEvent(proxy0, 'own.1', { metadata: { annotations: { x: 'y' } } })).status, 403, 'an annotation');
    // The rest of an Event the apiserver itself keeps immutable (422), whoever asks.
    for (const field of [{ note: 'rewritten' }, { reason: 'Renewed' }, { regarding: { ...pod('proxy-1') } }, { deprecatedCount: 9 }])
      assert.equal((await patchEvent(proxy0, 'own.1', field)).status, 422, JSON.stringify(field));
    assert.equal(await create(proxy1, 'theirs.1', { reportingInstance: 'proxy-1', regarding: pod('proxy-1') }), 201);
    const theirs = await patchEvent(proxy0, 'theirs.1', seriesPatch);
    assert.equal(theirs.status, 403, "another Pod's Event");
    assert.match(theirs.body, /only the Events its own Pod recorded/);
    const kubelets = JSON.stringify({ ...JSON.parse(eventJson('kubelet.1', 'proxy-0')), reportingController: 'kubelet', reportingInstance: 'node-1' });
    await must(['create', '-f', '-'], { input: kubelets });
    assert.equal((await patchEvent(proxy0, 'kubelet.1', seriesPatch)).status, 403, "the kubelet's Event about its Pod");
  });

  it("the certshare account creates only certshare's own objects: labelled TLS Secrets, certshare-* Leases and ConfigMaps", async () => {
    const secret = (name: string, type: string, labels: Record<string, string>) =>
      JSON.stringify({ apiVersion: 'v1', kind: 'Secret', metadata: { name, labels }, type, data: {} });
    const ours = { 'app.kubernetes.io/managed-by': 'certshare' };
    const tls = (name: string, labels: Record<string, string>) =>
      JSON.stringify({
        apiVersion: 'v1',
        kind: 'Secret',
        metadata: { name, labels },
        type: 'kubernetes.io/tls',
        data: { 'tls.crt': '', 'tls.key': '' },
      });
    // The escalation: a token Secret for another ServiceAccount, under a name the writer may read back.
    const tokenSecret = JSON.stringify({
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: DOMAIN, annotations: { 'kubernetes.io/service-account.name': 'default' }, labels: ours },
      type: 'kubernetes.io/service-account-token',
    });
    assert.equal(await as(writerKubeconfig, ['create', '-f', '-'], tokenSecret), 'forbidden', 'a ServiceAccount token Secret');
    assert.equal(await as(writerKubeconfig, ['create', '-f', '-'], secret('opaque-one', 'Opaque', ours)), 'forbidden', 'an Opaque Secret');
    assert.equal(await as(writerKubeconfig, ['create', '-f', '-'], tls('unlabelled', {})), 'forbidden', 'a TLS Secret without our label');
    // In the ledger's form (certshare-records-form holds the accounts' ConfigMaps to it).
    const cm = (name: string) => JSON.stringify({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name }, data: { 'ledger.json': '{"entries":[]}' } });
    // Created immutable, no writer could store in it again (on 3d853d5 allowed).
    const immutable = (json: string) => JSON.stringify({ ...(JSON.parse(json) as object), immutable: true });
    assert.equal(await as(writerKubeconfig, ['create', '-f', '-'], immutable(tls(DOMAIN, ours))), 'forbidden', "the domain's Secret, immutable");
    assert.equal(await as(writerKubeconfig, ['create', '-f', '-'], immutable(cm('certshare-proxy-ledger'))), 'forbidden', 'the ledger, immutable');
    assert.equal(await as(writerKubeconfig, ['create', '-f', '-'], tls(DOMAIN, ours)), 'allowed', "the domain's TLS Secret, labelled");
    assert.equal(await as(writerKubeconfig, ['create', '-f', '-'], cm('kube-root-ca-fake')), 'forbidden', 'a ConfigMap not named certshare-*');
    assert.equal(await as(writerKubeconfig, ['create', '-f', '-'], cm('certshare-proxy-ledger')), 'allowed', 'the ledger');
    assert.equal(await as(writerKubeconfig, ['create', '-f', '-'], leaseJson('kube-scheduler')), 'forbidden', 'a Lease not named certshare-*');
    const denied = await kubectl(['create', '-f', '-'], { kubeconfig: writerKubeconfig, input: secret('opaque-two', 'Opaque', ours) });
    assert.match(denied.stderr, /certshare may create only kubernetes\.io\/tls Secrets labelled app\.kubernetes\.io\/managed-by=certshare/);
    await must(['delete', 'secret', DOMAIN]);
    await must(['delete', 'configmap', 'certshare-proxy-ledger']);
  });

  it('both accounts list and watch the domain Secret by field selector, never all Secrets', async () => {
    for (const kubeconfig of [readerKubeconfig, writerKubeconfig]) {
      assert.equal(await as(kubeconfig, ['get', 'secrets', '--field-selector', `metadata.name=${DOMAIN}`]), 'allowed', 'list by name');
      const watchPath = `/api/v1/namespaces/${ns}/secrets?fieldSelector=${encodeURIComponent(`metadata.name=${DOMAIN}`)}&watch=true&timeoutSeconds=1`;
      assert.equal(await as(kubeconfig, ['get', '--raw', watchPath]), 'allowed', 'watch by name');
      assert.equal(await as(kubeconfig, ['get', 'secrets']), 'forbidden', 'plain list');
      assert.equal(await as(kubeconfig, ['get', 'secrets', '--field-selector', 'metadata.name=other-name']), 'forbidden', 'list of another name');
      assert.equal(await as(kubeconfig, ['get', '--raw', `/api/v1/namespaces/${ns}/secrets?watch=true&timeoutSeconds=1`]), 'forbidden', 'plain watch');
    }
  });

  /** A raw request under the ServiceAccount's token (kubectl patch would GET pods/status first; the daemon does not). */
  async function saRequest(kubeconfig: string, method: string, path: string, body: unknown, contentType: string): Promise<{ status: number; body: string }> {
    const config = loadAll(await readFile(kubeconfig, 'utf8'))[0] as { users: Array<{ user: { token: string } }> };
    return new Promise((resolve, reject) => {
      const req = httpsRequest(
        new URL(path, cp().server),
        { method, ca: cp().caPem, agent: false, headers: { authorization: `Bearer ${config.users[0]!.user.token}`, 'content-type': contentType } },
        (res) => {
          let text = '';
          res.setEncoding('utf8').on('data', (c: string) => (text += c));
          res.on('end', () => resolve({ status: res.statusCode ?? 0, body: text }));
        },
      );
      req.on('error', reject);
      req.end(JSON.stringify(body));
    });
  }

  const JSON_TYPE = 'application/json';
  const eventJson = (name: string, pod: string) =>
    JSON.stringify({
      apiVersion: 'events.k8s.io/v1',
      kind: 'Event',
      metadata: { name },
      eventTime: '2026-01-01T00:00:00.000000Z',
      reportingController: 'certshare.io/certshare',
      reportingInstance: pod,
      action: 'Issue',
      reason: 'Issued',
      type: 'Normal',
      note: 'probe',
      regarding: { apiVersion: 'v1', kind: 'Pod', name: pod, namespace: ns },
    });
  const seriesPatch = { series: { count: 2, lastObservedTime: '2026-01-01T00:00:01.000000Z' } };
  /** A merge patch of an Event under the token (kubectl patch would read it first, which the accounts may not). */
  const patchEvent = (kubeconfig: string, name: string, body: unknown) =>
    saRequest(kubeconfig, 'PATCH', `/apis/events.k8s.io/v1/namespaces/${ns}/events/${name}`, body, 'application/merge-patch+json');
  /** The Events policy applies once the apiserver has loaded it: waits until a dry run about another Pod is denied. */
  async function eventPolicyInEffect(kubeconfig: string): Promise<void> {
    const deadline = performance.now() + 30_000;
    const probe = { ...JSON.parse(eventJson('probe', 'proxy-1')), reportingInstance: 'proxy-0' };
    while ((await saRequest(kubeconfig, 'POST', `/apis/events.k8s.io/v1/namespaces/${ns}/events?dryRun=All`, probe, JSON_TYPE)).status !== 403) {
      assert.ok(performance.now() < deadline, 'the Events admission policy never took effect');
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
  }

  const gatePatch = (status: string) => ({ status: { conditions: [{ type: GATE, status, reason: 'Test' }] } });
  const statusPath = (pod: string, dryRun = false) => `/api/v1/namespaces/${ns}/pods/${pod}/status${dryRun ? '?dryRun=All' : ''}`;
  const SMP = 'application/strategic-merge-patch+json';

  /**
   * The admission policy applies once the apiserver has loaded it (an informer, a second or so after
   * apply): waits until a server-side dry run of a patch of another Pod's status is denied.
   */
  async function policyInEffect(kubeconfig: string, otherPod: string): Promise<void> {
    const deadline = performance.now() + 30_000;
    while ((await saRequest(kubeconfig, 'PATCH', statusPath(otherPod, true), gatePatch('False'), SMP)).status !== 403) {
      assert.ok(performance.now() < deadline, 'the admission policy never took effect');
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
  }

  it("each account patches its own Pod's readiness condition, with the Pod's own token, and nothing else of any Pod", async () => {
    const [proxy0, proxy1, consumer] = [
      await replicaKubeconfig(cp(), ns, 'proxy-0'),
      await replicaKubeconfig(cp(), ns, 'proxy-1'),
      await replicaKubeconfig(cp(), ns, 'consumer-abc12', 'certshare-reader'),
    ];
    await policyInEffect(proxy0, 'proxy-1');
    const kubeletConditions = {
      status: {
        conditions: [
          { type: 'PodScheduled', status: 'True' },
          { type: 'example.com/other', status: 'True' },
        ],
      },
    };
    for (const pod of ['proxy-0', 'proxy-1', 'consumer-abc12'])
      assert.equal((await cp().adminRequest('PATCH', statusPath(pod), { headers: { 'content-type': SMP }, body: kubeletConditions })).status, 200);
    for (const [kubeconfig, own, other] of [
      [proxy0, 'proxy-0', 'proxy-1'],
      [proxy1, 'proxy-1', 'consumer-abc12'],
      [consumer, 'consumer-abc12', 'proxy-0'],
    ] as const) {
      assert.equal((await saRequest(kubeconfig, 'PATCH', statusPath(own), gatePatch('False'), SMP)).status, 200, `${own}: its own condition`);
      const denied = await saRequest(kubeconfig, 'PATCH', statusPath(other), gatePatch('True'), SMP);
      assert.equal(denied.status, 403, `${own}'s token on ${other}'s status`);
      assert.match(denied.body, new RegExp(`certshare-own-pod-status.*bound to Pod ${own}, not to Pod ${other}`));
      const otherCondition = await saRequest(
        kubeconfig,
        'PATCH',
        statusPath(own),
        { status: { conditions: [{ type: 'PodScheduled', status: 'False' }] } },
        SMP,
      );
      assert.equal(otherCondition.status, 403, `${own}: the kubelet's condition`);
      assert.match(otherCondition.body, /its own readiness condition only/);
      const phase = await saRequest(kubeconfig, 'PATCH', statusPath(own), { status: { phase: 'Failed' } }, SMP);
      assert.equal(phase.status, 403, `${own}: another status field`);
      const labels = await saRequest(kubeconfig, 'PATCH', statusPath(own), { metadata: { labels: { 'app.kubernetes.io/name': 'elsewhere' } } }, SMP);
      assert.equal(labels.status, 403, `${own}: labels through pods/status (Service selection)`);
      const finalizer = await saRequest(kubeconfig, 'PATCH', statusPath(own), { metadata: { finalizers: ['example.com/keep'] } }, SMP);
      assert.equal(finalizer.status, 403, `${own}: a finalizer through pods/status (a deleted Pod kept forever)`);
      assert.match(finalizer.body, /finalizers/);
      assert.equal(
        (await saRequest(kubeconfig, 'PATCH', `/api/v1/namespaces/${ns}/pods/${own}`, { metadata: { labels: { x: 'y' } } }, SMP)).status,
        403,
        'the Pod itself is not writable',
      );
      assert.equal(await as(kubeconfig, ['get', 'pod', own]), 'forbidden', 'certshare never reads Pods');
    }
    // An unbound token of the same account (a legacy or hand-made token) changes no Pod's status.
    const unbound = await saRequest(writerKubeconfig, 'PATCH', statusPath('proxy-0'), gatePatch('True'), SMP);
    assert.equal(unbound.status, 403);
    assert.match(unbound.body, /bound to no Pod/);
    for (const pod of ['proxy-0', 'proxy-1', 'consumer-abc12']) {
      const stored = JSON.parse(await must(['get', 'pod', pod, '-o', 'json'])) as {
        metadata: { labels?: Record<string, string> };
        status: { phase?: string; conditions: Array<{ type: string; status: string }> };
      };
      const conditions = Object.fromEntries(stored.status.conditions.map((c) => [c.type, c.status]));
      assert.deepEqual(
        conditions,
        { PodScheduled: 'True', 'example.com/other': 'True', [GATE]: 'False' },
        `${pod}: only its own gate changed, to what its own token wrote`,
      );
      assert.notEqual(stored.status.phase, 'Failed');
      assert.equal(stored.metadata.labels?.x, undefined);
    }
  });

  it("a kustomize namePrefix keeps the policies in force: they key on the accounts' label, not their names", async () => {
    // An overlay renaming everything (team-certshare, team-certshare-own-pod-status, ...) in its own namespace.
    const overlay = join(REPO, 'manifests', `.test-prefix-${process.pid}`);
    const prefixedNs = `${ns}-prefixed`;
    await mkdir(overlay);
    try {
      await writeFile(join(overlay, 'kustomization.yaml'), 'resources:\n  - ../base\nnamePrefix: team-\n');
      const built = await cp().kubectl(['kustomize', overlay]);
      assert.equal(built.code, 0, built.stderr);
      const objects = loadAll(built.stdout) as K8sObject[];
      const policyNames = objects.filter((d) => d.kind === 'ValidatingAdmissionPolicy').map((d) => d.metadata.name);
      assert.deepEqual(policyNames.sort(), [
        'team-certshare-break-glass-claims',
        'team-certshare-creates-own-objects',
        'team-certshare-own-events',
        'team-certshare-own-pod-status',
        'team-certshare-pods-injected',
        'team-certshare-records-form',
      ]);
      for (const binding of objects.filter((d) => d.kind === 'ValidatingAdmissionPolicyBinding'))
        assert.ok(policyNames.includes((binding.spec as { policyName: string }).policyName), 'each binding names its renamed policy');
      assert.equal((await cp().kubectl(['create', 'namespace', prefixedNs])).code, 0);
      const applied = await cp().kubectl(['apply', '-n', prefixedNs, '-f', '-'], { input: built.stdout });
      assert.equal(applied.code, 0, applied.stderr);
    } finally {
      await rm(overlay, { recursive: true, force: true });
    }
    for (const name of ['team-0', 'team-1']) {
      const pod = {
        apiVersion: 'v1',
        kind: 'Pod',
        metadata: { name },
        spec: { serviceAccountName: 'team-certshare', automountServiceAccountToken: false, containers: [{ name: 'c', image: 'example.invalid/c:1' }] },
      };
      const created = await cp().kubectl(['-n', prefixedNs, 'create', '-f', '-'], { input: JSON.stringify(pod) });
      assert.equal(created.code, 0, created.stderr);
    }
    const team0 = await replicaKubeconfig(cp(), prefixedNs, 'team-0', 'team-certshare');
    const otherStatus = `/api/v1/namespaces/${prefixedNs}/pods/team-1/status`;
    const deadline = performance.now() + 30_000;
    let denied = await saRequest(team0, 'PATCH', `${otherStatus}?dryRun=All`, gatePatch('True'), SMP);
    while (denied.status !== 403 && performance.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 200));
      denied = await saRequest(team0, 'PATCH', `${otherStatus}?dryRun=All`, gatePatch('True'), SMP);
    }
    assert.equal(denied.status, 403, `team-certshare's token on another Pod's status: ${denied.body}`);
    assert.match(denied.body, /own-pod-status.*bound to Pod team-0, not to Pod team-1/);
    const own = await saRequest(team0, 'PATCH', `/api/v1/namespaces/${prefixedNs}/pods/team-0/status`, gatePatch('False'), SMP);
    assert.equal(own.status, 200, `its own condition: ${own.body}`);
    const opaque = JSON.stringify({ apiVersion: 'v1', kind: 'Secret', metadata: { name: 'opaque' }, type: 'Opaque', data: {} });
    const created = await cp().kubectl(['-n', prefixedNs, 'create', '-f', '-'], { kubeconfig: team0, input: opaque });
    assert.match(created.stderr, /creates-own-objects.*certshare may create only kubernetes\.io\/tls Secrets/);
  });

  describe("the daemon under these accounts, with the example's environment", () => {
    let dir: { path: string; remove(): Promise<void> };
    const children: ChildProcess[] = [];
    const emulators: Emulator[] = [];
    before(async () => {
      dir = await tempDir('certshare-manifests-');
    });
    after(async () => {
      for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await Promise.all(emulators.map((e) => e.close()));
      await dir.remove();
    });

    /**
     * `certshare run` as the image runs it (no arguments: all from the environment), with the sidecar's
     * variables from the manifest; only what points outside this test is replaced: the LocalAPI socket,
     * the output directory, the listen address, the routing check (no cluster network here).
     */
    async function replica(pod: string, ip: string, kubeconfig: string, overrides: Record<string, string> = {}) {
      const sts = JSON.parse(await must(['get', 'statefulset', 'proxy', '-o', 'json'])) as StatefulSet;
      const env: NodeJS.ProcessEnv = { PATH: process.env.PATH, KUBECONFIG: kubeconfig };
      for (const e of sidecarOf(injected(sts)).env ?? []) {
        if (e.value !== undefined) env[e.name] = e.value;
        else if (e.valueFrom?.fieldRef) env[e.name] = { 'metadata.name': pod, 'metadata.namespace': ns, 'status.podIPs': ip }[e.valueFrom.fieldRef.fieldPath];
      }
      const emulator = await startEmulator({ listen: join(dir.path, `${pod}.sock`), domains: [DOMAIN], id: pod });
      emulators.push(emulator);
      const outDir = join(dir.path, pod, 'certs');
      await mkdir(outDir, { recursive: true });
      Object.assign(
        env,
        { CERTSHARE_LOCALAPI: emulator.address, CERTSHARE_OUT_DIR: outDir, CERTSHARE_LISTEN: '127.0.0.1:0', CERTSHARE_ROUTING_CHECK: '' },
        overrides,
      );
      const child = spawn(process.execPath, [join(REPO, 'src/cli/main.ts'), 'run'], { env, stdio: ['ignore', 'pipe', 'pipe'] });
      children.push(child);
      let logs = '';
      child.stdout!.setEncoding('utf8').on('data', (c: string) => (logs += c));
      child.stderr!.setEncoding('utf8').on('data', (c: string) => (logs += c));
      return { pod, child, emulator, outDir, logs: () => logs };
    }

    it('elects one writer through the Lease, issues once, shares it, and every replica turns its gate True', async () => {
      // Each under its own Pod's token, as the projected volume gives it; the consumer (e.g. a Deployment
      // of proxies, created above) under the reader account.
      const replicas = [
        await replica('proxy-0', '10.0.0.10', await replicaKubeconfig(cp(), ns, 'proxy-0')),
        await replica('proxy-1', '10.0.0.11', await replicaKubeconfig(cp(), ns, 'proxy-1')),
        await replica('consumer-abc12', '10.0.0.20', await replicaKubeconfig(cp(), ns, 'consumer-abc12', 'certshare-reader'), {
          CERTSHARE_MODE: 'ro',
          CERTSHARE_GROUP: 'proxy',
        }),
      ];
      try {
        for (const r of replicas) {
          const wait = await kubectl(['wait', `--for=condition=${GATE}=True`, `pod/${r.pod}`, '--timeout=60s']);
          assert.equal(wait.code, 0, `${r.pod}: ${wait.stderr}\n${r.logs()}`);
        }
        const issued = replicas.reduce((n, r) => n + (r.emulator.stats().issuances[DOMAIN] ?? 0), 0);
        assert.equal(issued, 1, 'one issuance for the whole group');
        const lease = JSON.parse(await must(['get', 'lease', LEASE, '-o', 'json'])) as { spec: { holderIdentity: string } };
        assert.ok(['proxy-0', 'proxy-1'].includes(leaseHolderPod(lease.spec.holderIdentity)), `lease held by ${lease.spec.holderIdentity}`);
        const secret = JSON.parse(await must(['get', 'secret', DOMAIN, '-o', 'json'])) as { type: string; data: Record<string, string> };
        assert.equal(secret.type, 'kubernetes.io/tls');
        const serial = new X509Certificate(Buffer.from(secret.data['tls.crt']!, 'base64')).serialNumber;
        for (const r of replicas) {
          assert.equal(
            new X509Certificate(await readFile(join(r.outDir, DOMAIN, 'tls.crt'))).serialNumber,
            serial,
            `${r.pod} projects the Secret's certificate`,
          );
          assert.doesNotMatch(r.logs(), /forbidden|"code":403/i, `${r.pod} never hit RBAC limits`);
        }
        assert.deepEqual(replicas[2]!.emulator.stats().certRequests, {}, 'the read-only consumer never asks tailscaled');

        // SIGTERM: out of rotation first (gate False), then exit 0 within the shutdown timeout.
        const stopped = performance.now();
        await Promise.all(
          replicas.map(async (r) => {
            const exited = once(r.child, 'exit');
            r.child.kill('SIGTERM');
            const [code] = (await exited) as [number | null];
            assert.equal(code, 0, `${r.pod} exit code; logs:\n${r.logs()}`);
          }),
        );
        assert.ok(performance.now() - stopped < 25_000, 'within CERTSHARE_SHUTDOWN_TIMEOUT');
        for (const r of replicas) {
          const pod = JSON.parse(await must(['get', 'pod', r.pod, '-o', 'json'])) as { status: { conditions?: Array<{ type: string; status: string }> } };
          assert.equal(pod.status.conditions?.find((c) => c.type === GATE)?.status, 'False', `${r.pod} left rotation on SIGTERM`);
        }
      } finally {
        for (const r of replicas) if (r.child.exitCode === null) r.child.kill('SIGKILL');
      }
    });
  });
});

describe('manifests/monitoring', () => {
  const MONITORING = join(REPO, 'manifests/monitoring');

  async function ruleExpressions(): Promise<Array<{ alert: string; expr: string }>> {
    const files = (await readdir(MONITORING)).filter((f) => f.endsWith('.yaml') && f !== 'kustomization.yaml');
    const rules: Array<{ alert: string; expr: string }> = [];
    for (const file of files) {
      for (const doc of await yamlDocs(join(MONITORING, file))) {
        if (doc.kind !== 'PrometheusRule') continue;
        const groups = (doc.spec as { groups: Array<{ rules: Array<{ alert?: string; record?: string; expr: string }> }> }).groups;
        for (const rule of groups.flatMap((g) => g.rules)) rules.push({ alert: rule.alert ?? rule.record ?? '?', expr: String(rule.expr) });
      }
    }
    return rules;
  }

  it('scrapes the port the sidecar declares and labels series with the group label the Pods carry', async () => {
    const [monitor] = (await yamlDocs(join(MONITORING, 'podmonitor.yaml'))).filter((d) => d.kind === 'PodMonitor');
    assert.ok(monitor);
    const endpoints = (
      monitor.spec as { podMetricsEndpoints: Array<{ port: string; path: string; relabelings?: Array<{ sourceLabels: string[]; targetLabel: string }> }> }
    ).podMetricsEndpoints;
    const sts = await exampleStatefulSet();
    const port = sidecarOf(injected(sts)).ports?.find((p) => p.name === endpoints[0]?.port);
    assert.equal(port?.containerPort, 9002);
    assert.equal(endpoints[0]?.path, '/metrics');
    const relabel = endpoints[0]?.relabelings?.find((r) => r.targetLabel === 'group');
    const label = Object.keys(sts.spec.template.metadata.labels).find(
      (l) => `__meta_kubernetes_pod_label_${l.replace(/[^a-zA-Z0-9_]/g, '_')}` === relabel?.sourceLabels[0],
    );
    assert.equal(label, 'certshare.io/group');
  });

  it('alerts on certificates too short for the renewal rule (issuance storms held back)', async () => {
    const rules = await ruleExpressions();
    assert.ok(
      rules.some(({ expr }) => /certshare_issuance_attempts_total\{result="too_short"\}/.test(expr)),
      rules.map((r) => r.alert).join(', '),
    );
  });

  it('every metric in the alert expressions is exported by a running daemon, with the labels the rules select on', async () => {
    const rules = await ruleExpressions();
    assert.ok(rules.length >= 7, `${rules.length} rules`);
    const dir = await tempDir();
    const emulator = await emulatorIn(dir.path);
    // The served check's series: a check of a port where nothing listens (outcome unknown).
    const unused = createServer();
    await new Promise<void>((resolve) => unused.listen(0, '127.0.0.1', resolve));
    const port = (unused.address() as AddressInfo).port;
    await new Promise((resolve) => unused.close(resolve));
    const daemon = await standaloneDaemon(emulator, join(dir.path, 'certs'), ['--served-check', `127.0.0.1:${port}`]);
    try {
      await until('healthy', () => daemon.health.evaluate(Date.now()).healthy, [(l) => daemon.health.onChange(l)]);
      await until('the served check ran', () => daemon.health.details().some((l) => l.includes('served:')), [(l) => daemon.health.onChange(l)]);
      const text = await (await fetch(`${daemon.address}/metrics`)).text();
      const registered = new Set([...text.matchAll(/^# HELP (\S+) /gm)].map((m) => m[1]!));
      const samples = text.split('\n').filter((l) => l !== '' && !l.startsWith('#'));
      for (const { alert, expr } of rules) {
        const names = [...new Set([...expr.matchAll(/\bcertshare_[a-z_]+/g)].map((m) => m[0].replace(/_(bucket|sum|count)$/, '')))];
        assert.ok(names.length > 0, `${alert} uses certshare metrics`);
        for (const name of names) {
          assert.ok(
            registered.has(name),
            `${alert}: ${name} is not exported (exported: ${[...registered].filter((n) => n.startsWith('certshare_')).join(', ')})`,
          );
          // certshare_writer is set only in Kubernetes mode: registered is enough for it.
          if (name !== 'certshare_writer')
            assert.ok(
              samples.some((s) => s.startsWith(`${name}{`) || s.startsWith(`${name} `)),
              `${alert}: ${name} has samples`,
            );
        }
        for (const m of expr.matchAll(/\b(certshare_[a-z_]+)\{([^}]*)\}/g)) {
          for (const label of [...m[2]!.matchAll(/([a-z_]+)\s*(?:=~|!~|!=|=)/g)].map((l) => l[1]!)) {
            assert.ok(
              samples.some((s) => s.startsWith(`${m[1]}{`) && s.includes(`${label}="`)),
              `${alert}: ${m[1]} has a "${label}" label`,
            );
          }
        }
      }
    } finally {
      await daemon.stop();
      await emulator.close();
      await dir.remove();
    }
  });
});
