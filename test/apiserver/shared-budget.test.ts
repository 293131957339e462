// One issuance budget per registered domain (issue 34), against a real kube-apiserver and etcd: two
// groups, each in its own namespace with its own writer, share the ledger of tailnet-0000.ts.net in the
// platform's namespace (--budget-namespace, manifests/budget). 60 new names under 50/168h: at most 50
// first issuances in all, the rest queued with their reason in /healthz and the metrics. The sidecar
// token's rights on the shared ledger: get and update of that one object, everything else refused. And what
// that right gives one group's token (a tenant of its namespace mints one) over another's names: entries of
// their name limit, dated now, written again before they leave the window, delay a renewal to its
// certificate's safety point, never past it (on 7bec7cd the renewal waited for the window over and over, and
// the certificate ran out).
import assert from 'node:assert/strict';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, it } from 'node:test';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { breakGlassPoint } from '../../src/core/federation/home-verdicts.ts';
import type { IssuanceDecision } from '../../src/core/issuance/issuance-policy.ts';
import { held } from '../../src/core/loop/held-certificate.ts';
import { renewalTime, rotationExitTime } from '../../src/core/renewal/renewal.ts';
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

  it("another group's stolen token fills a name's limit again and again: the renewal waits until its safety point, no longer", async () => {
    const clock = new JumpClock();
    const [thief, victim] = [await exampleNamespace(cp(), 'grp'), await exampleNamespace(cp(), 'grp')];
    const platformNs = await platform([thief, victim]);
    // A tenant of the thief's namespace (the bootstrap admin and edit roles) mints its sidecar account's token.
    const tenant = await namespaceAdmin(cp(), thief, 'tenant');
    const body = { apiVersion: 'authentication.k8s.io/v1', kind: 'TokenRequest', spec: { expirationSeconds: 3600 } };
    const minted = await asAccount(cp(), tenant, 'POST', `/api/v1/namespaces/${thief}/serviceaccounts/certshare/token`, body);
    assert.equal(minted.status, 201, `edit creates serviceaccounts/token: ${minted.body}`);
    const stolen = join(dir(), 'stolen.kubeconfig');
    await writeFile(stolen, `token: ${(JSON.parse(minted.body) as { status: { token: string } }).status.token}\n`, { mode: 0o600 });
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
    /** The thief: the victim's name limit filled, five renewals dated now, with its own group's sidecar token. */
    async function fillNameLimit(): Promise<void> {
      const read = await asAccount(cp(), stolen, 'GET', ledger);
      assert.equal(read.status, 200, read.body);
      const object = JSON.parse(read.body) as { data: Record<string, string> };
      const { entries } = JSON.parse(object.data['ledger.json']!) as { entries: unknown[] };
      const at = new Date(clock.now()).toISOString();
      const forged = Array.from({ length: 5 }, () => ({ domain: KUBE_DOMAIN, registeredDomain: 'tailnet-0000.ts.net', at, issued: true, renewal: true }));
      const write = await asAccount(cp(), stolen, 'PUT', ledger, { ...object, data: { 'ledger.json': JSON.stringify({ entries: [...entries, ...forged] }) } });
      assert.equal(write.status, 200, `another group's token may write the shared ledger: ${write.body}`);
    }
    /** Moves the clock to `at`, where the victim's loop looks again (`looks`): resolves once it has decided what to do. */
    async function jumpTo(at: number, looks: boolean): Promise<void> {
      decisions.length = 0;
      clock.jumpTo(at);
      if (!looks) return;
      const settled = (): boolean => decisions.some((d) => d.reason === 'name_limited') || signed() === 2;
      await until(`the victim's loop looked again at ${new Date(at).toISOString()}`, settled, [onEvent(w.daemon.events, 'decided')], 20_000);
    }
    try {
      await until('the first certificate', () => current() !== undefined, [onEvent(w.daemon.events, 'planned')], 30_000);
      const first = current()!;
      const safety = breakGlassPoint(held(first), policy, LEAD_MS);
      // Written a minute before the renewal point, then again at every look of the victim's loop, each time dated
      // before the entries of the last write leave the window: always 5 of the name in the last 168 h.
      await jumpTo(renewalTime(held(first), policy) - 60_000, false);
      await fillNameLimit();
      let next = renewalTime(held(first), policy);
      const looks: string[] = [];
      for (;;) {
        // A second past it: the loop sleeps from when it decided, a few milliseconds after the time it computed with.
        await jumpTo(next + 1000, true);
        if (signed() === 2) break;
        next = decisions.findLast((d) => d.reason === 'name_limited')!.at;
        looks.push(`${new Date(clock.now()).toISOString()}: waits until ${new Date(next).toISOString()}`);
        if (next > first.info.notAfter) break;
        await fillNameLimit();
      }
      // On 7bec7cd the renewal waited for the window at every look, past the safety point and past the expiry.
      assert.equal(signed(), 2, `renewed by the safety point ${new Date(safety).toISOString()}; the looks:\n${looks.join('\n')}`);
      await until('the renewal held', () => current()?.info.serial !== first.info.serial, [onEvent(w.daemon.events, 'planned')], 20_000);
      const renewed = current()!;
      assert.ok(renewed.obtainedAt! >= safety, 'not before the safety point: the forged entries count until then');
      assert.ok(renewed.obtainedAt! < rotationExitTime(held(first), policy, LEAD_MS), "before the gate's exit point");
      // The thief goes on; the certificate renewed is not due, nothing more is issued, and it is the one held.
      const DAY = 86_400_000;
      for (let at = clock.now() + DAY; at < first.info.notAfter; at += 6 * DAY) {
        await fillNameLimit();
        await jumpTo(at, false);
      }
      await jumpTo(first.info.notAfter + 1000, false);
      await until('a look after the expiry', () => decisions.length > 0, [onEvent(w.daemon.events, 'decided')], 20_000);
      assert.equal(current()?.info.serial, renewed.info.serial);
      assert.equal(signed(), 2, 'one renewal in the window');
    } finally {
      w.daemon.events.off('decided', record);
      await w.stop();
    }
  });
});
