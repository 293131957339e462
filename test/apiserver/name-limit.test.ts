// Issue 39: a burst of renew requests, under the real renew account of manifests/renew, does not spend the
// CA's limit for the name (--name-limit 5/168h, Let's Encrypt's): three are served, then each is refused
// with CERTSHARE_RENEW_RESERVE, keeping two issuances of the window for the ordinary renewals; a restarted
// writer (nothing in memory) finds the same count in the ledger ConfigMap. An id already served, asked again
// (the account writes any id), is a new request: on 7226645 it found its old slot and was served uncounted, 7
// certificates of the name in its window.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, it } from 'node:test';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { makePair } from '../support/certs.ts';
import { GROUP, KUBE_DOMAIN, exampleNamespace, heldSerial, must, startReplica, type Replica } from '../support/kube.ts';
import { useTempDir } from '../support/standalone.ts';
import { nextEvent, onEvent, until } from '../support/wait.ts';
import { connectKube, type KubeConnection } from '../../src/kube/connection.ts';
import { renewAnswer, requestRenewal } from '../../src/kube/secret-renew-request.ts';

const cp = useControlPlane();
const RENEW = fileURLToPath(new URL('../../manifests/renew', import.meta.url));
const LIMIT = ['--name-limit', '5/168h'];
const DAY = 86_400_000;

/** The Secret already holds a 90-day certificate obtained two days ago: nothing is due, nothing counted yet. */
async function storedCertificate(ns: string): Promise<void> {
  const pair = await makePair(KUBE_DOMAIN, Date.now() - 2 * DAY, 90 * DAY);
  const data = { 'tls.crt': Buffer.from(pair.certPem).toString('base64'), 'tls.key': Buffer.from(pair.keyPem).toString('base64') };
  const labels = { 'app.kubernetes.io/managed-by': 'certshare', 'certshare.io/group': GROUP };
  const body = { apiVersion: 'v1', kind: 'Secret', type: 'kubernetes.io/tls', metadata: { name: KUBE_DOMAIN, labels }, data };
  const res = await cp().adminRequest('POST', `/api/v1/namespaces/${ns}/secrets`, { body });
  assert.equal(res.status, 201, res.body);
}

/** A namespace with manifests/renew and a stored certificate, and the renew account's connection to it. */
async function renewNamespace(name: string): Promise<{ ns: string; connection: KubeConnection }> {
  const ns = await exampleNamespace(cp(), name);
  await must(cp().kubectl(['apply', '-k', RENEW, '-n', ns]));
  await storedCertificate(ns);
  const connection = await connectKube({ KUBECONFIG: await cp().kubeconfigFor(ns, 'certshare-renew'), POD_NAMESPACE: ns });
  return { ns, connection };
}

async function writer(ns: string, dir: string): Promise<Replica> {
  const r = await startReplica(cp(), ns, dir, 'proxy-0', { mode: 'rw', flags: LIMIT });
  await until('the writer holds the certificate', () => heldSerial(r) !== undefined, [onEvent(r.daemon.events, 'planned')], 30_000);
  return r;
}

/** Asks for a renewal with the renew account's token, waits for the writer's answer, and returns what the Secret records. */
async function ask(w: Replica, connection: KubeConnection, id: string): Promise<string> {
  // The emulator stamps validity to the second: the next request after the second the last was obtained in,
  // and not within the writer's least interval between two issuances (--first-retry, 200 ms) either.
  const toNextSecond = 1000 - (Date.now() % 1000);
  await new Promise((resolve) => setTimeout(resolve, toNextSecond < 250 ? toNextSecond + 1000 : toNextSecond));
  const answered = nextEvent<{ id: string; result: string }>(w.daemon.events, 'renewRequest', (a) => a.id === id, 30_000);
  await requestRenewal(connection, KUBE_DOMAIN, id);
  await answered;
  return (await renewAnswer(connection, KUBE_DOMAIN)).outcome ?? '';
}

describe("renew bursts against the CA's limit for one name, with the renew account's real token", () => {
  const dir = useTempDir();

  it('serves three, refuses the rest with CERTSHARE_RENEW_RESERVE, and a restart loses nothing', async () => {
    const { ns, connection } = await renewNamespace('burst');
    let w = await writer(ns, join(dir(), 'a'));
    const outcomes: string[] = [];
    try {
      for (let i = 1; i <= 5; i++) outcomes.push(await ask(w, connection, `burst-${i}`));
      assert.equal(w.emulator.stats().issuances[KUBE_DOMAIN] ?? 0, 3, outcomes.join('\n'));
      assert.match(outcomes[0]!, /^issued \S+; name limit \(5 per 168 h, 2 kept for renewals\): 2 more renew request\(s\) possible now$/);
      assert.match(outcomes[2]!, /^issued \S+; name limit .*: no more renew request before /);
      for (const refused of outcomes.slice(3)) assert.match(refused, /^refused CERTSHARE_RENEW_RESERVE renew request burst-\d for .* fewer than 2 issuances/);

      // A restart, nothing in memory: the ledger ConfigMap still counts the three.
      await w.stop();
      w = await writer(ns, join(dir(), 'b'));
      const answered = nextEvent<{ id: string; result: string; reason?: string }>(w.daemon.events, 'renewRequest', () => true, 30_000);
      await requestRenewal(connection, KUBE_DOMAIN, 'after-restart');
      assert.deepEqual(await answered.then((a) => [a.result, a.reason]), ['refused', 'name_reserve']);
      assert.equal(w.emulator.stats().issuances[KUBE_DOMAIN] ?? 0, 0);
    } finally {
      connection.close();
      await w.stop();
    }
  });

  // The renew account may write any id, an old one too, once another request was answered since (its own
  // refused one will do): the slot its first asking took is no retry of a call that failed.
  it('an id already served, asked again, is a new request: refused past the reserve, nothing issued', async () => {
    const { ns, connection } = await renewNamespace('replay');
    const w = await writer(ns, join(dir(), 'replay'));
    try {
      for (let i = 1; i <= 3; i++) assert.match(await ask(w, connection, `replay-${i}`), /^issued /);
      const again: string[] = [];
      for (const id of ['replay-1', 'replay-2', 'replay-1', 'replay-2']) again.push(await ask(w, connection, id));
      assert.equal(w.emulator.stats().issuances[KUBE_DOMAIN] ?? 0, 3, again.join('\n'));
      for (const refused of again) assert.match(refused, /^refused CERTSHARE_RENEW_RESERVE renew request replay-\d for /);
    } finally {
      connection.close();
      await w.stop();
    }
  });
});
