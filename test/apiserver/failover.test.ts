import assert from 'node:assert/strict';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { useControlPlane } from '../harness/use-control-plane.ts';
import {
  KUBE_DOMAIN,
  exampleNamespace,
  filesWritten,
  heldSerial,
  kubeconfigVia,
  startReplica,
  startReplicas,
  type Replica,
  roleChange,
  isWriter,
} from '../support/kube.ts';
import { useTempDir } from '../support/standalone.ts';
import { startTcpProxy } from '../support/tcp-proxy.ts';
import { nextEvent, until } from '../support/wait.ts';

const cp = useControlPlane();
const LEASE = ['--lease-duration', '2s'];
const issuances = (replicas: Replica[]): number => replicas.reduce((n, r) => n + (r.emulator.stats().issuances[KUBE_DOMAIN] ?? 0), 0);

describe('--mode auto: the writer fails over', () => {
  const dir = useTempDir();

  it('elects one writer; when it stops, another takes over and renewals go on without double issuance', async () => {
    const ns = await exampleNamespace(cp());
    // 8 s certificates: a renewal window every 4 s.
    const replicas = await startReplicas(cp(), ns, join(dir(), 'stop'), ['proxy-0', 'proxy-1', 'proxy-2'], {
      mode: 'auto',
      flags: LEASE,
      emulator: { certLifetimeMs: 8000 },
    });
    try {
      await until('everyone has the certificate', () => replicas.every((r) => heldSerial(r) !== undefined), replicas.map(filesWritten), 20_000);
      assert.equal(replicas.filter(isWriter).length, 1, 'exactly one writer');
      assert.equal(issuances(replicas), 1);
      const writer = replicas.find(isWriter)!;
      const rest = replicas.filter((r) => r !== writer);
      const stoppedAt = performance.now();
      await writer.stop(); // releases the Lease
      await until('a new writer', () => rest.some(isWriter), rest.map(roleChange), 5000);
      assert.ok(performance.now() - stoppedAt < 2000, 'a released Lease is taken over at once');
      const successor = rest.find(isWriter)!;
      const renewed = await nextEvent<{ serial: string }>(successor.emulator.events, 'issued', () => true, 10_000);
      await until('the other replica has the renewal', () => rest.every((r) => heldSerial(r) === renewed.serial), rest.map(filesWritten), 5000);
      assert.equal(issuances(replicas), 2, 'the first issuance and one renewal by the successor');
    } finally {
      await Promise.all(replicas.map((r) => r.stop()));
    }
  });

  it("a second process under the writer Pod's name (a force-deleted StatefulSet Pod, recreated) waits for the Lease to expire", async () => {
    const ns = await exampleNamespace(cp());
    const lease = ['--lease-duration', '3s'];
    const first = await startReplica(cp(), ns, join(dir(), 'same-a'), 'proxy-0', { mode: 'auto', flags: lease });
    let second: Replica | undefined;
    let stopped = false;
    try {
      await until('the first process writes', () => isWriter(first), [roleChange(first)], 20_000);
      // The old process still runs (its node stopped answering) when the new Pod of the same name starts.
      second = await startReplica(cp(), ns, join(dir(), 'same-b'), 'proxy-0', { mode: 'auto', flags: lease });
      const becameWriter = await until('the second process writes', () => isWriter(second!), [roleChange(second)], 7000).then(
        () => true,
        () => false,
      );
      assert.equal(becameWriter, false, 'never two writers: the second waits while the first renews (7 s, two lease durations)');
      assert.ok(isWriter(first), 'the first process still writes');
      await first.stop();
      stopped = true;
      await until('the second process writes once the first has gone', () => isWriter(second!), [roleChange(second)], 10_000);
    } finally {
      if (!stopped) await first.stop();
      await second?.stop();
    }
  });

  it('a partitioned writer stops issuing as its lease runs out; another replica takes over', async () => {
    const ns = await exampleNamespace(cp());
    const apiPort = Number(new URL(cp().server).port);
    const proxy = await startTcpProxy(apiPort);
    const partitionedConfig = await kubeconfigVia(cp(), ns, join(dir(), 'partitioned.kubeconfig'), { url: `https://127.0.0.1:${proxy.port}` });
    const first = await startReplica(cp(), ns, join(dir(), 'cut'), 'proxy-0', {
      mode: 'auto',
      flags: LEASE,
      env: { KUBECONFIG: partitionedConfig },
      emulator: { certLifetimeMs: 30_000 },
    });
    await until('proxy-0 writes', () => isWriter(first) && heldSerial(first) !== undefined, [roleChange(first), filesWritten(first)], 20_000);
    const second = await startReplica(cp(), ns, join(dir(), 'cut'), 'proxy-1', { mode: 'auto', flags: LEASE, emulator: { certLifetimeMs: 30_000 } });
    try {
      await until('proxy-1 has the certificate', () => heldSerial(second) !== undefined, [filesWritten(second)], 10_000);
      assert.equal(isWriter(second), false);
      const cutAt = performance.now();
      proxy.cut();
      await until('proxy-0 gives up writing', () => !isWriter(first), [roleChange(first)], 5000);
      assert.ok(performance.now() - cutAt <= 2500, 'within the lease duration');
      await until('proxy-1 takes over', () => isWriter(second), [roleChange(second)], 10_000);
      assert.equal(heldSerial(first), heldSerial(second), 'the partitioned replica keeps serving its valid certificate');
      assert.deepEqual(second.emulator.stats().certRequests, {}, 'taking over issues nothing while the certificate is valid');
    } finally {
      proxy.restore();
      await Promise.all([first.stop(), second.stop()]);
      await proxy.close();
    }
  });
});
