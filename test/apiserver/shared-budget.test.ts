// One issuance budget per registered domain (issue 34), against a real kube-apiserver and etcd: two
// groups, each in its own namespace with its own writer, share the ledger of tailnet-0000.ts.net in the
// platform's namespace (--budget-namespace, manifests/budget). 60 new names under 50/168h: at most 50
// first issuances in all, the rest queued with their reason in /healthz and the metrics. The sidecar
// token's rights on the shared ledger: get and update of that one object, and of it only its own
// namespace's part (ledger.<namespace>.json), everything else refused. And what that right gives one
// group's token (a tenant of its namespace mints one) over another's names (issue 40): nothing. The
// apiserver refuses its writes of another group's part, of the 0.1.0 ledger.json and the removal of a part;
// the renewals of the victim's name it writes in its own part hold the victim's renewal not at all (on
// 4a80975 they held it until its safety point, and the token could write every group's entries).
import assert from 'node:assert/strict';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, it } from 'node:test';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { breakGlassPoint } from '../../src/core/federation/home-verdicts.ts';
import type { IssuanceDecision } from '../../src/core/issuance/issuance-policy.ts';
import { held } from '../../src/core/loop/held-certificate.ts';
import { renewalTime } from '../../src/core/renewal/renewal.ts';
import { KUBE_DOMAIN, allowDomains, exampleNamespace, must, namespaceAdmin, startReplica, type Replica } from '../support/kube.ts';
import { JumpClock } from '../support/jump-clock.ts';
import { useTempDir } from '../support/standalone.ts';
import { asAccount } from '../support/token-request.ts';
import { onEvent, until } from '../support/wait.ts';

const cp = useControlPlane();
const BUDGET = fileURLToPath(new URL('../../manifests/budget', import.meta.url));
const LEDGER = 'certshare-budget-tailnet-0000.ts.net';
const names = (from: number, count: number): string[] =>
  Array.from({ length: count }, (_, i) => `host-${String(from + i).padStart(4, '0')}.tailnet-0000.ts.net`);

/** The platform's namespace with manifests/budget, its RoleBinding naming the writer account of each group namespace. */
async function platform(groups: string[]): Promise<string> {
  const ns = `platform-${process.pid}-${groups.length}-${Date.now() % 100_000}`;
  await must(cp().kubectl(['create', 'namespace', ns]));
  await must(cp().kubectl(['apply', '-k', BUDGET, '-n', ns]));
  const subjects = groups.map((g) => ({ kind: 'ServiceAccount', name: 'certshare', namespace: g }));
  await must(
    cp().kubectl([
      '-n',
      ns,
      'patch',
      'rolebinding',
      'certshare-budget',
      '--type=json',
      '-p',
      JSON.stringify([{ op: 'replace', path: '/subjects', value: subjects }]),
    ]),
  );
  return ns;
}

/** Every part's entries, by key (ledger.<namespace>.json, and the 0.1.0 ledger.json). */
async function ledgerParts(ns: string): Promise<Record<string, Array<{ domain: string; issued: boolean }>>> {
  const res = await cp().adminRequest('GET', `/api/v1/namespaces/${ns}/configmaps/${LEDGER}`);
  assert.equal(res.status, 200, res.body);
  const data = (JSON.parse(res.body) as { data: Record<string, string> }).data;
  const parse = (v: string) => {
    try {
      return (JSON.parse(v) as { entries: Array<{ domain: string; issued: boolean }> }).entries;
    } catch {
      return []; // a part garbled on purpose
    }
  };
  return Object.fromEntries(Object.entries(data).map(([k, v]) => [k, parse(v)]));
}

/** A tenant of `ns` (the bootstrap admin and edit roles) mints its sidecar account's token: its kubeconfig, at `path`. */
async function mintedSidecarToken(ns: string, path: string): Promise<string> {
  const tenant = await namespaceAdmin(cp(), ns, 'tenant');
  const body = { apiVersion: 'authentication.k8s.io/v1', kind: 'TokenRequest', spec: { expirationSeconds: 3600 } };
  const minted = await asAccount(cp(), tenant, 'POST', `/api/v1/namespaces/${ns}/serviceaccounts/certshare/token`, body);
  assert.equal(minted.status, 201, `edit creates serviceaccounts/token: ${minted.body}`);
  await writeFile(path, `token: ${(JSON.parse(minted.body) as { status: { token: string } }).status.token}\n`, { mode: 0o600 });
  return path;
}

const queuedIn = async (r: Replica): Promise<number> => {
  const text = await r.daemon.metrics.registry.metrics();
  return Number(/certshare_issuance_queued\{registered_domain="tailnet-0000\.ts\.net"\} (\d+)/.exec(text)?.[1] ?? Number.NaN);
};

describe('one issuance budget per registered domain, shared by the groups of a cluster', () => {
  const dir = useTempDir();

  it('60 new names in two groups under 50/168h: 50 first issuances in all, 10 queued with their reason in /healthz and the metrics', async () => {
    const groups = [await exampleNamespace(cp(), 'grp'), await exampleNamespace(cp(), 'grp')];
    const platformNs = await platform(groups);
    const domains = [names(1, 30), names(31, 30)];
    const writers: Replica[] = [];
    try {
      for (const [i, ns] of groups.entries()) {
        await allowDomains(cp(), ns, domains[i]!);
        writers.push(
          await startReplica(cp(), ns, join(dir(), `g${i}`), 'proxy-0', {
            mode: 'rw',
            // Only the 30 names: the example's own domain is not among the emulator's, so it never asks.
            flags: [...domains[i]!.flatMap((d) => ['--domain', d]), '--issuance-budget', '50/168h', '--budget-namespace', platformNs],
            emulator: { domains: domains[i]! },
          }),
        );
      }
      const issued = (): number => writers.reduce((n, w) => n + w.emulator.stats().issuancesTotal, 0);
      const queuedReasons = (): number =>
        writers.reduce(
          (n, w) => n + (w.daemon.health.evaluate(Date.now()).reason.match(/host-\d{4}\.tailnet-0000\.ts\.net: waiting for the issuance budget/g)?.length ?? 0),
          0,
        );
      // Held: stored, and marked issued in the ledger before that.
      const held = (): number => writers.reduce((n, w, i) => n + domains[i]!.filter((d) => w.daemon.manager.loop(d)?.current !== undefined).length, 0);
      await until(
        '50 held and 10 queued',
        () => held() === 50 && queuedReasons() === 10,
        writers.map((w) => onEvent(w.daemon.events, 'planned')),
        180_000,
      );
      assert.equal(issued(), 50, 'at most 50 first issuances for the tailnet');
      const parts = await ledgerParts(platformNs);
      const entries = Object.values(parts).flat();
      assert.equal(entries.filter((e) => e.issued).length, 50, 'the shared ledger holds the 50');
      assert.equal(new Set(entries.map((e) => e.domain)).size, 50);
      // Each group's in its own namespace's part, and only its own names there.
      for (const [i, ns] of groups.entries()) assert.ok(parts[`ledger.${ns}.json`]!.every((e) => domains[i]!.includes(e.domain)));
      // Every group took some: the budget is the tailnet's, not the first group's.
      for (const w of writers) assert.ok(w.emulator.stats().issuancesTotal > 0);
      assert.equal(
        (await Promise.all(writers.map(queuedIn))).reduce((a, b) => a + b, 0),
        10,
        'certshare_issuance_queued over both writers',
      );
      const verbose = await Promise.all(writers.map((w) => fetch(`${w.daemon.address}/healthz`).then((r) => r.text())));
      assert.equal(verbose.join('\n').match(/waiting for the issuance budget \(50 per 604800s first issuances for tailnet-0000\.ts\.net\)/g)?.length, 10);
      // Each reason names who holds the window's 50, by part (own, and the other namespace's key).
      const holders = [...verbose.join('\n').matchAll(/the window's slots by part: ((?:[\w.-]+ \d+(?:, )?)+)\)/g)].map((m) => m[1]!);
      assert.equal(holders.length, 10, verbose.join('\n'));
      for (const h of holders) {
        const parts = h.split(', ').map((p) => p.split(' '));
        assert.equal(
          parts.reduce((n, [, count]) => n + Number(count), 0),
          50,
          h,
        );
        assert.ok(
          parts.every(([name]) => name === 'own' || groups.some((g) => name === `ledger.${g}.json`)),
          h,
        );
      }
      // Nothing more happens: the queued ones wait for a slot to free in a week.
      const stats = writers.map((w) => w.emulator.stats().certRequests);
      for (const [i, w] of writers.entries()) assert.deepEqual(w.emulator.stats().certRequests, stats[i]);
    } finally {
      await Promise.all(writers.map((w) => w.stop()));
    }
  });

  it('a 0.1.0 ledger read after the upgrade: its first issuances count, it is never written; a garbled part counts for nothing, told', async () => {
    const group = await exampleNamespace(cp(), 'grp');
    const platformNs = await platform([group]);
    // The ledger.json of 0.1.0 (every group's entries in one key): 49 first issuances of this week.
    const at = new Date(Date.now() - 3_600_000).toISOString();
    const old = names(1, 49).map((domain) => ({ domain, registeredDomain: 'tailnet-0000.ts.net', at, issued: true }));
    const legacy = `${JSON.stringify({ entries: old })}\n`;
    const path = `/api/v1/namespaces/${platformNs}/configmaps/${LEDGER}`;
    const patch = { data: { 'ledger.json': legacy, 'ledger.garbled.json': '{"entries":[' } };
    const patched = await cp().adminRequest('PATCH', path, { body: patch, headers: { 'Content-Type': 'application/merge-patch+json' } });
    assert.equal(patched.status, 200, patched.body);
    const domains = names(100, 2);
    await allowDomains(cp(), group, domains);
    const w = await startReplica(cp(), group, join(dir(), 'upgraded'), 'proxy-0', {
      mode: 'rw',
      flags: [...domains.flatMap((d) => ['--domain', d]), '--issuance-budget', '50/168h', '--budget-namespace', platformNs],
      emulator: { domains },
    });
    try {
      const held = (): number => domains.filter((d) => w.daemon.manager.loop(d)?.current !== undefined).length;
      const queued = (): number => w.daemon.health.evaluate(Date.now()).reason.match(/waiting for the issuance budget/g)?.length ?? 0;
      await until('one issued, one queued', () => held() === 1 && queued() === 1, [onEvent(w.daemon.events, 'planned')], 60_000);
      assert.equal(await queuedIn(w), 1);
      assert.equal(w.emulator.stats().issuancesTotal, 1, "the 49 of 0.1.0's ledger count: one slot left of 50");
      const parts = await ledgerParts(platformNs);
      assert.deepEqual(parts['ledger.json'], JSON.parse(legacy).entries, '0.1.0 ledger.json as it was: read, never written');
      assert.equal(parts[`ledger.${group}.json`]?.filter((e) => e.issued).length, 1, "the new first issuance, in the group's own part");
      const metrics = await w.daemon.metrics.registry.metrics();
      assert.match(metrics, /certshare_out_of_bounds_values_total\{field="ledger-part"\} [1-9]/, 'the garbled part, told');
    } finally {
      await w.stop();
    }
  });

  it("a sidecar's token may get and update its registered domain's ledger, and nothing else in the platform's namespace", async () => {
    const groups = [await exampleNamespace(cp(), 'grp')];
    const platformNs = await platform(groups);
    const other = await exampleNamespace(cp(), 'grp'); // a group the RoleBinding does not name
    await must(cp().kubectl(['-n', platformNs, 'create', 'configmap', 'other', '--from-literal=k=v']));
    const sidecar = await cp().kubeconfigFor(groups[0]!, 'certshare');
    const stranger = await cp().kubeconfigFor(other, 'certshare');
    const base = `/api/v1/namespaces/${platformNs}/configmaps`;
    const ledger = `${base}/${LEDGER}`;
    const read = await asAccount(cp(), sidecar, 'GET', ledger);
    assert.equal(read.status, 200, read.body);
    const object = JSON.parse(read.body) as { metadata: { labels: Record<string, string> }; data: Record<string, string> };
    const entry = { domain: 'a.tailnet-0000.ts.net', registeredDomain: 'tailnet-0000.ts.net', at: new Date().toISOString(), issued: false };
    const part = `ledger.${groups[0]}.json`;
    const updated = { ...object, data: { ...object.data, [part]: JSON.stringify({ entries: [entry] }) } };
    // The policy applies once the apiserver has loaded it (an informer, a second or so after apply).
    const deadline = performance.now() + 30_000;
    for (;;) {
      const r = await asAccount(cp(), sidecar, 'PUT', `${ledger}?dryRun=All`, { ...object, data: { ...object.data, [part]: '[]' } });
      if (r.status === 403 && /as certshare writes it/.test(r.body)) break;
      assert.ok(performance.now() < deadline, `the budget ledger policy never took effect: ${r.status} ${r.body}`);
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
    const write = await asAccount(cp(), sidecar, 'PUT', ledger, updated);
    assert.equal(write.status, 200, write.body);
    const current = JSON.parse(write.body) as typeof object & { metadata: { resourceVersion: string } };
    const refusals: Array<[string, Promise<{ status: number; body: string }>, RegExp]> = [
      ['list', asAccount(cp(), sidecar, 'GET', base), /cannot list/],
      ['watch', asAccount(cp(), sidecar, 'GET', `${base}?watch=1&fieldSelector=metadata.name%3D${LEDGER}`), /cannot watch/],
      ['another ConfigMap', asAccount(cp(), sidecar, 'GET', `${base}/other`), /cannot get/],
      [
        'create',
        asAccount(cp(), sidecar, 'POST', base, { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'certshare-budget-x.ts.net' } }),
        /cannot create/,
      ],
      ['delete', asAccount(cp(), sidecar, 'DELETE', ledger), /cannot delete/],
      ['patch', asAccount(cp(), sidecar, 'PATCH', ledger, {}), /cannot patch/],
      ['Secrets', asAccount(cp(), sidecar, 'GET', `/api/v1/namespaces/${platformNs}/secrets`), /cannot list/],
      ['a label', asAccount(cp(), sidecar, 'PUT', ledger, { ...current, metadata: { ...current.metadata, labels: {} } }), /not its labels/],
      ['another key', asAccount(cp(), sidecar, 'PUT', ledger, { ...current, data: { ...current.data, extra: 'x' } }), /own namespace's part/],
      [
        "another namespace's part",
        asAccount(cp(), sidecar, 'PUT', ledger, { ...current, data: { ...current.data, [`ledger.${other}.json`]: '{"entries":[]}' } }),
        /own namespace's part/,
      ],
      [
        'the 0.1.0 ledger.json',
        asAccount(cp(), sidecar, 'PUT', ledger, { ...current, data: { ...current.data, 'ledger.json': JSON.stringify({ entries: [entry] }) } }),
        /own namespace's part/,
      ],
      [
        'its part past 64 KiB',
        asAccount(cp(), sidecar, 'PUT', ledger, { ...current, data: { ...current.data, [part]: `{"entries":[${' '.repeat(65_536)}]}` } }),
        /at most 64 KiB/,
      ],
      ['a group the binding does not name', asAccount(cp(), stranger, 'GET', ledger), /cannot get/],
    ];
    for (const [what, result, expected] of refusals) {
      const r = await result;
      assert.equal(r.status, 403, `${what}: ${r.status} ${r.body}`);
      assert.match(r.body, expected, what);
    }
  });

  it("another group's stolen token may write its own namespace's part only: the victim's part refused, its renewals held not at all", async () => {
    const clock = new JumpClock();
    const [thief, victim] = [await exampleNamespace(cp(), 'grp'), await exampleNamespace(cp(), 'grp')];
    const platformNs = await platform([thief, victim]);
    const stolen = await mintedSidecarToken(thief, join(dir(), 'stolen.kubeconfig'));
    const ledger = `/api/v1/namespaces/${platformNs}/configmaps/${LEDGER}`;
    const policy = { renewFraction: 1 / 3, checkIntervalMs: 3_600_000 };
    const LEAD_MS = 60_000;
    const flags = ['--issuance-budget', '50/168h', '--budget-namespace', platformNs, '--name-limit', '5/168h'];
    const w = await startReplica(cp(), victim, join(dir(), 'victim'), 'proxy-0', {
      mode: 'rw',
      clock,
      flags: [...flags, '--renew-fraction', '1/3', '--readiness-lead', '1m'],
    });
    const decisions: IssuanceDecision[] = [];
    const record = ({ decision }: { decision: IssuanceDecision }): void => void decisions.push(decision);
    w.daemon.events.on('decided', record);
    const current = () => w.daemon.manager.loop(KUBE_DOMAIN)?.current;
    const signed = (): number => w.emulator.stats().issuances[KUBE_DOMAIN] ?? 0;
    const [theirs, mine] = [`ledger.${victim}.json`, `ledger.${thief}.json`];
    /** The thief: the victim's name limit filled (five renewals dated now) in part `key`, or the ledger's data as `edit` makes it. */
    async function forge(edit: (data: Record<string, string>, forged: object[]) => Record<string, string>): Promise<{ status: number; body: string }> {
      const read = await asAccount(cp(), stolen, 'GET', ledger);
      assert.equal(read.status, 200, read.body);
      const object = JSON.parse(read.body) as { data: Record<string, string> };
      const at = new Date(clock.now()).toISOString();
      const forged = Array.from({ length: 5 }, () => ({ domain: KUBE_DOMAIN, registeredDomain: 'tailnet-0000.ts.net', at, issued: true, renewal: true }));
      return await asAccount(cp(), stolen, 'PUT', ledger, { ...object, data: edit(object.data, forged) });
    }
    const into = (key: string) => (data: Record<string, string>, forged: object[]) => {
      const { entries } = JSON.parse(data[key] ?? '{"entries":[]}') as { entries: unknown[] };
      return { ...data, [key]: JSON.stringify({ entries: [...entries, ...forged] }) };
    };
    try {
      await until('the first certificate', () => current() !== undefined, [onEvent(w.daemon.events, 'planned')], 30_000);
      const first = current()!;
      const renewal = renewalTime(held(first), policy);
      clock.jumpTo(renewal - 60_000); // the thief writes a minute before the victim's renewal point
      // Refused by the apiserver: the 0.1.0 ledger (on 4a80975 the one every group's token writes: admitted),
      // the victim's part, the victim's part removed.
      type Edit = (data: Record<string, string>, forged: object[]) => Record<string, string>;
      const refuse = async (what: string, edit: Edit): Promise<void> => {
        const r = await forge(edit);
        assert.equal(r.status, 403, `${what}: ${r.status} ${r.body}`);
        assert.match(r.body, /own namespace's part of a budget ledger only/, what);
      };
      await refuse('the 0.1.0 ledger.json', into('ledger.json'));
      const parts = await ledgerParts(platformNs);
      assert.ok(
        parts[theirs]?.some((e) => e.domain === KUBE_DOMAIN && e.issued),
        "the victim's first issuance, in its own part",
      );
      await refuse("the victim's part", into(theirs));
      await refuse("the victim's part removed", (data) => Object.fromEntries(Object.entries(data).filter(([k]) => k !== theirs)));
      // Admitted: its own part, where the victim believes no renewal of its names.
      const own = await forge(into(mine));
      assert.equal(own.status, 200, `the thief's own part: ${own.body}`);
      decisions.length = 0;
      clock.jumpTo(renewal + 1000);
      const settled = (): boolean => decisions.some((d) => d.reason === 'name_limited') || signed() === 2;
      await until('the victim renewed or held', settled, [onEvent(w.daemon.events, 'decided')], 20_000);
      const holds = decisions.filter((d) => d.reason === 'name_limited');
      assert.deepEqual(holds, [], 'the renewal is not held by entries of another part');
      assert.equal(signed(), 2, 'renewed at its renewal point');
      await until('the renewal held', () => current()?.info.serial !== first.info.serial, [onEvent(w.daemon.events, 'planned')], 20_000);
      assert.ok(current()!.obtainedAt! < breakGlassPoint(held(first), policy, LEAD_MS), 'well before the safety point');
    } finally {
      w.daemon.events.off('decided', record);
      await w.stop();
    }
  });

  it("another group's stolen token cannot freeze the shared ledger (immutable: true): the victim's first issuance goes ahead", async () => {
    const [thief, victim] = [await exampleNamespace(cp(), 'grp'), await exampleNamespace(cp(), 'grp')];
    const platformNs = await platform([thief, victim]);
    const stolen = await mintedSidecarToken(thief, join(dir(), 'freezer.kubeconfig'));
    const ledger = `/api/v1/namespaces/${platformNs}/configmaps/${LEDGER}`;
    // The thief's update changes no key, no label: the ConfigMap made immutable, which the apiserver never lets
    // anyone undo (only delete, which no group's account may). On 3d853d5 admitted: every later write of the
    // ledger, by any group, answered 422, so no first issuance of the cluster's names, ever.
    const read = await asAccount(cp(), stolen, 'GET', ledger);
    assert.equal(read.status, 200, read.body);
    const frozen = { ...(JSON.parse(read.body) as object), immutable: true };
    // The policy applies once the apiserver has loaded it (an informer, a second or so after apply).
    const deadline = performance.now() + 30_000;
    for (;;) {
      const r = await asAccount(cp(), stolen, 'PUT', `${ledger}?dryRun=All`, frozen);
      if (r.status === 403 && /never makes a budget ledger immutable/.test(r.body)) break;
      assert.ok(performance.now() < deadline, `the immutable ledger is still admitted: ${r.status} ${r.body}`);
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
    const r = await asAccount(cp(), stolen, 'PUT', ledger, frozen);
    assert.equal(r.status, 403, `the thief's freeze: ${r.status} ${r.body}`);
    const after = JSON.parse((await cp().adminRequest('GET', ledger)).body) as { immutable?: boolean };
    assert.notEqual(after.immutable, true, 'the ledger stays writable');
    // The victim's first certificate: its slot written in its own part before the call.
    const w = await startReplica(cp(), victim, join(dir(), 'frozen-victim'), 'proxy-0', {
      mode: 'rw',
      flags: ['--issuance-budget', '50/168h', '--budget-namespace', platformNs],
    });
    try {
      const reason = () => w.daemon.health.evaluate(Date.now()).reason;
      await until(
        "the victim's first certificate",
        () => w.daemon.manager.loop(KUBE_DOMAIN)?.current !== undefined,
        [onEvent(w.daemon.events, 'planned')],
        30_000,
      ).catch((err: unknown) => assert.fail(`${String(err)}; /healthz: ${reason()}`));
      const parts = await ledgerParts(platformNs);
      assert.ok(
        parts[`ledger.${victim}.json`]?.some((e) => e.domain === KUBE_DOMAIN && e.issued),
        "the victim's first issuance, in its own part",
      );
    } finally {
      await w.stop();
    }
  });
});
