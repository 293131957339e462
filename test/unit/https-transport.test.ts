// The Kubernetes transport's configuration errors, without a cluster.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { KubeConfig } from '@kubernetes/client-node/dist/config.js';
import { CoreV1Api } from '@kubernetes/client-node/dist/gen/index.js';
import { apiServer, makeApi } from '../../src/kube/https-transport.ts';

describe('https transport', () => {
  it('refuses a kubeconfig without a current cluster with a clear, coded error', () => {
    const empty = new KubeConfig();
    empty.loadFromString('apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n');
    for (const attempt of [() => apiServer(empty), () => makeApi(empty, CoreV1Api)]) {
      assert.throws(attempt, { code: 'CERTSHARE_BAD_CONFIG', message: /no Kubernetes cluster configured/ });
    }
  });

  it('takes the server of the current context, without a trailing slash', () => {
    const config = new KubeConfig();
    config.loadFromClusterAndUser({ name: 'c', server: 'https://10.0.0.1:6443/', skipTLSVerify: false }, { name: 'u' });
    assert.equal(apiServer(config), 'https://10.0.0.1:6443');
  });
});
