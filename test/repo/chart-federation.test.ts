// charts/certshare's federation values (docs/federation.md): federationHome renders exactly manifests/federation
// (kustomize) for the same group, and sidecar.homeKubeconfigSecret reaches the injector as its flag.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { parseFlags } from '../../src/flags/flags.ts';
import { INJECTOR_FLAGS, injectorConfigFrom } from '../../src/injector/injector.ts';
import { applied, CHART, helm, kustomize, REPO, renderChart, type KubeObject } from '../support/helm.ts';

const FEDERATION = join(REPO, 'manifests/federation');
const key = (o: KubeObject): string => `${o.kind}/${o.metadata.name}`;
/** What Helm adds for an uninstall to keep: the rest is the manifests' own. */
type Annotated = KubeObject & { metadata: { annotations?: Record<string, string> } };
const annotationsOf = (o: KubeObject): Record<string, string> => (o as Annotated).metadata.annotations ?? {};
const withoutKeep = (o: KubeObject): KubeObject => {
  const { 'helm.sh/resource-policy': _keep, ...annotations } = annotationsOf(o);
  const { annotations: _all, ...metadata } = (o as Annotated).metadata;
  return { ...o, metadata: Object.keys(annotations).length > 0 ? ({ ...metadata, annotations } as KubeObject['metadata']) : metadata };
};

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
});
