import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { describe, it } from 'node:test';
import type { StoredCert } from '../../src/core/ports/store.ts';
import type { EventOccurrence } from '../../src/kube/event-recorder.ts';
import { EVENT_REASONS, PodEvents } from '../../src/kube/pod-events.ts';

const DOMAIN = 'proxy.tailnet-0000.ts.net';
const cert = (serial: string): StoredCert => ({ info: { serial, notAfter: Date.UTC(2030, 0, 1) } }) as unknown as StoredCert;

function recording(): { events: PodEvents; recorded: EventOccurrence[] } {
  const recorded: EventOccurrence[] = [];
  return { events: new PodEvents((o) => recorded.push(o)), recorded };
}

describe('the Events about the Pod', () => {
  it('a certificate obtained by a call is Issued (first) or Renewed, never also Loaded', async () => {
    const { events, recorded } = recording();
    events.observer.certificate?.(DOMAIN, cert('AA'));
    events.observer.attempt?.(DOMAIN, 'success', 'no_certificate');
    events.observer.certificate?.(DOMAIN, cert('BB'));
    events.observer.attempt?.(DOMAIN, 'success', 'expiry');
    await Promise.resolve();
    // Each on the Pod, and on the domain's Secret the writer stored it in.
    assert.deepEqual(
      recorded.map((e) => [e.reason, e.type, e.about?.kind ?? 'Pod']),
      [
        ['Issued', 'Normal', 'Pod'],
        ['Issued', 'Normal', 'Secret'],
        ['Renewed', 'Normal', 'Pod'],
        ['Renewed', 'Normal', 'Secret'],
      ],
    );
    assert.match(recorded[2]!.note, /certificate BB obtained \(expiry\), valid until 2030-01-01/);
    assert.deepEqual(recorded[3]!.about, { kind: 'Secret', name: DOMAIN });
    assert.match(recorded[3]!.note, /certificate BB obtained \(expiry\) and stored in this Secret by the writer/);
  });

  it('a certificate no call claimed came from the Secret: Loaded', async () => {
    const { events, recorded } = recording();
    events.observer.certificate?.(DOMAIN, cert('CC'));
    await Promise.resolve();
    assert.deepEqual(
      recorded.map((e) => e.reason),
      ['Loaded'],
    );
  });

  it('a failure is recorded with its code and the retry the loop planned; a rate limit with its end', () => {
    const { events, recorded } = recording();
    const at = Date.UTC(2030, 0, 1, 12);
    events.observer.attempt?.(DOMAIN, 'error', 'no_certificate', { kind: 'transient', message: 'socket hang up' });
    events.observer.planned?.(DOMAIN, at, 1000);
    events.observer.attempt?.(DOMAIN, 'rate_limited', 'no_certificate', { kind: 'rate_limited', message: '429' });
    events.observer.planned?.(DOMAIN, at, 1000);
    events.observer.planned?.(DOMAIN, at, 0); // a later plan without a failure records nothing
    assert.deepEqual(
      recorded.map((e) => [e.reason, e.type]),
      [
        ['IssuanceFailed', 'Warning'],
        ['RateLimited', 'Warning'],
      ],
    );
    assert.match(recorded[0]!.note, /\[transient\]: socket hang up; next retry at 2030-01-01T12:00:00.000Z/);
    assert.notEqual(recorded[0]!.key, DOMAIN, 'the failure code is part of the key: another code is another Event');
    assert.match(recorded[1]!.note, /rate limited until 2030-01-01T12:00:00.000Z/);
  });

  it('a domain entering the issuance budget queue is recorded once per wait, not on every turn there', () => {
    const { events, recorded } = recording();
    const at = Date.UTC(2030, 0, 2);
    for (let turn = 0; turn < 3; turn++) {
      events.observer.decided?.(DOMAIN, { action: 'ask_budget', reason: 'no_certificate', at });
      events.observer.decided?.(DOMAIN, { action: 'wait', reason: 'budget_exhausted', at });
    }
    events.observer.decided?.(DOMAIN, { action: 'issue', reason: 'no_certificate', at });
    events.observer.decided?.(DOMAIN, { action: 'wait', reason: 'budget_exhausted', at });
    assert.deepEqual(
      recorded.map((e) => e.reason),
      ['BudgetQueued', 'BudgetQueued'],
    );
    assert.match(recorded[0]!.note, /waits for the issuance budget; its turn at 2030-01-02T00:00:00.000Z/);
  });

  it('the Lease at the federation home: BecameHomeWriter and LostHomeWriter, apart from the local Lease', () => {
    const { events, recorded } = recording();
    events.writer(true);
    events.writer(true, 'home');
    events.writer(false, 'home');
    assert.deepEqual(
      recorded.map((e) => [e.reason, e.type]),
      [
        ['BecameWriter', 'Normal'],
        ['BecameHomeWriter', 'Normal'],
        ['LostHomeWriter', 'Normal'],
      ],
    );
    assert.match(recorded[1]!.note, /federation home: issues for every member cluster/);
  });

  it('docs/operations.md documents every reason', async () => {
    const page = await readFile(new URL('../../docs/operations.md', import.meta.url), 'utf8');
    for (const reason of Object.keys(EVENT_REASONS)) assert.match(page, new RegExp(`\`${reason}\``), reason);
  });
});
