// Tests of the test control plane itself, against a real kube-apiserver + etcd.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { ApiException, CoreV1Api, KubeConfig, PatchStrategy, RbacAuthorizationV1Api, setHeaderOptions, type V1PodCondition } from '@kubernetes/client-node';
import { startControlPlane } from '../harness/control-plane.ts';
import { useControlPlane } from '../harness/use-control-plane.ts';

const cp = useControlPlane();

function clientsFor(kubeconfigPath: string): { core: CoreV1Api; rbac: RbacAuthorizationV1Api } {
  const kc = new KubeConfig();
  kc.loadFromFile(kubeconfigPath);
  return { core: kc.makeApiClient(CoreV1Api), rbac: kc.makeApiClient(RbacAuthorizationV1Api) };
}

/** Repeats `fn` until it stops throwing (RBAC changes reach the authorizer through an informer). */
async function eventually<T>(fn: () => Promise<T>, timeoutMs = 10_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      return await fn();
    } catch (err) {
      if (Date.now() > deadline) throw err;
      await sleep(100);
    }
  }
}

/** Walks an error and its `cause` chain looking for a connection refusal. */
function isConnectionRefused(err: unknown): boolean {
  for (let e: unknown = err, depth = 0; e && depth < 10; e = (e as { cause?: unknown }).cause, depth++) {
    const { code, message } = e as { code?: unknown; message?: unknown };
    if (code === 'ECONNREFUSED' || (typeof message === 'string' && message.includes('ECONNREFUSED'))) return true;
    if (e instanceof AggregateError && e.errors.some(isConnectionRefused)) return true;
  }
  return false;
}

const ns = 'harness-test';

describe('test control plane', () => {
  test('admin can create a namespace and a Secret', async () => {
    const { core } = clientsFor(cp().adminKubeconfigPath);
    await core.createNamespace({ body: { metadata: { name: ns } } });
    await core.createNamespacedSecret({
      namespace: ns,
      body: { metadata: { name: 'shared-cert' }, type: 'Opaque', stringData: { 'tls.crt': 'pem' } },
    });
    const secret = await core.readNamespacedSecret({ namespace: ns, name: 'shared-cert' });
    assert.equal(Buffer.from(secret.data?.['tls.crt'] ?? '', 'base64').toString(), 'pem');

    const got = await cp().kubectl(['get', 'secret', 'shared-cert', '-n', ns, '-o', 'jsonpath={.metadata.name}']);
    assert.deepEqual(got, { stdout: 'shared-cert', stderr: '', code: 0 });
    const version = await cp().kubectl(['version', '-o', 'json']);
    assert.equal(version.code, 0, version.stderr);
    assert.equal(JSON.parse(version.stdout).serverVersion.gitVersion, 'v1.36.3');
  });

  test('RBAC is enforced for ServiceAccount tokens', async () => {
    const admin = clientsFor(cp().adminKubeconfigPath);
    await admin.core.createNamespacedServiceAccount({ namespace: ns, body: { metadata: { name: 'sidecar' } } });
    const sa = clientsFor(await cp().kubeconfigFor(ns, 'sidecar'));

    await assert.rejects(sa.core.listNamespacedSecret({ namespace: ns }), (err: unknown) => {
      assert.ok(err instanceof ApiException, `expected ApiException, got ${String(err)}`);
      assert.equal(err.code, 403);
      const status = JSON.parse(err.body as string) as { reason?: string; message?: string };
      assert.equal(status.reason, 'Forbidden');
      assert.match(status.message ?? '', /system:serviceaccount:harness-test:sidecar/);
      return true;
    });

    await admin.rbac.createNamespacedRole({
      namespace: ns,
      body: {
        metadata: { name: 'secrets-reader' },
        rules: [{ apiGroups: [''], resources: ['secrets'], verbs: ['get', 'list', 'watch'] }],
      },
    });
    await admin.rbac.createNamespacedRoleBinding({
      namespace: ns,
      body: {
        metadata: { name: 'sidecar-secrets-reader' },
        roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'secrets-reader' },
        subjects: [{ kind: 'ServiceAccount', name: 'sidecar', namespace: ns }],
      },
    });
    const list = await eventually(() => sa.core.listNamespacedSecret({ namespace: ns }));
    assert.ok(list.items.some((s) => s.metadata?.name === 'shared-cert'));
    // Still no write access.
    await assert.rejects(
      sa.core.deleteNamespacedSecret({ namespace: ns, name: 'shared-cert' }),
      (err: unknown) => err instanceof ApiException && err.code === 403,
    );
  });

  test('strategic merge patch on pods/status merges conditions by type', async () => {
    const { core } = clientsFor(cp().adminKubeconfigPath);
    await core.createNamespacedPod({
      namespace: ns,
      body: {
        metadata: { name: 'proxy-0' },
        spec: {
          containers: [{ name: 'proxy', image: 'example.invalid/proxy:1' }],
          readinessGates: [{ conditionType: 'certshare.io/ready' }],
        },
      },
    });
    const smp = setHeaderOptions('Content-Type', PatchStrategy.StrategicMergePatch);
    const patchCondition = (condition: V1PodCondition) =>
      core.patchNamespacedPodStatus({ namespace: ns, name: 'proxy-0', body: { status: { conditions: [condition] } } }, smp);

    await patchCondition({ type: 'Other', status: 'True' });
    await patchCondition({ type: 'certshare.io/ready', status: 'False', reason: 'Starting' });
    const pod = await patchCondition({ type: 'certshare.io/ready', status: 'True', reason: 'Routable' });
    const conditions = pod.status?.conditions ?? [];
    assert.deepEqual(conditions.map((c) => [c.type, c.status]).sort(), [
      ['Other', 'True'],
      ['certshare.io/ready', 'True'],
    ]);
    assert.equal(pod.status?.phase, 'Pending'); // no kubelet, no scheduler
    assert.equal(pod.spec?.nodeName, undefined);
  });

  test('metrics() exposes apiserver_request_total', async () => {
    const text = await cp().metrics();
    assert.match(text, /^apiserver_request_total\{/m);
  });

  test('stopApiServer() makes requests fail; startApiServer() brings the same data back', async () => {
    const { core } = clientsFor(cp().adminKubeconfigPath);
    const server = cp().server;
    await cp().stopApiServer();
    assert.equal(cp().apiServerRunning, false);

    await assert.rejects(core.readNamespacedSecret({ namespace: ns, name: 'shared-cert' }), (err: unknown) => {
      assert.ok(isConnectionRefused(err), `expected ECONNREFUSED, got ${String(err)}`);
      return true;
    });
    await assert.rejects(cp().adminRequest('GET', '/readyz'), (err: unknown) => isConnectionRefused(err));

    await cp().startApiServer();
    assert.equal(cp().server, server);
    const secret = await core.readNamespacedSecret({ namespace: ns, name: 'shared-cert' });
    assert.equal(secret.metadata?.name, 'shared-cert');

    // A crash (SIGKILL) instead of a graceful stop.
    await cp().stopApiServer({ signal: 'SIGKILL' });
    await assert.rejects(cp().adminRequest('GET', '/readyz'), (err: unknown) => isConnectionRefused(err));
    await cp().startApiServer();
    assert.equal((await core.readNamespacedSecret({ namespace: ns, name: 'shared-cert' })).metadata?.name, 'shared-cert');
  });

  test('rss() reports both processes', async () => {
    const rss = await cp().rss();
    if (process.platform !== 'linux') return;
    assert.ok((rss.apiserver ?? 0) > 10 * 1024 * 1024, `apiserver rss ${rss.apiserver}`);
    assert.ok((rss.etcd ?? 0) > 1024 * 1024, `etcd rss ${rss.etcd}`);
  });
});

describe('start-up failures', () => {
  test('an apiserver that exits reports its last output', { timeout: 120_000 }, async () => {
    await assert.rejects(startControlPlane({ extraApiServerArgs: ['--no-such-flag'] }), (err: unknown) => {
      assert.ok(err instanceof Error);
      assert.match(err.message, /kube-apiserver exited \(code 1/);
      assert.match(err.message, /unknown flag: --no-such-flag/);
      return true;
    });
  });

  test('a readiness timeout names the process and shows its output', { timeout: 120_000 }, async () => {
    await assert.rejects(startControlPlane({ readyTimeoutMs: 1 }), /etcd not ready after 1 ms/);
  });
});
