// Renew now against a real kube-apiserver and etcd (issue 34): `certshare renew <domain>` under the renew
// account of manifests/renew (patch on the domain's Secret, nothing else), the writer in kube mode with
// its emulated tailscaled. Two requests while one is pending make one order; a writer restarted
// mid-request issues once; the budget refuses with its reason; the renew token can do nothing else.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { X509Certificate } from 'node:crypto';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, it } from 'node:test';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { KUBE_DOMAIN, exampleNamespace, heldSerial, must, startReplica, type Replica, type SecretObject } from '../support/kube.ts';
import { about, watchEvents } from '../support/kube-events.ts';
import { recordingLogger } from '../support/recording-logger.ts';
import { useTempDir } from '../support/standalone.ts';
import { asAccount } from '../support/token-request.ts';
import { nextEvent, onEvent, until } from '../support/wait.ts';
import { connectKube } from '../../src/kube/connection.ts';
import { requestRenewal } from '../../src/kube/secret-renew-request.ts';
import { makePair } from '../support/certs.ts';

const cp = useControlPlane();
const MAIN = fileURLToPath(new URL('../../src/cli/main.ts', import.meta.url));
const RENEW = fileURLToPath(new URL('../../manifests/renew', import.meta.url));
/** A minimum interval long enough that a second request right after the first is refused. */
const LONG_INTERVAL = ['--first-retry', '1m', '--retry-cap', '5m'];
const DAY = 86_400_000;
const issuances = (r: Replica): number => r.emulator.stats().issuances[KUBE_DOMAIN] ?? 0;
const certRequests = (r: Replica): number => r.emulator.stats().certRequests[KUBE_DOMAIN] ?? 0;

async function secret(ns: string): Promise<SecretObject> {
  const res = await cp().adminRequest('GET', `/api/v1/namespaces/${ns}/secrets/${KUBE_DOMAIN}`);
  assert.equal(res.status, 200, res.body);
  return JSON.parse(res.body) as SecretObject;
}
const serialOf = (s: SecretObject): string => new X509Certificate(Buffer.from(s.data!['tls.crt']!, 'base64')).serialNumber;
const keyOf = (s: SecretObject): string => Buffer.from(s.data!['tls.key']!, 'base64').toString('utf8');
const annotation = (s: SecretObject, name: string): string | undefined => s.metadata.annotations?.[`certshare.io/${name}`];

/**
 * The example namespace with manifests/renew applied, and the renew account's kubeconfig. `stored`: the
 * domain's Secret already holds a 90-day certificate obtained two hours ago (so no minimum interval runs
 * from it, and no first issuance takes a slot of the budget).
 */
async function renewNamespace(options: { stored?: boolean } = {}): Promise<{ ns: string; kubeconfig: string }> {
  const ns = await exampleNamespace(cp(), 'renew');
  await must(cp().kubectl(['apply', '-k', RENEW, '-n', ns]));
  if (options.stored) {
    const pair = await makePair(KUBE_DOMAIN, Date.now() - 2 * 3_600_000, 90 * DAY);
    const body = {
      apiVersion: 'v1',
      kind: 'Secret',
      type: 'kubernetes.io/tls',
      metadata: { name: KUBE_DOMAIN, labels: { 'app.kubernetes.io/managed-by': 'certshare', 'certshare.io/group': 'proxy' } },
      data: { 'tls.crt': Buffer.from(pair.certPem).toString('base64'), 'tls.key': Buffer.from(pair.keyPem).toString('base64') },
    };
    const res = await cp().adminRequest('POST', `/api/v1/namespaces/${ns}/secrets`, { body });
    assert.equal(res.status, 201, res.body);
  }
  return { ns, kubeconfig: await cp().kubeconfigFor(ns, 'certshare-renew') };
}

/** `certshare renew` as a process under the renew account. */
async function renewCli(kubeconfig: string, ns: string, ...flags: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn(process.execPath, [MAIN, 'renew', KUBE_DOMAIN, '--namespace', ns, ...flags], {
    env: { PATH: process.env.PATH, KUBECONFIG: kubeconfig },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.setEncoding('utf8').on('data', (c: string) => (stdout += c));
  child.stderr.setEncoding('utf8').on('data', (c: string) => (stderr += c));
  const timer = setTimeout(() => child.kill('SIGKILL'), 60_000);
  const [code] = (await once(child, 'exit')) as [number | null];
  clearTimeout(timer);
  return { code, stdout, stderr };
}

/** The writer holds its first certificate and has finished the turn that stored it. */
async function writerWithCertificate(ns: string, dir: string, name = 'proxy-0', extra: Partial<Parameters<typeof startReplica>[4]> = {}): Promise<Replica> {
  const writer = await startReplica(cp(), ns, dir, name, { mode: 'rw', ...extra });
  await until('the writer holds a certificate', () => heldSerial(writer) !== undefined, [onEvent(writer.daemon.events, 'planned')], 30_000);
  return writer;
}

/** Resolves once the emulator has received `n` cert requests (the writer's call is under way). */
const callsReached = (r: Replica, n: number): Promise<void> =>
  until(`${n} cert requests`, () => certRequests(r) >= n, [onEvent(r.emulator.events, 'certRequest')], 20_000);

describe('renew now against a real apiserver', () => {
  const dir = useTempDir();

  it('two requests while one is pending make one order with a new key, an Event and the metrics; a later one is refused by the minimum interval', async () => {
    const { ns, kubeconfig } = await renewNamespace({ stored: true });
    const writer = await writerWithCertificate(ns, join(dir(), 'one'), 'proxy-0', { flags: [...LONG_INTERVAL, '--cert-timeout', '1m'] });
    const events = watchEvents(cp(), ns);
    try {
      const before = await secret(ns);
      const [issued0, calls0] = [issuances(writer), certRequests(writer)];
      // The writer's call takes 15 s (its timeout 1 min): the second request (a process of its own, its start seconds long on a loaded
      // machine) arrives while the first is pending.
      writer.emulator.injectFault('cert:slow:delay=15s');
      const served = nextEvent<{ id: string; result: string; serial?: string }>(writer.daemon.events, 'renewRequest', () => true, 60_000);
      const first = await renewCli(kubeconfig, ns);
      assert.equal(first.code, 0, first.stderr);
      const id = /renew request (\S+) written/.exec(first.stdout)?.[1];
      assert.ok(id, first.stdout);
      await callsReached(writer, calls0 + 1);
      const second = await renewCli(kubeconfig, ns);
      assert.equal(second.code, 0, second.stderr);
      assert.match(second.stdout, new RegExp(`renew request ${id.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')} is already pending`));

      const answer = await served;
      assert.deepEqual([answer.id, answer.result], [id, 'issued']);
      const after = await secret(ns);
      assert.equal(issuances(writer), issued0 + 1, 'exactly one order');
      assert.equal(certRequests(writer), calls0 + 1, 'exactly one call');
      assert.notEqual(serialOf(after), serialOf(before));
      assert.notEqual(keyOf(after), keyOf(before), 'a new key');
      assert.equal(annotation(after, 'renew-answered'), id);
      assert.equal(annotation(after, 'renew-outcome'), `issued ${serialOf(after)}`);
      const metrics = await writer.daemon.metrics.registry.metrics();
      assert.match(metrics, new RegExp(`certshare_renew_requests_total\\{domain="${KUBE_DOMAIN}",result="issued",reason="operator_requested"\\} 1`));
      assert.match(metrics, /certshare_issuance_attempts_total\{[^}]*result="success",reason="operator_requested"\} 1/);
      await until('a Renewed Event', () => about(events.events, 'proxy-0', 'Renewed').some((e) => /operator_requested/.test(e.note ?? '')), [
        onEvent(events.changed, 'change'),
      ]);

      // Served: a new request inside the minimum interval (1m) is refused, with its reason, and issues nothing.
      const third = await renewCli(kubeconfig, ns, '--wait', '30s');
      assert.equal(third.code, 1, third.stdout + third.stderr);
      assert.match(third.stdout, /refused CERTSHARE_RENEW_REFUSED .*\(min_interval\)/);
      assert.equal(issuances(writer), issued0 + 1);
    } finally {
      events.close();
      await writer.stop();
    }
  });

  it('a writer restarted mid-request issues once, and a request made while it is down is served once after its start', async () => {
    const { ns, kubeconfig } = await renewNamespace({ stored: true });
    const connection = await connectKube({ KUBECONFIG: kubeconfig, POD_NAMESPACE: ns });
    let writer = await writerWithCertificate(ns, join(dir(), 'restart-a'));
    try {
      // Stopped while its CertPair call for the request is under way: the stop lets the call end and
      // stores its certificate with the answer, in one write.
      writer.emulator.injectFault('cert:slow:delay=2s');
      const calls0 = certRequests(writer);
      const { id } = await requestRenewal(connection, KUBE_DOMAIN, 'restart-1');
      await callsReached(writer, calls0 + 1);
      await writer.stop();
      assert.equal(writer.emulator.stats().issuances[KUBE_DOMAIN], 1, 'the certificate for the request');
      let stored = await secret(ns);
      assert.equal(annotation(stored, 'renew-answered'), id, 'answered with the certificate');

      // The restart (nothing in memory, a new tailscaled) finds the request answered: no call at all.
      writer = await writerWithCertificate(ns, join(dir(), 'restart-b'));
      assert.equal(certRequests(writer), 0, 'the restarted writer called tailscaled for an answered request');
      await writer.stop();

      // A request made while no writer runs is served once by the next. Asked once the minimum interval
      // (200 ms) has passed since the last certificate was obtained, and the second it was stamped in (the
      // emulator's validity is to the second: one issued within the same second would expire no later,
      // and be refused as older): a wait for a known instant, not a guess.
      const obtainedAt = Date.parse(annotation(stored, 'obtained-at') ?? '');
      assert.ok(Number.isFinite(obtainedAt));
      await new Promise((resolve) => setTimeout(resolve, Math.max(0, obtainedAt + 1000 - Date.now())));
      await requestRenewal(connection, KUBE_DOMAIN, 'restart-2');
      const served = (r: Replica) => nextEvent<{ id: string; result: string }>(r.daemon.events, 'renewRequest', () => true, 30_000);
      writer = await startReplica(cp(), ns, join(dir(), 'restart-c'), 'proxy-0', { mode: 'rw' });
      assert.deepEqual(await served(writer).then((a) => [a.id, a.result]), ['restart-2', 'issued']);
      assert.equal(issuances(writer), 1);
      stored = await secret(ns);
      assert.equal(annotation(stored, 'renew-answered'), 'restart-2');
      await writer.stop();
      writer = await writerWithCertificate(ns, join(dir(), 'restart-d'));
      assert.equal(certRequests(writer), 0);
    } finally {
      connection.close();
      await writer.stop();
    }
  });

  it('the budget refuses with its reason: a CERTSHARE code in the Secret, /healthz?verbose, a log line, an Event and the metrics', async () => {
    const { ns, kubeconfig } = await renewNamespace({ stored: true });
    // One issuance per hour for the tailnet, and another domain of it took the slot a minute ago.
    const at = new Date(Date.now() - 60_000).toISOString();
    const ledger = { entries: [{ domain: 'other.tailnet-0000.ts.net', registeredDomain: 'tailnet-0000.ts.net', at, issued: true }] };
    const map = { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'certshare-proxy-ledger' }, data: { 'ledger.json': JSON.stringify(ledger) } };
    assert.equal((await cp().adminRequest('POST', `/api/v1/namespaces/${ns}/configmaps`, { body: map })).status, 201);
    const log = recordingLogger();
    const writer = await writerWithCertificate(ns, join(dir(), 'budget'), 'proxy-0', { flags: ['--issuance-budget', '1/1h'], logger: log.logger });
    const events = watchEvents(cp(), ns);
    try {
      const calls0 = certRequests(writer);
      const refused = nextEvent<{ result: string; reason?: string }>(writer.daemon.events, 'renewRequest', () => true, 30_000);
      const asked = await renewCli(kubeconfig, ns);
      assert.equal(asked.code, 0, asked.stderr);
      const answer = await refused;
      assert.deepEqual([answer.result, answer.reason], ['refused', 'budget_exhausted']);
      assert.equal(certRequests(writer), calls0, 'no call');
      const stored = await secret(ns);
      assert.match(
        annotation(stored, 'renew-outcome') ?? '',
        /^refused CERTSHARE_RENEW_REFUSED .*\(budget_exhausted\): the issuance budget for tailnet-0000\.ts\.net/,
      );
      const verbose = await fetch(`${writer.daemon.address}/healthz?verbose`).then((r) => r.text());
      assert.match(verbose, /proxy\.tailnet-0000\.ts\.net: renew request \S+: CERTSHARE_RENEW_REFUSED .*budget_exhausted/);
      assert.ok(log.entries.some((e) => e.code === 'CERTSHARE_RENEW_REFUSED' && e.level === 'warn'));
      assert.match(await writer.daemon.metrics.registry.metrics(), /certshare_renew_requests_total\{[^}]*result="refused",reason="budget_exhausted"\} 1/);
      await until('a RenewRefused Event', () => about(events.events, 'proxy-0', 'RenewRefused').length > 0, [onEvent(events.changed, 'change')]);
    } finally {
      events.close();
      await writer.stop();
    }
  });

  it("the renew token may patch the request annotation of the domain's Secret, and nothing else", async () => {
    const { ns, kubeconfig } = await renewNamespace();
    const writer = await writerWithCertificate(ns, join(dir(), 'rbac'));
    await writer.stop();
    await must(cp().kubectl(['-n', ns, 'create', 'secret', 'generic', 'other', '--from-literal=k=v']));
    const secrets = `/api/v1/namespaces/${ns}/secrets`;
    const mine = `${secrets}/${KUBE_DOMAIN}`;
    const patch = (path: string, body: unknown) => asAccount(cp(), kubeconfig, 'PATCH', path, body);
    const request = (id: string | null) => ({ metadata: { annotations: { 'certshare.io/renew-requested': id } } });
    // The policy applies once the apiserver has loaded it (an informer, a second or so after apply).
    const deadline = performance.now() + 30_000;
    for (;;) {
      const r = await patch(`${mine}?dryRun=All`, { data: { 'tls.key': '' } });
      if (r.status === 403 && /renew request annotation only/.test(r.body)) break;
      assert.ok(performance.now() < deadline, `the renew admission policy never took effect: ${r.status} ${r.body}`);
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
    const allowed = await patch(mine, request('rbac-1'));
    assert.equal(allowed.status, 200, `the one right: ${allowed.body}`);
    const refusals: Array<[string, Promise<{ status: number; body: string }>, RegExp]> = [
      ['get', asAccount(cp(), kubeconfig, 'GET', mine), /cannot get/],
      ['list', asAccount(cp(), kubeconfig, 'GET', secrets), /cannot list/],
      ['watch', asAccount(cp(), kubeconfig, 'GET', `${secrets}?watch=1&fieldSelector=metadata.name%3D${KUBE_DOMAIN}`), /cannot watch/],
      ['update', asAccount(cp(), kubeconfig, 'PUT', mine, { apiVersion: 'v1', kind: 'Secret', metadata: { name: KUBE_DOMAIN } }), /cannot update/],
      ['delete', asAccount(cp(), kubeconfig, 'DELETE', mine), /cannot delete/],
      ['create', asAccount(cp(), kubeconfig, 'POST', secrets, { apiVersion: 'v1', kind: 'Secret', metadata: { name: 'mine' } }), /cannot create/],
      ['patch another Secret', patch(`${secrets}/other`, request('rbac-2')), /cannot patch/],
      ['patch the key', patch(mine, { data: { 'tls.key': '' } }), /renew request annotation only/],
      ['patch a label', patch(mine, { metadata: { labels: { x: 'y' } } }), /renew request annotation only/],
      // No replica could store a renewal in it again, nor anyone undo it (on 3d853d5 admitted).
      ['make the Secret immutable', patch(mine, { immutable: true }), /renew request annotation only/],
      ['patch the answer', patch(mine, { metadata: { annotations: { 'certshare.io/renew-answered': 'rbac-1' } } }), /renew-requested annotation only/],
      ['remove the request', patch(mine, request(null)), /annotation only/],
      ['a request id with spaces', patch(mine, request('a b')), /printable/],
      ['pods', asAccount(cp(), kubeconfig, 'GET', `/api/v1/namespaces/${ns}/pods`), /cannot list/],
      ['the ledger', asAccount(cp(), kubeconfig, 'GET', `/api/v1/namespaces/${ns}/configmaps/certshare-proxy-ledger`), /cannot get/],
    ];
    for (const [what, result, expected] of refusals) {
      const r = await result;
      assert.equal(r.status, 403, `${what}: ${r.status} ${r.body}`);
      assert.match(r.body, expected, what);
    }
  });
});
