// GET /leave-rotation acts only while certshare's own Pod is terminating, against the real apiserver: the
// token alone (which anyone who may `get pods` reads from the spec) answers 409 and changes nothing; once the
// Pod has a deletionTimestamp (a finalizer keeps the deleted Pod, terminating, as a kubelet's grace period
// would) the same call withdraws the Service, waits the failover and the drain, and leaves the readiness gate.
// certshare learns the deletion from the answer to an empty status patch: its existing right, its own token.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { DAY, makePair } from '../support/certs.ts';
import { GATE, KUBE_DOMAIN, exampleNamespace, must, startReplica } from '../support/kube.ts';
import { recordingLogger } from '../support/recording-logger.ts';
import { useTempDir } from '../support/standalone.ts';
import { startTlsProxy } from '../support/tls-proxy.ts';
import { every, until } from '../support/wait.ts';

const cp = useControlPlane();
const TOKEN = 'leave-token-0123456789';
const SERVICE = `svc:${KUBE_DOMAIN.split('.')[0]}`;
const HOLD = 'example.com/hold';

interface PodState {
  deletionTimestamp: string | undefined;
  gate: { status: string; reason?: string; lastTransitionTime?: string } | undefined;
}

async function podState(ns: string, name: string): Promise<PodState> {
  const res = await cp().adminRequest('GET', `/api/v1/namespaces/${ns}/pods/${name}`);
  assert.equal(res.status, 200, res.body);
  const pod = JSON.parse(res.body) as {
    metadata: { deletionTimestamp?: string };
    status?: { conditions?: Array<{ type: string; status: string; reason?: string; lastTransitionTime?: string }> };
  };
  return { deletionTimestamp: pod.metadata.deletionTimestamp, gate: pod.status?.conditions?.find((c) => c.type === GATE) };
}

describe('GET /leave-rotation (real apiserver)', () => {
  const dir = useTempDir();

  it('answers 409 and changes nothing until the Pod is terminating, then withdraws, waits and leaves the gate', async () => {
    const ns = await exampleNamespace(cp());
    const name = 'proxy-0';
    const pod = {
      apiVersion: 'v1',
      kind: 'Pod',
      metadata: { name, finalizers: [HOLD] },
      spec: { serviceAccountName: 'certshare', readinessGates: [{ conditionType: GATE }], containers: [{ name: 'proxy', image: 'nginx' }] },
    };
    await must(cp().kubectl(['-n', ns, 'create', '-f', '-'], { input: JSON.stringify(pod) }));
    const proxy = await startTlsProxy(await makePair(KUBE_DOMAIN, Date.now() - DAY, 30 * DAY));
    const log = recordingLogger();
    const replica = await startReplica(cp(), ns, dir(), name, {
      logger: log.logger,
      flags: [
        '--readiness-gate',
        GATE,
        '--served-check',
        `127.0.0.1:${proxy.port}`,
        '--served-check-interval',
        '1s',
        '--advertise-services',
        SERVICE,
        '--advertise-failover',
        '400ms',
        '--drain-delay',
        '600ms',
        '--shutdown-timeout',
        '5s',
        '--leave-token',
        TOKEN,
      ],
    });
    const advertised = (): boolean => replica.emulator.prefs.advertiseServices.includes(SERVICE);
    const url = `${replica.daemon.address}/leave-rotation`;
    try {
      // Held, then projected: the files land a moment after the loop reports the certificate.
      await until('the certificate held', () => replica.daemon.health.infoOf(KUBE_DOMAIN) !== undefined, [every(50)], 30_000);
      await until(
        'the certificate projected',
        () => ['tls.crt', 'tls.key'].every((f) => existsSync(join(replica.outDir, KUBE_DOMAIN, f))),
        [every(50)],
        30_000,
      );
      proxy.serve({
        certPem: await readFile(join(replica.outDir, KUBE_DOMAIN, 'tls.crt'), 'utf8'),
        keyPem: await readFile(join(replica.outDir, KUBE_DOMAIN, 'tls.key'), 'utf8'),
      });
      await until('advertised', advertised, [every(50)], 30_000);
      const deadline = Date.now() + 30_000;
      let before = await podState(ns, name);
      while (before.gate?.status !== 'True') {
        assert.ok(Date.now() < deadline, `the gate never turned True: ${JSON.stringify(before)}`);
        await new Promise((r) => setTimeout(r, 100));
        before = await podState(ns, name);
      }

      for (const headers of [{}, { 'certshare-leave-token': 'leave-token-0123456780' }, { 'certshare-leave-token': 'short' }])
        assert.equal((await fetch(url, { headers })).status, 403, JSON.stringify(headers));
      const edits = replica.emulator.prefs.edits;
      const early = await fetch(url, { headers: { 'certshare-leave-token': TOKEN } });
      assert.equal(early.status, 409, 'the token alone, on a Pod nobody deletes');
      assert.match(await early.text(), /not terminating/);
      assert.equal(advertised(), true, 'still advertised');
      assert.equal(replica.emulator.prefs.edits, edits, 'no prefs edit');
      assert.deepEqual(await podState(ns, name), before, 'the readiness condition untouched');

      const deleted = await cp().adminRequest('DELETE', `/api/v1/namespaces/${ns}/pods/${name}`);
      assert.equal(deleted.status, 200, deleted.body);
      assert.ok((await podState(ns, name)).deletionTimestamp, 'terminating: the finalizer holds it');
      const asked = Date.now();
      const answer = await fetch(url, { headers: { 'certshare-leave-token': TOKEN } });
      const tookMs = Date.now() - asked;
      assert.equal(answer.status, 200);
      assert.equal(await answer.text(), 'left rotation');
      assert.equal(advertised(), false, 'withdrawn before the answer');
      assert.ok(tookMs >= 550, `answered after the failover wait and the drain delay (${tookMs} ms)`);
      const after = await podState(ns, name);
      assert.equal(after.gate?.status, 'False');
      assert.equal(after.gate?.reason, 'Terminating');
      const withdrawn = replica.emulator.prefs.edits;
      await replica.daemon.stop();
      assert.equal(replica.emulator.prefs.edits, withdrawn, 'no second edit on stop');
      assert.equal(log.entries.filter((e) => e.msg?.includes('waiting for control to move clients')).length, 1, 'no second failover wait on stop');
    } finally {
      await replica.stop();
      await proxy.close();
      await cp().adminRequest('PATCH', `/api/v1/namespaces/${ns}/pods/${name}`, {
        headers: { 'content-type': 'application/merge-patch+json' },
        body: { metadata: { finalizers: null } },
      });
    }
  });
});
