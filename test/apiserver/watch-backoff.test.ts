// Watches never reconnect in a tight loop: behind a proxy that ends every watch as soon as it begins
// (a clean end, no event), the reconnects follow the backoff instead of hammering the API server.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { systemClock } from '../../src/core/ports/clock.ts';
import { connectKube } from '../../src/kube/connection.ts';
import { SecretWatch } from '../../src/kube/secret-watch.ts';
import { FaultProxy } from '../chaos/fault-proxy.ts';
import { Rng } from '../chaos/rng.ts';
import { recordingLogger } from '../support/localapi.ts';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { KUBE_DOMAIN, exampleNamespace, kubeconfigVia } from '../support/kube.ts';
import { useTempDir } from '../support/standalone.ts';

const cp = useControlPlane();

async function watchBehind(proxy: FaultProxy, dir: string, options: { firstRetryMs?: number; maxRetryMs?: number } = {}) {
  const ns = await exampleNamespace(cp());
  const kubeconfig = await kubeconfigVia(cp(), ns, join(dir, `${ns}.kubeconfig`), proxy, { serviceAccount: 'certshare-reader' });
  const connection = await connectKube({ KUBECONFIG: kubeconfig, POD_NAMESPACE: ns });
  const { logger, lines } = recordingLogger();
  const watch = new SecretWatch({ connection, name: KUBE_DOMAIN, clock: systemClock, logger, onChange: () => {}, ...options });
  return { watch, failures: () => lines.filter((l) => l.msg === 'Secret watch failed').length };
}

describe('Secret watch reconnects', () => {
  const dir = useTempDir();

  it('back off when every watch ends before any event: a few requests at first, then one per backoff cap', { timeout: 60_000 }, async (t) => {
    const proxy = new FaultProxy({ upstream: cp().server, upstreamCaPem: cp().caPem, rng: new Rng(10) });
    await proxy.start();
    proxy.setFaults({ endWatchEarly: 1, endAfterMs: [0, 0] });
    const ended = () => proxy.applied.get('endWatchEarly') ?? 0;
    // The defaults: 500 ms doubling to a 5 s cap, ±25 % jitter.
    const { watch, failures } = await watchBehind(proxy, dir());
    try {
      watch.start();
      // A measurement window, not a synchronisation: the rate is what is asserted.
      await sleep(5000);
      const firstHalf = ended();
      await sleep(5000);
      const secondHalf = ended() - firstHalf;
      t.diagnostic(`watches ended at once: ${firstHalf} in the first 5 s, ${secondHalf} in the next 5 s (${proxy.requests} requests in all)`);
      // Expected about 4 and 1-2 (starts near 0, 0.5, 1.5, 3.5, 7.5 s); a tight loop makes hundreds.
      assert.ok(firstHalf >= 2 && firstHalf <= 6, `${firstHalf} watches in the first 5 s`);
      assert.ok(secondHalf <= 3, `${secondHalf} watches in the next 5 s: at most about one per 5 s cap`);
      assert.ok(failures() >= firstHalf + secondHalf - 1, 'each eventless end is logged as a failure');
    } finally {
      await watch.stop();
      await proxy.close();
    }
  });

  it('reconnect at once, without backoff, after a watch that stayed open longer than the backoff cap', { timeout: 60_000 }, async () => {
    const proxy = new FaultProxy({ upstream: cp().server, upstreamCaPem: cp().caPem, rng: new Rng(11) });
    await proxy.start();
    // A quiet cluster (no event, no bookmark) whose watches end on the server's timeout: here 1.5 s.
    proxy.setFaults({ endWatchEarly: 1, endAfterMs: [1500, 1500] });
    const { watch, failures } = await watchBehind(proxy, dir(), { firstRetryMs: 500, maxRetryMs: 1000 });
    try {
      watch.start();
      await sleep(6000);
      const ended = proxy.applied.get('endWatchEarly') ?? 0;
      assert.ok(ended >= 3, `${ended} watches ended in 6 s: each reopened at once`);
      assert.equal(failures(), 0, 'a watch that outlived the backoff cap is no failure');
    } finally {
      await watch.stop();
      await proxy.close();
    }
  });
});
