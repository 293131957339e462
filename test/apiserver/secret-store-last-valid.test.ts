// KubeSecretStore's last valid pair (StoreRead.lastValid), against the API server, in both watch scopes:
// a pair the watch delivered and a hand edit overwrote before any load() read it is offered while the
// Secret holds garbage, an older pair or nothing; never once it expired, nor after the domain was
// unfollowed.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { validateCertPair } from '../../src/core/certificates/certificate.ts';
import { systemClock, type Clock } from '../../src/core/ports/clock.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import type { StoredCert } from '../../src/core/ports/store.ts';
import { connectKube } from '../../src/kube/connection.ts';
import { certSecret } from '../../src/kube/secret-codec.ts';
import { KubeSecretStore } from '../../src/kube/secret-store.ts';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { DAY, makePair } from '../support/certs.ts';
import { GROUP, KUBE_DOMAIN, allowGroupScope, exampleNamespace } from '../support/kube.ts';
import { until } from '../support/wait.ts';

const cp = useControlPlane();

async function pairFrom(notBefore: number): Promise<StoredCert> {
  const pair = await makePair(KUBE_DOMAIN, notBefore, 90 * DAY);
  return { pair, info: validateCertPair(pair, KUBE_DOMAIN, Date.now()) };
}

describe('KubeSecretStore: the last valid pair', () => {
  for (const scope of ['secret', 'group'] as const) {
    it(`--watch-scope ${scope}: offered over garbage, an older pair and a deletion; not once expired or unfollowed`, { timeout: 60_000 }, async () => {
      const ns = await exampleNamespace(cp());
      if (scope === 'group') await allowGroupScope(cp(), ns);
      const path = `/api/v1/namespaces/${ns}/secrets`;
      const admin = async (method: string, suffix: string, body?: unknown): Promise<void> => {
        const headers = method === 'PATCH' ? { 'content-type': 'application/merge-patch+json' } : undefined;
        const res = await cp().adminRequest(method, `${path}${suffix}`, body === undefined ? {} : { body, ...(headers ? { headers } : {}) });
        assert.ok(res.status < 300, `${method} ${suffix}: HTTP ${res.status}: ${res.body.slice(0, 300)}`);
      };
      const holding = (cert: StoredCert | undefined) =>
        certSecret(KUBE_DOMAIN, undefined, { namespace: ns, group: GROUP, writer: 'test' }, { ...(cert ? { cert } : {}), coordination: {} });
      const [older, newer] = [await pairFrom(Date.now() - 2 * DAY), await pairFrom(Date.now() - DAY)];

      let offset = 0; // moves the store's clock past the newer pair's expiry at the end
      const clock: Clock = { now: () => Date.now() + offset, sleep: systemClock.sleep };
      const connection = await connectKube({ KUBECONFIG: await cp().kubeconfigFor(ns, 'certshare-reader'), POD_NAMESPACE: ns });
      const store = new KubeSecretStore({ connection, clock, logger: silentLogger, group: GROUP, watchScope: scope });
      const signal = new AbortController().signal;
      let changes = 0;
      const woken = (listener: () => void) => store.watch(KUBE_DOMAIN, listener);
      const follow = () => store.watch(KUBE_DOMAIN, () => changes++);
      /** Makes the changes, then waits until the watch delivered one event per change. */
      const step = async (what: string, ...changesMade: Array<() => Promise<void>>): Promise<void> => {
        const target = changes + changesMade.length;
        for (const change of changesMade) await change();
        await until(`the watch delivered ${what}`, () => changes >= target, [woken], 10_000);
      };
      let unfollow = follow();
      try {
        assert.equal((await store.load(KUBE_DOMAIN, signal)).state, 'absent', 'listed');
        await step('the older pair', () => admin('POST', '', holding(older)));
        assert.equal((await store.load(KUBE_DOMAIN, signal)).lastValid, undefined, 'nothing newer seen');

        // The newer pair, and garbage over it before any load(): the watch delivers both.
        await step(
          'the newer pair and the garbage',
          () => admin('PUT', `/${KUBE_DOMAIN}`, holding(newer)),
          () => admin('PATCH', `/${KUBE_DOMAIN}`, { data: { 'tls.crt': Buffer.from('garbage').toString('base64') } }),
        );
        let read = await store.load(KUBE_DOMAIN, signal);
        assert.equal(read.state, 'unusable');
        assert.equal(read.lastValid?.info.serial, newer.info.serial);

        // A hand edit back to the older (valid) pair: still offered, as newer than what the Secret holds.
        await step('the older pair again', () => admin('PUT', `/${KUBE_DOMAIN}`, holding(older)));
        read = await store.load(KUBE_DOMAIN, signal);
        assert.equal(read.state === 'valid' && read.cert.info.serial, older.info.serial);
        assert.equal(read.lastValid?.info.serial, newer.info.serial);

        // Deleted, then recreated with garbage.
        await step('the deletion', () => admin('DELETE', `/${KUBE_DOMAIN}`));
        read = await store.load(KUBE_DOMAIN, signal);
        assert.equal(read.state, 'absent');
        assert.equal(read.lastValid?.info.serial, newer.info.serial);
        await step('the empty Secret', () => admin('POST', '', holding(undefined)));
        read = await store.load(KUBE_DOMAIN, signal);
        assert.equal(read.state, 'unusable');
        assert.equal(read.lastValid?.info.serial, newer.info.serial);

        // The Secret holding the newest pair: nothing to offer beside it.
        await step('the newer pair again', () => admin('PUT', `/${KUBE_DOMAIN}`, holding(newer)));
        assert.equal((await store.load(KUBE_DOMAIN, signal)).lastValid, undefined);

        // Unfollowed, the pair is forgotten (as a restart forgets it).
        await step('the garbage key', () => admin('PATCH', `/${KUBE_DOMAIN}`, { data: { 'tls.key': Buffer.from('garbage').toString('base64') } }));
        assert.equal((await store.load(KUBE_DOMAIN, signal)).lastValid?.info.serial, newer.info.serial);
        unfollow();
        unfollow = follow();
        read = await store.load(KUBE_DOMAIN, signal);
        assert.equal(read.state, 'unusable');
        assert.equal(read.lastValid, undefined);

        // Never an expired pair.
        await step('the newer pair once more', () => admin('PUT', `/${KUBE_DOMAIN}`, holding(newer)));
        await step('the second deletion', () => admin('DELETE', `/${KUBE_DOMAIN}`));
        assert.equal((await store.load(KUBE_DOMAIN, signal)).lastValid?.info.serial, newer.info.serial);
        offset = newer.info.notAfter - Date.now();
        assert.equal((await store.load(KUBE_DOMAIN, signal)).lastValid, undefined);
      } finally {
        unfollow();
        await store.stop();
      }
    });
  }
});
