// manifests/injector against the injector's own flags: names the Deployment, the RBAC and the webhook
// configuration must agree on (the real-apiserver test, webhook.test.ts, applies and runs them).
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { loadAll } from 'js-yaml';
import { envName, findFlag } from '../../../src/flags/flags.ts';
import { INJECTOR_FLAGS } from '../../../src/config/injector-options.ts';
import { SIDECAR_FORM_BOUNDS, SIDECAR_FORM_CONFIGMAP } from '../../../src/injector/sidecar-form.ts';
import { parseTarget } from '../../../src/core/injector-ca/ca-targets.ts';
import { RUNTIME_VARIABLES } from '../../support/injector-deployment.ts';

const DIR = fileURLToPath(new URL('../../../manifests/injector', import.meta.url));

interface Doc {
  kind: string;
  metadata: { name: string };
  [key: string]: unknown;
}

async function docs(file: string): Promise<Doc[]> {
  return loadAll(await readFile(join(DIR, file), 'utf8')) as Doc[];
}

const flagDefault = (name: string): string => findFlag(INJECTOR_FLAGS, name)!.default!;

describe('manifests/injector', () => {
  it('the Deployment runs two replicas with only environment variables the injector reads', async () => {
    const [deployment, pdb, service] = await docs('deployment.yaml');
    const spec = deployment!.spec as {
      replicas: number;
      template: {
        spec: { serviceAccountName: string; containers: { args: string[]; env: { name: string; value?: string }[]; ports: { containerPort: number }[] }[] };
      };
    };
    assert.equal(spec.replicas, 2);
    assert.equal(pdb!.kind, 'PodDisruptionBudget');
    assert.equal(service!.metadata.name, flagDefault('service'));
    const container = spec.template.spec.containers[0]!;
    assert.deepEqual(container.args, ['injector']);
    // The runtime's own (Node's heap bound, glibc's allocator): the flood test and the bench run the injector with them.
    const known = new Set([...INJECTOR_FLAGS.map((f) => envName(f.name)), 'POD_NAMESPACE', 'POD_NAME', ...RUNTIME_VARIABLES]);
    for (const e of container.env) assert.ok(known.has(e.name), `${e.name} is not read by certshare injector`);
    assert.deepEqual(
      container.ports.map((p) => p.containerPort),
      [Number(flagDefault('listen').split(':').pop()), Number(flagDefault('metrics-listen').split(':').pop())],
    );
  });

  it('RBAC names exactly the Secrets, the Lease and the webhook configuration the injector uses by default', async () => {
    const rbac = await docs('rbac.yaml');
    type Rules = { rules: { resources: string[]; resourceNames?: string[]; verbs: string[] }[] };
    const role = rbac.find((d) => d.kind === 'Role') as unknown as Rules;
    const named = (resource: string) => role.rules.find((r) => r.resources.includes(resource) && r.resourceNames)!.resourceNames!.sort();
    assert.deepEqual(named('secrets'), [flagDefault('ca-secret'), flagDefault('tls-secret')].sort());
    assert.deepEqual(named('leases'), [flagDefault('lease')]);
    assert.deepEqual(named('configmaps'), [SIDECAR_FORM_CONFIGMAP]);
    const clusterRole = rbac.find((d) => d.kind === 'ClusterRole') as unknown as Rules;
    const target = parseTarget(flagDefault('inject-ca-into'));
    assert.deepEqual(clusterRole.rules, [
      {
        apiGroups: ['admissionregistration.k8s.io'],
        resources: ['mutatingwebhookconfigurations'],
        resourceNames: [target.name],
        verbs: ['get', 'list', 'watch', 'update'],
      },
    ]);
  });

  it("the caBundle-only policy covers the injector's account: the label it carries, in the namespace the kustomization sets", async () => {
    const [kustomization] = await docs('kustomization.yaml');
    assert.ok(((kustomization as unknown as { resources: string[] }).resources ?? []).includes('admission-policy.yaml'));
    const namespace = (kustomization as unknown as { namespace: string }).namespace;
    const account = (await docs('rbac.yaml')).find((d) => d.kind === 'ServiceAccount') as Doc & { metadata: { labels?: Record<string, string> } };
    const policyDocs = await docs('admission-policy.yaml');
    const bindings = policyDocs.filter(
      (d) => d.kind === 'ValidatingAdmissionPolicyBinding' && d.metadata.name.startsWith('certshare-injector-'),
    ) as unknown as Array<{
      spec: { policyName: string; paramRef: { namespace: string; selector: { matchLabels: Record<string, string> }; parameterNotFoundAction: string } };
    }>;
    // The caBundle-only policy and the one on its creates (certshare-injector-creates-own-objects).
    assert.deepEqual(
      bindings.map((b) => b.spec.policyName),
      ['certshare-injector-cabundle-only', 'certshare-injector-creates-own-objects'],
    );
    for (const { spec } of bindings) {
      const { paramRef } = spec;
      assert.equal(paramRef.namespace, namespace, `${spec.policyName}: paramRef.namespace follows the kustomization namespace: change both`);
      for (const [key, value] of Object.entries(paramRef.selector.matchLabels))
        assert.equal(account.metadata.labels?.[key], value, `${spec.policyName}: ${key}=${value}`);
    }
    const policy = policyDocs.find((d) => d.kind === 'ValidatingAdmissionPolicy') as unknown as {
      spec: { matchConstraints: { resourceRules: Array<{ resources: string[]; operations: string[] }> } };
    };
    const covered = policy.spec.matchConstraints.resourceRules.flatMap((r) => r.resources);
    // Every kind --inject-ca-into accepts (src/injector/targets.ts) is held to its caBundle.
    for (const kind of ['mwc', 'vwc', 'crd', 'apiservice'])
      assert.ok(
        covered.some((plural) => plural.startsWith(parseTarget(`${kind}/x`).kind)),
        `${kind} is covered`,
      );
  });

  it('the opt-in NetworkPolicy selects the injector Pods and admits the webhook port from one address range, metrics from one namespace', async () => {
    const [deployment] = await docs('deployment.yaml');
    const template = (
      deployment!.spec as { template: { metadata: { labels: Record<string, string> }; spec: { containers: { ports: { containerPort: number }[] }[] } } }
    ).template;
    const [policy] = await docs('network-policy/networkpolicy.yaml');
    const spec = policy!.spec as {
      podSelector: { matchLabels: Record<string, string> };
      policyTypes: string[];
      ingress: Array<{ from: Array<Record<string, unknown>>; ports: Array<{ port: number }> }>;
    };
    for (const [key, value] of Object.entries(spec.podSelector.matchLabels)) assert.equal(template.metadata.labels[key], value);
    assert.deepEqual(spec.policyTypes, ['Ingress'], 'ingress only: the injector reaches the apiserver, and nothing else needs fencing');
    const ports = template.spec.containers[0]!.ports.map((p) => p.containerPort);
    assert.deepEqual(
      spec.ingress.flatMap((rule) => rule.ports.map((p) => p.port)).sort(),
      [...ports].sort(),
      'the two ports the injector serves, nothing else',
    );
    const webhook = spec.ingress.find((rule) => rule.ports.some((p) => p.port === Number(flagDefault('listen').split(':').pop())))!;
    assert.deepEqual(
      webhook.from.map((peer) => Object.keys(peer)),
      [['ipBlock']],
      'the webhook port from an address range only (the apiserver), no Pod or namespace selector',
    );
    const [kustomization] = await docs('network-policy/kustomization.yaml');
    assert.equal(
      (kustomization as unknown as { namespace: string }).namespace,
      ((await docs('kustomization.yaml'))[0] as unknown as { namespace: string }).namespace,
    );
  });

  it('the webhook fails closed, selects neither kube-system nor the injector namespace, and no Pod label keeps a Pod from it', async () => {
    const [mwc] = await docs('webhook.yaml');
    assert.equal(mwc!.metadata.name, parseTarget(flagDefault('inject-ca-into')).name);
    const [hook] = mwc!.webhooks as {
      failurePolicy: string;
      reinvocationPolicy: string;
      clientConfig: { caBundle?: string; service: { name: string } };
      namespaceSelector: { matchExpressions: { values: string[] }[] };
      objectSelector?: unknown;
    }[];
    assert.equal(hook!.failurePolicy, 'Fail');
    assert.equal(hook!.reinvocationPolicy, 'IfNeeded');
    assert.equal(hook!.clientConfig.caBundle, undefined, 'the injector writes the caBundle');
    assert.equal(hook!.clientConfig.service.name, flagDefault('service'));
    for (const ns of ['kube-system', 'certshare']) assert.ok(hook!.namespaceSelector.matchExpressions[0]!.values.includes(ns));
    // A label is the Pod author's: the injector's own Pods are kept out by their namespace alone.
    assert.equal(hook!.objectSelector, undefined);
  });

  it("the sidecar's form policy reads the ConfigMap the injector writes, in its namespace, and refuses where it is missing", async () => {
    const [kustomization] = await docs('kustomization.yaml');
    const namespace = (kustomization as unknown as { namespace: string }).namespace;
    const binding = (await docs('admission-policy.yaml')).find(
      (d) => d.kind === 'ValidatingAdmissionPolicyBinding' && d.metadata.name === 'certshare-sidecar-as-injected',
    ) as unknown as { spec: { paramRef: { namespace: string; name: string; parameterNotFoundAction: string } } };
    assert.deepEqual(binding.spec.paramRef, { namespace, name: SIDECAR_FORM_CONFIGMAP, parameterNotFoundAction: 'Deny' });
  });

  it("bounds the sidecar's form where the injector writes it and where the policy reads it, as the injector's own", async () => {
    const text = JSON.stringify(await docs('admission-policy.yaml'));
    const bounds = `size() <= ${SIDECAR_FORM_BOUNDS.keys} && `;
    const value = `].size() <= ${SIDECAR_FORM_BOUNDS.valueChars}`;
    // certshare-injector-creates-own-objects (what the account writes) and certshare-sidecar-as-injected (what it reads).
    assert.equal(text.split(bounds).length - 1, 2, `both policies bound the keys at ${SIDECAR_FORM_BOUNDS.keys}`);
    assert.equal(text.split(value).length - 1, 2, `both policies bound a value at ${SIDECAR_FORM_BOUNDS.valueChars}`);
  });
});
