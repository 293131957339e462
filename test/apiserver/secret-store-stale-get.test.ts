// KubeSecretStore against the API server: a GET of a Secret that answers after the watch delivered a newer
// version (the reader's GET begun while the writer stored the first certificate) neither is reported by
// load() nor replaces the newer version: the reader reads the certificate, not the empty Secret it left
// behind (its loop would warn "stored certificate unusable" at an ordinary start).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { validateCertPair } from '../../src/core/certificates/certificate.ts';
import { systemClock } from '../../src/core/ports/clock.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import { connectKube } from '../../src/kube/connection.ts';
import { certSecret } from '../../src/kube/secret-codec.ts';
import { KubeSecretStore } from '../../src/kube/secret-store.ts';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { DAY, makePair } from '../support/certs.ts';
import { GROUP, KUBE_DOMAIN, allowGroupScope, exampleNamespace } from '../support/kube.ts';
import { until } from '../support/wait.ts';

const cp = useControlPlane();

describe('KubeSecretStore: a GET answered after the watch moved on', () => {
  for (const scope of ['secret', 'group'] as const) {
    it(`--watch-scope ${scope}: load() gives the newer Secret the watch delivered, then and afterwards`, { timeout: 60_000 }, async () => {
      const ns = await exampleNamespace(cp());
      if (scope === 'group') await allowGroupScope(cp(), ns);
      const path = `/api/v1/namespaces/${ns}/secrets`;
      const admin = async (method: string, suffix: string, body: unknown): Promise<void> => {
        const res = await cp().adminRequest(method, `${path}${suffix}`, { body });
        assert.ok(res.status < 300, `${method} ${suffix}: HTTP ${res.status}: ${res.body.slice(0, 300)}`);
      };
      const pair = await makePair(KUBE_DOMAIN, Date.now() - DAY, 90 * DAY);
      const cert = { pair, info: validateCertPair(pair, KUBE_DOMAIN, Date.now()) };
      const meta = { namespace: ns, group: GROUP, writer: 'test' };
      // The writer's intent: a Secret without tls.crt / tls.key while the first issuance runs.
      await admin('POST', '', certSecret(KUBE_DOMAIN, undefined, meta, { coordination: { intent: { holder: 'test', at: Date.now() } } }));

      const connection = await connectKube({ KUBECONFIG: await cp().kubeconfigFor(ns, 'certshare-reader'), POD_NAMESPACE: ns });
      // The GET's answer is held back until the test lets it through.
      const answered = Promise.withResolvers<void>();
      const release = Promise.withResolvers<void>();
      const read = connection.core.readNamespacedSecret.bind(connection.core);
      connection.core.readNamespacedSecret = (async (...args: Parameters<typeof read>) => {
        const answer = await read(...args);
        answered.resolve();
        await release.promise;
        return answer;
      }) as typeof read;
      const store = new KubeSecretStore({ connection, clock: systemClock, logger: silentLogger, group: GROUP, watchScope: scope });
      const signal = new AbortController().signal;
      let changes = 0;
      const unfollow = store.watch(KUBE_DOMAIN, () => changes++);
      try {
        await store.start();
        const first = await store.load(KUBE_DOMAIN, signal);
        assert.equal(first.state === 'unusable' && first.empty, true, 'the empty Secret, from the watch');
        // A GET (a loop that doubts the watched copy asks the API server) answers the empty Secret; the writer
        // stores the certificate and the watch delivers it before that answer reaches load().
        const loading = store.load(KUBE_DOMAIN, signal, { fresh: true });
        await answered.promise;
        const seen = changes;
        const current = JSON.parse((await cp().adminRequest('GET', `${path}/${KUBE_DOMAIN}`)).body);
        await admin('PUT', `/${KUBE_DOMAIN}`, certSecret(KUBE_DOMAIN, current, meta, { cert, coordination: {} }));
        await until('the watch delivered the certificate', () => changes > seen, [(listener) => store.watch(KUBE_DOMAIN, listener)], 10_000);
        release.resolve();
        const got = await loading;
        assert.equal(got.state === 'valid' && got.cert.info.serial, cert.info.serial, `the GET's older answer was reported: ${got.state}`);
        const after = await store.load(KUBE_DOMAIN, signal);
        assert.equal(after.state === 'valid' && after.cert.info.serial, cert.info.serial, `the watched copy went back: ${after.state}`);
      } finally {
        release.resolve();
        unfollow();
        await store.stop();
        connection.close();
      }
    });
  }
});
