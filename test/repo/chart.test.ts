// charts/certshare rendered by helm (built from its Go module): with the default values it is exactly
// manifests/injector as kustomize builds it (and its opt-in parts, the monitoring objects and the
// NetworkPolicy, exactly theirs), so the two installs never drift apart; every value lands where it says;
// values.schema.json refuses what the chart cannot honour. install.test.ts installs it on the real apiserver.
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { load } from 'js-yaml';
import { parseFlags } from '../../src/flags/flags.ts';
import { INJECTOR_FLAGS, injectorConfigFrom } from '../../src/config/injector-options.ts';
import { DEFAULT_IMAGE } from '../../src/config/injection-defaults.ts';
import { applied, CHART, helm, kustomize, MANIFESTS, REPO, renderChart, withoutKeep, type KubeObject } from '../support/helm.ts';

interface Container {
  image: string;
  imagePullPolicy?: string;
  env: Array<{ name: string; value?: string }>;
  resources: unknown;
}
interface PodSpec {
  priorityClassName?: string;
  nodeSelector?: unknown;
  tolerations?: unknown;
  containers: Container[];
}

const find = (objects: KubeObject[], kind: string): KubeObject | undefined => objects.find((o) => o.kind === kind);
const podSpec = (objects: KubeObject[]): PodSpec => (find(objects, 'Deployment')!.spec as { template: { spec: PodSpec } }).template.spec;

/** Every option away from its default (the documentation address ranges for the apiserver). */
const EVERY_OPTION: Record<string, unknown> = {
  image: { repository: 'registry.example/certshare', tag: '0.2.0', pullPolicy: 'IfNotPresent' },
  replicas: 3,
  resources: { requests: { cpu: '50m', memory: '128Mi' }, limits: { memory: '300Mi' } },
  priorityClass: { create: false, name: 'system-cluster-critical' },
  nodeSelector: { 'kubernetes.io/os': 'linux' },
  tolerations: [{ key: 'dedicated', operator: 'Equal', value: 'platform', effect: 'NoSchedule' }],
  sidecar: {
    image: 'registry.example/certshare-sidecar:0.2.0',
    imagePullPolicy: 'Always',
    flags: '--issuance-budget=20/168h --acme-directory=https://acme.example.internal/directory',
    caConfigMap: 'acme-ca:root.pem',
    resources: { requests: { cpu: '100m', memory: '160Mi' }, limits: { memory: '256Mi' } },
  },
  injectorFlags: { 'log-level': 'debug', 'leaf-lifetime': '480h' },
  commonLabels: { release: 'prometheus' },
  monitoring: { enabled: true },
  networkPolicy: {
    enabled: true,
    apiserverCIDRs: ['192.0.2.0/24', '2001:db8::/64'],
    metricsNamespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'monitoring' } },
  },
};

/**
 * Injector flags the chart sets itself, or that other objects of the chart depend on: injectorFlags may not
 * name them (values.schema.json lists the others).
 */
const WIRED_FLAGS = [
  'listen', // port 8443: the Service, the probes, the NetworkPolicy
  'metrics-listen', // port 9003: the PodMonitor, the NetworkPolicy
  'metrics-tls', // a Secret the Role would have to grant, and an https PodMonitor
  'service', // the Service, the webhook's clientConfig
  'service-namespace',
  'inject-ca-into', // the webhook configuration, the ClusterRole, the admission policy
  'ca-secret', // named in the Role
  'tls-secret',
  'lease',
  'sidecar-image', // sidecar.image
  'sidecar-image-pull-policy', // sidecar.imagePullPolicy
  'sidecar-flags', // sidecar.flags
  'tailscale-operator', // sidecar.tailscaleOperator
  'sidecar-ca-configmap', // sidecar.caConfigMap
  'sidecar-home-kubeconfig-secret', // sidecar.homeKubeconfigSecret
  'sidecar-resources', // sidecar.resources
];

describe('charts/certshare', () => {
  it('passes helm lint --strict, with the default values and with every option set', async () => {
    for (const sets of [[], Object.entries(EVERY_OPTION).flatMap(([k, v]) => ['--set-json', `${k}=${JSON.stringify(v)}`])]) {
      const r = await helm(['lint', '--strict', CHART, ...sets]);
      assert.equal(r.code, 0, r.stdout + r.stderr);
      assert.match(r.stdout, /1 chart\(s\) linted, 0 chart\(s\) failed/);
    }
  });

  it('renders exactly the objects of manifests/injector (kustomize) with the default values', async () => {
    assert.deepEqual(applied(await renderChart()), applied(await kustomize(MANIFESTS)));
  });

  it('budget.registeredDomains and budget.sidecarAccounts add exactly the objects of manifests/budget (its admission policy included)', async () => {
    const plain = new Set((await renderChart()).map((o) => `${o.kind}/${o.metadata.name}`));
    const rendered = await renderChart({
      'budget.registeredDomains': ['tailnet-0000.ts.net'],
      'budget.sidecarAccounts': [{ namespace: 'proxy', name: 'certshare' }],
    });
    const added = rendered.filter((o) => !plain.has(`${o.kind}/${o.metadata.name}`));
    // The ledger is kept on uninstall (its count outlives it): Helm's annotation aside, the manifests' own objects.
    assert.deepEqual(applied(added.map(withoutKeep)), applied(await kustomize(join(REPO, 'manifests/budget'))));
  });

  it('monitoring.enabled and networkPolicy.enabled add exactly manifests/injector/monitoring and network-policy', async () => {
    const rendered = await renderChart({ 'monitoring.enabled': true, 'networkPolicy.enabled': true, 'networkPolicy.apiserverCIDRs': ['192.0.2.0/24'] });
    const built = [
      ...(await kustomize(MANIFESTS)),
      ...(await kustomize(join(MANIFESTS, 'monitoring'))),
      ...(await kustomize(join(MANIFESTS, 'network-policy'))),
    ];
    assert.deepEqual(applied(rendered), applied(built));
  });

  it('follows the release namespace wherever the manifests name theirs (which kustomize users change by hand)', async () => {
    const values = { 'monitoring.enabled': true, 'networkPolicy.enabled': true, 'networkPolicy.apiserverCIDRs': ['192.0.2.0/24'] };
    const inCertshare = JSON.stringify(await renderChart(values));
    assert.ok(!inCertshare.includes('platform'));
    const moved = inCertshare
      .replaceAll('"namespace":"certshare"', '"namespace":"platform"')
      .replace('"kube-node-lease","certshare"', '"kube-node-lease","platform"');
    const inPlatform = await renderChart(values, 'platform');
    assert.deepEqual(inPlatform, JSON.parse(moved));
    const webhook = find(inPlatform, 'MutatingWebhookConfiguration')!;
    const [hook] = webhook.webhooks as Array<{
      clientConfig: { service: { namespace: string } };
      namespaceSelector: { matchExpressions: { values: string[] }[] };
    }>;
    assert.equal(hook!.clientConfig.service.namespace, 'platform');
    assert.deepEqual(
      hook!.namespaceSelector.matchExpressions[0]!.values,
      ['kube-system', 'kube-public', 'kube-node-lease', 'platform'],
      'never its own namespace',
    );
  });

  it('puts every value where it belongs, as environment the injector reads', async () => {
    const objects = await renderChart(EVERY_OPTION);
    const spec = podSpec(objects);
    const container = spec.containers[0]!;
    assert.equal(container.image, 'registry.example/certshare:0.2.0');
    assert.equal(container.imagePullPolicy, 'IfNotPresent');
    assert.equal((find(objects, 'Deployment')!.spec as { replicas: number }).replicas, 3);
    assert.deepEqual(container.resources, EVERY_OPTION.resources);
    assert.equal(spec.priorityClassName, 'system-cluster-critical');
    assert.equal(find(objects, 'PriorityClass'), undefined, 'an existing class: none created');
    assert.deepEqual(spec.nodeSelector, EVERY_OPTION.nodeSelector);
    assert.deepEqual(spec.tolerations, EVERY_OPTION.tolerations);
    const env = Object.fromEntries(container.env.filter((e) => e.value !== undefined).map((e) => [e.name, e.value!]));
    const flags = parseFlags(INJECTOR_FLAGS, [], env);
    assert.equal(flags['sidecar-image'], 'registry.example/certshare-sidecar:0.2.0');
    assert.equal(flags['sidecar-image-pull-policy'], 'Always');
    assert.equal(flags['sidecar-flags'], '--issuance-budget=20/168h --acme-directory=https://acme.example.internal/directory');
    assert.equal(flags['sidecar-ca-configmap'], 'acme-ca:root.pem');
    // As the injector reads them when it starts: every value it would refuse, the schema refuses first.
    assert.deepEqual(injectorConfigFrom(flags, {}).defaults.caBundle, { configMap: 'acme-ca', key: 'root.pem' });
    assert.deepEqual(injectorConfigFrom(flags, {}).defaults.resources, { requests: { cpu: '100m', memory: '160Mi' }, limits: { memory: '256Mi' } });
    assert.equal(flags['log-level'], 'debug');
    assert.equal(flags['leaf-lifetime'], '480h');
    for (const o of objects) assert.equal(o.metadata.labels?.release, 'prometheus', `${o.kind} ${o.metadata.name} carries commonLabels`);
    assert.ok(find(objects, 'PodMonitor') && find(objects, 'PrometheusRule'));
    const policy = find(objects, 'NetworkPolicy')!.spec as { ingress: Array<{ from: Array<Record<string, unknown>> }> };
    assert.deepEqual(policy.ingress[0]!.from, [{ ipBlock: { cidr: '192.0.2.0/24' } }, { ipBlock: { cidr: '2001:db8::/64' } }]);
    assert.deepEqual(policy.ingress[1]!.from, [{ namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'monitoring' } } }]);

    const single = await renderChart({ replicas: 1 });
    assert.equal(find(single, 'PodDisruptionBudget'), undefined, 'minAvailable 1 of 1 replica would block every drain');
  });

  it('refuses values the chart cannot honour, naming them', async () => {
    const refused: Array<[Record<string, unknown>, RegExp]> = [
      [{ replica: 2 }, /additional properties 'replica' not allowed/],
      [{ replicas: 0 }, /\/replicas': minimum/],
      [{ 'image.pullPolicy': 'Sometimes' }, /\/image\/pullPolicy'/],
      [{ 'injectorFlags.lease': 'mine' }, /\/injectorFlags': additional properties 'lease' not allowed/],
      [{ 'injectorFlags.log-level': '' }, /\/injectorFlags\/log-level': minLength/],
      [{ 'priorityClass.name': '' }, /\/priorityClass\/name': minLength/],
      [{ 'networkPolicy.enabled': true }, /\/networkPolicy\/apiserverCIDRs': minItems/],
      [{ 'networkPolicy.enabled': true, 'networkPolicy.apiserverCIDRs': ['the apiserver'] }, /\/networkPolicy\/apiserverCIDRs\/0'/],
      [{ 'commonLabels.team': 7 }, /\/commonLabels\/team'/],
      // What the injector would refuse at start: a quantity the apiserver does not read, a resource it does not set.
      [{ 'sidecar.resources.limits.memory': '256 MB' }, /\/sidecar\/resources\/limits\/memory'/],
      [{ 'sidecar.resources.requests.nvidia.com/gpu': '1' }, /\/sidecar\/resources\/requests'/],
    ];
    for (const [values, message] of refused) {
      const sets = Object.entries(values).flatMap(([k, v]) => ['--set-json', `${k}=${JSON.stringify(v)}`]);
      const r = await helm(['template', 'certshare', CHART, ...sets]);
      assert.notEqual(r.code, 0, `${JSON.stringify(values)} is refused`);
      assert.match(r.stderr, message, JSON.stringify(values));
    }
  });

  it('sidecar.caConfigMap: the schema refuses what the injector would refuse when it starts (failing the opted-in Pods), passes the rest', async () => {
    const caBundle = (value: string) => injectorConfigFrom(parseFlags(INJECTOR_FLAGS, [], { CERTSHARE_SIDECAR_CA_CONFIGMAP: value }), {}).defaults.caBundle;
    for (const value of ['Acme-CA', 'acme_ca', '-acme', 'acme:', 'acme:../root.pem', 'acme:..root', 'acme:.', 'acme:a/b', 'acme:a:b']) {
      assert.throws(() => caBundle(value), { code: 'CERTSHARE_BAD_FLAG' }, value);
      const r = await helm(['template', 'certshare', CHART, '--set-json', `sidecar.caConfigMap=${JSON.stringify(value)}`]);
      assert.notEqual(r.code, 0, `${value} is refused`);
      assert.match(r.stderr, /\/sidecar\/caConfigMap'/, value);
    }
    for (const value of ['acme-ca', 'trust.example.com:bundle.pem', 'acme-ca:.root.pem', 'acme-ca:Root_CA-2.crt']) {
      const env = podSpec(await renderChart({ 'sidecar.caConfigMap': value })).containers[0]!.env;
      const set = env.find((e) => e.name === 'CERTSHARE_SIDECAR_CA_CONFIGMAP')?.value;
      assert.equal(set, value);
      assert.ok(caBundle(set), value);
    }
  });

  it("sidecar.tailscaleOperator: grant (the injector's default, nothing rendered) or manual, which the injector reads; nothing else", async () => {
    const operator = async (value?: string) => {
      const env = podSpec(await renderChart(value === undefined ? {} : { 'sidecar.tailscaleOperator': value })).containers[0]!.env;
      const set = env.find((e) => e.name === 'CERTSHARE_TAILSCALE_OPERATOR')?.value;
      return injectorConfigFrom(parseFlags(INJECTOR_FLAGS, [], set === undefined ? {} : { CERTSHARE_TAILSCALE_OPERATOR: set }), {}).defaults
        .grantTailscaleOperator;
    };
    assert.equal(await operator(), true);
    assert.equal(await operator('grant'), true);
    assert.equal(await operator('manual'), false);
    const r = await helm(['template', 'certshare', CHART, '--set', 'sidecar.tailscaleOperator=always']);
    assert.notEqual(r.code, 0);
    assert.match(r.stderr, /\/sidecar\/tailscaleOperator'/);
  });

  it('lets injectorFlags name every injector flag but those the chart wires itself', async () => {
    const schema = JSON.parse(await readFile(join(CHART, 'values.schema.json'), 'utf8')) as {
      properties: { injectorFlags: { properties: Record<string, unknown>; additionalProperties: boolean } };
    };
    const names: string[] = INJECTOR_FLAGS.map((f) => f.name);
    for (const wired of WIRED_FLAGS) assert.ok(names.includes(wired), `${wired} is an injector flag`);
    assert.equal(schema.properties.injectorFlags.additionalProperties, false);
    assert.deepEqual(Object.keys(schema.properties.injectorFlags.properties).sort(), names.filter((n) => !WIRED_FLAGS.includes(n)).sort());
  });

  it('docs/install.md names every value', async () => {
    const values = load(await readFile(join(CHART, 'values.yaml'), 'utf8')) as Record<string, unknown>;
    const page = await readFile(join(REPO, 'docs', 'install.md'), 'utf8');
    for (const key of Object.keys(values)) assert.match(page, new RegExp(`\`${key}[\`.]`), key);
  });

  it("defaults to the image of its appVersion: the package's version, the injector's default sidecar image", async () => {
    const chart = load(await readFile(join(CHART, 'Chart.yaml'), 'utf8')) as { version: string; appVersion: string };
    const pkg = JSON.parse(await readFile(join(REPO, 'package.json'), 'utf8')) as { version: string };
    assert.equal(chart.appVersion, pkg.version);
    const container = podSpec(await renderChart()).containers[0]!;
    assert.equal(container.image, DEFAULT_IMAGE);
    assert.equal(container.env.find((e) => e.name === 'CERTSHARE_SIDECAR_IMAGE')?.value, DEFAULT_IMAGE);
  });
});
