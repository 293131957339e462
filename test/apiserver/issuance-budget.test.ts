import assert from 'node:assert/strict';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { GROUP, KUBE_DOMAIN, exampleNamespace, must, startReplica, type Replica } from '../support/kube.ts';
import { about, watchEvents } from '../support/kube-events.ts';
import { useTempDir } from '../support/standalone.ts';
import { onEvent, until } from '../support/wait.ts';

const cp = useControlPlane();
/** A second domain of the same tailnet (registered domain tailnet-0000.ts.net), added to the example's Roles. */
const SECOND = 'second.tailnet-0000.ts.net';
const LEDGER = `certshare-${GROUP}-ledger`;
const requestsFor = (r: Replica, domain: string): number => r.emulator.stats().certRequests[domain] ?? 0;
const reason = (r: Replica): string => r.daemon.health.evaluate(Date.now()).reason;

async function allowSecondDomain(ns: string): Promise<void> {
  for (const [role, index] of [
    ['certshare-reader', 0],
    ['certshare-writer', 1],
  ] as const) {
    const patch = [{ op: 'add', path: `/rules/${index}/resourceNames/-`, value: SECOND }];
    await must(cp().kubectl(['-n', ns, 'patch', 'role', role, '--type=json', '-p', JSON.stringify(patch)]));
  }
}

/** The replica holds KUBE_DOMAIN's certificate and reports SECOND waiting for the budget. */
async function firstHeldSecondQueued(r: Replica): Promise<void> {
  await until('the first domain held', () => r.daemon.manager.loop(KUBE_DOMAIN)?.current !== undefined, [onEvent(r.daemon.events, 'planned')], 20_000);
  await until(
    'the second domain queued',
    () => /second\.tailnet-0000\.ts\.net: waiting for the issuance budget/.test(reason(r)),
    [onEvent(r.daemon.events, 'planned')],
    10_000,
  );
  assert.equal(requestsFor(r, SECOND), 0, `${r.name}: the queued domain was asked for`);
}

async function ledgerDomains(ns: string): Promise<string[]> {
  const res = await cp().adminRequest('GET', `/api/v1/namespaces/${ns}/configmaps/${LEDGER}`);
  assert.equal(res.status, 200, res.body);
  const ledger = JSON.parse((JSON.parse(res.body) as { data: Record<string, string> }).data['ledger.json']!) as { entries: Array<{ domain: string }> };
  return ledger.entries.map((e) => e.domain).sort();
}

describe('issuance budget in the cluster: the ledger ConfigMap', () => {
  const dir = useTempDir();

  it('a restarted writer and a new writer both find the slot taken: the queued domain is not issued', async () => {
    const ns = await exampleNamespace(cp());
    await allowSecondDomain(ns);
    const options = {
      mode: 'rw' as const,
      flags: ['--domain', SECOND, '--issuance-budget', '1/1h'],
      emulator: { domains: [KUBE_DOMAIN, SECOND] },
    };
    const events = watchEvents(cp(), ns);
    let writer = await startReplica(cp(), ns, join(dir(), 'a'), 'proxy-0', options);
    try {
      await firstHeldSecondQueued(writer);
      assert.deepEqual(await ledgerDomains(ns), [KUBE_DOMAIN]);
      // The wait is an Event about the Pod too (kubectl describe pod), recorded once for the wait.
      await until('a BudgetQueued Event', () => about(events.events, 'proxy-0', 'BudgetQueued').length > 0, [onEvent(events.changed, 'change')]);
      const [queued] = about(events.events, 'proxy-0', 'BudgetQueued');
      assert.match(queued!.note ?? '', /^second\.tailnet-0000\.ts\.net: a first issuance waits for the issuance budget; its turn at /);
      // A restart (nothing in memory), then a failover to another replica with its own tailscaled.
      for (const [name, sub] of [
        ['proxy-0', 'b'],
        ['proxy-1', 'c'],
      ] as const) {
        await writer.stop();
        writer = await startReplica(cp(), ns, join(dir(), sub), name, options);
        await firstHeldSecondQueued(writer);
        assert.equal(requestsFor(writer, KUBE_DOMAIN), 0, `${name}: the stored certificate was issued again`);
      }
      assert.deepEqual(await ledgerDomains(ns), [KUBE_DOMAIN]);
    } finally {
      events.close();
      await writer.stop();
    }
  });

  it('a ledger the writer may not read (403) means no issuance, with the reason in /healthz', async () => {
    const ns = await exampleNamespace(cp());
    // Take the ledger rules (the last two) away from the writer's Role.
    const remove = [
      { op: 'test', path: '/rules/5/resources', value: ['configmaps'] },
      { op: 'remove', path: '/rules/5' },
      { op: 'remove', path: '/rules/4' },
    ];
    await must(cp().kubectl(['-n', ns, 'patch', 'role', 'certshare-writer', '--type=json', '-p', JSON.stringify(remove)]));
    const writer = await startReplica(cp(), ns, join(dir(), 'forbidden'), 'proxy-0', { mode: 'rw' });
    try {
      await until(
        'the ledger failure reported',
        () => /issuance ledger unusable: .*403/.test(reason(writer)),
        [onEvent(writer.daemon.events, 'problem')],
        20_000,
      );
      assert.equal(requestsFor(writer, KUBE_DOMAIN), 0, 'issued without a readable ledger');
    } finally {
      await writer.stop();
    }
  });
});
