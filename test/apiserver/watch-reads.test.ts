// Reads come from the watch: a reader follows renewals with no GET of its Secret (counted in the API
// server's audit log), in both watch scopes; `--watch-scope group` serves many domains with one watch,
// ignores Secrets outside its group, tells a hand-edited Secret (unusable) from a missing one (absent),
// and refuses to start under a Role that cannot list and watch the namespace's Secrets.
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { EventEmitter } from 'node:events';
import { readAudit, writeAuditPolicy, type AuditEvent } from '../../bench/lib/apiserver.ts';
import { parseFlags } from '../../src/flags/flags.ts';
import { RUN_FLAGS, daemonConfigFrom } from '../../src/config/run-options.ts';
import { validateCertPair } from '../../src/core/certificates/certificate.ts';
import { systemClock } from '../../src/core/ports/clock.ts';
import { CertshareError } from '../../src/core/errors.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import { startDaemon } from '../../src/daemon/daemon.ts';
import { connectKube } from '../../src/kube/connection.ts';
import { ANNOTATION_INTENT, certSecret } from '../../src/kube/secret-codec.ts';
import { KubeSecretStore } from '../../src/kube/secret-store.ts';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { DAY, makePair } from '../support/certs.ts';
import { recordingLogger } from '../support/recording-logger.ts';
import { GROUP, KUBE_DOMAIN, allowGroupScope, exampleNamespace, filesWritten, heldSerial, replicaArgs, startReplica, startReplicas } from '../support/kube.ts';
import { useTempDir } from '../support/standalone.ts';
import { nextEvent, onEvent, until } from '../support/wait.ts';

const auditDir = mkdtempSync(join(tmpdir(), 'certshare-audit-'));
const auditPolicy = join(auditDir, 'policy.yaml');
const auditLog = join(auditDir, 'audit.log');
before(() => writeAuditPolicy(auditPolicy));
after(() => rm(auditDir, { recursive: true, force: true }));
const cp = useControlPlane({ extraApiServerArgs: [`--audit-policy-file=${auditPolicy}`, `--audit-log-path=${auditLog}`, '--audit-log-format=json'] });

/**
 * Requests of a ServiceAccount since `since` (epoch ms), from the audit log: each completed request, and
 * each watch once it started streaming (its completion comes only when it ends).
 */
async function requestsOf(ns: string, serviceAccount: string, since: number): Promise<AuditEvent[]> {
  const user = `system:serviceaccount:${ns}:${serviceAccount}`;
  return (await readAudit(auditLog)).filter(
    (e) =>
      e.user.username === user &&
      Date.parse(e.stageTimestamp) >= since &&
      (e.verb === 'watch' ? e.stage === 'ResponseStarted' : e.stage === 'ResponseComplete'),
  );
}
const secretGets = (events: AuditEvent[]): AuditEvent[] => events.filter((e) => e.verb === 'get' && e.objectRef?.resource === 'secrets');
const watchesOf = (events: AuditEvent[]): AuditEvent[] => events.filter((e) => e.verb === 'watch' && e.objectRef?.resource === 'secrets');

/** A Secret as certshare's writer writes it, holding a fresh certificate for `domain`, in `group`. */
async function writerSecret(ns: string, domain: string, group: string | undefined): Promise<unknown> {
  const pair = await makePair(domain, Date.now() - DAY, 90 * DAY);
  return certSecret(
    domain,
    undefined,
    { namespace: ns, group, writer: 'test' },
    { cert: { pair, info: validateCertPair(pair, domain, Date.now()) }, coordination: {} },
  );
}

async function admin(method: string, path: string, body?: unknown): Promise<void> {
  const res = await cp().adminRequest(
    method,
    path,
    body === undefined ? {} : { body, ...(method === 'PATCH' ? { headers: { 'content-type': 'application/merge-patch+json' } } : {}) },
  );
  if (res.status >= 300) throw new Error(`${method} ${path}: HTTP ${res.status}: ${res.body.slice(0, 300)}`);
}

describe('reads served by the watch', () => {
  const dir = useTempDir();

  for (const scope of ['secret', 'group'] as const) {
    it(`a reader (--watch-scope ${scope}) follows renewals without a single GET of its Secret, nor does the writer`, { timeout: 90_000 }, async (t) => {
      const ns = await exampleNamespace(cp());
      if (scope === 'group') await allowGroupScope(cp(), ns);
      // 8 s certificates: a renewal every 4 s.
      const flags = ['--watch-scope', scope];
      const writer = await startReplica(cp(), ns, dir(), 'proxy-0', { mode: 'rw', flags, emulator: { certLifetimeMs: 8000 } });
      // The reader reads the Secret itself once a renewal is --first-retry late (a stalled watch's safety net):
      // 2 s here, not the tests' 200 ms, so that a loaded machine's slower renewal is not taken for a stall.
      const [reader] = await startReplicas(cp(), ns, dir(), ['proxy-1'], {
        mode: 'ro',
        serviceAccount: 'certshare-reader',
        flags: [...flags, '--first-retry', '2s'],
      });
      try {
        await until('the reader has the certificate', () => heldSerial(reader!) !== undefined, [filesWritten(reader!)], 20_000);
        const since = Date.now();
        for (let i = 0; i < 2; i++) {
          const issued = await nextEvent<{ serial: string }>(writer.emulator.events, 'issued', () => true, 15_000);
          await until(`the reader has renewal ${i + 1}`, () => heldSerial(reader!) === issued.serial, [filesWritten(reader!)], 5000);
        }
        const readerRequests = await requestsOf(ns, 'certshare-reader', since);
        const writerRequests = await requestsOf(ns, 'certshare', since);
        t.diagnostic(
          `during two renewals: reader ${readerRequests.length} requests (${secretGets(readerRequests).length} GETs of a Secret), ` +
            `writer ${writerRequests.length} (${secretGets(writerRequests).length} GETs): ${writerRequests.map((e) => e.verb).join(' ')}`,
        );
        const described = (events: AuditEvent[]) =>
          events.map((e) => `${e.verb} ${e.requestURI} (${e.responseStatus?.code ?? '?'}) at +${Date.parse(e.stageTimestamp) - since} ms`).join(', ');
        assert.equal(secretGets(readerRequests).length, 0, `the reader takes each renewal from its watch event: ${described(readerRequests)}`);
        assert.equal(secretGets(writerRequests).length, 0, 'the writer CASes on its own answers and the watch, without re-reading');
      } finally {
        await Promise.all([writer.stop(), reader!.stop()]);
      }
    });
  }

  it('--watch-scope group: one watch serves many domains, ignores Secrets outside the group, tells unusable from absent', { timeout: 60_000 }, async () => {
    const ns = await exampleNamespace(cp());
    await allowGroupScope(cp(), ns);
    const domains = Array.from({ length: 30 }, (_, i) => `d${i}.tailnet-0000.ts.net`);
    const otherGroup = 'other.tailnet-0000.ts.net';
    const unlabelled = 'plain.tailnet-0000.ts.net';
    for (const d of domains.slice(0, 20)) await admin('POST', `/api/v1/namespaces/${ns}/secrets`, await writerSecret(ns, d, GROUP));
    await admin('POST', `/api/v1/namespaces/${ns}/secrets`, await writerSecret(ns, otherGroup, 'another-group'));
    const plain = (await writerSecret(ns, unlabelled, undefined)) as { metadata: { labels?: unknown } };
    delete plain.metadata.labels;
    await admin('POST', `/api/v1/namespaces/${ns}/secrets`, plain);

    const since = Date.now();
    const connection = await connectKube({ KUBECONFIG: await cp().kubeconfigFor(ns, 'certshare-reader'), POD_NAMESPACE: ns });
    const store = new KubeSecretStore({ connection, clock: systemClock, logger: silentLogger, group: GROUP, watchScope: 'group' });
    const signal = new AbortController().signal;
    await store.start();
    const woken = new Map<string, number>();
    const offs = [...domains, otherGroup, unlabelled].map((d) => store.watch(d, () => woken.set(d, (woken.get(d) ?? 0) + 1)));
    try {
      for (const d of domains.slice(0, 20)) assert.equal((await store.load(d, signal)).state, 'valid', d);
      for (const d of [...domains.slice(20), otherGroup, unlabelled]) assert.equal((await store.load(d, signal)).state, 'absent', d);

      // The writer stores ten more: each wakes its own domain's listener, and only that one.
      woken.clear();
      for (const d of domains.slice(20)) await admin('POST', `/api/v1/namespaces/${ns}/secrets`, await writerSecret(ns, d, GROUP));
      const onWake = (listener: () => void) => {
        const offs2 = [...domains, otherGroup, unlabelled].map((d) => store.watch(d, listener));
        return () => {
          for (const off of offs2) off();
        };
      };
      await until('each new Secret delivered', () => domains.slice(20).every((d) => woken.has(d)), [onWake], 10_000);
      for (const d of domains) assert.equal((await store.load(d, signal)).state, 'valid', d);
      assert.ok(
        domains.slice(0, 20).every((d) => !woken.has(d)),
        'Secrets that did not change wake nobody',
      );

      // Changes outside the group wake nobody and stay invisible.
      await admin('PATCH', `/api/v1/namespaces/${ns}/secrets/${otherGroup}`, { metadata: { annotations: { touched: 'yes' } } });
      await admin('PATCH', `/api/v1/namespaces/${ns}/secrets/${unlabelled}`, { metadata: { annotations: { touched: 'yes' } } });
      // A hand edit that breaks a certificate is unusable, not absent; a deleted Secret is absent.
      await admin('PATCH', `/api/v1/namespaces/${ns}/secrets/${domains[0]}`, { data: { 'tls.crt': Buffer.from('garbage').toString('base64') } });
      await admin('DELETE', `/api/v1/namespaces/${ns}/secrets/${domains[1]}`);
      await until('edit and delete delivered', () => woken.has(domains[0]!) && woken.has(domains[1]!), [onWake], 10_000);
      assert.equal((await store.load(domains[0]!, signal)).state, 'unusable');
      assert.equal((await store.load(domains[1]!, signal)).state, 'absent');
      assert.equal(woken.get(otherGroup), undefined, 'a Secret of another group is not ours');
      assert.equal(woken.get(unlabelled), undefined, 'an unlabelled Secret is not ours');
      assert.equal((await store.load(otherGroup, signal)).state, 'absent');

      const requests = await requestsOf(ns, 'certshare-reader', since);
      assert.equal(watchesOf(requests).length, 1, `one watch for ${domains.length} domains`);
      assert.equal(store.gets, 0, 'every read came from the watch');
      assert.equal(secretGets(requests).length, 0, 'no GET of a Secret in the audit log');
      assert.equal(requests.filter((e) => e.verb === 'list').length, 1, 'one list for the whole group');
    } finally {
      for (const off of offs) off();
      await store.stop();
    }
  });

  it('--watch-scope group under a Role without list/watch of the namespace: start-up fails with the 403 and a hint', { timeout: 60_000 }, async () => {
    const ns = await exampleNamespace(cp());
    const kubeconfig = await cp().kubeconfigFor(ns, 'certshare-reader');
    const env = { KUBECONFIG: kubeconfig, POD_NAME: 'proxy-1', POD_NAMESPACE: ns };
    const values = parseFlags(RUN_FLAGS, [...replicaArgs('http://127.0.0.1:1', join(dir(), 'forbidden'), 'ro'), '--watch-scope', 'group'], {});
    await assert.rejects(startDaemon(daemonConfigFrom(values, env), { logger: silentLogger, env }), (err: CertshareError) => {
      assert.equal(err.code, 'CERTSHARE_BAD_CONFIG');
      assert.match(err.message, /--watch-scope group: needs list and watch on Secrets in namespace .*403 Forbidden/);
      assert.match(err.message, /manifests\/group-scope|--watch-scope secret/);
      return true;
    });
    // The same Role serves the default scope.
    const reader = await startReplica(cp(), ns, dir(), 'proxy-1', { mode: 'ro', serviceAccount: 'certshare-reader' });
    await reader.stop();
  });

  it('a stale copy costs a 409, never a write on a state not read; a failed watch reads from the API server, and fails loudly', {
    timeout: 90_000,
  }, async () => {
    const ns = await exampleNamespace(cp());
    await allowGroupScope(cp(), ns);
    const connection = await connectKube({ KUBECONFIG: await cp().kubeconfigFor(ns, 'certshare'), POD_NAMESPACE: ns });
    const { logger, entries, events } = recordingLogger();
    const store = new KubeSecretStore({ connection, clock: systemClock, logger, group: GROUP });
    const signal = new AbortController().signal;
    const isConflict = (err: unknown) => err instanceof CertshareError && err.code === 'CERTSHARE_STORE_CONFLICT';
    const changed = new EventEmitter();
    let wakes = 0;
    const off = store.watch(KUBE_DOMAIN, () => {
      wakes++;
      changed.emit('change');
    });
    const woken = (after: number, what: string) => until(what, () => wakes > after, [onEvent(changed, 'change')], 10_000);
    try {
      await woken(0, 'the first list');
      assert.equal((await store.load(KUBE_DOMAIN, signal)).state, 'absent', 'a synced list without the Secret');
      const pair = await makePair(KUBE_DOMAIN, Date.now() - DAY, 90 * DAY);
      let seen = wakes;
      await store.save(KUBE_DOMAIN, { pair, info: validateCertPair(pair, KUBE_DOMAIN, Date.now()) }, signal);
      await woken(seen, 'our own write delivered');
      assert.equal((await store.load(KUBE_DOMAIN, signal)).state, 'valid');
      assert.equal(store.gets, 0, 'served from the watch');

      // Another writer records its intent; our watch delivers it, but our last load() saw the state before:
      // our intent (a compare-and-swap on what we decided on) loses, and the next load() asks the API server.
      seen = wakes;
      const intent = JSON.stringify({ holder: 'proxy-9', at: new Date().toISOString() });
      await admin('PATCH', `/api/v1/namespaces/${ns}/secrets/${KUBE_DOMAIN}`, { metadata: { annotations: { [ANNOTATION_INTENT]: intent } } });
      await woken(seen, 'the other intent delivered');
      await assert.rejects(store.recordIntent(KUBE_DOMAIN, 'proxy-0', Date.now(), signal), isConflict);
      const read = await store.load(KUBE_DOMAIN, signal);
      assert.equal(read.coordination?.intent?.holder, 'proxy-9');
      assert.equal(store.gets, 1, 'after a lost compare-and-swap, one GET');
      await store.recordIntent(KUBE_DOMAIN, 'proxy-0', Date.now(), signal);

      // The API server goes away: once the watch has failed, load() asks the API server and fails loudly.
      await cp().stopApiServer();
      try {
        await until('the watch failed', () => entries.some((e) => e.msg === 'Secret watch failed'), [onEvent(events, 'entry')], 30_000);
        await assert.rejects(store.load(KUBE_DOMAIN, signal), (err: unknown) => err instanceof CertshareError && err.code === 'CERTSHARE_STORE_UNAVAILABLE');
      } finally {
        await cp().startApiServer();
      }
      assert.equal((await store.load(KUBE_DOMAIN, signal)).state, 'valid');
    } finally {
      off();
      await store.stop();
    }

    // Group scope: an unlabelled Secret is absent from the group's view; writing it is a create, which the
    // API server refuses (409 AlreadyExists), and the next load() reads what really is there.
    const unlabelled = (await writerSecret(ns, 'plain.tailnet-0000.ts.net', undefined)) as { metadata: { labels?: unknown } };
    delete unlabelled.metadata.labels;
    await admin('POST', `/api/v1/namespaces/${ns}/secrets`, unlabelled);
    const group = new KubeSecretStore({ connection, clock: systemClock, logger: silentLogger, group: GROUP, watchScope: 'group' });
    await group.start();
    const offPlain = group.watch('plain.tailnet-0000.ts.net', () => {});
    try {
      assert.equal((await group.load('plain.tailnet-0000.ts.net', signal)).state, 'absent');
      await assert.rejects(group.recordIntent('plain.tailnet-0000.ts.net', 'proxy-0', Date.now(), signal), isConflict);
      assert.equal((await group.load('plain.tailnet-0000.ts.net', signal)).state, 'valid', 'read from the API server after the conflict');
    } finally {
      offPlain();
      await group.stop();
    }
  });
});
