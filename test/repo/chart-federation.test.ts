// charts/certshare's federation values (docs/federation.md): federationHome renders exactly manifests/federation
// (kustomize) for the same group, sidecar.homeKubeconfigSecret reaches the injector as its flag, and the member
// side's kustomize overlay (manifests/federation-member) renders what the chart does with those values.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { parseFlags } from '../../src/flags/flags.ts';
import { INJECTOR_FLAGS, injectorConfigFrom } from '../../src/config/injector-options.ts';
import { checkDefaults } from '../../src/injector/injector.ts';
import { annotationsOf, applied, CHART, helm, kustomize, REPO, renderChart, MANIFESTS, withoutKeep, type KubeObject } from '../support/helm.ts';

const FEDERATION = join(REPO, 'manifests/federation');
const MEMBER = join(REPO, 'manifests/federation-member');
const key = (o: KubeObject): string => `${o.kind}/${o.metadata.name}`;

type Env = Array<{ name: string; value?: string }>;
type WithContainers = KubeObject & { spec: { template: { spec: { containers: Array<{ env: Env }> } } } };
const injectorEnv = (objects: KubeObject[]): Env => (objects.find((o) => o.kind === 'Deployment') as WithContainers).spec.template.spec.containers[0]!.env;
const envValues = (env: Env): Record<string, string> => Object.fromEntries(env.filter((e) => e.value !== undefined).map((e) => [e.name, e.value!]));
/**
 * The objects with the injector's environment in name order: a strategic merge patch puts the variables it
 * adds first, the chart beside the others; no variable refers to another ($(NAME)), so the order means nothing.
 */
const envSorted = (objects: KubeObject[]): KubeObject[] =>
  objects.map((o) => {
    if (o.kind !== 'Deployment') return o;
    const d = structuredClone(o) as WithContainers;
    for (const c of d.spec.template.spec.containers) c.env.sort((a, b) => a.name.localeCompare(b.name));
    return d;
  });

describe('charts/certshare: the federation', () => {
  it('federationHome.groups renders exactly the objects of manifests/federation for the same group', async () => {
    const plain = new Set((await renderChart()).map(key));
    const rendered = await renderChart({ 'federationHome.groups': [{ name: 'proxy', domains: ['proxy.tailnet-0000.ts.net'] }] });
    const added = rendered.filter((o) => !plain.has(key(o)));
    const kept = added.filter((o) => annotationsOf(o)['helm.sh/resource-policy'] === 'keep').map(key);
    assert.deepEqual(
      kept.sort(),
      ['ConfigMap/certshare-proxy-ledger', 'Secret/proxy.tailnet-0000.ts.net'],
      'the Secret of record and the ledger outlive an uninstall',
    );
    assert.deepEqual(applied(added.map(withoutKeep)), applied(await kustomize(FEDERATION)));
  });

  it('sidecar.homeKubeconfigSecret is the injector flag --sidecar-home-kubeconfig-secret; the schema refuses what is no Secret name', async () => {
    const objects = await renderChart({
      'sidecar.homeKubeconfigSecret': 'certshare-home',
      'sidecar.flags': '--federation-namespace=certshare-home --federation-cluster=east',
    });
    const deployment = objects.find((o) => o.kind === 'Deployment')!;
    const container = (deployment.spec as { template: { spec: { containers: Array<{ env: Array<{ name: string; value?: string }> }> } } }).template.spec
      .containers[0]!;
    const env = Object.fromEntries(container.env.filter((e) => e.value !== undefined).map((e) => [e.name, e.value!]));
    assert.equal(injectorConfigFrom(parseFlags(INJECTOR_FLAGS, [], env), {}).defaults.homeKubeconfigSecret, 'certshare-home');
    for (const value of ['Home', 'home_kc', '-home']) {
      const r = await helm(['template', 'certshare', CHART, '--set-json', `sidecar.homeKubeconfigSecret=${JSON.stringify(value)}`]);
      assert.notEqual(r.code, 0, value);
      assert.match(r.stderr, /\/sidecar\/homeKubeconfigSecret'/, value);
    }
    const r = await helm(['template', 'certshare', CHART, '--set-json', 'federationHome.groups=[{"name":"Proxy","domains":[]}]']);
    assert.notEqual(r.code, 0);
    assert.match(r.stderr, /federationHome\/groups\/0/);
  });

  it('manifests/federation-member is manifests/injector with the home kubeconfig Secret and the federation flags, as the chart renders them', async () => {
    const member = await kustomize(MEMBER);
    const env = envValues(injectorEnv(member));
    const flags = parseFlags(INJECTOR_FLAGS, [], env);
    // The injector starts with them: the flag needs both federation flags in --sidecar-flags, and the
    // sidecar flags pass the daemon's own checks (checkDefaults refuses what every Pod would refuse).
    const config = injectorConfigFrom(flags, {});
    checkDefaults(config.defaults);
    assert.equal(config.defaults.homeKubeconfigSecret, 'certshare-home');
    assert.match(config.defaults.sidecarFlags ?? '', /(^| )--federation-namespace=certshare-home( |$)/);
    assert.match(config.defaults.sidecarFlags ?? '', /(^| )--federation-cluster=this-cluster( |$)/);
    // Nothing else changes: the base's variables are all there, with their values.
    const base = envValues(injectorEnv(await kustomize(MANIFESTS)));
    assert.deepEqual(env, { ...base, CERTSHARE_SIDECAR_HOME_KUBECONFIG_SECRET: 'certshare-home', CERTSHARE_SIDECAR_FLAGS: flags['sidecar-flags'] });
    // The chart with the same values renders the same objects.
    const chart = await renderChart({ 'sidecar.homeKubeconfigSecret': config.defaults.homeKubeconfigSecret, 'sidecar.flags': flags['sidecar-flags'] });
    assert.deepEqual(applied(envSorted(chart)), applied(envSorted(member)));
  });
});
