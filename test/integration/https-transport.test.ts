// The Kubernetes transport's configuration errors and deadlines, without a cluster.
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { createServer, type Socket } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { KubeConfig, CoreV1Api } from '../../src/kube/transport/client-node.ts';
import { apiServer, makeApi, watchOnce, withSignal } from '../../src/kube/transport/https-transport.ts';

describe('https transport', () => {
  it('refuses a kubeconfig without a current cluster with a clear, coded error', () => {
    const empty = new KubeConfig();
    empty.loadFromString('apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n');
    for (const attempt of [() => apiServer(empty), () => makeApi(empty, CoreV1Api)]) {
      assert.throws(attempt, { code: 'CERTSHARE_BAD_CONFIG', message: /Kubernetes credentials: no cluster configured/ });
    }
  });

  it('takes the server of the current context, without a trailing slash', () => {
    const config = new KubeConfig();
    config.loadFromClusterAndUser({ name: 'c', server: 'https://10.0.0.1:6443/', skipTLSVerify: false }, { name: 'u' });
    assert.equal(apiServer(config), 'https://10.0.0.1:6443');
  });

  describe('against a server that accepts connections and never answers', () => {
    const held = new Set<Socket>();
    const silent = createServer((socket) => {
      held.add(socket);
      socket.on('close', () => held.delete(socket));
    });
    const config = new KubeConfig();
    before(async () => {
      silent.listen(0, '127.0.0.1');
      await once(silent, 'listening');
      const { port } = silent.address() as { port: number };
      config.loadFromClusterAndUser({ name: 'c', server: `http://127.0.0.1:${port}`, skipTLSVerify: true }, { name: 'u' });
    });
    after(() => {
      for (const socket of held) socket.destroy();
      silent.close();
    });

    it('a request fails with CERTSHARE_KUBE_TIMEOUT after the request timeout', async () => {
      const started = performance.now();
      await assert.rejects(makeApi(config, CoreV1Api, 300).readNamespacedSecret({ name: 's', namespace: 'n' }), {
        code: 'CERTSHARE_KUBE_TIMEOUT',
        message: /GET \/api\/v1\/namespaces\/n\/secrets\/s: no answer from the Kubernetes API within 300 ms/,
      });
      assert.ok(performance.now() - started < 5000);
    });

    it("a request ends at once when the caller's signal aborts, and a caller's deadline reads as a timeout", async () => {
      const api = makeApi(config, CoreV1Api, 60_000);
      const stop = new AbortController();
      const cancelled = api.readNamespacedSecret({ name: 's', namespace: 'n' }, withSignal(stop.signal));
      stop.abort();
      await assert.rejects(cancelled, { name: 'AbortError' });
      await assert.rejects(api.readNamespacedSecret({ name: 's', namespace: 'n' }, withSignal(AbortSignal.timeout(200))), {
        code: 'CERTSHARE_KUBE_TIMEOUT',
        message: /caller's deadline/,
      });
    });

    it('a watch without response headers fails with CERTSHARE_KUBE_TIMEOUT after the headers timeout, whatever its inactivity bound', async () => {
      const watching = watchOnce(config, '/api/v1/namespaces/n/secrets', {}, () => {}, {
        signal: new AbortController().signal,
        inactivityMs: 60_000,
        headersTimeoutMs: 300,
      });
      await assert.rejects(watching, { code: 'CERTSHARE_KUBE_TIMEOUT' });
    });
  });
});
