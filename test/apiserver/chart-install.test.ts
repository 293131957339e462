// `helm install` of charts/certshare against the real kube-apiserver (the README's line): the objects it
// creates are manifests/injector's as kustomize builds them, its admission policy holds the injector's own
// token to the caBundle, `helm upgrade` applies new values and `helm uninstall` leaves nothing behind.
// (No kubelet here: the injector's Pods are not run; test/apiserver/injector/webhook.test.ts runs the injector itself.)
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { before, describe, it } from 'node:test';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { dryRunWebhookUpdate, must, refusedWebhookUpdate } from '../support/kube.ts';
import {
  applied,
  CHART,
  helm,
  kustomize,
  MANIFESTS,
  NAMESPACE,
  objectsOf,
  README_HELM_INSTALL,
  readmeHelmInstallArgs,
  REPO,
  type KubeObject,
} from '../support/helm.ts';

const cp = useControlPlane();
const RELEASE = 'certshare';
const WEBHOOK = 'certshare-injector';

/** `kind.version.group`, as kubectl names a resource without ambiguity. */
const resourceOf = (o: KubeObject): string => {
  const [group, version] = o.apiVersion.includes('/') ? o.apiVersion.split('/') : ['', o.apiVersion];
  return group ? `${o.kind}.${version}.${group}` : o.kind;
};

/**
 * An object as stored, less what the apiserver and helm keep for themselves: identity and history (uid,
 * resourceVersion, managedFields...), status, allocations, and helm's label and annotations.
 */
function declared({ metadata, status: _status, ...fields }: KubeObject & { status?: unknown }): unknown {
  const { name, namespace, labels = {}, annotations = {} } = metadata as KubeObject['metadata'] & { annotations?: Record<string, string> };
  const { 'app.kubernetes.io/managed-by': _helm, ...ownLabels } = labels;
  const ownAnnotations = Object.fromEntries(Object.entries(annotations).filter(([key]) => !key.startsWith('meta.helm.sh/')));
  // A Service's cluster IP is the apiserver's allocation, another at each create.
  const spec = fields.kind === 'Service' ? { ...(fields.spec as object), clusterIP: undefined, clusterIPs: undefined } : fields.spec;
  return { ...fields, spec, metadata: { name, namespace, labels: ownLabels, annotations: ownAnnotations } };
}

describe('helm install charts/certshare on the real apiserver', () => {
  let kubeconfig: string;
  let expected: KubeObject[];
  const release = (args: string[]) => helm([...args, '--namespace', NAMESPACE, '--kubeconfig', cp().adminKubeconfigPath]);
  const get = (o: KubeObject) => cp().kubectl(['get', resourceOf(o), o.metadata.name, '-n', NAMESPACE, '-o', 'json']);

  before(async () => {
    // manifests/injector as the apiserver would store it (a server-side dry run, defaults filled in), in
    // the namespace the README creates for it.
    await must(cp().kubectl(['create', 'namespace', NAMESPACE]));
    const objects = applied(await kustomize(MANIFESTS));
    const dryRun = await must(
      cp().kubectl(['create', '--dry-run=server', '-o', 'yaml', '-f', '-'], { input: JSON.stringify({ kind: 'List', apiVersion: 'v1', items: objects }) }),
    );
    expected = applied(objectsOf(dryRun));
    assert.deepEqual(
      expected.map((o) => o.kind),
      objects.map((o) => o.kind),
    );
    // The README's line, as a user runs it from the clone.
    const readme = await readFile(join(REPO, 'README.md'), 'utf8');
    assert.ok(readme.includes(README_HELM_INSTALL), `the README shows: ${README_HELM_INSTALL}`);
    const installed = await helm([...readmeHelmInstallArgs(), '--kubeconfig', cp().adminKubeconfigPath]);
    assert.equal(installed.code, 0, installed.stderr);
    kubeconfig = await cp().kubeconfigFor(NAMESPACE, 'certshare-injector');
  });

  it('creates every object of manifests/injector as kustomize makes it', async () => {
    for (const o of expected) {
      const stored = JSON.parse(await must(get(o))) as KubeObject;
      assert.deepEqual(declared(stored), declared(o), `${o.kind} ${o.metadata.name}`);
      assert.equal(stored.metadata.labels?.['app.kubernetes.io/managed-by'], 'Helm', "helm's own label, added at install");
    }
    const manifest = await release(['get', 'manifest', RELEASE]);
    assert.equal(manifest.code, 0, manifest.stderr);
    assert.equal(manifest.stdout.match(/^kind: /gm)?.length, expected.length, 'the release holds these objects and no more');
  });

  it("holds the injector's own token to the webhook's caBundle (the policy's binding follows the release namespace)", async () => {
    type Configuration = { webhooks: Array<{ namespaceSelector?: unknown; clientConfig: { caBundle?: string } }> };
    const widen = (c: Configuration) => {
      c.webhooks[0]!.namespaceSelector = {};
    };
    const refusal = await refusedWebhookUpdate(cp(), kubeconfig, WEBHOOK, widen);
    assert.match(refusal, /certshare-injector-cabundle-only.*the injector may change the webhooks' clientConfig\.caBundle only/);
    const caBundle = Buffer.from(cp().caPem).toString('base64');
    const setCaBundle = (c: Configuration) => {
      c.webhooks[0]!.clientConfig.caBundle = caBundle;
    };
    assert.equal(await dryRunWebhookUpdate(cp(), kubeconfig, WEBHOOK, setCaBundle), 'allowed', 'the caBundle itself');
  });

  it('helm upgrade applies new values to the installed objects', async () => {
    const upgraded = await release(['upgrade', RELEASE, CHART, '--reuse-values', '--set', 'replicas=3', '--set', 'injectorFlags.log-level=debug']);
    assert.equal(upgraded.code, 0, upgraded.stderr);
    const deployment = JSON.parse(await must(cp().kubectl(['get', 'deployment', 'certshare-injector', '-n', NAMESPACE, '-o', 'json']))) as {
      spec: { replicas: number; template: { spec: { containers: Array<{ env: Array<{ name: string; value?: string }> }> } } };
    };
    assert.equal(deployment.spec.replicas, 3);
    assert.ok(deployment.spec.template.spec.containers[0]!.env.some((e) => e.name === 'CERTSHARE_LOG_LEVEL' && e.value === 'debug'));
  });

  it('helm uninstall removes every object, the cluster-scoped ones too', async () => {
    const uninstalled = await release(['uninstall', RELEASE]);
    assert.equal(uninstalled.code, 0, uninstalled.stderr);
    for (const o of expected) {
      const r = await get(o);
      assert.equal(r.code, 1, `${o.kind} ${o.metadata.name} is gone`);
      assert.match(r.stderr, /NotFound/);
    }
    assert.equal((await release(['list', '--short'])).stdout.trim(), '', 'no release left');
  });
});
