// The renew policy (manifests/renew/admission-policy.yaml) narrows every subject of the renew RoleBinding, not
// only its ServiceAccount: a User and a Group added to the binding, as docs/renew.md says to give a person the
// right, may write the renew request annotation of the domain's Secret and nothing else. Real apiserver, the
// requests impersonating the User and a member of the Group (the apiserver authorizes and admits them as theirs).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { KUBE_DOMAIN, exampleNamespace, must } from '../support/kube.ts';
import { makePair } from '../support/certs.ts';

const cp = useControlPlane();
const RENEW = fileURLToPath(new URL('../../manifests/renew', import.meta.url));
const REQUEST = 'certshare.io/renew-requested';

describe('every subject of the renew binding is narrowed to the request annotation', () => {
  it('a User and a Group added to the RoleBinding may not patch tls.crt, tls.key or another annotation; the request they may', async () => {
    const ns = await exampleNamespace(cp(), 'renew-subjects');
    await must(cp().kubectl(['apply', '-k', RENEW, '-n', ns]));
    const subjects = [
      { kind: 'ServiceAccount', name: 'certshare-renew' },
      { apiGroup: 'rbac.authorization.k8s.io', kind: 'User', name: 'alice@example.com' },
      { apiGroup: 'rbac.authorization.k8s.io', kind: 'Group', name: 'renewers' },
    ];
    await must(cp().kubectl(['patch', 'rolebinding', 'certshare-renew', '-n', ns, '--type=merge', '-p', JSON.stringify({ subjects })]));
    const pair = await makePair(KUBE_DOMAIN, Date.now() - 3_600_000, 90 * 86_400_000);
    const secret = {
      apiVersion: 'v1',
      kind: 'Secret',
      type: 'kubernetes.io/tls',
      metadata: { name: KUBE_DOMAIN, labels: { 'app.kubernetes.io/managed-by': 'certshare' } },
      data: { 'tls.crt': Buffer.from(pair.certPem).toString('base64'), 'tls.key': Buffer.from(pair.keyPem).toString('base64') },
    };
    const created = await cp().adminRequest('POST', `/api/v1/namespaces/${ns}/secrets`, { body: secret });
    assert.equal(created.status, 201, created.body);
    const path = `/api/v1/namespaces/${ns}/secrets/${KUBE_DOMAIN}`;
    const otherCrt = Buffer.from((await makePair(KUBE_DOMAIN, Date.now(), 90 * 86_400_000)).certPem).toString('base64');
    const patchAs = (who: Record<string, string>, body: unknown, dryRun = true) =>
      cp().adminRequest('PATCH', `${path}${dryRun ? '?dryRun=All' : ''}`, {
        body,
        headers: { 'Content-Type': 'application/merge-patch+json', ...who },
      });
    const alice = { 'Impersonate-User': 'alice@example.com' };
    const bob = { 'Impersonate-User': 'bob@example.com', 'Impersonate-Group': 'renewers' };
    // The policy applies once the apiserver has loaded it and its parameters (informers, a second or so).
    const deadline = performance.now() + 30_000;
    for (;;) {
      const r = await patchAs(alice, { data: { 'tls.crt': otherCrt } });
      if (r.status === 403 && /certshare-renew-request-only/.test(r.body)) break;
      assert.ok(performance.now() < deadline, `the renew policy never held the User: ${r.status} ${r.body}`);
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
    for (const [name, who, id] of [
      ['the User', alice, 'user-1'],
      ['a member of the Group', bob, 'group-1'],
    ] as const) {
      const refusals: Array<[string, unknown, RegExp]> = [
        ['tls.crt', { data: { 'tls.crt': otherCrt } }, /renew request annotation only/],
        ['tls.key', { data: { 'tls.key': '' } }, /renew request annotation only/],
        ['a label', { metadata: { labels: { x: 'y' } } }, /renew request annotation only/],
        ['another annotation', { metadata: { annotations: { 'certshare.io/retry-not-before': '9999-12-31T00:00:00Z' } } }, /renew-requested annotation only/],
        ['the answer', { metadata: { annotations: { 'certshare.io/renew-answered': 'x' } } }, /renew-requested annotation only/],
      ];
      for (const [what, body, message] of refusals) {
        const r = await patchAs(who, body);
        assert.equal(r.status, 403, `${name}, ${what}: ${r.status} ${r.body}`);
        assert.match(r.body, message, `${name}, ${what}`);
      }
      const asked = await patchAs(who, { metadata: { annotations: { [REQUEST]: id } } });
      assert.equal(asked.status, 200, `${name}: the request itself: ${asked.body}`);
    }
    // Whoever is not a subject of the binding is not the policy's (here the administrator, whose right is RBAC's).
    const admin = await cp().adminRequest('PATCH', `${path}?dryRun=All`, {
      body: { data: { 'tls.crt': otherCrt } },
      headers: { 'Content-Type': 'application/merge-patch+json' },
    });
    assert.equal(admin.status, 200, admin.body);
  });
});
