import assert from 'node:assert/strict';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { KUBE_DOMAIN, exampleNamespace, filesWritten, heldSerial, startReplica } from '../support/kube.ts';
import { recordingLogger } from '../support/recording-logger.ts';
import { useTempDir } from '../support/standalone.ts';
import { nextEvent, until } from '../support/wait.ts';

const cp = useControlPlane();

describe('kube mode when the API server or RBAC says no', () => {
  const dir = useTempDir();

  it('issues nothing and loses nothing while the API server is down, and catches up after', async () => {
    const ns = await exampleNamespace(cp());
    // 20 s certificates: renewal due 10 s after issuance, which falls inside the outage.
    const writer = await startReplica(cp(), ns, join(dir(), 'outage'), 'proxy-0', { mode: 'rw', emulator: { certLifetimeMs: 20_000 } });
    const reader = await startReplica(cp(), ns, join(dir(), 'outage'), 'proxy-1', { mode: 'ro' });
    try {
      await until('shared', () => heldSerial(reader) !== undefined, [filesWritten(reader)], 20_000);
      const first = heldSerial(writer)!;
      // The writer sleeps until the renewal point; its turn then finds the store unreadable.
      const unreadable = nextEvent<{ message: string }>(writer.daemon.events, 'problem', (p) => /unreadable/.test(p.message), 20_000);
      await cp().stopApiServer({ signal: 'SIGKILL' });
      const problem = await unreadable;
      assert.match(problem.message, /store kube unreadable/);
      assert.deepEqual(writer.emulator.stats().issuances, { [KUBE_DOMAIN]: 1 }, 'no issuance while the store cannot be read');
      assert.equal(writer.emulator.stats().certRequests[KUBE_DOMAIN], 1, 'no CertPair call at all');
      assert.equal(heldSerial(reader), first, 'the reader keeps its certificate');
      const health = await fetch(`${reader.daemon.address}/healthz`);
      assert.equal(health.status, 200, await health.text());
      const issued = nextEvent<{ serial: string }>(writer.emulator.events, 'issued', () => true, 30_000);
      await cp().startApiServer();
      const renewed = await issued;
      assert.equal(writer.emulator.stats().issuances[KUBE_DOMAIN], 2, 'one renewal for the window that passed');
      const restartedAt = performance.now();
      await until('reader has the renewal', () => heldSerial(reader) === renewed.serial, [filesWritten(reader)], 10_000);
      assert.ok(performance.now() - restartedAt < 6000, 'the reader catches up within the watch retry cap');
    } finally {
      if (!cp().apiServerRunning) await cp().startApiServer();
      await Promise.all([writer.stop(), reader.stop()]);
    }
  });

  it('a replica without write permission gets 403, issues nothing and keeps serving', async () => {
    const ns = await exampleNamespace(cp());
    const writer = await startReplica(cp(), ns, join(dir(), 'rbac'), 'proxy-0', { mode: 'rw', emulator: { certLifetimeMs: 6000 } });
    // Misconfigured: told to write, but running under the read-only ServiceAccount.
    const impostor = await startReplica(cp(), ns, join(dir(), 'rbac'), 'proxy-1', { mode: 'rw', serviceAccount: 'certshare-reader' });
    try {
      await until('impostor has the shared certificate', () => heldSerial(impostor) !== undefined, [filesWritten(impostor)], 20_000);
      await writer.stop(); // nobody renews now; the impostor's turn comes at the renewal point
      const problem = await nextEvent<{ message: string }>(impostor.daemon.events, 'problem', (p) => /intent/.test(p.message), 20_000);
      assert.match(problem.message, /Forbidden|403/);
      assert.deepEqual(impostor.emulator.stats().certRequests, {}, 'no CertPair without a recorded intent');
      const metrics = await (await fetch(`${impostor.daemon.address}/metrics`)).text();
      assert.match(metrics, /certshare_store_errors_total\{operation="write"\} [1-9]/);
      assert.equal(heldSerial(impostor) !== undefined, true);
    } finally {
      await Promise.all([writer.stop(), impostor.stop()]);
    }
  });

  it('a replica refused the repair of a hand-edited Secret stops at once, not at the end of its shutdown budget', async () => {
    const ns = await exampleNamespace(cp());
    const writer = await startReplica(cp(), ns, join(dir(), 'refused'), 'proxy-0', { mode: 'rw' });
    const { logger, entries } = recordingLogger();
    // Told to write, running under the read-only ServiceAccount: its verification at stop reads the
    // Secret (allowed) and is refused the repair (403 on update).
    const impostor = await startReplica(cp(), ns, join(dir(), 'refused'), 'proxy-1', {
      mode: 'rw',
      serviceAccount: 'certshare-reader',
      flags: ['--shutdown-timeout', '20s'],
      logger,
    });
    try {
      await until('impostor has the shared certificate', () => heldSerial(impostor) !== undefined, [filesWritten(impostor)], 20_000);
      await writer.stop(); // the one replica that could repair the Secret is gone
      const edit = await cp().adminRequest('PATCH', `/api/v1/namespaces/${ns}/secrets/${KUBE_DOMAIN}`, {
        headers: { 'content-type': 'application/merge-patch+json' },
        body: { data: { 'tls.crt': Buffer.from('edited by hand').toString('base64') } },
      });
      assert.equal(edit.status, 200, edit.body);
      const startedAt = performance.now();
      await impostor.stop();
      const tookMs = performance.now() - startedAt;
      const gaveUp = entries.find((e) => e.msg === 'could not verify the stored certificate before handing over');
      assert.match(String(gaveUp?.err), /403|Forbidden/, 'the refusal is what ended the verification');
      // Retrying a refusal would have taken the 20 s budget (less the stop reserve).
      assert.ok(tookMs < 10_000, `stopped in ${Math.round(tookMs)} ms`);
    } finally {
      await Promise.all([writer.stop(), impostor.stop()]);
    }
  });
});
