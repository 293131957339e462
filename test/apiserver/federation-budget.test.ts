// One issuance budget per registered domain across the members of a federation (issue 34, docs/federation.md):
// the home (a real kube-apiserver) keeps the ledger of tailnet-0000.ts.net (--budget-namespace, manifests/budget
// applied there), and four groups, two in each member cluster, one writer each serving 15 new names, ask for
// 60 first issuances at once under the default 50/168h. The bed (test/support/federation.ts): three real
// apiservers with etcd, in-process daemons, a LocalAPI emulator per writer counting what it signs, a jump clock.
// Then the same ledger under least privilege: the federation account of manifests/federation, bound by
// manifests/budget's RoleBinding at the home, is enough for a member's first issuance counted there.
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { describe, it } from 'node:test';
import { HOME_NS, useFederation, type FederatedReplica, type Member } from '../support/federation.ts';
import { KUBE_DOMAIN, must } from '../support/kube.ts';
import { onEvent, until } from '../support/wait.ts';

const BUDGET = fileURLToPath(new URL('../../manifests/budget', import.meta.url));
const FEDERATION = fileURLToPath(new URL('../../manifests/federation', import.meta.url));
const LEDGER = 'certshare-budget-tailnet-0000.ts.net';
const WEEK = 168 * 3_600_000;
const names = (from: number, count: number): string[] =>
  Array.from({ length: count }, (_, i) => `host-${String(from + i).padStart(4, '0')}.tailnet-0000.ts.net`);
/** Two groups per member, 15 new names each. */
const GROUPS: Array<{ member: Member['name']; group: string; domains: string[] }> = [
  { member: 'east', group: 'east-a', domains: names(1, 15) },
  { member: 'east', group: 'east-b', domains: names(16, 15) },
  { member: 'west', group: 'west-a', domains: names(31, 15) },
  { member: 'west', group: 'west-b', domains: names(46, 15) },
];
const ALL = GROUPS.flatMap((g) => g.domains);
/** A queued domain in /healthz: the budget, the registered domain and the decision's reason code. */
const WAITING =
  /(host-\d{4}\.tailnet-0000\.ts\.net): waiting for the issuance budget \(50 per 604800s first issuances for tailnet-0000\.ts\.net\)[^;]*\[budget_exhausted\]/g;

describe('one issuance budget per registered domain across the members of a federation, kept at the home', () => {
  const bed = useFederation(GROUPS.map((g) => g.group));
  let writers: FederatedReplica[] = [];

  const held = (): string[] => writers.flatMap((w) => w.domains.filter((d) => w.daemon.manager.loop(d)?.current !== undefined)).sort();
  /** The queued domains each writer's health names (what /healthz answers), without a request. */
  const queued = (): string[] => writers.flatMap((w) => [...w.daemon.health.evaluate(bed.clock.now()).reason.matchAll(WAITING)].map((m) => m[1]!)).sort();
  async function queuedInHealthz(): Promise<string[]> {
    const bodies = await Promise.all(writers.map((w) => fetch(`${w.daemon.address}/healthz`).then((r) => r.text())));
    return bodies.flatMap((body) => [...body.matchAll(WAITING)].map((m) => m[1]!)).sort();
  }
  async function queuedInMetrics(): Promise<number> {
    const texts = await Promise.all(writers.map((w) => fetch(`${w.daemon.address}/metrics`).then((r) => r.text())));
    const series = /^certshare_issuance_queued\{registered_domain="tailnet-0000\.ts\.net"\} (\d+)$/m;
    return texts.reduce((n, text) => n + Number(series.exec(text)?.[1] ?? Number.NaN), 0);
  }
  /** The entries of every part of a ledger (a budget ledger's: one part per namespace writing it), by key. */
  async function ledgerParts(ns = HOME_NS, name = LEDGER): Promise<Record<string, Array<{ domain: string; issued: boolean }>>> {
    const res = await bed.home().adminRequest('GET', `/api/v1/namespaces/${ns}/configmaps/${name}`);
    assert.equal(res.status, 200, res.body);
    const data = (JSON.parse(res.body) as { data: Record<string, string> }).data;
    return Object.fromEntries(Object.entries(data).map(([k, v]) => [k, (JSON.parse(v) as { entries: Array<{ domain: string; issued: boolean }> }).entries]));
  }
  const ledger = async (ns = HOME_NS, name = LEDGER): Promise<Array<{ domain: string; issued: boolean }>> => Object.values(await ledgerParts(ns, name)).flat();
  /** Names signed more than once, across every emulator of both clusters. */
  const twice = (): string[] => ALL.filter((d) => bed.issued(d) > 1);
  const changes = () => writers.flatMap((w) => [onEvent(w.daemon.events, 'planned'), onEvent(w.daemon.events, 'attempt')]);

  it('60 new names in four groups of two members under 50/168h: at most 50 first issuances, 10 queued with their reason; a week later the 10', async () => {
    // The platform's ledger at the home, in the namespace of the groups' objects.
    await must(bed.home().kubectl(['apply', '-k', BUDGET, '-n', HOME_NS]));
    // The four writers start together: the last slots are raced for across the clusters.
    writers = await Promise.all(
      GROUPS.map((g) => bed.startReplica(bed.member(g.member), g.group, `${g.group}-0`, { domains: g.domains, flags: ['--budget-namespace', HOME_NS] })),
    );

    // An issuance past the 50th ends the wait at once (an assertion below, not a timeout).
    await until('50 held and 10 queued', () => bed.issued() > 50 || (held().length === 50 && queued().length === 10), changes(), 60_000);
    assert.equal(bed.issued(), 50, 'at most 50 first issuances across both clusters');
    assert.deepEqual(twice(), []);
    const waiting = ALL.filter((d) => !held().includes(d));
    assert.deepEqual(await queuedInHealthz(), waiting, "the 10 without a certificate, each with its reason in its writer's /healthz");
    assert.equal(await queuedInMetrics(), 10, 'certshare_issuance_queued over the four writers');
    const entries = await ledger();
    assert.deepEqual(
      entries
        .filter((e) => e.issued)
        .map((e) => e.domain)
        .sort(),
      held(),
      "the home's ledger holds the 50, each once",
    );
    // The budget is the tailnet's, not one cluster's or one group's: both members took slots.
    for (const member of ['east', 'west'] as const) {
      const took = writers.filter((w) => w.member === member).reduce((n, w) => n + w.emulator.stats().issuancesTotal, 0);
      assert.ok(took > 0, `${member} took no slot`);
    }

    // A week on, the slots free: the 10 are issued, once each, and nothing waits.
    bed.clock.jump(WEEK + 60_000);
    await until('60 held', () => bed.issued() > 60 || (held().length === 60 && queued().length === 0), changes(), 30_000);
    assert.equal(bed.issued(), 60);
    assert.deepEqual(twice(), []);
    assert.deepEqual(await queuedInHealthz(), []);
    const statuses = await Promise.all(writers.map((w) => fetch(`${w.daemon.address}/healthz`).then((r) => r.status)));
    assert.deepEqual(statuses, [200, 200, 200, 200], 'every writer healthy: a certificate for each of its names');
    assert.equal(await queuedInMetrics(), 0);
    assert.deepEqual(
      (await ledger())
        .filter((e) => e.issued)
        .map((e) => e.domain)
        .sort(),
      ALL,
    );
  });

  it("the federation account's token suffices: manifests/budget at the home, its RoleBinding naming the account", async () => {
    const home = bed.home();
    const ns = 'fed-budget';
    await must(home.kubectl(['create', 'namespace', ns]));
    await must(home.kubectl(['apply', '-k', FEDERATION, '-n', ns]));
    await must(home.kubectl(['apply', '-k', BUDGET, '-n', ns]));
    const subjects = [{ kind: 'ServiceAccount', name: 'certshare-federation', namespace: ns }];
    const patch = JSON.stringify([{ op: 'replace', path: '/subjects', value: subjects }]);
    await must(home.kubectl(['-n', ns, 'patch', 'rolebinding', 'certshare-budget', '--type=json', '-p', patch]));
    const token = await home.kubeconfigFor(ns, 'certshare-federation');
    const writer = await bed.startReplica(bed.member('east'), 'proxy', 'proxy-0', {
      domains: [KUBE_DOMAIN],
      flags: ['--federation-kubeconfig', token, '--federation-namespace', ns, '--budget-namespace', ns],
    });
    const holds = (): boolean => writer.daemon.manager.loop(KUBE_DOMAIN)?.current !== undefined;
    await until('the writer holds a certificate', holds, [onEvent(writer.daemon.events, 'planned')], 30_000);
    assert.equal(writer.emulator.stats().issuancesTotal, 1);
    assert.deepEqual(
      Object.entries(await ledgerParts(ns))
        .sort(([a], [b]) => (a < b ? -1 : 1))
        .map(([part, entries]) => [part, entries.map((e) => [e.domain, e.issued])]),
      [
        [`ledger.${ns}.json`, [[KUBE_DOMAIN, true]]],
        ['ledger.json', []],
      ],
      "counted in the registered domain's ledger at the home, in the federation account's namespace's part",
    );
    assert.deepEqual(await ledger(ns, 'certshare-proxy-ledger'), [], "not in the group's");
  });
});
