import assert from 'node:assert/strict';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { systemClock } from '../../src/core/ports/clock.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import { connectKube } from '../../src/kube/connection.ts';
import { EventRecorder, type EventOccurrence, REPORTING_CONTROLLER } from '../../src/kube/event-recorder.ts';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { GATE, KUBE_DOMAIN, createGatedPod, exampleNamespace, podUid, kubeconfigVia, must, startReplica } from '../support/kube.ts';
import { about, type RecordedEvent, watchEvents } from '../support/kube-events.ts';
import { useTempDir } from '../support/standalone.ts';
import { onEvent, until } from '../support/wait.ts';

const cp = useControlPlane();

describe('Events about the Pod', () => {
  const dir = useTempDir();

  it('`kubectl describe pod` shows the writer Issued and Ready, the reader Loaded from the Secret', async () => {
    const ns = await exampleNamespace(cp());
    await createGatedPod(cp(), ns, 'proxy-0');
    await createGatedPod(cp(), ns, 'proxy-1');
    const watch = watchEvents(cp(), ns);
    const writer = await startReplica(cp(), ns, dir(), 'proxy-0', {
      mode: 'rw',
      flags: ['--readiness-gate', GATE],
      env: { POD_UID: await podUid(cp(), ns, 'proxy-0') },
    });
    const reader = await startReplica(cp(), ns, dir(), 'proxy-1', {
      mode: 'ro',
      flags: ['--readiness-gate', GATE],
      env: { POD_UID: await podUid(cp(), ns, 'proxy-1') },
    });
    try {
      await until(
        'Issued and Ready on proxy-0, Loaded and Ready on proxy-1',
        () =>
          ['Issued', 'Ready'].every((r) => about(watch.events, 'proxy-0', r).length > 0) &&
          about(watch.events, KUBE_DOMAIN, 'Issued').length > 0 &&
          ['Loaded', 'Ready'].every((r) => about(watch.events, 'proxy-1', r).length > 0),
        [onEvent(watch.changed, 'change')],
      );
      const [issued] = about(watch.events, 'proxy-0', 'Issued');
      assert.equal(issued?.type, 'Normal');
      assert.equal(issued?.reportingController, 'certshare.io/certshare');
      assert.match(issued?.note ?? '', /proxy\.tailnet-0000\.ts\.net: certificate \S+ obtained \(no_certificate\), valid until /);
      assert.deepEqual(about(watch.events, 'proxy-0', 'Loaded'), [], 'the writer obtained its certificate: not Loaded');
      assert.deepEqual(about(watch.events, 'proxy-1', 'Issued'), [], 'the reader issues nothing');

      // The same fact on the Secret the writer stored, naming the Pod that wrote it.
      const [stored] = about(watch.events, KUBE_DOMAIN, 'Issued');
      assert.equal(stored?.regarding.kind, 'Secret');
      assert.deepEqual([stored?.related?.kind, stored?.related?.name], ['Pod', 'proxy-0']);
      assert.match(stored?.note ?? '', /stored in this Secret by the writer/);
      // (`kubectl describe secret` shows no Events; `kubectl events --for` does.)
      const secretEvents = await must(cp().kubectl(['-n', ns, 'events', '--for', `secret/${KUBE_DOMAIN}`]));
      assert.match(secretEvents, /Normal\s+Issued\s+Secret\/proxy\.tailnet-0000\.ts\.net\s+.*stored in this Secret/, secretEvents);

      const described = await must(cp().kubectl(['-n', ns, 'describe', 'pod', 'proxy-0']));
      const section = described.slice(described.indexOf('\nEvents:'));
      assert.match(section, /Normal\s+Issued\s+.*certshare\.io\/certshare/, described);
      assert.match(section, /Normal\s+Ready\s+/);
      const describedReader = await must(cp().kubectl(['-n', ns, 'describe', 'pod', 'proxy-1']));
      assert.match(describedReader.slice(describedReader.indexOf('\nEvents:')), /Normal\s+Loaded\s+.*read from the Secret/);
    } finally {
      watch.close();
      await reader.stop();
      await writer.stop();
    }
  });

  for (const { fault, reason, note } of [
    { fault: { kind: 'error_500' as const }, reason: 'IssuanceFailed', note: /issuance failed \[error\]: .*; next retry at \d{4}-.*, then backing off$/ },
    { fault: { kind: 'rate_limit_429' as const, retryAfterSeconds: 1 }, reason: 'RateLimited', note: /rate limited until \d{4}-/ },
  ]) {
    it(`a storm of ${fault.kind} is one ${reason} Warning Event whose series counts the repeats`, async () => {
      const ns = await exampleNamespace(cp());
      await createGatedPod(cp(), ns, 'proxy-0');
      const watch = watchEvents(cp(), ns);
      const writer = await startReplica(cp(), ns, dir(), 'proxy-0', {
        mode: 'rw',
        env: { POD_UID: await podUid(cp(), ns, 'proxy-0') },
        emulator: { faults: [{ target: 'cert', count: 'always', ...fault }] },
      });
      try {
        await until(`${reason} counted 3 times`, () => (about(watch.events, 'proxy-0', reason)[0]?.series?.count ?? 0) >= 3, [
          onEvent(watch.changed, 'change'),
        ]);
        const recorded = about(watch.events, 'proxy-0', reason);
        assert.equal(recorded.length, 1, 'one Event, not one per failure');
        assert.equal(recorded[0]!.type, 'Warning');
        assert.match(recorded[0]!.note ?? '', note);
        const calls = writer.emulator.stats().certRequests;
        assert.ok(Object.values(calls).reduce((a, b) => a + b, 0) >= 3, 'the loop did fail several times');
      } finally {
        watch.close();
        await writer.stop();
      }
    });
  }

  it('the writer Lease: BecameWriter on the replica that wins it; on a graceful stop LostWriter, and the successor BecameWriter', async () => {
    const ns = await exampleNamespace(cp());
    // The Pods exist, as in a cluster: their tokens are bound to them (certshare-own-events admits no other).
    await createGatedPod(cp(), ns, 'proxy-0');
    await createGatedPod(cp(), ns, 'proxy-1');
    const watch = watchEvents(cp(), ns);
    const first = await startReplica(cp(), ns, dir(), 'proxy-0', { mode: 'auto' });
    try {
      await until('proxy-0 BecameWriter', () => about(watch.events, 'proxy-0', 'BecameWriter').length > 0, [onEvent(watch.changed, 'change')]);
      const second = await startReplica(cp(), ns, dir(), 'proxy-1', { mode: 'auto' });
      try {
        await first.stop();
        await until(
          'proxy-0 LostWriter, proxy-1 BecameWriter',
          () => about(watch.events, 'proxy-0', 'LostWriter').length > 0 && about(watch.events, 'proxy-1', 'BecameWriter').length > 0,
          [onEvent(watch.changed, 'change')],
        );
      } finally {
        await second.stop();
      }
    } finally {
      watch.close();
      await first.stop();
    }
  });

  it('never blocks the caller: beyond the queue, and when the API is away, occurrences are dropped and counted', async () => {
    const ns = await exampleNamespace(cp());
    const occurrence = (key: string): EventOccurrence => ({ type: 'Normal', reason: 'Loaded', action: 'Load', note: key, key });
    const recordAll = async (kubeconfig: string, queueLimit: number, keys: string[]): Promise<number> => {
      const connection = await connectKube({ KUBECONFIG: kubeconfig, POD_NAMESPACE: ns }, { requestTimeoutMs: 2000 });
      let dropped = 0;
      const recorder = new EventRecorder({
        connection,
        regarding: { name: 'proxy-0' },
        instance: 'proxy-0',
        clock: systemClock,
        logger: silentLogger,
        queueLimit,
        onDropped: () => dropped++,
      });
      try {
        for (const key of keys) recorder.record(occurrence(key)); // returns at once, whatever the API does
        await recorder.idle();
        return dropped;
      } finally {
        await recorder.stop();
        connection.close();
      }
    };
    // The first is taken at once; one waits in a queue of one; the other three are dropped.
    assert.equal(await recordAll(cp().adminKubeconfigPath, 1, ['a', 'b', 'c', 'd', 'e']), 3);
    const names = JSON.parse(await must(cp().kubectl(['-n', ns, 'get', 'events.v1.events.k8s.io', '-o', 'json']))) as { items: RecordedEvent[] };
    // Only certshare's own: the apiserver records Events of its own in any namespace (its ClusterIP repair
    // loop wrote one here once, about a Service of another test).
    const ours = names.items.filter((e) => e.reportingController === REPORTING_CONTROLLER);
    assert.deepEqual(ours.map((e) => e.note).sort(), ['a', 'b']);
    // An API server that does not answer: every occurrence is dropped (after its request fails), none thrown.
    const away = await kubeconfigVia(cp(), ns, join(dir(), 'away.kubeconfig'), { url: 'https://127.0.0.1:9' });
    assert.equal(await recordAll(away, 8, ['a', 'b']), 2);
  });
});
