// What a stolen injector token can create, against the real apiserver: RBAC lets the injector's account create
// any Secret and any Lease of its namespace (create cannot be limited by name), and the admission policy
// certshare-injector-creates-own-objects narrows that to its own four objects (and ConfigMaps to its one), none of its
// Secrets or its ConfigMap ever immutable. Its real token (TokenRequest), real creates; the same for the chart,
// installed in another namespace (its binding follows the release's).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { applied, MANIFESTS, renderChart } from '../support/helm.ts';
import { must } from '../support/kube.ts';

const cp = useControlPlane();
const POLICY = 'certshare-injector-creates-own-objects';
const b64 = (text: string) => Buffer.from(text).toString('base64');

const secret = (name: string, type: string, extra: Record<string, unknown> = {}) => ({
  apiVersion: 'v1',
  kind: 'Secret',
  metadata: { name, ...extra },
  type,
  data: type === 'kubernetes.io/tls' ? { 'tls.crt': b64('crt'), 'tls.key': b64('key') } : { probe: b64('x') },
});
const configMap = (name: string) => ({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name }, data: { image: 'attacker.example/certshare:1' } });
/** What a stolen injector token writes to make every Pod creation of the opted-in namespaces costly: 10,000 keys, 1 MB. */
const floodedForm = () => ({
  ...configMap('certshare-injector-sidecar'),
  data: { image: 'attacker.example/certshare:1', ...Object.fromEntries(Array.from({ length: 10_000 }, (_, i) => [`junk${i}`, 'x'.repeat(80)])) },
});
const lease = (name: string) => ({ apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name }, spec: { holderIdentity: 'probe' } });
/** The object the attack wants: a token Secret for another account, which the token controller fills and never expires. */
const tokenSecret = (name: string) => secret(name, 'kubernetes.io/service-account-token', { annotations: { 'kubernetes.io/service-account.name': 'default' } });

/** A create under `kubeconfig` (a real one, or `--dry-run=server`): 'created' or the apiserver's refusal. */
async function create(kubeconfig: string, ns: string, object: object, dryRun = false): Promise<string> {
  const r = await cp().kubectl(['create', '-n', ns, '-f', '-', ...(dryRun ? ['--dry-run=server'] : [])], { kubeconfig, input: JSON.stringify(object) });
  return r.code === 0 ? 'created' : r.stderr.trim();
}

/** An unconditional update under `kubeconfig`, a server-side dry run: 'updated' or the apiserver's refusal. */
async function updateDryRun(kubeconfig: string, ns: string, object: object): Promise<string> {
  const r = await cp().kubectl(['replace', '-n', ns, '-f', '-', '--dry-run=server'], { kubeconfig, input: JSON.stringify(object) });
  return r.code === 0 ? 'updated' : r.stderr.trim();
}

/** The apiserver loads a new policy and its parameters through informers, a moment after they are created. */
async function policyInEffect(kubeconfig: string, ns: string): Promise<void> {
  const deadline = performance.now() + 30_000;
  while ((await create(kubeconfig, ns, tokenSecret('probe-in-effect'), true)) === 'created') {
    assert.ok(performance.now() < deadline, `${POLICY} never took effect`);
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}

async function checkCreates(ns: string): Promise<void> {
  const kubeconfig = await cp().kubeconfigFor(ns, 'certshare-injector');
  await policyInEffect(kubeconfig, ns);
  // Its own three objects, as the controller and the Lease elector create them.
  assert.equal(await create(kubeconfig, ns, secret('certshare-injector-ca', 'Opaque')), 'created', 'its CA Secret');
  assert.equal(await create(kubeconfig, ns, secret('certshare-injector-tls', 'kubernetes.io/tls')), 'created', 'its serving Secret');
  assert.equal(await create(kubeconfig, ns, lease('certshare-injector')), 'created', 'its Lease');
  assert.equal(await create(kubeconfig, ns, configMap('certshare-injector-sidecar')), 'created', "its sidecar's form");
  const refused: Array<[string, object, RegExp]> = [
    ['a service-account-token Secret', tokenSecret('stolen-token'), /its own Secrets/],
    ['a service-account-token Secret under its own name', tokenSecret('certshare-injector-ca'), /its own Secrets/],
    ['a Secret of another name', secret('certshare-injector-other', 'Opaque'), /its own Secrets/],
    ['a Secret of another name, its serving type', secret('some-tls', 'kubernetes.io/tls'), /its own Secrets/],
    ['its serving Secret of another type', secret('certshare-injector-tls', 'Opaque'), /its own Secrets/],
    ['its CA Secret of another type', secret('certshare-injector-ca', 'kubernetes.io/tls'), /its own Secrets/],
    ['a Lease of another name', lease('certshare-proxy'), /its own Lease/],
    ['a ConfigMap of another name', configMap('certshare-proxy-ledger'), /its own ConfigMap/],
    ['its serving Secret, immutable', { ...secret('certshare-injector-tls', 'kubernetes.io/tls'), immutable: true }, /never makes its Secrets/],
    ["its sidecar's form, immutable", { ...configMap('certshare-injector-sidecar'), immutable: true }, /never makes its Secrets/],
    ["its sidecar's form, 10,000 keys", floodedForm(), /at most 128 keys/],
    ["its sidecar's form, a value of 8193 characters", { ...configMap('certshare-injector-sidecar'), data: { image: 'x'.repeat(8193) } }, /at most 128 keys/],
    ["its sidecar's form, with binaryData", { ...configMap('certshare-injector-sidecar'), binaryData: { blob: b64('x') } }, /no binaryData/],
  ];
  for (const [what, object, message] of refused) {
    // Its own names exist by now: dry runs, so the refusal is the policy's, not AlreadyExists.
    const answer = await create(kubeconfig, ns, object, true);
    assert.match(answer, new RegExp(`${POLICY}.*denied`), what);
    assert.match(answer, message, what);
  }
  // Made immutable by an update (on 3d853d5 admitted): the injector could never rotate its serving certificate (the
  // webhook's, so every Pod of the opted-in namespaces refused once it expires) nor record its sidecar's form again.
  for (const object of [
    secret('certshare-injector-ca', 'Opaque'),
    secret('certshare-injector-tls', 'kubernetes.io/tls'),
    configMap('certshare-injector-sidecar'),
  ]) {
    const answer = await updateDryRun(kubeconfig, ns, { ...object, immutable: true });
    assert.match(answer, new RegExp(`${POLICY}.*denied.*never makes its Secrets`), object.metadata.name);
  }
  assert.equal(await updateDryRun(kubeconfig, ns, secret('certshare-injector-tls', 'kubernetes.io/tls')), 'updated', 'its serving Secret, rotated');
  // Read by certshare-sidecar-as-injected at every Pod creation of the opted-in namespaces: on d7d4d70 this update was
  // admitted, and each Pod creation then cost the apiserver seconds of CPU (docs/security.md).
  assert.match(await updateDryRun(kubeconfig, ns, floodedForm()), new RegExp(`${POLICY}.*denied.*at most 128 keys`), "its sidecar's form, flooded");
  // The rest of the namespace's users are not this policy's business: the administrator still creates a token Secret.
  assert.equal(await create(cp().adminKubeconfigPath, ns, tokenSecret('admin-token'), true), 'created');
}

describe("the injector's account creates only its own Secrets and Lease (real token, real apiserver)", () => {
  it('manifests/injector: its CA and serving Secrets, its Lease and its ConfigMap; no token Secret, no other name, no other type', async () => {
    await must(cp().kubectl(['create', 'namespace', 'certshare']));
    await must(cp().kubectl(['apply', '-k', MANIFESTS]));
    await checkCreates('certshare');
  });

  it('charts/certshare, released in another namespace: the same', async () => {
    const ns = 'platform-certshare';
    await must(cp().kubectl(['create', 'namespace', ns]));
    // The cluster-scoped objects replace the kustomization's (same names: one release per cluster).
    const objects = applied(await renderChart({}, ns), ns);
    await must(cp().kubectl(['apply', '-f', '-'], { input: JSON.stringify({ apiVersion: 'v1', kind: 'List', items: objects }) }));
    await checkCreates(ns);
  });
});
