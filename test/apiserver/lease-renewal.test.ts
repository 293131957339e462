// The Lease holder renews on the object its last write returned (compare-and-swap on its resourceVersion),
// without reading it first: one request per renewal, half of what a read and a write cost (at a federation
// home, every member's writer renews there). A Lease changed under it is read again, as a candidate reads
// it: an annotation the platform added costs one read and no leadership, a takeover ends the leadership.
import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { systemClock } from '../../src/core/ports/clock.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import { connectKube } from '../../src/kube/connection.ts';
import { LeaseElector } from '../../src/kube/lease-elector.ts';
import { FaultProxy } from '../chaos/fault-proxy.ts';
import { Rng } from '../chaos/rng.ts';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { GROUP, exampleNamespace, kubeconfigVia } from '../support/kube.ts';
import { useTempDir } from '../support/standalone.ts';
import { onEvent, until } from '../support/wait.ts';

const cp = useControlPlane();

describe('the Lease holder renews without reading first', () => {
  const dir = useTempDir();

  it('one write per renewal; a Lease changed under it is read again: an annotation keeps the leadership, a takeover ends it', { timeout: 60_000 }, async () => {
    const ns = await exampleNamespace(cp());
    const name = `certshare-${GROUP}`;
    const leasePath = `/apis/coordination.k8s.io/v1/namespaces/${ns}/leases/${name}`;
    const seen: string[] = [];
    const requests = new EventEmitter();
    const proxy = new FaultProxy({
      upstream: cp().server,
      upstreamCaPem: cp().caPem,
      rng: new Rng(1),
      onRequest: (method, path) => {
        if (path === leasePath || path.endsWith('/leases')) seen.push(method);
        requests.emit('request');
      },
    });
    await proxy.start();
    const connection = await connectKube({ KUBECONFIG: await kubeconfigVia(cp(), ns, join(dir(), 'lease.kubeconfig'), proxy), POD_NAMESPACE: ns });
    // A 3 s lease: a renewal every second.
    const elector = new LeaseElector({ name, identity: 'proxy-0', leaseDurationMs: 3000 }, { connection, clock: systemClock, logger: silentLogger });
    const flips: boolean[] = [];
    elector.onChange(() => flips.push(elector.canIssue()));
    const count = (method: string): number => seen.filter((m) => m === method).length;
    const onRequest = (listener: () => void) => onEvent(requests, 'request')(listener);
    elector.start();
    try {
      await until('four renewals', () => count('PUT') >= 4, [onRequest], 15_000);
      assert.deepEqual(seen.slice(0, 2), ['GET', 'POST'], 'the first attempt finds no Lease and creates it');
      assert.equal(count('GET'), 1, `renewals write without reading: ${seen.join(' ')}`);
      assert.deepEqual(flips, [true]);

      // The platform annotates the Lease: the holder's next write conflicts, it reads, and renews on what it read.
      const patch = (body: unknown) =>
        cp().adminRequest('PATCH', `/apis/coordination.k8s.io/v1/namespaces/${ns}/leases/${name}`, {
          headers: { 'content-type': 'application/merge-patch+json' },
          body,
        });
      assert.equal((await patch({ metadata: { annotations: { 'platform.example/owner': 'team-a' } } })).status, 200);
      const puts = count('PUT');
      await until('a read, then renewals again', () => count('GET') === 2 && count('PUT') >= puts + 3, [onRequest], 15_000);
      assert.equal(count('GET'), 2, `one read after the conflict: ${seen.join(' ')}`);
      assert.deepEqual(flips, [true], 'still the writer throughout');

      // Another replica took the Lease over: the conflict is read, and the leadership ends at once.
      const renewTime = new Date().toISOString().replace('Z', '000Z');
      assert.equal((await patch({ spec: { holderIdentity: 'proxy-9', renewTime } })).status, 200);
      await until('no longer the writer', () => !elector.canIssue(), [(l) => elector.onChange(l)], 10_000);
      assert.deepEqual(flips, [true, false]);
    } finally {
      await elector.stop();
      connection.close();
      await proxy.close();
    }
  });
});
