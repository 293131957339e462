// One issuance budget per registered domain (issue 34), against a real kube-apiserver and etcd: two
// groups, each in its own namespace with its own writer, share the ledger of tailnet-0000.ts.net in the
// platform's namespace (--budget-namespace, manifests/budget). 60 new names under 50/168h: at most 50
// first issuances in all, the rest queued with their reason in /healthz and the metrics. The sidecar
// token's rights on the shared ledger: get and update of that one object, everything else refused.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, it } from 'node:test';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { allowDomains, exampleNamespace, must, startReplica, type Replica } from '../support/kube.ts';
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

async function ledgerEntries(ns: string): Promise<Array<{ domain: string; issued: boolean }>> {
  const res = await cp().adminRequest('GET', `/api/v1/namespaces/${ns}/configmaps/${LEDGER}`);
  assert.equal(res.status, 200, res.body);
  return (
    JSON.parse((JSON.parse(res.body) as { data: Record<string, string> }).data['ledger.json']!) as { entries: Array<{ domain: string; issued: boolean }> }
  ).entries;
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
      const entries = await ledgerEntries(platformNs);
      assert.equal(entries.filter((e) => e.issued).length, 50, 'the shared ledger holds the 50');
      assert.equal(new Set(entries.map((e) => e.domain)).size, 50);
      // Every group took some: the budget is the tailnet's, not the first group's.
      for (const w of writers) assert.ok(w.emulator.stats().issuancesTotal > 0);
      assert.equal(
        (await Promise.all(writers.map(queuedIn))).reduce((a, b) => a + b, 0),
        10,
        'certshare_issuance_queued over both writers',
      );
      const verbose = await Promise.all(writers.map((w) => fetch(`${w.daemon.address}/healthz`).then((r) => r.text())));
      assert.equal(verbose.join('\n').match(/waiting for the issuance budget \(50 per 604800s first issuances for tailnet-0000\.ts\.net\)/g)?.length, 10);
      // Nothing more happens: the queued ones wait for a slot to free in a week.
      const stats = writers.map((w) => w.emulator.stats().certRequests);
      for (const [i, w] of writers.entries()) assert.deepEqual(w.emulator.stats().certRequests, stats[i]);
    } finally {
      await Promise.all(writers.map((w) => w.stop()));
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
    const updated = { ...object, data: { 'ledger.json': JSON.stringify({ entries: [entry] }) } };
    // The policy applies once the apiserver has loaded it (an informer, a second or so after apply).
    const deadline = performance.now() + 30_000;
    for (;;) {
      const r = await asAccount(cp(), sidecar, 'PUT', `${ledger}?dryRun=All`, { ...object, data: { 'ledger.json': '[]' } });
      if (r.status === 403 && /one key, ledger\.json/.test(r.body)) break;
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
      ['another key', asAccount(cp(), sidecar, 'PUT', ledger, { ...current, data: { ...current.data, extra: 'x' } }), /one key, ledger\.json/],
      ['a group the binding does not name', asAccount(cp(), stranger, 'GET', ledger), /cannot get/],
    ];
    for (const [what, result, expected] of refusals) {
      const r = await result;
      assert.equal(r.status, 403, `${what}: ${r.status} ${r.body}`);
      assert.match(r.body, expected, what);
    }
  });
});
