// Renew now (issue 34): the rule of the chain (issuance-policy.ts renewRequestRule) on its own and in the
// chain, the pending/answered reading of a request, and the budget's slot for a request (never a queue).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  decideIssuance,
  renewRequestRule,
  type IssuanceDecision,
  type IssuanceSettings,
  type IssuanceSnapshot,
} from '../../src/core/issuance/issuance-policy.ts';
import { IssuanceBudget, decodeLedger, encodeLedger } from '../../src/core/issuance/issuance-budget.ts';
import { pendingRenewRequest, refusalText } from '../../src/core/renewal/renew-request.ts';
import { RENEW_FLAGS, renewOptionsFrom } from '../../src/config/renew-options.ts';
import { parseFlags } from '../../src/flags/flags.ts';
import { FakeClock } from '../support/fake-clock.ts';
import { MemoryLedger } from '../support/memory-ledger.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';

const MIN = 60_000;
const DAY = 24 * 60 * MIN;
const NOW = Date.UTC(2026, 10, 27, 12);
const settings: IssuanceSettings = {
  renewal: { renewFraction: 1 / 3, checkIntervalMs: DAY },
  backoff: { firstRetryMs: MIN, retryCapMs: DAY, rateLimitFirstRetryMs: 60 * MIN },
  intentTtlMs: 10 * MIN,
};
/** A 90-day certificate obtained yesterday: not due for two months. */
const held = { notBefore: NOW - DAY, notAfter: NOW + 89 * DAY };
const ID = '2026-11-27T12:00:00.000Z/ab12cd34';
const writer = { identity: 'writer-0', issue: true, write: true };
const snapshot = (s: Partial<IssuanceSnapshot> = {}): IssuanceSnapshot => ({
  now: NOW,
  store: { state: 'valid', notAfter: held.notAfter },
  held,
  pending: undefined,
  role: writer,
  coordination: { renewRequest: ID },
  backoff: undefined,
  callFloor: NOW - DAY + MIN,
  turn: {},
  ...s,
});
const step = (action: 'ask_renew_budget' | 'take_slot' | 'announce' | 'issue'): IssuanceDecision =>
  ({ action, reason: 'operator_requested', at: NOW }) as IssuanceDecision;

describe('renewRequestRule: an operator asks for one new certificate now', () => {
  const rows: Array<[string, Partial<IssuanceSnapshot>, IssuanceDecision | undefined]> = [
    ['no request: the ordinary rules', { coordination: {} }, undefined],
    ['a reader: the ordinary rules (it uses what it holds)', { role: { identity: 'r', issue: false, write: false } }, undefined],
    ['nothing held: the first issuance answers it', { held: undefined, store: { state: 'absent' } }, undefined],
    ['due anyway: the ordinary renewal answers it', { held: { notBefore: NOW - 80 * DAY, notAfter: NOW + 10 * DAY } }, undefined],
    ['asks the budget first', {}, step('ask_renew_budget')],
    ['then a slot', { turn: { renewBudget: { kind: 'granted' } } }, step('take_slot')],
    ['then the intent', { turn: { renewBudget: { kind: 'not_needed' }, slot: true } }, step('announce')],
    ['then the call', { turn: { renewBudget: { kind: 'granted' }, slot: true, intent: { kind: 'recorded' } } }, step('issue')],
    ['refused inside the minimum interval', { callFloor: NOW + 30_000 }, { action: 'refuse_renew', reason: 'min_interval', at: NOW }],
    [
      'refused when the budget has no free slot',
      { turn: { renewBudget: { kind: 'refused', reason: 'budget_exhausted', registeredDomain: 'tailnet-0000.ts.net', nextSlotAt: NOW + DAY } } },
      { action: 'refuse_renew', reason: 'budget_exhausted', at: NOW },
    ],
    [
      'waits, not refused, on a ledger it cannot read',
      { turn: { renewBudget: { kind: 'unusable', failures: 1 } } },
      { action: 'wait', reason: 'ledger_unavailable', at: NOW + MIN },
    ],
    [
      'waits for a rate limit recorded in the store',
      { coordination: { renewRequest: ID, retryNotBefore: NOW + 5 * MIN } },
      { action: 'wait', reason: 'rate_limited', at: NOW + 5 * MIN },
    ],
    [
      'waits for its own backoff',
      { backoff: { until: NOW + 2 * MIN, reason: 'retry_backoff' } },
      { action: 'wait', reason: 'retry_backoff', at: NOW + 2 * MIN },
    ],
    [
      "waits for another writer's call",
      { coordination: { renewRequest: ID, intent: { holder: 'writer-1', at: NOW - MIN } } },
      { action: 'wait', reason: 'other_writer_issuing', at: NOW + 9 * MIN },
    ],
    [
      'a lost intent race decides again',
      { turn: { renewBudget: { kind: 'granted' }, slot: true, intent: { kind: 'conflict' } } },
      { action: 'wait', reason: 'store_changed', at: NOW },
    ],
  ];
  for (const [name, s, expected] of rows) it(name, () => assert.deepEqual(renewRequestRule(snapshot(s), settings), expected));

  it('is in the chain: a certificate not due is renewed on request, and used without one', () => {
    assert.deepEqual(decideIssuance(snapshot(), settings), step('ask_renew_budget'));
    assert.equal(decideIssuance(snapshot({ coordination: {} }), settings).action, 'use');
    // A store the writer cannot read still decides first: never a reason to issue.
    assert.equal(decideIssuance(snapshot({ store: { state: 'unreadable', failures: 1 } }), settings).reason, 'store_unavailable');
  });
});

describe('a renew request on the record', () => {
  it('is pending until its id is the one answered; garbage is no request', () => {
    assert.equal(pendingRenewRequest(ID, undefined), ID);
    assert.equal(pendingRenewRequest(ID, 'older'), ID);
    assert.equal(pendingRenewRequest(ID, ID), undefined);
    assert.equal(pendingRenewRequest(` ${ID} `, ID), undefined);
    for (const bad of [undefined, '', '   ', 'x'.repeat(129), 'with space', 'nul\u0000'])
      assert.equal(pendingRenewRequest(bad, undefined), undefined, String(bad));
  });

  it('is refused with a stable code and the reason', () => {
    const text = refusalText('a.tailnet-0000.ts.net', ID, 'budget_exhausted', { until: NOW + DAY, registeredDomain: 'tailnet-0000.ts.net' });
    assert.match(text, /^CERTSHARE_RENEW_REFUSED renew request .* for a\.tailnet-0000\.ts\.net refused \(budget_exhausted\): .*tailnet-0000\.ts\.net/);
    assert.match(refusalText('a.tailnet-0000.ts.net', ID, 'min_interval', { until: NOW }), /--first-retry.*2026-11-27T12:00:00\.000Z/);
  });
});

describe("the budget's slot for a renew request", () => {
  const budgetOf = (ledger: MemoryLedger, count: number): IssuanceBudget =>
    new IssuanceBudget({ limit: { count, windowMs: 7 * DAY }, store: ledger, clock: new FakeClock(NOW), logger: silentLogger });
  const A = 'a.tailnet-0000.ts.net';
  const signal = new AbortController().signal;

  it('takes a slot while one is free, finds it again on a retry of the same request, and is refused (never queued) when none is', async () => {
    const ledger = new MemoryLedger();
    ledger.entries = [{ domain: A, registeredDomain: 'tailnet-0000.ts.net', at: NOW - 2 * DAY, issued: true }];
    const budget = budgetOf(ledger, 2);
    assert.deepEqual(await budget.requestRenewal(A, 'r1', signal), { kind: 'granted' });
    assert.deepEqual(await budget.requestRenewal(A, 'r1', signal), { kind: 'granted' }, 'the same request: its slot');
    assert.equal(ledger.entries.length, 2);
    assert.deepEqual(await budget.requestRenewal(A, 'r2', signal), {
      kind: 'refused',
      reason: 'budget_exhausted',
      registeredDomain: 'tailnet-0000.ts.net',
      nextSlotAt: NOW + 5 * DAY,
    });
    assert.equal(ledger.entries.length, 2, 'a refusal takes nothing');
  });

  // An id is the requester's to write (an old one too, once another request was answered): the slot its first
  // asking took is no retry's once a certificate came back, nor in another process (a restart, a failover).
  it('takes a new slot for an id asked again once a certificate came back, or in another process', async () => {
    const ledger = new MemoryLedger();
    ledger.entries = [{ domain: A, registeredDomain: 'tailnet-0000.ts.net', at: NOW - 2 * DAY, issued: true }];
    const clock = new FakeClock(NOW);
    const inProcess = (): IssuanceBudget => new IssuanceBudget({ limit: { count: 5, windowMs: 7 * DAY }, store: ledger, clock, logger: silentLogger });
    const first = inProcess();
    assert.deepEqual(await first.requestRenewal(A, 'r1', signal), { kind: 'granted' });
    first.certificateReturned(A);
    await clock.advance(1000);
    assert.deepEqual(await first.requestRenewal(A, 'r1', signal), { kind: 'granted' });
    assert.equal(ledger.entries.length, 3, 'served, then asked again: a slot of its own');
    assert.deepEqual(await first.requestRenewal(A, 'r1', signal), { kind: 'granted' });
    assert.equal(ledger.entries.length, 3, 'its retry, no certificate back yet: the same slot');
    await clock.advance(1000);
    assert.deepEqual(await inProcess().requestRenewal(A, 'r1', signal), { kind: 'granted' });
    assert.equal(ledger.entries.length, 4, 'another process (a restart, a failover): a slot of its own');
    assert.deepEqual(await first.requestRenewal(A, 'r1', signal), { kind: 'granted' });
    assert.equal(ledger.entries.length, 5, 'the first process again, past the later slot: a slot of its own');
  });

  it("drops a request's slot once it left the window, keeps the first issuance's record", async () => {
    const ledger = new MemoryLedger();
    ledger.entries = [
      { domain: A, registeredDomain: 'tailnet-0000.ts.net', at: NOW - 9 * DAY, issued: true },
      { domain: A, registeredDomain: 'tailnet-0000.ts.net', at: NOW - 8 * DAY, issued: true, renew: 'old' },
    ];
    assert.deepEqual(await budgetOf(ledger, 1).requestRenewal(A, 'r3', signal), { kind: 'granted' });
    assert.deepEqual(
      ledger.entries.map((e) => e.renew ?? 'first'),
      ['first', 'r3'],
    );
    assert.deepEqual(decodeLedger(encodeLedger(ledger.entries), 'test'), ledger.entries, 'the request id survives the JSON form');
  });
});

describe('certshare renew: its command line', () => {
  const parse = (argv: string[]) => {
    const [first, ...rest] = argv;
    return renewOptionsFrom(first, parseFlags(RENEW_FLAGS, first?.startsWith('-') ? argv : rest, {}));
  };
  it('takes the domain first, the Secret by default, or a store directory', () => {
    assert.deepEqual(parse(['Web.Tailnet-0000.ts.net.', '--namespace', 'proxy']), {
      domain: 'web.tailnet-0000.ts.net',
      store: { kind: 'kube' },
      namespace: 'proxy',
      waitMs: 0,
    });
    assert.deepEqual(parse(['a.tailnet-0000.ts.net', '--store', 'dir:/var/certs', '--wait', '30s']).store, { kind: 'dir', path: '/var/certs' });
  });
  const refused: Array<[string, string[], RegExp]> = [
    ['no domain', [], /needs the domain first/],
    ['a flag where the domain goes', ['--wait', '1s'], /needs the domain first/],
    ['a hostile domain', ['../../x'], /not a fully qualified domain name/],
    ['an unknown store', ['a.tailnet-0000.ts.net', '--store', 'etcd'], /--store: must be kube or dir:PATH/],
    ['a namespace standalone', ['a.tailnet-0000.ts.net', '--store', 'dir:/x', '--namespace', 'proxy'], /--namespace: needs --store kube/],
    ['a bad namespace', ['a.tailnet-0000.ts.net', '--namespace', 'No_Such'], /is not a namespace name/],
    ['a wait over an hour', ['a.tailnet-0000.ts.net', '--wait', '2h'], /--wait: from 0s to 1h/],
  ];
  for (const [name, argv, message] of refused) it(`refuses ${name}`, () => assert.throws(() => parse(argv), message));
});
