// Issue 39: the times certshare reads back from objects a credential can write, against a real
// kube-apiserver. The writer's own ServiceAccount token (any replica's holds it) writes a retry date and an
// intent of 9999-12-31 on the domain's Secret, and a ledger entry in 9999: admitted (CEL has no clock), and
// the writer still issues at once, reporting each value (an Event). Malformed values are refused at
// admission (manifests/base/admission-policy.yaml, certshare-writer-annotations). The same token writes its group
// Lease with a holder and a duration of 2^31 s: believed up to twice a replica's own duration; and with a
// leaseTransitions of 2^31 - 1: a takeover keeps that count instead of writing one the apiserver refuses. A tenant
// (`edit`) creates that Lease again with a break-glass claim's label: no claim (not its name), so still written.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { CLAIM_LABEL, GROUP, KUBE_DOMAIN, claimsPolicyInForce, exampleNamespace, heldSerial, must, roleChange, startReplica } from '../support/kube.ts';
import { recordingLogger } from '../support/recording-logger.ts';
import { about, watchEvents } from '../support/kube-events.ts';
import { useTempDir } from '../support/standalone.ts';
import { asAccount } from '../support/token-request.ts';
import { onEvent, until } from '../support/wait.ts';

const cp = useControlPlane();
const YEAR_9999 = '9999-12-31T00:00:00.000Z';
const LEDGER = `certshare-${GROUP}-ledger`;
const issuances = (r: { emulator: { stats(): { issuances: Record<string, number> } } }): number => r.emulator.stats().issuances[KUBE_DOMAIN] ?? 0;

/** The domain's Secret as a writer's token may create it: empty, labelled, with `annotations`. */
const emptySecret = (annotations: Record<string, string>) => ({
  apiVersion: 'v1',
  kind: 'Secret',
  type: 'kubernetes.io/tls',
  metadata: { name: KUBE_DOMAIN, labels: { 'app.kubernetes.io/managed-by': 'certshare', 'certshare.io/group': GROUP }, annotations },
  data: { 'tls.crt': '', 'tls.key': '' },
});

describe("times read back from the writer's own objects, written by its real token", () => {
  const dir = useTempDir();

  it('a retry date and an intent of 9999-12-31 on the Secret hold nobody: the writer issues at once and says why', async () => {
    const ns = await exampleNamespace(cp());
    const token = await cp().kubeconfigFor(ns, 'certshare');
    const created = await asAccount(
      cp(),
      token,
      'POST',
      `/api/v1/namespaces/${ns}/secrets`,
      emptySecret({
        'certshare.io/retry-not-before': YEAR_9999,
        'certshare.io/issuing': JSON.stringify({ holder: 'proxy-9', at: YEAR_9999 }),
      }),
    );
    assert.equal(created.status, 201, `the writer's token may write such dates (CEL cannot compare them with now): ${created.body}`);
    const events = watchEvents(cp(), ns);
    const writer = await startReplica(cp(), ns, join(dir(), 'dates'), 'proxy-0', { mode: 'rw' });
    try {
      await until('a certificate held', () => heldSerial(writer) !== undefined, [onEvent(writer.daemon.events, 'planned')], 30_000);
      assert.equal(issuances(writer), 1);
      await until('both values reported', () => about(events.events, 'proxy-0', 'OutOfBoundsValue').length >= 2, [onEvent(events.changed, 'change')], 15_000);
      const notes = about(events.events, 'proxy-0', 'OutOfBoundsValue').map((e) => e.note ?? '');
      assert.ok(
        notes.some((n) => /^CERTSHARE_UNTRUSTED_VALUE retry-not-before of .* ignored \(9999-12-31T00:00:00\.000Z\)/.test(n)),
        notes.join('\n'),
      );
      assert.ok(
        notes.some((n) => /^CERTSHARE_UNTRUSTED_VALUE issuing of .* ignored \(proxy-9 at 9999-12-31/.test(n)),
        notes.join('\n'),
      );
    } finally {
      events.close();
      await writer.stop();
    }
  });

  it('a ledger entry in 9999 takes no slot: the first issuance is granted at once', async () => {
    const ns = await exampleNamespace(cp());
    const token = await cp().kubeconfigFor(ns, 'certshare');
    const entry = { domain: 'other.tailnet-0000.ts.net', registeredDomain: 'tailnet-0000.ts.net', at: YEAR_9999, issued: false };
    const ledger = { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: LEDGER }, data: { 'ledger.json': `${JSON.stringify({ entries: [entry] })}\n` } };
    const created = await asAccount(cp(), token, 'POST', `/api/v1/namespaces/${ns}/configmaps`, ledger);
    assert.equal(created.status, 201, created.body);
    const writer = await startReplica(cp(), ns, join(dir(), 'ledger'), 'proxy-0', { mode: 'rw', flags: ['--issuance-budget', '1/1h'] });
    try {
      await until('a certificate held', () => heldSerial(writer) !== undefined, [onEvent(writer.daemon.events, 'planned')], 30_000);
      const res = await cp().adminRequest('GET', `/api/v1/namespaces/${ns}/configmaps/${LEDGER}`);
      const stored = JSON.parse((JSON.parse(res.body) as { data: Record<string, string> }).data['ledger.json']!) as { entries: Array<{ domain: string }> };
      assert.deepEqual(
        stored.entries.map((e) => e.domain),
        [KUBE_DOMAIN],
        'the future entry is gone at the write',
      );
    } finally {
      await writer.stop();
    }
  });

  it('a group Lease held for 2^31 s by that token holds nobody past twice the duration: a replica takes it over and issues', async () => {
    const ns = await exampleNamespace(cp());
    const token = await cp().kubeconfigFor(ns, 'certshare');
    // Written once, with a token that may then be rotated or expire: on 7bec7cd no replica ever became the writer.
    const spec = { holderIdentity: 'thief', leaseDurationSeconds: 2_147_483_647, renewTime: new Date().toISOString().replace('Z', '000Z') };
    const lease = { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: `certshare-${GROUP}` }, spec };
    const created = await asAccount(cp(), token, 'POST', `/apis/coordination.k8s.io/v1/namespaces/${ns}/leases`, lease);
    assert.equal(created.status, 201, `the writer's token creates its group's Lease: ${created.body}`);
    const { logger, entries, events } = recordingLogger();
    const recorded = watchEvents(cp(), ns);
    const replica = await startReplica(cp(), ns, join(dir(), 'lease'), 'proxy-0', { mode: 'auto', flags: ['--lease-duration', '2s'], logger });
    try {
      await until('a certificate held', () => heldSerial(replica) !== undefined, [onEvent(replica.daemon.events, 'planned'), roleChange(replica)], 30_000);
      assert.equal(issuances(replica), 1);
      const res = await cp().adminRequest('GET', `/apis/coordination.k8s.io/v1/namespaces/${ns}/leases/certshare-${GROUP}`);
      assert.match((JSON.parse(res.body) as { spec: { holderIdentity: string } }).spec.holderIdentity, /^proxy-0_/);
      await until('the value reported', () => entries.some((e) => e.code === 'CERTSHARE_UNTRUSTED_VALUE'), [onEvent(events, 'entry')], 5_000);
      const line = entries.find((e) => e.code === 'CERTSHARE_UNTRUSTED_VALUE')!;
      assert.match(line.msg ?? '', /lease-duration of the Lease .* ignored \(2147483647s\): longer than 2 times this replica's own duration: taken as 4s$/);
      // Told as every value read back is: an Event about the Pod (and the metric, from the same report).
      const reported = (): string[] => about(recorded.events, 'proxy-0', 'OutOfBoundsValue').map((e) => e.note ?? '');
      await until('the Event recorded', () => reported().some((n) => /lease-duration of the Lease/.test(n)), [onEvent(recorded.changed, 'change')], 15_000);
    } finally {
      recorded.close();
      await replica.stop();
    }
  });

  it('a group Lease whose leaseTransitions that token sets to 2^31 - 1 still changes hands: a replica takes it over and issues', async () => {
    const ns = await exampleNamespace(cp());
    const token = await cp().kubeconfigFor(ns, 'certshare');
    // The count is an int32: a takeover writing one more is refused (400), so on 080ee30 no replica ever became the writer.
    const renewTime = new Date().toISOString().replace('Z', '000Z');
    const spec = { holderIdentity: 'thief', leaseDurationSeconds: 2, leaseTransitions: 2_147_483_647, renewTime };
    const lease = { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: `certshare-${GROUP}` }, spec };
    const created = await asAccount(cp(), token, 'POST', `/apis/coordination.k8s.io/v1/namespaces/${ns}/leases`, lease);
    assert.equal(created.status, 201, `the writer's token creates its group's Lease: ${created.body}`);
    const { logger, entries, events } = recordingLogger();
    const replica = await startReplica(cp(), ns, join(dir(), 'transitions'), 'proxy-0', { mode: 'auto', flags: ['--lease-duration', '2s'], logger });
    try {
      await until('a certificate held', () => heldSerial(replica) !== undefined, [onEvent(replica.daemon.events, 'planned'), roleChange(replica)], 30_000);
      assert.equal(issuances(replica), 1);
      const res = await cp().adminRequest('GET', `/apis/coordination.k8s.io/v1/namespaces/${ns}/leases/certshare-${GROUP}`);
      const stored = (JSON.parse(res.body) as { spec: { holderIdentity: string; leaseTransitions: number } }).spec;
      assert.match(stored.holderIdentity, /^proxy-0_/);
      assert.equal(stored.leaseTransitions, 2_147_483_647, 'kept at the largest count the field holds');
      await until('the value reported', () => entries.some((e) => /lease-transitions of the Lease/.test(e.msg ?? '')), [onEvent(events, 'entry')], 5_000);
    } finally {
      await replica.stop();
    }
  });

  it('a group Lease a tenant (edit) deletes and creates again labelled as a break-glass claim still changes hands: a replica takes it over', async () => {
    const ns = await exampleNamespace(cp());
    await must(cp().kubectl(['-n', ns, 'create', 'serviceaccount', 'tenant']));
    for (const role of ['edit', 'view']) {
      await must(
        cp().kubectl(['-n', ns, 'create', 'rolebinding', `tenant-${role}`, `--clusterrole=system:aggregate-to-${role}`, `--serviceaccount=${ns}:tenant`]),
      );
    }
    const tenant = await cp().kubeconfigFor(ns, 'tenant');
    await claimsPolicyInForce(cp(), ns, tenant);
    const { logger, entries, events } = recordingLogger();
    const replica = await startReplica(cp(), ns, join(dir(), 'claim-label'), 'proxy-0', { mode: 'auto', flags: ['--lease-duration', '2s'], logger });
    try {
      await until('a certificate held', () => heldSerial(replica) !== undefined, [onEvent(replica.daemon.events, 'planned'), roleChange(replica)], 30_000);
      // The claims' policy refuses everyone's update of a Lease carrying the claim's label: on cd68f49 it did so for any
      // Lease, the group's too, and no replica ever wrote again (a 403 at each takeover) until a cluster admin acted.
      const leases = `/apis/coordination.k8s.io/v1/namespaces/${ns}/leases`;
      assert.equal((await asAccount(cp(), tenant, 'DELETE', `${leases}/certshare-${GROUP}`)).status, 200, 'the tenant deletes the group Lease');
      const renewTime = new Date().toISOString().replace('Z', '000Z');
      const labelled = {
        apiVersion: 'coordination.k8s.io/v1',
        kind: 'Lease',
        metadata: { name: `certshare-${GROUP}`, labels: { [CLAIM_LABEL]: 'first' } },
        spec: { holderIdentity: 'tenant', leaseDurationSeconds: 2, renewTime },
      };
      const created = await asAccount(cp(), tenant, 'POST', leases, labelled);
      assert.equal(created.status, 201, `and creates it again, labelled as a claim: ${created.body}`);
      const elected = () => entries.filter((e) => e.msg === 'became the writer').length;
      await until('the replica the writer again', () => elected() >= 2, [onEvent(events, 'entry')], 20_000);
      const res = await cp().adminRequest('GET', `${leases}/certshare-${GROUP}`);
      assert.match((JSON.parse(res.body) as { spec: { holderIdentity: string } }).spec.holderIdentity, /^proxy-0_/);
      assert.equal(issuances(replica), 1, 'no issuance more');
    } finally {
      await replica.stop();
    }
  });

  // Last: the policies applied with the first namespace are in force by now.
  it('refuses at admission what is not in the form certshare writes (dry runs under the same token)', async () => {
    const ns = await exampleNamespace(cp());
    const token = await cp().kubeconfigFor(ns, 'certshare');
    const create = (path: string, body: unknown) => asAccount(cp(), token, 'POST', `/api/v1/namespaces/${ns}/${path}?dryRun=All`, body);
    const malformed: Array<Record<string, string>> = [
      { 'certshare.io/retry-not-before': 'soon' },
      { 'certshare.io/retry-not-before': '+275760-09-13T00:00:00.000Z' },
      { 'certshare.io/issuing': JSON.stringify({ holder: 'proxy-9', at: 'later' }) },
      { 'certshare.io/issuing': `{"holder":"${'x'.repeat(300)}","at":"${YEAR_9999}"}` },
      { 'certshare.io/replaced-now': 'ABC,DEF,123,456,789' },
      { 'certshare.io/replaced-now': 'not-a-serial' },
      { 'certshare.io/replaced-now': 'A'.repeat(43) },
    ];
    for (const annotations of malformed) {
      const res = await create('secrets', emptySecret(annotations));
      assert.equal(res.status, 422, `${JSON.stringify(annotations).slice(0, 80)}: ${res.body}`);
    }
    assert.equal((await create('secrets', emptySecret({ 'certshare.io/retry-not-before': YEAR_9999 }))).status, 201, 'the form certshare writes');
    const replaced = emptySecret({ 'certshare.io/replaced-now': `${'A'.repeat(42)},0123456789abcdef,1,2` });
    assert.equal((await create('secrets', replaced)).status, 201, 'up to 4 serials, as certshare writes them');
    const configMap = (data: Record<string, string>) => ({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: LEDGER }, data });
    assert.equal((await create('configmaps', configMap({ 'ledger.json': '{"other":1}' }))).status, 422);
    assert.equal((await create('configmaps', configMap({ 'ledger.json': '{"entries":[]}', extra: 'x' }))).status, 422);
    assert.equal((await create('configmaps', configMap({ 'ledger.json': '{"entries":[]}\n' }))).status, 201);
  });
});
