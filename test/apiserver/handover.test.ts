// A writer stopping gracefully hands its role over only after checking the store itself: a hand edit its
// watch had not delivered yet (the watch stalled by a proxy in between) is put back first. Else a successor
// that never saw the certificate issues the domain again (found by the 50-domain chaos run: garbage written
// 42 ms after a renewal, the writer SIGTERMed a second later, its watch stalled; the successor issued anew).
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { FaultProxy } from '../chaos/fault-proxy.ts';
import { Rng } from '../chaos/rng.ts';
import { GARBAGE as garbage } from '../chaos/schedule.ts';
import { useControlPlane } from '../harness/use-control-plane.ts';
import {
  KUBE_DOMAIN,
  exampleNamespace,
  filesWritten,
  heldSerial,
  isWriter,
  kubeconfigVia,
  secretSatisfies,
  startReplica,
  type Replica,
  type SecretObject,
  roleChange,
} from '../support/kube.ts';
import { useTempDir } from '../support/standalone.ts';
import { until } from '../support/wait.ts';
import { ANNOTATION_SERIAL } from '../../src/kube/secret-codec.ts';

const cp = useControlPlane();

const holds = (serial: string) => (s: SecretObject | undefined) =>
  s?.metadata.annotations?.[ANNOTATION_SERIAL] === serial && s.data?.['tls.crt'] !== garbage['tls.crt'];

/** A namespace and its writer (proxy-0, --mode auto) talking to the apiserver through the chaos fault proxy, holding a certificate. */
async function writerBehindFaultProxy(dir: string, seed: number): Promise<{ ns: string; proxy: FaultProxy; writer: Replica; serial: string }> {
  const ns = await exampleNamespace(cp());
  const proxy = new FaultProxy({ upstream: cp().server, upstreamCaPem: cp().caPem, rng: new Rng(seed) });
  await proxy.start();
  const kubeconfig = await kubeconfigVia(cp(), ns, join(dir, 'proxy-0.kubeconfig'), { url: proxy.url, caPem: proxy.caPem }, { pod: 'proxy-0' });
  const writer = await startReplica(cp(), ns, dir, 'proxy-0', { mode: 'auto', env: { KUBECONFIG: kubeconfig } });
  try {
    await until('the writer holds a certificate', () => heldSerial(writer) !== undefined && isWriter(writer), [filesWritten(writer), roleChange(writer)]);
  } catch (err) {
    await writer.stop();
    await proxy.close();
    throw err;
  }
  return { ns, proxy, writer, serial: heldSerial(writer)! };
}

describe('a hand edit the writer did not see', () => {
  const dir = useTempDir();

  it('puts its certificate back before releasing the Lease; the successor, which never saw it, issues nothing', { timeout: 120_000 }, async () => {
    const { ns, proxy, writer, serial } = await writerBehindFaultProxy(dir(), 7);
    let successor: Replica | undefined;
    try {
      await secretSatisfies(cp(), ns, KUBE_DOMAIN, holds(serial));

      // The writer's watch goes silent (events dropped, the stream left open); its GETs and writes still pass.
      proxy.setFaults({ stallWatch: 1, stallMs: [600_000, 600_000] });
      assert.ok(proxy.stallOpenWatches([600_000, 600_000]) >= 1, 'the writer watches through the proxy');
      const edit = await cp().kubectl(['-n', ns, 'patch', 'secret', KUBE_DOMAIN, '--type=merge', '-p', JSON.stringify({ data: garbage })]);
      assert.equal(edit.code, 0, edit.stderr);
      await secretSatisfies(cp(), ns, KUBE_DOMAIN, (s) => s?.data?.['tls.crt'] === garbage['tls.crt']);

      // A successor that starts only now has never seen the certificate.
      successor = await startReplica(cp(), ns, dir(), 'proxy-1', { mode: 'auto' });
      await writer.stop();
      await secretSatisfies(cp(), ns, KUBE_DOMAIN, holds(serial));
      const s = successor;
      await until(
        'the successor is the writer and holds the certificate',
        () => s.daemon.role.canIssue(KUBE_DOMAIN) && heldSerial(s) === serial,
        [filesWritten(s), roleChange(s)],
        30_000,
      );
      assert.equal(writer.emulator.stats().issuancesTotal + s.emulator.stats().issuancesTotal, 1, 'one issuance for the group');
      assert.equal(s.emulator.stats().certRequests[KUBE_DOMAIN] ?? 0, 0, 'the successor never asked tailscaled');
    } finally {
      await successor?.stop();
      await writer.stop();
      await proxy.close();
    }
  });

  it('a candidate that is not the writer puts back the certificate a hand edit took, while the writer does not see it', { timeout: 120_000 }, async () => {
    const { ns, proxy, writer, serial } = await writerBehindFaultProxy(dir(), 8);
    let other: Replica | undefined;
    try {
      const o = await startReplica(cp(), ns, dir(), 'proxy-1', { mode: 'auto' });
      other = o;
      await until('the other replica holds it too', () => heldSerial(o) === serial, [filesWritten(o)]);
      // The writer's watch goes silent: it will not see the edit (it does not read the Secret before renewal).
      proxy.setFaults({ stallWatch: 1, stallMs: [600_000, 600_000] });
      assert.ok(proxy.stallOpenWatches([600_000, 600_000]) >= 1, 'the writer watches through the proxy');
      const edit = await cp().kubectl(['-n', ns, 'patch', 'secret', KUBE_DOMAIN, '--type=merge', '-p', JSON.stringify({ data: garbage })]);
      assert.equal(edit.code, 0, edit.stderr);
      await secretSatisfies(cp(), ns, KUBE_DOMAIN, holds(serial), 15_000);
      assert.ok(isWriter(writer) && !isWriter(o), 'restored by the candidate that does not write, the writer still holding the Lease');
      assert.equal(writer.emulator.stats().issuancesTotal + o.emulator.stats().issuancesTotal, 1, 'one issuance for the group');
    } finally {
      await other?.stop();
      await writer.stop();
      await proxy.close();
    }
  });
});
