import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { describe, it } from 'node:test';
import { systemClock } from '../../src/core/ports/clock.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import { connectKube } from '../../src/kube/connection.ts';
import { SecretWatch } from '../../src/kube/secret-watch.ts';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { groupSelector } from '../../src/kube/secret-store.ts';
import { GROUP, KUBE_DOMAIN, allowGroupScope, exampleNamespace, must } from '../support/kube.ts';
import { onEvent, until } from '../support/wait.ts';

// Watches served by etcd directly (no watch cache) and history compacted every second: a watch
// resumed from an old resourceVersion really gets 410 Gone, as after a long disconnection.
const cp = useControlPlane({ extraApiServerArgs: ['--watch-cache=false', '--etcd-compaction-interval=1s'] });

/** Waits until history up to resourceVersion 1 is compacted away (the apiserver answers 410 Gone). */
async function compacted(ns: string): Promise<void> {
  for (let attempt = 0; ; attempt++) {
    const probe = await cp().adminRequest('GET', `/api/v1/namespaces/${ns}/secrets?watch=1&resourceVersion=1&timeoutSeconds=1`, { timeoutMs: 5000 });
    if (probe.body.includes('"code":410')) return;
    if (attempt > 30) throw new Error('etcd never compacted');
    await must(cp().kubectl(['-n', ns, 'create', 'configmap', `churn-${attempt}`]));
  }
}

describe('Secret watch expiry', () => {
  it('relists after 410 Gone and resumes the watch', async () => {
    const ns = await exampleNamespace(cp());
    const kubeconfig = await cp().kubeconfigFor(ns, 'certshare-reader');
    const connection = await connectKube({ KUBECONFIG: kubeconfig, POD_NAMESPACE: ns });
    await compacted(ns);
    let changes = 0;
    const changed = new EventEmitter();
    const watch = new SecretWatch({
      connection,
      name: KUBE_DOMAIN,
      clock: systemClock,
      logger: silentLogger,
      onChange: () => {
        changes++;
        changed.emit('change');
      },
      initialResourceVersion: '1',
    });
    watch.start();
    try {
      await until('relisted after 410', () => watch.relists >= 1, [onEvent(changed, 'change')], 15_000);
      const before = changes;
      await must(cp().kubectl(['-n', ns, 'create', 'secret', 'generic', KUBE_DOMAIN, '--from-literal=a=b']));
      await until('event after relist', () => changes > before, [onEvent(changed, 'change')], 10_000);
    } finally {
      await watch.stop();
    }
  });

  it('a group watch (label selector) relists after 410 Gone: the list holds the group, the watch goes on', async () => {
    const ns = await exampleNamespace(cp());
    await allowGroupScope(cp(), ns);
    const connection = await connectKube({ KUBECONFIG: await cp().kubeconfigFor(ns, 'certshare-reader'), POD_NAMESPACE: ns });
    const label = (name: string, group: string) =>
      must(cp().kubectl(['-n', ns, 'label', 'secret', name, 'app.kubernetes.io/managed-by=certshare', `certshare.io/group=${group}`]));
    for (const name of ['a.tailnet-0000.ts.net', 'b.tailnet-0000.ts.net', 'c.tailnet-0000.ts.net']) {
      await must(cp().kubectl(['-n', ns, 'create', 'secret', 'generic', name, '--from-literal=a=b']));
      await label(name, name.startsWith('c') ? 'another' : GROUP);
    }
    await compacted(ns);
    const lists: string[][] = [];
    const events: string[] = [];
    const changed = new EventEmitter();
    const watch = new SecretWatch({
      connection,
      labelSelector: groupSelector(GROUP),
      clock: systemClock,
      logger: silentLogger,
      pageSize: 1, // and in pages
      onList: (secrets) => lists.push(secrets.map((s) => s.metadata.name).sort()),
      onEvent: (type, secret) => events.push(`${type} ${secret.metadata.name}`),
      onChange: () => changed.emit('change'),
      initialResourceVersion: '1',
    });
    watch.start();
    try {
      await until('relisted after 410', () => watch.relists >= 1 && lists.length >= 1, [onEvent(changed, 'change')], 15_000);
      assert.deepEqual(lists[0], ['a.tailnet-0000.ts.net', 'b.tailnet-0000.ts.net'], "the group's Secrets, not another group's");
      assert.ok(watch.synced);
      await must(cp().kubectl(['-n', ns, 'create', 'secret', 'generic', KUBE_DOMAIN, '--from-literal=a=b']));
      await label(KUBE_DOMAIN, GROUP);
      await until(
        'event after relist',
        () => events.includes(`MODIFIED ${KUBE_DOMAIN}`) || events.includes(`ADDED ${KUBE_DOMAIN}`),
        [onEvent(changed, 'change')],
        10_000,
      );
    } finally {
      await watch.stop();
    }
    assert.equal(watch.synced, false, 'a stopped watch serves no reads');
  });
});
