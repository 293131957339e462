import { EventEmitter } from 'node:events';
import { describe, it } from 'node:test';
import { systemClock } from '../../src/core/clock.ts';
import { silentLogger } from '../../src/core/logger.ts';
import { connectKube } from '../../src/kube/connection.ts';
import { SecretWatch } from '../../src/kube/secret-watch.ts';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { KUBE_DOMAIN, exampleNamespace, must } from '../support/kube.ts';
import { onEvent, until } from '../support/wait.ts';

// Watches served by etcd directly (no watch cache) and history compacted every second: a watch
// resumed from an old resourceVersion really gets 410 Gone, as after a long disconnection.
const cp = useControlPlane({ extraApiServerArgs: ['--watch-cache=false', '--etcd-compaction-interval=1s'] });

describe('Secret watch expiry', () => {
  it('relists after 410 Gone and resumes the watch', async () => {
    const ns = await exampleNamespace(cp());
    const kubeconfig = await cp().kubeconfigFor(ns, 'certshare-reader');
    const connection = await connectKube({ KUBECONFIG: kubeconfig, POD_NAMESPACE: ns });
    // Precondition: history up to resourceVersion 1 is compacted away (the apiserver answers 410).
    for (let attempt = 0; ; attempt++) {
      const probe = await cp().adminRequest('GET', `/api/v1/namespaces/${ns}/secrets?watch=1&resourceVersion=1&timeoutSeconds=1`, { timeoutMs: 5000 });
      if (probe.body.includes('"code":410')) break;
      if (attempt > 30) throw new Error('etcd never compacted');
      await must(cp().kubectl(['-n', ns, 'create', 'configmap', `churn-${attempt}`]));
    }
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
});
