// Pods that use certshare's ServiceAccounts, against the real apiserver with the ServiceAccount admission
// plugin (tokens mounted as in a real cluster), the injector's webhook (in this process, called by URL) and
// manifests/example applied to a namespace opted in to injection. Every Pod is created, or refused, under the
// real token of a Pod author allowed to create and update Pods there: the rule certshare-pods-injected and the
// webhook hold certshare's accounts to the Pods the injector makes.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import type { V1Container, V1Pod, V1Volume } from '../../src/kube/transport/client-node.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import { parseFlags } from '../../src/flags/flags.ts';
import { startInjector, type Injector } from '../../src/injector/injector.ts';
import { INJECTOR_FLAGS, injectorConfigFrom } from '../../src/config/injector-options.ts';
import { ANNOTATION, STOP_FITTED_ANNOTATION } from '../../src/injector/mutate.ts';
import { DIST_COMMAND } from '../../src/injector/sidecar.ts';
import { SIDECAR_FORM_CONFIGMAP } from '../../src/injector/sidecar-form.ts';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { injectorLoopbackFlags } from '../support/replica-flags.ts';
import { must } from '../support/kube.ts';
import { freePort } from '../support/processes.ts';

const cp = useControlPlane({ serviceAccountAdmission: true });
const POLICY = 'certshare-pods-injected';
const FORM_POLICY = 'certshare-sidecar-as-injected';
const NODE_POLICY = 'certshare-pods-off-the-node';
const PLATFORM_FLAG = '--issuance-budget=20/168h';
const PLATFORM_ENV = 'CERTSHARE_ISSUANCE_BUDGET';
/** The platform's CA bundle (a private ACME CA's): a volume the Pod may not point elsewhere. */
const CA_CONFIGMAP = 'acme-ca';
/** The federation home's kubeconfig (--sidecar-home-kubeconfig-secret): the home's token, which every member cluster shares. */
const HOME_SECRET = 'certshare-home';
const HOME_FLAGS = '--federation-namespace=certshare-home --federation-cluster=west';
/** The label the webhook once skipped Pods by (the injector's own): a Pod author sets what labels they like. */
const INJECTOR_LABEL = { 'app.kubernetes.io/name': 'certshare-injector' };
const CONFIG = 'certshare-injector';
const REPO = fileURLToPath(new URL('../../', import.meta.url));
const ns = `pods-${process.pid}`;
const DOMAIN = 'proxy.tailnet-0000.ts.net';
const asked = { [ANNOTATION.inject]: 'true', [ANNOTATION.domains]: DOMAIN };
const socketVolume: V1Volume = { name: 'tailscale-socket', emptyDir: {} };
const proxy: V1Container = { name: 'proxy', image: 'nginx', volumeMounts: [{ name: 'tailscale-socket', mountPath: '/var/run/tailscale' }] };
/** A token volume of the Pod's own making, as kube-api-access-* is made. */
const ownTokenVolume: V1Volume = { name: 'my-token', projected: { sources: [{ serviceAccountToken: { path: 'token', expirationSeconds: 3600 } }] } };

function pod(name: string, spec: Partial<V1Pod['spec']> & { serviceAccountName?: string }, annotations?: Record<string, string>): V1Pod {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name, ...(annotations ? { annotations } : {}) },
    spec: { containers: [proxy], volumes: [socketVolume], ...spec },
  };
}

describe("Pods under certshare's ServiceAccounts in an opted-in namespace (real tokens, real Pod creations)", () => {
  let injector: Injector | undefined;
  let author: string;
  /** Who may debug the namespace's Pods and nothing more: get pods and pods/ephemeralcontainers (no Secrets, no exec). */
  let podDebugger: string;

  /** A create under the Pod author's token: 'created' or the apiserver's refusal. */
  async function create(body: V1Pod, dryRun = false): Promise<string> {
    const args = ['create', '-n', ns, '-f', '-', ...(dryRun ? ['--dry-run=server'] : [])];
    const r = await cp().kubectl(args, { kubeconfig: author, input: JSON.stringify(body) });
    return r.code === 0 ? 'created' : r.stderr.trim();
  }
  async function stored(name: string): Promise<V1Pod> {
    return JSON.parse(await must(cp().kubectl(['get', 'pod', name, '-n', ns, '-o', 'json']))) as V1Pod;
  }
  /** A stored Pod as a new Pod to create: what `kubectl get -o yaml`, edited, hands back. */
  async function copyOf(name: string, newName: string): Promise<V1Pod> {
    const { metadata, spec } = await stored(name);
    return { apiVersion: 'v1', kind: 'Pod', metadata: { name: newName, annotations: metadata!.annotations }, spec: { ...spec!, nodeName: undefined } };
  }
  async function eventually(answer: () => Promise<string>, expected: RegExp): Promise<string> {
    const deadline = performance.now() + 30_000;
    for (;;) {
      const got = await answer();
      if (expected.test(got) || performance.now() > deadline) return got;
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
  }

  /** An ephemeral container added to a Pod under the author's token (what `kubectl debug` does). */
  function addEphemeral(name: string, container: Record<string, unknown>, kubeconfig = author) {
    const body = JSON.stringify({ spec: { ephemeralContainers: [container] } });
    return cp().kubectl(['patch', 'pod', name, '-n', ns, '--subresource=ephemeralcontainers', '--type=strategic', '-p', body], { kubeconfig });
  }

  before(async () => {
    await must(cp().kubectl(['create', 'namespace', 'certshare']));
    await must(cp().kubectl(['apply', '-k', `${REPO}manifests/injector`]));
    const port = await freePort();
    const clientConfig = [{ op: 'replace', path: '/webhooks/0/clientConfig', value: { url: `https://127.0.0.1:${port}/mutate` } }];
    await must(cp().kubectl(['patch', 'mutatingwebhookconfiguration', CONFIG, '--type=json', '-p', JSON.stringify(clientConfig)]));
    const env = { KUBECONFIG: await cp().kubeconfigFor('certshare', 'certshare-injector'), POD_NAMESPACE: 'certshare', POD_NAME: 'injector-0' };
    // A platform flag: the sidecar's form (certshare-sidecar-as-injected's parameters) then holds one of the platform's settings.
    const flags = [
      ...injectorLoopbackFlags(port),
      `--sidecar-flags=${PLATFORM_FLAG} ${HOME_FLAGS}`,
      `--sidecar-ca-configmap=${CA_CONFIGMAP}`,
      `--sidecar-home-kubeconfig-secret=${HOME_SECRET}`,
    ];
    injector = await startInjector(injectorConfigFrom(parseFlags(INJECTOR_FLAGS, flags, {}), env), {
      logger: silentLogger,
      env,
      defaultMetrics: false,
    });

    await must(cp().kubectl(['create', 'namespace', ns]));
    await must(cp().kubectl(['label', 'namespace', ns, 'certshare.io/injection=enabled']));
    await must(cp().kubectl(['apply', '-k', `${REPO}manifests/example`, '-n', ns]));
    // The Pod author: a namespace's developer, with a token of its own (no controller makes `default` here).
    const authorRbac = [
      { apiVersion: 'v1', kind: 'ServiceAccount', metadata: { name: 'default' } },
      { apiVersion: 'v1', kind: 'ServiceAccount', metadata: { name: 'pod-author' } },
      {
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: 'Role',
        metadata: { name: 'pod-author' },
        rules: [
          { apiGroups: [''], resources: ['pods'], verbs: ['create', 'get', 'update', 'patch'] },
          { apiGroups: [''], resources: ['pods/ephemeralcontainers'], verbs: ['get', 'update', 'patch'] },
          { apiGroups: [''], resources: ['pods/exec', 'pods/attach'], verbs: ['get', 'create'] },
        ],
      },
      {
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: 'RoleBinding',
        metadata: { name: 'pod-author' },
        roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'pod-author' },
        subjects: [{ kind: 'ServiceAccount', name: 'pod-author', namespace: ns }],
      },
      { apiVersion: 'v1', kind: 'ServiceAccount', metadata: { name: 'debugger' } },
      {
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: 'Role',
        metadata: { name: 'debugger' },
        rules: [
          { apiGroups: [''], resources: ['pods'], verbs: ['get'] },
          { apiGroups: [''], resources: ['pods/ephemeralcontainers'], verbs: ['get', 'update', 'patch'] },
        ],
      },
      {
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: 'RoleBinding',
        metadata: { name: 'debugger' },
        roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'debugger' },
        subjects: [{ kind: 'ServiceAccount', name: 'debugger', namespace: ns }],
      },
    ];
    await must(cp().kubectl(['apply', '-n', ns, '-f', '-'], { input: JSON.stringify({ apiVersion: 'v1', kind: 'List', items: authorRbac }) }));
    author = await cp().kubeconfigFor(ns, 'pod-author');
    podDebugger = await cp().kubeconfigFor(ns, 'debugger');
    // In effect once the webhook answers (the apiserver trusts the caBundle the injector wrote) and the policy is loaded.
    const injected = await eventually(() => create(pod('probe', { serviceAccountName: 'certshare' }, asked), true), /^created$/);
    assert.equal(injected, 'created');
    const refused = await eventually(() => create(pod('probe', { serviceAccountName: 'certshare' }), true), new RegExp(POLICY));
    assert.match(refused, new RegExp(POLICY));
  });

  after(async () => {
    await injector?.stop();
  });

  it('refuses a Pod that names a certshare account without asking for injection, whatever it mounts', async () => {
    for (const account of ['certshare', 'certshare-reader']) {
      for (const spec of [{}, { automountServiceAccountToken: false }]) {
        const answer = await create(pod(`plain-${account}`, { serviceAccountName: account, ...spec }));
        assert.match(answer, new RegExp(`${POLICY}.*ServiceAccount ${account} must ask the injector for certshare`), `${account} ${JSON.stringify(spec)}`);
      }
    }
    // Another account of the namespace is not certshare's business.
    assert.equal(await create(pod('plain-default', {})), 'created');
  });

  it('admits the Pod the injector makes under either account: the token in certshare alone', async () => {
    for (const [name, account] of [
      ['injected-0', 'certshare'],
      ['injected-reader', 'certshare-reader'],
    ]) {
      assert.equal(await create(pod(name!, { serviceAccountName: account }, asked)), 'created', name);
      const { spec } = await stored(name!);
      const tokenVolumes = spec!.volumes!.filter((v) => v.projected?.sources?.some((s) => s.serviceAccountToken)).map((v) => v.name);
      assert.deepEqual(tokenVolumes, ['certshare-token']);
      const mounting = [...spec!.initContainers!, ...spec!.containers].filter((c) => c.volumeMounts?.some((m) => tokenVolumes.includes(m.name)));
      assert.deepEqual(
        mounting.map((c) => c.name),
        ['certshare'],
      );
    }
    // The example's own Pod template, as its StatefulSet's Pods are created.
    const sts = JSON.parse(await must(cp().kubectl(['get', 'statefulset', 'proxy', '-n', ns, '-o', 'json']))) as {
      spec: { template: { metadata: V1Pod['metadata']; spec: V1Pod['spec'] } };
    };
    const example = { apiVersion: 'v1', kind: 'Pod', metadata: { ...sts.spec.template.metadata, name: 'proxy-0' }, spec: sts.spec.template.spec };
    assert.equal(await create(example), 'created');
  });

  it('refuses an injected Pod that would share the token: automount, its own token volume in another container, a shared process namespace', async () => {
    const cases: Array<[string, V1Pod, RegExp]> = [
      ['automount', pod('automount', { serviceAccountName: 'certshare', automountServiceAccountToken: true }, asked), /automountServiceAccountToken: false/],
      [
        'a token volume of its own in the proxy',
        pod(
          'own-token',
          {
            serviceAccountName: 'certshare',
            containers: [{ ...proxy, volumeMounts: [...proxy.volumeMounts!, { name: 'my-token', mountPath: '/t' }] }],
            volumes: [socketVolume, ownTokenVolume],
          },
          asked,
        ),
        /mounts a volume holding its token \(my-token, certshare-token\) in certshare's container only/,
      ],
      ['shareProcessNamespace', pod('shared-pid', { serviceAccountName: 'certshare', shareProcessNamespace: true }, asked), /shares no process namespace/],
      // certshare-pods-off-the-node refuses it under any account: either policy may answer.
      ['hostPID', pod('host-pid', { serviceAccountName: 'certshare', hostPID: true }, asked), /shares no process namespace|host's namespaces/],
    ];
    for (const [what, body, message] of cases) {
      const answer = await create(body);
      assert.match(answer, new RegExp(`${POLICY}|${NODE_POLICY}`), what);
      assert.match(answer, message, what);
    }
  });

  it("admits a shared process namespace only when the account's owner accepted it (stock nginx reloaded by signal); hostPID never", async () => {
    // The Pod docs/proxies.md describes: nginx's pid file in a volume of its own, tailscaled a native sidecar.
    const stock = (name: string) =>
      pod(
        name,
        {
          serviceAccountName: 'certshare',
          containers: [{ name: 'proxy', image: 'nginx', volumeMounts: [{ name: 'nginx-run', mountPath: '/run/nginx' }] }],
          initContainers: [{ ...proxy, name: 'tailscale', restartPolicy: 'Always' }],
          volumes: [socketVolume, { name: 'nginx-run', emptyDir: {} }],
        },
        { ...asked, [ANNOTATION.reloadSignal]: 'HUP', [ANNOTATION.reloadPidfile]: '/run/nginx/nginx.pid' },
      );
    assert.match(await create(stock('stock-refused'), true), new RegExp(`${POLICY}.*shares no process namespace`), 'not accepted: refused');
    const annotation = 'certshare.io/share-process-namespace';
    await must(cp().kubectl(['annotate', 'serviceaccount', 'certshare', '-n', ns, `${annotation}=accepted`]));
    try {
      assert.equal(await eventually(() => create(stock('stock-0'), true), /^created$/), 'created', 'accepted: admitted');
      const shared = await create(pod('host-pid-accepted', { serviceAccountName: 'certshare', hostPID: true }, asked), true);
      assert.match(shared, /shares no process namespace|host's namespaces \(hostPID/, 'hostPID stays refused');
    } finally {
      await must(cp().kubectl(['annotate', 'serviceaccount', 'certshare', '-n', ns, `${annotation}-`]));
    }
    assert.match(await eventually(() => create(stock('stock-again'), true), /shares no/), /shares no process namespace/, 'withdrawn: refused again');
  });

  it('refuses a Pod that carries its own certshare container; admits a copy of a Pod the injector made, as stored', async () => {
    const own: V1Container = {
      name: 'certshare',
      image: 'attacker.example/certshare:1',
      restartPolicy: 'Always',
      command: ['sh', '-c', 'cat /var/run/secrets/kubernetes.io/serviceaccount/token'],
    };
    // Asking for injection: the webhook refuses it.
    const asking = await create(pod('own-asking', { serviceAccountName: 'certshare', initContainers: [own] }, asked));
    assert.match(asking, /certshare injector: .*brings its own container named certshare \(its image is not the injector's\)/);
    // Not asking: the policy does.
    const silent = await create(pod('own-silent', { serviceAccountName: 'certshare', automountServiceAccountToken: false, initContainers: [own] }));
    // Both policies refuse it; the apiserver names whichever it evaluated first.
    assert.match(silent, new RegExp(`${POLICY}.*must ask the injector|${FORM_POLICY}.*runs the injector's image`));
    // The injector's own container with another image, or a platform flag set by hand.
    const copy = await copyOf('injected-0', 'copy-0');
    assert.equal(await create(copy), 'created', 'a stored injected Pod, copied as it is');
    const sidecar = (p: V1Pod) => p.spec!.initContainers!.find((c) => c.name === 'certshare')!;
    const otherImage = structuredClone(copy);
    otherImage.metadata!.name = 'copy-image';
    sidecar(otherImage).image = 'attacker.example/certshare:1';
    assert.match(await create(otherImage), /brings its own container named certshare \(its image is not the injector's\)/);
    const budget = structuredClone(copy);
    budget.metadata!.name = 'copy-budget';
    sidecar(budget).env!.push({ name: 'CERTSHARE_ISSUANCE_BUDGET', value: '0' });
    assert.match(await create(budget), /brings its own container named certshare \(its env is not the injector's\)/);
    // The injector's container, untouched, and the proxy mounting its token beside it.
    const sharing = structuredClone(copy);
    sharing.metadata!.name = 'copy-sharing';
    sharing.spec!.containers[0]!.volumeMounts!.push({ name: 'certshare-token', mountPath: '/t', readOnly: true });
    assert.match(await create(sharing), new RegExp(`${POLICY}.*in certshare's container only`));
  });

  it("a Pod labelled as the injector's own goes through the webhook: its own certshare container under the writer's account is refused", async () => {
    const own: V1Container = {
      name: 'certshare',
      image: 'attacker.example/certshare:1',
      restartPolicy: 'Always',
      command: ['sh', '-c', 'cat /t/token'],
      env: [{ name: PLATFORM_ENV, value: '0' }],
      volumeMounts: [{ name: 'my-token', mountPath: '/t' }],
    };
    // Everything certshare-pods-injected asks for: injection asked, no automount, one native sidecar, the token in it alone.
    const labelled = pod(
      'labelled-own',
      { serviceAccountName: 'certshare', automountServiceAccountToken: false, initContainers: [own], volumes: [socketVolume, ownTokenVolume] },
      asked,
    );
    labelled.metadata!.labels = INJECTOR_LABEL;
    assert.match(await create(labelled), /certshare injector: .*brings its own container named certshare/);
    // The injector's own sidecar, as a labelled Pod gets it: the label changes nothing.
    const plain = pod('labelled-injected', { serviceAccountName: 'certshare' }, asked);
    plain.metadata!.labels = INJECTOR_LABEL;
    assert.equal(await create(plain, true), 'created');
  });

  it("refuses changing certshare's container of a running Pod, and an ephemeral container mounting the token", async () => {
    const image = [{ op: 'replace', path: '/spec/initContainers/0/image', value: 'attacker.example/certshare:1' }];
    const patched = await cp().kubectl(['patch', 'pod', 'injected-0', '-n', ns, '--type=json', '-p', JSON.stringify(image)], { kubeconfig: author });
    assert.match(patched.stderr, new RegExp(`${POLICY}.*cannot change \\(its image included\\)|${FORM_POLICY}.*runs the injector's image`));
    const ephemeral = (name: string, mounts: Array<{ name: string; mountPath: string }>) =>
      cp().kubectl(
        [
          'patch',
          'pod',
          'injected-0',
          '-n',
          ns,
          '--subresource=ephemeralcontainers',
          '--type=strategic',
          '-p',
          JSON.stringify({ spec: { ephemeralContainers: [{ name, image: 'busybox', volumeMounts: mounts }] } }),
        ],
        { kubeconfig: author },
      );
    const stealing = await ephemeral('debug-token', [{ name: 'certshare-token', mountPath: '/t' }]);
    // Both policies refuse it; the apiserver names whichever it evaluated first.
    assert.match(stealing.stderr, new RegExp(`${POLICY}.*in certshare's container only|${FORM_POLICY}.*mounts no volume holding a ServiceAccount token`));
    const debugging = await ephemeral('debug', [{ name: 'tailscale-socket', mountPath: '/var/run/tailscale' }]);
    assert.equal(debugging.code, 0, debugging.stderr);
    // Targeting certshare's container shares its process namespace: its token through /proc/<pid>/root.
    const targeting = await addEphemeral('injected-0', { name: 'debug-target', image: 'busybox', targetContainerName: 'certshare' });
    assert.match(targeting.stderr, new RegExp(`${FORM_POLICY}.*may not target certshare's container`));
    const other = await addEphemeral('injected-0', { name: 'debug-proxy', image: 'busybox', targetContainerName: 'proxy' });
    assert.equal(other.code, 0, other.stderr);
    // The author may still change what is theirs: a label, the proxy's image.
    const proxyImage = [{ op: 'replace', path: '/spec/containers/0/image', value: 'nginx:2' }];
    const allowed = await cp().kubectl(['patch', 'pod', 'injected-0', '-n', ns, '--type=json', '-p', JSON.stringify(proxyImage)], { kubeconfig: author });
    assert.equal(allowed.code, 0, allowed.stderr);
  });

  it("refuses resizing certshare's container in place (pods/resize) to whoever may resize Pods; the proxy's stays theirs", async () => {
    // In-place resize (GA in Kubernetes 1.35) changes a running Pod's requests and limits through pods/resize:
    // certshare's too (a memory limit of 1Mi: killed at each start; a CPU limit of 1m: its renewals and its
    // readiness condition late), whose resources are the platform's (--sidecar-resources). The bootstrap `edit`
    // role does not hold pods/resize (1.36); a VPA's updater does, and a Role granting `pods/*`.
    await must(cp().kubectl(['-n', ns, 'create', 'serviceaccount', 'tenant-resize']));
    for (const part of ['edit', 'view'])
      await must(
        cp().kubectl([
          '-n',
          ns,
          'create',
          'rolebinding',
          `tenant-resize-${part}`,
          `--clusterrole=system:aggregate-to-${part}`,
          `--serviceaccount=${ns}:tenant-resize`,
        ]),
      );
    const tenant = await cp().kubeconfigFor(ns, 'tenant-resize');
    const resize = (container: string, resources: unknown) =>
      cp().kubectl(
        ['patch', 'pod', 'injected-0', '-n', ns, '--subresource=resize', '--type=strategic', '-p', JSON.stringify({ spec: { [container]: resources } })],
        { kubeconfig: tenant },
      );
    const starved = { limits: { memory: '1Mi', cpu: '1m' }, requests: { memory: '1Mi', cpu: '1m' } };
    const byEdit = await resize('initContainers', [{ name: 'certshare', resources: starved }]);
    assert.match(byEdit.stderr, /cannot get resource "pods\/resize"/, 'the bootstrap edit role holds no pods/resize');
    await must(cp().kubectl(['-n', ns, 'create', 'role', 'resizer', '--verb=get,patch,update', '--resource=pods/resize']));
    await must(cp().kubectl(['-n', ns, 'create', 'rolebinding', 'tenant-resize-resizer', '--role=resizer', `--serviceaccount=${ns}:tenant-resize`]));
    const proxy = await eventually(
      async () => (await resize('containers', [{ name: 'proxy', resources: { requests: { cpu: '50m' } } }])).stderr,
      /^(?![\s\S]*cannot get resource)/,
    );
    assert.equal(proxy, '', "the proxy's resources are the tenant's");
    // Once RBAC lets the request through, admission answers (on 1043d72 it admitted it: the sidecar's limit 1Mi).
    const sidecar = await resize('initContainers', [{ name: 'certshare', resources: starved }]);
    const held = (await stored('injected-0')).spec!.initContainers!.find((c) => c.name === 'certshare')!.resources;
    assert.match(sidecar.stderr, new RegExp(`${POLICY}.*cannot change`), `the sidecar resized in place: ${JSON.stringify(held)}`);
    assert.notEqual(held?.limits?.memory, '1Mi');
  });

  it("under any account: certshare's container keeps the injector's image, and no ephemeral container targets it or mounts its token", async () => {
    assert.equal(await create(pod('injected-default', {}, asked)), 'created');
    const image = [{ op: 'replace', path: '/spec/initContainers/0/image', value: 'attacker.example/certshare:1' }];
    const patched = await cp().kubectl(['patch', 'pod', 'injected-default', '-n', ns, '--type=json', '-p', JSON.stringify(image)], { kubeconfig: author });
    assert.match(patched.stderr, new RegExp(`${FORM_POLICY}.*runs the injector's image`));
    const mounting = await addEphemeral('injected-default', {
      name: 'debug-token',
      image: 'busybox',
      volumeMounts: [{ name: 'certshare-token', mountPath: '/t' }],
    });
    assert.match(mounting.stderr, new RegExp(`${FORM_POLICY}.*mounts no volume holding a ServiceAccount token \\(certshare-token\\)`));
    const targeting = await addEphemeral('injected-default', { name: 'debug-target', image: 'busybox', targetContainerName: 'certshare' });
    assert.match(targeting.stderr, new RegExp(`${FORM_POLICY}.*may not target certshare's container`));
  });

  it("the federation home's kubeconfig stays in certshare's container: no ephemeral container mounts it, no other container of a new Pod", async () => {
    // `kubectl debug` with pods/ephemeralcontainers alone (the grant docs/security.md gives instead of exec): the
    // volume's name is all it needs, and the file is the home's token (the federation account, every member's records).
    const home = { name: 'debug-home', image: 'busybox', volumeMounts: [{ name: 'certshare-federation', mountPath: '/home-kubeconfig' }] };
    const secret = await cp().kubectl(['get', 'secret', HOME_SECRET, '-n', ns], { kubeconfig: podDebugger });
    assert.match(secret.stderr, /forbidden/, 'the debugger may not read the Secret itself');
    const debugging = await addEphemeral('injected-0', home, podDebugger);
    assert.match(debugging.stderr, new RegExp(`${FORM_POLICY}.*kubeconfig is mounted in certshare's container only.*\\(certshare-federation\\)`));
    // The same grant still debugs: an ephemeral container beside the proxy, with tailscaled's socket.
    const plain = { name: 'debug-plain', image: 'busybox', volumeMounts: [{ name: 'tailscale-socket', mountPath: '/var/run/tailscale' }] };
    const allowed = await addEphemeral('injected-0', plain, podDebugger);
    assert.equal(allowed.code, 0, allowed.stderr);
    // A Pod of its own making, under no certshare account, mounting the same Secret by another volume name.
    const own: V1Volume = { name: 'mine', secret: { secretName: HOME_SECRET } };
    const reading = pod('home-reader', { volumes: [socketVolume, own], containers: [{ ...proxy, volumeMounts: [{ name: 'mine', mountPath: '/kc' }] }] });
    assert.match(await create(reading, true), new RegExp(`${FORM_POLICY}.*kubeconfig is mounted in certshare's container only.*\\(mine\\)`));
    const projected: V1Volume = { name: 'mine', projected: { sources: [{ secret: { name: HOME_SECRET } }] } };
    assert.match(await create({ ...reading, spec: { ...reading.spec!, volumes: [socketVolume, projected] } }, true), new RegExp(FORM_POLICY));
    // A Pod that asks for injection and mounts, in its proxy, the volume the injector is about to add.
    const byName = { ...proxy, volumeMounts: [...proxy.volumeMounts!, { name: 'certshare-federation', mountPath: '/kc' }] };
    const asking = pod('home-by-name', { serviceAccountName: 'certshare', containers: [byName] }, asked);
    assert.match(await create(asking, true), new RegExp(`${FORM_POLICY}.*kubeconfig is mounted in certshare's container only`));
    // The Secret's own Pod, injected, is admitted: the volume in certshare's container alone.
    const injected = await stored('injected-0');
    const sidecar = injected.spec!.initContainers!.find((c) => c.name === 'certshare')!;
    assert.ok(
      sidecar.volumeMounts!.some((m) => m.name === 'certshare-federation'),
      "the injector mounts it in certshare's container",
    );
  });

  it("refuses exec and attach into certshare's container to whoever holds pods/exec, before any node is asked", async () => {
    const EXEC_POLICY = 'certshare-no-exec-into-sidecar';
    const into = (verb: string, container: string) =>
      cp().kubectl([verb, '-n', ns, 'injected-0', '-c', container, ...(verb === 'exec' ? ['--', '/nodejs/bin/node', '-v'] : [])], { kubeconfig: author });
    for (const verb of ['exec', 'attach']) {
      const refused = await into(verb, 'certshare');
      assert.match(refused.stderr, new RegExp(`${EXEC_POLICY}.*no exec or attach into certshare's container`), verb);
    }
    // The proxy's container is RBAC's business: the request passes admission (and fails here only for want of a node).
    const proxyExec = await into('exec', 'proxy');
    assert.notEqual(proxyExec.code, 0);
    assert.doesNotMatch(proxyExec.stderr, new RegExp(EXEC_POLICY));
  });

  it("refuses changing the passwd file the injector gave tailscaled's container (a Pod advertising a Tailscale Service)", async () => {
    const advertising = { ...asked, [ANNOTATION.flags]: '--served-check=127.0.0.1:8443 --advertise-services=svc:proxy --shutdown-timeout=8s' };
    assert.equal(await create(pod('advertising-0', { serviceAccountName: 'certshare' }, advertising)), 'created');
    const { metadata } = await stored('advertising-0');
    assert.match(metadata!.annotations!['certshare.io/tailscaled-passwd']!, /^certshare-advertise:x:65533:/m);
    const patch = (annotations: Record<string, string | null>) =>
      cp().kubectl(['patch', 'pod', 'advertising-0', '-n', ns, '--type=merge', '-p', JSON.stringify({ metadata: { annotations } })], { kubeconfig: author });
    for (const value of ['certshare:x:0:0::/:/bin/sh\n', null]) {
      const changed = await patch({ 'certshare.io/tailscaled-passwd': value });
      assert.match(changed.stderr, new RegExp(`${POLICY}.*certshare.io/tailscaled-passwd .* cannot change`), String(value));
    }
    const other = await patch({ 'example.com/note': 'mine' });
    assert.equal(other.code, 0, other.stderr);
  });

  it("advertising on certshare's defaults in the default grace: its stop fitted, and the stored copy passes both policies and the webhook", async () => {
    const onDefaults = { ...asked, [ANNOTATION.flags]: '--served-check=127.0.0.1:8443 --advertise-services=svc:proxy' };
    assert.equal(await create(pod('fitted-0', { serviceAccountName: 'certshare' }, onDefaults)), 'created');
    const { metadata, spec } = await stored('fitted-0');
    assert.equal(spec!.terminationGracePeriodSeconds, 30);
    const certshare = spec!.initContainers!.find((c) => c.name === 'certshare')!;
    assert.deepEqual(
      certshare.env!.filter((e) => e.name === 'CERTSHARE_SHUTDOWN_TIMEOUT'),
      [{ name: 'CERTSHARE_SHUTDOWN_TIMEOUT', value: '10s' }],
    );
    assert.match(metadata!.annotations![STOP_FITTED_ANNOTATION]!, /^--shutdown-timeout=10s: terminationGracePeriodSeconds 30 less 20s/);
    assert.equal(await create(await copyOf('fitted-0', 'fitted-copy')), 'created');
    // Another value in the copy is the Pod's own container, not the injector's.
    const edited = await copyOf('fitted-0', 'fitted-edited');
    edited.spec!.initContainers!.find((c) => c.name === 'certshare')!.env!.find((e) => e.name === 'CERTSHARE_SHUTDOWN_TIMEOUT')!.value = '9s';
    assert.match(await create(edited), /brings its own container named certshare \(its env\[\d+\]\.value is not the injector's\)/);
  });

  it("tailscaled from the operator's config file: admitted, certshare told not to advertise, and the author cannot add it back", async () => {
    const configDir = [{ name: 'TS_EXPERIMENTAL_VERSIONED_CONFIG_DIR', value: '/etc/tsconfig/proxy-0' }];
    const tailscale: V1Container = { name: 'tailscale', image: 'tailscale/tailscale', env: configDir, volumeMounts: proxy.volumeMounts! };
    const advertising = { ...asked, [ANNOTATION.flags]: '--served-check=127.0.0.1:8443 --advertise-services=svc:proxy --shutdown-timeout=8s' };
    const body = pod('config-file-0', { serviceAccountName: 'certshare', containers: [{ name: 'proxy', image: 'nginx' }, tailscale] }, advertising);
    assert.equal(await create(body), 'created');
    const { metadata, spec } = await stored('config-file-0');
    const certshare = spec!.initContainers!.find((c) => c.name === 'certshare')!;
    assert.deepEqual(
      certshare.env!.filter((e) => e.name.startsWith('CERTSHARE_ADVERTISE') || e.name === 'CERTSHARE_LEAVE_TOKEN'),
      [{ name: 'CERTSHARE_ADVERTISE_LEFT_TO_FILE', value: 'svc:proxy' }],
    );
    assert.deepEqual(
      spec!.containers.map((c) => c.name),
      ['proxy', 'tailscale'],
      'no advertise agent',
    );
    assert.deepEqual(spec!.containers[1]!.env, configDir, "tailscaled's container as the operator wrote it");
    assert.equal(metadata!.annotations!['certshare.io/tailscaled-passwd'], undefined);
    assert.match(metadata!.annotations!['certshare.io/advertise-owner']!, /^config-file: container tailscale/);
    // The stored Pod, copied, passes both policies and the webhook again; with the advertisement added by hand it does not.
    const copy = await copyOf('config-file-0', 'config-file-copy');
    assert.equal(await create(copy), 'created');
    const handAdvertised = structuredClone(copy);
    handAdvertised.metadata!.name = 'config-file-advertised';
    handAdvertised.spec!.initContainers!.find((c) => c.name === 'certshare')!.env!.push({ name: 'CERTSHARE_ADVERTISE_SERVICES', value: 'svc:proxy' });
    assert.match(await create(handAdvertised), /brings its own container named certshare \(its env is not the injector's\)/);
  });

  it('a webhook that is down opens nothing: its Pods refused; without the webhook at all, the policy alone still refuses', async () => {
    await injector!.stop();
    injector = undefined;
    const own: V1Container = { name: 'certshare', image: 'attacker.example/certshare:1', restartPolicy: 'Always' };
    const asking = await create(pod('down-own', { serviceAccountName: 'certshare', automountServiceAccountToken: false, initContainers: [own] }, asked));
    assert.match(asking, /failed calling webhook "inject\.certshare\.io"/);
    // No webhook configuration at all (deleted, or a namespace it does not select): the policy needs none.
    await must(cp().kubectl(['delete', 'mutatingwebhookconfiguration', CONFIG]));
    const cases: Array<[string, V1Pod, RegExp]> = [
      ['no injection asked', pod('alone-plain', { serviceAccountName: 'certshare' }), /must ask the injector/],
      ['automount', pod('alone-automount', { serviceAccountName: 'certshare' }, asked), /automountServiceAccountToken: false/],
      ['no certshare container', pod('alone-none', { serviceAccountName: 'certshare', automountServiceAccountToken: false }, asked), /one native sidecar/],
      [
        'the token in the proxy',
        pod(
          'alone-token',
          {
            serviceAccountName: 'certshare',
            automountServiceAccountToken: false,
            initContainers: [{ ...own, volumeMounts: [{ name: 'my-token', mountPath: '/var/run/secrets/kubernetes.io/serviceaccount' }] }],
            containers: [{ ...proxy, volumeMounts: [...proxy.volumeMounts!, { name: 'my-token', mountPath: '/t' }] }],
            volumes: [socketVolume, ownTokenVolume],
          },
          asked,
        ),
        // Its own certshare container is refused by the form's policy too: either may answer.
        new RegExp(`${POLICY}.*in certshare's container only|${FORM_POLICY}.*runs the injector's image`),
      ],
    ];
    for (const [what, body, message] of cases) {
      const answer = await eventually(() => create(body, true), message);
      assert.match(answer, new RegExp(`${POLICY}|${FORM_POLICY}`), what);
      assert.match(answer, message, what);
    }
  });

  it("without the webhook, a container named certshare is admitted only in the injector's form (its ConfigMap): image, variables, its command", async () => {
    // The webhook configuration was deleted above. The injector's own output, as stored, is still admitted.
    const copy = await copyOf('injected-0', 'form-copy');
    // Added above; a Pod is created without ephemeral containers.
    delete copy.spec!.ephemeralContainers;
    assert.equal(await eventually(() => create(copy, true), /^created$/), 'created', "the injector's form");
    const sidecar = (p: V1Pod) => p.spec!.initContainers!.find((c) => c.name === 'certshare')!;
    const variant = (name: string, change: (c: V1Container) => void): V1Pod => {
      const body = structuredClone(copy);
      body.metadata!.name = name;
      change(sidecar(body));
      return body;
    };
    const env = (c: V1Container) => c.env!;
    const INJECTOR_COMMAND = new RegExp(`runs the injector's command only \\(${DIST_COMMAND.join(' ')} run\\)`);
    assert.deepEqual([sidecar(copy).command, sidecar(copy).args], [DIST_COMMAND, ['run']], "the injector's command: dist/cli/main.js");
    const cases: Array<[string, V1Pod, RegExp]> = [
      [
        'another image',
        variant('form-image', (c) => (c.image = 'attacker.example/certshare:1')),
        /runs the injector's image \(ghcr\.io\/certshare\/certshare:/,
      ],
      [
        'another command',
        variant('form-command', (c) => (c.command = ['sh', '-c', 'cat /var/run/secrets/kubernetes.io/serviceaccount/token'])),
        INJECTOR_COMMAND,
      ],
      // The image's own entry (its start-up snapshot) is not the injector's command either.
      ['no command', variant('form-no-command', (c) => delete c.command), INJECTOR_COMMAND],
      ['a command split otherwise', variant('form-split', (c) => (c.command = [c.command!.join(' ')])), INJECTOR_COMMAND],
      ['other args', variant('form-args', (c) => (c.args = ['run', '--issuance-budget=0'])), INJECTOR_COMMAND],
      ['envFrom', variant('form-envfrom', (c) => (c.envFrom = [{ configMapRef: { name: 'mine' } }])), /no envFrom/],
      ['a postStart hook', variant('form-hook', (c) => (c.lifecycle = { postStart: { exec: { command: ['sh'] } } })), /no envFrom, lifecycle hook/],
      ['an exec probe', variant('form-probe', (c) => (c.livenessProbe = { exec: { command: ['sh'] } })), /exec probe/],
      [
        'a platform setting changed',
        variant('form-budget', (c) => (env(c).find((e) => e.name === PLATFORM_ENV)!.value = '0')),
        new RegExp(`not ${PLATFORM_ENV}`),
      ],
      [
        'a platform setting left out',
        variant('form-no-budget', (c) => (c.env = env(c).filter((e) => e.name !== PLATFORM_ENV))),
        new RegExp(`${PLATFORM_ENV} missing`),
      ],
      [
        'a flag no Pod sets',
        variant('form-reload', (c) => env(c).push({ name: 'CERTSHARE_RELOAD_COMMAND', value: 'sh -c id' })),
        /not CERTSHARE_RELOAD_COMMAND/,
      ],
      [
        'a Pod field from elsewhere',
        variant('form-field', (c) => (env(c).find((e) => e.name === 'POD_NAME')!.valueFrom = { secretKeyRef: { name: 'x', key: 'y' } })),
        /not POD_NAME/,
      ],
    ];
    // What the sidecar trusts is the platform's: the CA bundle from its ConfigMap, nothing mounted over it.
    const otherCa = structuredClone(copy);
    otherCa.metadata!.name = 'form-other-ca';
    otherCa.spec!.volumes!.find((v) => v.name === 'certshare-ca')!.configMap!.name = 'my-ca';
    cases.push(['another CA bundle', otherCa, /not certshare-ca/]);
    const overCa = variant('form-over-ca', (c) => c.volumeMounts!.push({ name: 'tailscale-socket', mountPath: '/etc/certshare/ca/more' }));
    cases.push(['a volume under the CA bundle', overCa, /not \/etc\/certshare\/ca\/more/]);
    for (const [what, body, message] of cases) {
      const answer = await create(body, true);
      assert.match(answer, new RegExp(FORM_POLICY), what);
      assert.match(answer, message, what);
    }
    // A Pod's own setting (certshare.io/flags) is the Pod's: any value the daemon takes.
    assert.equal(
      await create(
        variant('form-drain', (c) => env(c).push({ name: 'CERTSHARE_DRAIN_DELAY', value: '2s' })),
        true,
      ),
      'created',
    );
    // The Pod the webhook once skipped by its label, now with no webhook at all: the policy refuses it.
    const labelled = variant('form-labelled', (c) => (c.image = 'attacker.example/certshare:1'));
    labelled.metadata!.labels = INJECTOR_LABEL;
    assert.match(await create(labelled, true), new RegExp(`${FORM_POLICY}.*runs the injector's image`));
  });

  it('a Pod under any account stays off the node, which holds every token: no host namespace, hostPath, privilege or added capability', async () => {
    const as = (securityContext: V1Container['securityContext']): V1Container => ({ ...proxy, securityContext });
    // On d7d4d70 each admitted (Pod Security's default level is privileged): hostPID as certshare's uid reads, through
    // /proc/<pid>/root, the token of every certshare on the node, whatever its namespace; a hostPath or a privileged
    // container reads the kubelet's copy of every Pod's token.
    const cases: Array<[string, V1Pod, RegExp]> = [
      ["hostPID as certshare's uid", pod('node-pid', { hostPID: true, securityContext: { runAsUser: 65532 } }), /host's namespaces/],
      ['hostNetwork', pod('node-net', { hostNetwork: true }), /host's namespaces/],
      ['hostIPC', pod('node-ipc', { hostIPC: true }), /host's namespaces/],
      [
        "a hostPath of the kubelet's Pods",
        pod('node-path', { volumes: [socketVolume, { name: 'pods', hostPath: { path: '/var/lib/kubelet/pods' } }] }),
        /no hostPath volume/,
      ],
      ['a privileged container', pod('node-privileged', { containers: [as({ privileged: true })] }), /is not privileged/],
      [
        'an init container adding SYS_PTRACE',
        pod('node-ptrace', { initContainers: [{ ...as({ capabilities: { add: ['SYS_PTRACE'] } }), name: 'init' }] }),
        /adds no capability/,
      ],
    ];
    for (const [what, body, message] of cases) {
      const answer = await create(body, true);
      assert.match(answer, new RegExp(NODE_POLICY), what);
      assert.match(answer, message, what);
    }
    // What baseline allows stays the Pod's.
    assert.equal(await create(pod('node-bind', { containers: [as({ capabilities: { add: ['NET_BIND_SERVICE'] } })] }), true), 'created');
    // Nor an ephemeral container added later, by the author or by whoever holds only the debugging grant.
    for (const kubeconfig of [author, podDebugger]) {
      const privileged = await addEphemeral('plain-default', { name: 'debug-node', image: 'busybox', securityContext: { privileged: true } }, kubeconfig);
      assert.notEqual(privileged.code, 0, 'a privileged ephemeral container');
      assert.match(privileged.stderr, new RegExp(`${NODE_POLICY}.*is not privileged`));
    }
    assert.equal((await addEphemeral('plain-default', { name: 'debug-plain', image: 'busybox' }, podDebugger)).code, 0, 'a plain one');
    // A namespace the platform labels privileged on purpose (Tailscale's operator's proxies) is left to that choice.
    const privileged = 'pod-security.kubernetes.io/enforce';
    await must(cp().kubectl(['label', 'namespace', ns, `${privileged}=privileged`]));
    try {
      assert.equal(await eventually(() => create(cases[0]![1], true), /^created$/), 'created', 'labelled privileged');
    } finally {
      await must(cp().kubectl(['label', 'namespace', ns, `${privileged}-`]));
    }
    assert.match(await eventually(() => create(cases[0]![1], true), new RegExp(NODE_POLICY)), new RegExp(NODE_POLICY), 'unlabelled again');
  });

  it("a sidecar's form of 10,000 keys (written before the policy that bounds the injector's writes) is not read: every Pod refused at once", async () => {
    const path = `/api/v1/namespaces/certshare/configmaps/${SIDECAR_FORM_CONFIGMAP}`;
    const form = JSON.parse((await cp().adminRequest('GET', path)).body) as { metadata: Record<string, unknown>; data: Record<string, string> };
    const flood = Object.fromEntries(Array.from({ length: 10_000 }, (_, i) => [`junk${i}`, 'x'.repeat(80)]));
    const written = await cp().adminRequest('PUT', path, { body: { ...form, data: { ...form.data, ...flood } } });
    assert.equal(written.status, 200, written.body);
    try {
      // On d7d4d70 admitted, each creation costing the apiserver seconds of CPU (docs/security.md).
      const answer = await eventually(() => create(pod('flooded-form', {}), true), /over 128 keys/);
      assert.match(answer, new RegExp(`${FORM_POLICY}.*is not the injector's: over 128 keys`));
    } finally {
      const restored = await cp().adminRequest('PUT', path, { body: { ...form, metadata: { ...form.metadata, resourceVersion: undefined } } });
      assert.equal(restored.status, 200, restored.body);
    }
  });
});
