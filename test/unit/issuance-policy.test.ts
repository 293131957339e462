// Table tests of the issuance rules (src/core/issuance/issuance-policy.ts), each rule on its own, then their order.
// The loop around them (cert-loop.ts) is covered by cert-loop.test.ts and issuance-properties.test.ts.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  backoffRule,
  budgetRule,
  decideIssuance,
  intentRule,
  issueReason,
  judgeAnswer,
  minIntervalRule,
  notDueRule,
  notYetValidRule,
  otherWriterRule,
  planAfterCall,
  readerRule,
  restoreRule,
  slotRule,
  storedRateLimitRule,
  storeUnreadableRule,
  type IssuanceDecision,
  type IssuanceRule,
  type IssuanceSettings,
  type IssuanceSnapshot,
} from '../../src/core/issuance/issuance-policy.ts';
import { holding, NO_ARI_STATE, withAnswer } from '../../src/core/renewal/renewal-info.ts';

const MIN = 60_000;
const DAY = 24 * 60 * MIN;
const NOW = Date.UTC(2026, 10, 25, 12);

const settings: IssuanceSettings = {
  renewal: { renewFraction: 1 / 3, checkIntervalMs: DAY },
  backoff: { firstRetryMs: MIN, retryCapMs: DAY, rateLimitFirstRetryMs: 60 * MIN },
  intentTtlMs: 10 * MIN,
};

/** 90 minutes long (under 10 days: due at half), 10 minutes old: due at NOW + 35 minutes. */
const fresh = { notBefore: NOW - 10 * MIN, notAfter: NOW + 80 * MIN };
/** 90 minutes long, 50 minutes old: due since NOW - 5 minutes, expires at NOW + 40 minutes. */
const due = { notBefore: NOW - 50 * MIN, notAfter: NOW + 40 * MIN };

/** A writer that holds nothing, reads an empty store, and has taken no step yet. */
const base: IssuanceSnapshot = {
  now: NOW,
  store: { state: 'absent' },
  held: undefined,
  pending: undefined,
  role: { identity: 'writer-0', issue: true, write: true },
  coordination: {},
  backoff: undefined,
  callFloor: -Infinity,
  turn: {},
};
const writerOnItsWay = (s: Partial<IssuanceSnapshot>): IssuanceSnapshot => ({ ...base, ...s });
const reader = { identity: 'reader-1', issue: false, write: false };
const wait = (reason: IssuanceDecision['reason'], at: number): IssuanceDecision => ({ action: 'wait', reason, at });

/**
 * ARI state for the held certificate `fresh` (ID "k.s", held since 10 minutes ago), with the CA's window
 * `start`..`end` fetched at NOW - MIN; the time chosen is the window's middle (random 0.5).
 */
function ariFor(start: number, end: number): IssuanceSnapshot['ari'] {
  const answered = withAnswer(holding(NO_ARI_STATE, 'k.s', NOW - 10 * MIN), { certId: 'k.s', window: { start, end }, fetchedAt: NOW - MIN }, () => 0.5);
  return { state: answered, minHoldMs: MIN };
}

type Row = [name: string, snapshot: Partial<IssuanceSnapshot>, expected: IssuanceDecision | undefined];

/** Runs `rule` over every row: its decision, or undefined when it passes on to the next rule. */
function table(rule: IssuanceRule, rows: Row[], p: IssuanceSettings = settings): void {
  for (const [name, snapshot, expected] of rows) {
    it(name, () => assert.deepEqual(rule(writerOnItsWay(snapshot), p), expected));
  }
}

describe('storeUnreadableRule: a failed store read is never a reason to issue', () => {
  table(storeUnreadableRule, [
    ['passes on when the store was read', {}, undefined],
    ['retries at the first-retry pace', { store: { state: 'unreadable', failures: 1 } }, wait('store_unavailable', NOW + MIN)],
    ['doubles per failure', { store: { state: 'unreadable', failures: 3 } }, wait('store_unavailable', NOW + 4 * MIN)],
    ['up to 8 first retries', { store: { state: 'unreadable', failures: 9 } }, wait('store_unavailable', NOW + 8 * MIN)],
    [
      'at least every half of what the held certificate has left',
      { store: { state: 'unreadable', failures: 9 }, held: { notBefore: NOW - MIN, notAfter: NOW + 10 * MIN } },
      wait('store_unavailable', NOW + 5 * MIN),
    ],
    [
      'never sooner than the first retry',
      { store: { state: 'unreadable', failures: 9 }, held: { notBefore: NOW - MIN, notAfter: NOW + MIN } },
      wait('store_unavailable', NOW + MIN),
    ],
  ]);
});

describe('restoreRule: the store lost what we hold', () => {
  const restore: IssuanceDecision = { action: 'restore', reason: 'stored_mismatch', at: NOW };
  table(restoreRule, [
    ['restores into an empty store', { held: fresh }, restore],
    ['restores over an unusable one', { held: fresh, store: { state: 'unusable' } }, restore],
    ['restores over an older one', { held: fresh, store: { state: 'valid', notAfter: fresh.notAfter - 1 } }, restore],
    ['passes on when the store holds it', { held: fresh, store: { state: 'valid', notAfter: fresh.notAfter } }, undefined],
    ['passes on when the store holds a newer one', { held: fresh, store: { state: 'valid', notAfter: fresh.notAfter + 1 } }, undefined],
    ['needs the role that writes (not the one that issues)', { held: fresh, role: { ...reader, write: true } }, restore],
    ['a reader restores nothing', { held: fresh, role: reader }, undefined],
    ['nothing held, nothing to restore', { store: { state: 'unusable' } }, undefined],
  ]);
  // The certificate of record (the Secret's serial annotation, which outlives a hand edit of its data).
  const candidate = { ...reader, write: true };
  const held = { ...fresh, serial: 'A' };
  const recordB = (notAfter: number | undefined) => ({ record: { serial: 'B', notAfter } });
  table(restoreRule, [
    [
      'a candidate restores the pair the record names',
      { held, role: candidate, store: { state: 'unusable', record: { serial: 'A', notAfter: fresh.notAfter } } },
      restore,
    ],
    ['a candidate restores a pair newer than the record', { held, role: candidate, store: { state: 'unusable', ...recordB(fresh.notAfter - 1) } }, restore],
    ['but never an older one than the record names', { held, role: candidate, store: { state: 'unusable', ...recordB(fresh.notAfter + MIN) } }, undefined],
    ['nor one the record names without a readable expiry', { held, role: candidate, store: { state: 'unusable', ...recordB(undefined) } }, undefined],
    ['nor over an older valid pair', { held, role: candidate, store: { state: 'valid', notAfter: NOW + MIN, ...recordB(fresh.notAfter + MIN) } }, undefined],
    ['a record that names none leaves it to expiry (a deleted Secret)', { held, role: candidate }, restore],
    ['the writer restores what it holds whatever the record', { held, store: { state: 'unusable', ...recordB(fresh.notAfter + MIN) } }, restore],
  ]);
});

describe('notYetValidRule: a pair obtained for later', () => {
  table(notYetValidRule, [
    ['waits for its notBefore', { pending: { notBefore: NOW + 2 * MIN } }, wait('not_yet_valid', NOW + 2 * MIN)],
    ['passes on without one', {}, undefined],
  ]);
});

describe('notDueRule: a valid certificate before its renewal point', () => {
  const ninetyDays = { notBefore: NOW - DAY, notAfter: NOW + 89 * DAY };
  table(notDueRule, [
    ['uses it until its renewal point', { held: fresh }, { action: 'use', reason: 'not_due', at: NOW + 35 * MIN }],
    ['looks again after the check interval when that is sooner', { held: ninetyDays }, { action: 'use', reason: 'not_due', at: NOW + DAY }],
    [
      'measures from when it was obtained, not from a backdated notBefore',
      { held: { ...due, obtainedAt: NOW - 10 * MIN } },
      { action: 'use', reason: 'not_due', at: NOW + 15 * MIN },
    ],
    ['passes on once it is due', { held: due }, undefined],
    ['passes on with nothing held', {}, undefined],
    // ACME Renewal Information: the CA's window can only make the renewal earlier.
    [
      'looks again at the time chosen inside the CA window',
      { held: fresh, ari: ariFor(NOW + 10 * MIN, NOW + 20 * MIN) },
      { action: 'use', reason: 'not_due', at: NOW + 15 * MIN },
    ],
    [
      'a window later than the expiry rule changes nothing',
      { held: fresh, ari: ariFor(NOW + 50 * MIN, NOW + 60 * MIN) },
      { action: 'use', reason: 'not_due', at: NOW + 35 * MIN },
    ],
    ['passes on once the chosen time has come', { held: fresh, ari: ariFor(NOW - 20 * MIN, NOW - 2 * MIN + 1) }, undefined],
    ['passes on for a window already over (revoked)', { held: fresh, ari: ariFor(NOW - 60 * MIN, NOW - 59 * MIN) }, undefined],
    [
      'not before the certificate was held for the minimum interval',
      { held: fresh, ari: { ...ariFor(NOW - 60 * MIN, NOW - 59 * MIN)!, minHoldMs: 20 * MIN } },
      { action: 'use', reason: 'not_due', at: NOW + 10 * MIN },
    ],
    [
      'never a second order for a certificate whose ARI renewal returned a pair',
      { held: fresh, ari: { state: { ...ariFor(NOW - 60 * MIN, NOW - 59 * MIN)!.state, renewed: ['k.s'] }, minHoldMs: MIN } },
      { action: 'use', reason: 'not_due', at: NOW + 35 * MIN },
    ],
  ]);
});

describe('readerRule: only the writer issues', () => {
  table(readerRule, [
    ['passes on for the writer', {}, undefined],
    ['a reader looks again at the first-retry pace (a safety net for a stalled watch)', { role: reader }, wait('not_writer', NOW + MIN)],
    [
      'a writer that lost the role while this turn waited looks again at once',
      { role: reader, turn: { budget: { kind: 'not_needed' } } },
      wait('not_writer', NOW),
    ],
  ]);
  const shortCheck = { ...settings, renewal: { ...settings.renewal, checkIntervalMs: 30_000 } };
  table(readerRule, [['or at the check interval when that is sooner', { role: reader }, wait('not_writer', NOW + 30_000)]], shortCheck);
});

describe('storedRateLimitRule: a rate limit recorded in the store holds for every replica', () => {
  table(storedRateLimitRule, [
    ['waits until it ends', { coordination: { retryNotBefore: NOW + 30 * MIN } }, wait('rate_limited', NOW + 30 * MIN)],
    [
      'over a shorter backoff of our own',
      { coordination: { retryNotBefore: NOW + 30 * MIN }, backoff: { until: NOW + MIN, reason: 'retry_backoff' } },
      wait('rate_limited', NOW + 30 * MIN),
    ],
    [
      'passes on when our own backoff ends later',
      { coordination: { retryNotBefore: NOW + 30 * MIN }, backoff: { until: NOW + 40 * MIN, reason: 'retry_backoff' } },
      undefined,
    ],
    ['passes on once it has ended', { coordination: { retryNotBefore: NOW } }, undefined],
    ['passes on without one', {}, undefined],
  ]);
});

describe("backoffRule: this loop's own backoff", () => {
  table(backoffRule, [
    ['waits, saying what set it', { backoff: { until: NOW + 2 * MIN, reason: 'retry_backoff' } }, wait('retry_backoff', NOW + 2 * MIN)],
    ['a rate limit', { backoff: { until: NOW + 60 * MIN, reason: 'rate_limited' } }, wait('rate_limited', NOW + 60 * MIN)],
    ['a certificate too short', { backoff: { until: NOW + MIN, reason: 'too_short' } }, wait('too_short', NOW + MIN)],
    ['passes on once it has ended', { backoff: { until: NOW, reason: 'retry_backoff' } }, undefined],
    ['passes on without one', {}, undefined],
  ]);
});

describe('minIntervalRule: never two issuances closer than the minimum interval', () => {
  table(minIntervalRule, [
    ['waits for the floor', { callFloor: NOW + 1 }, wait('min_interval', NOW + 1)],
    ['passes on at the floor', { callFloor: NOW }, undefined],
    ['passes on before any certificate', {}, undefined],
  ]);
});

describe("otherWriterRule: another writer's announced call", () => {
  table(otherWriterRule, [
    ['waits until its intent lapses', { coordination: { intent: { holder: 'writer-1', at: NOW - MIN } } }, wait('other_writer_issuing', NOW + 9 * MIN)],
    ['passes on once it has lapsed', { coordination: { intent: { holder: 'writer-1', at: NOW - 10 * MIN } } }, undefined],
    ['passes on over our own (a restart mid-issuance)', { coordination: { intent: { holder: 'writer-0', at: NOW } } }, undefined],
    ['passes on without one', {}, undefined],
  ]);
});

describe('budgetRule: a first issuance waits for a slot of the budget', () => {
  table(budgetRule, [
    ['asks first', {}, { action: 'ask_budget', reason: 'no_certificate', at: NOW }],
    ['asks for a renewal too (the answer is then not_needed)', { held: due }, { action: 'ask_budget', reason: 'expiry', at: NOW }],
    ['passes on when not needed', { turn: { budget: { kind: 'not_needed' } } }, undefined],
    ['passes on when exempt', { turn: { budget: { kind: 'exempt' } } }, undefined],
    ['passes on when granted', { turn: { budget: { kind: 'granted' } } }, undefined],
    [
      'waits for the turn the queue gives',
      { turn: { budget: { kind: 'queued', registeredDomain: 'tailnet-9.ts.net', position: 2, queued: 3, turnAt: NOW + DAY } } },
      wait('budget_exhausted', NOW + DAY),
    ],
    ['a ledger it cannot use is never an empty budget', { turn: { budget: { kind: 'unusable', failures: 2 } } }, wait('ledger_unavailable', NOW + 2 * MIN)],
  ]);
});

describe('slotRule and intentRule: the last two steps before the call', () => {
  const budgetDone = { budget: { kind: 'not_needed' as const } };
  table(slotRule, [
    ['takes a slot', { turn: budgetDone }, { action: 'take_slot', reason: 'no_certificate', at: NOW }],
    ['passes on holding one', { turn: { ...budgetDone, slot: true } }, undefined],
  ]);
  const slotDone = { ...budgetDone, slot: true as const };
  table(intentRule, [
    ['announces', { turn: slotDone }, { action: 'announce', reason: 'no_certificate', at: NOW }],
    ['passes on once recorded', { turn: { ...slotDone, intent: { kind: 'recorded' } } }, undefined],
    ['a write that lost a race: look again at once', { turn: { ...slotDone, intent: { kind: 'conflict' } } }, wait('store_changed', NOW)],
    [
      'a write that failed backs off as a store read would',
      { turn: { ...slotDone, intent: { kind: 'failed', failures: 3 } } },
      wait('store_unavailable', NOW + 4 * MIN),
    ],
  ]);
});

describe('issueReason: why a call is made (the label of certshare_issuance_attempts_total)', () => {
  const rows: Array<[string, Partial<IssuanceSnapshot>, string]> = [
    ['nothing stored, nothing held', {}, 'no_certificate'],
    ['an unusable store, nothing held', { store: { state: 'unusable' } }, 'stored_unusable'],
    ['a held certificate due', { held: due, store: { state: 'valid', notAfter: due.notAfter } }, 'expiry'],
    ['a held certificate over an unusable store (restored first; its renewal is still an expiry)', { held: due, store: { state: 'unusable' } }, 'expiry'],
    ['the time chosen inside the CA window has come', { held: fresh, ari: ariFor(NOW - 20 * MIN, NOW - MIN / 2) }, 'ca_requested'],
    ['the CA window was over when it arrived (revoked)', { held: fresh, ari: ariFor(NOW - 60 * MIN, NOW - 59 * MIN) }, 'ca_requested_now'],
    [
      'the CA asks for a certificate also due by expiry: its word, for the min_validity',
      { held: due, ari: ariFor(NOW - 60 * MIN, NOW - 59 * MIN) },
      'ca_requested_now',
    ],
    ['a CA window not reached yet: still the expiry', { held: due, ari: ariFor(NOW + 10 * MIN, NOW + 20 * MIN) }, 'expiry'],
  ];
  for (const [name, s, reason] of rows) it(name, () => assert.equal(issueReason(writerOnItsWay(s)), reason));
});

describe('decideIssuance: the first rule that decides wins', () => {
  const rows: Array<[string, Partial<IssuanceSnapshot>, IssuanceDecision]> = [
    ['an unreadable store before a reader', { store: { state: 'unreadable', failures: 1 }, role: reader }, wait('store_unavailable', NOW + MIN)],
    [
      'a restore before the certificate counts as not due',
      { held: fresh, store: { state: 'absent' } },
      { action: 'restore', reason: 'stored_mismatch', at: NOW },
    ],
    [
      'a pending pair before a held one that is not due',
      { held: fresh, store: { state: 'valid', notAfter: fresh.notAfter }, pending: { notBefore: NOW + MIN } },
      wait('not_yet_valid', NOW + MIN),
    ],
    [
      'a reader with a due certificate waits for the writer, whatever the rate limits',
      { held: due, store: { state: 'valid', notAfter: due.notAfter }, role: reader, coordination: { retryNotBefore: NOW + 30 * MIN } },
      wait('not_writer', NOW + MIN),
    ],
    [
      'a rate limit before the floor and another writer',
      { coordination: { retryNotBefore: NOW + 30 * MIN, intent: { holder: 'writer-1', at: NOW } }, callFloor: NOW + 40 * MIN },
      wait('rate_limited', NOW + 30 * MIN),
    ],
    ['our backoff before the floor', { backoff: { until: NOW + MIN, reason: 'too_short' }, callFloor: NOW + 40 * MIN }, wait('too_short', NOW + MIN)],
    ['the floor before another writer', { callFloor: NOW + MIN, coordination: { intent: { holder: 'writer-1', at: NOW } } }, wait('min_interval', NOW + MIN)],
    ['another writer before asking the budget', { coordination: { intent: { holder: 'writer-1', at: NOW } } }, wait('other_writer_issuing', NOW + 10 * MIN)],
    [
      'every step taken: issue',
      { turn: { budget: { kind: 'granted' }, slot: true, intent: { kind: 'recorded' } } },
      { action: 'issue', reason: 'no_certificate', at: NOW },
    ],
    [
      'a due certificate the store holds: renew',
      { held: due, store: { state: 'valid', notAfter: due.notAfter }, turn: { budget: { kind: 'not_needed' }, slot: true, intent: { kind: 'recorded' } } },
      { action: 'issue', reason: 'expiry', at: NOW },
    ],
    [
      'a revoked certificate not due by expiry: renew through the same steps',
      {
        held: fresh,
        store: { state: 'valid', notAfter: fresh.notAfter },
        ari: ariFor(NOW - 60 * MIN, NOW - 59 * MIN),
        turn: { budget: { kind: 'not_needed' }, slot: true, intent: { kind: 'recorded' } },
      },
      { action: 'issue', reason: 'ca_requested_now', at: NOW },
    ],
    [
      'the CA asks, but the storm bound holds',
      { held: fresh, store: { state: 'valid', notAfter: fresh.notAfter }, ari: ariFor(NOW - 60 * MIN, NOW - 59 * MIN), callFloor: NOW + MIN },
      wait('min_interval', NOW + MIN),
    ],
    [
      'the CA asks a reader: the writer renews',
      { held: fresh, store: { state: 'valid', notAfter: fresh.notAfter }, ari: ariFor(NOW - 60 * MIN, NOW - 59 * MIN), role: reader },
      wait('not_writer', NOW + MIN),
    ],
  ];
  for (const [name, s, expected] of rows) it(name, () => assert.deepEqual(decideIssuance(writerOnItsWay(s), settings), expected));

  it('walks a first issuance step by step: budget, slot, intent, call', () => {
    const s = writerOnItsWay({});
    const actions: string[] = [];
    const steps: Array<(t: IssuanceSnapshot['turn']) => void> = [
      (t) => (t.budget = { kind: 'granted' }),
      (t) => (t.slot = true),
      (t) => (t.intent = { kind: 'recorded' }),
    ];
    for (const step of [...steps, undefined]) {
      const d = decideIssuance(s, settings);
      actions.push(`${d.action}/${d.reason}`);
      step?.(s.turn);
    }
    assert.deepEqual(actions, ['ask_budget/no_certificate', 'take_slot/no_certificate', 'announce/no_certificate', 'issue/no_certificate']);
  });
});

describe('planAfterCall: when to look again after a call that gave a certificate', () => {
  const rows: Array<[string, Parameters<typeof planAfterCall>[0], IssuanceDecision]> = [
    [
      'a pair for later: at its notBefore',
      { now: NOW, held: undefined, pending: { notBefore: NOW + MIN }, backoff: undefined },
      wait('not_yet_valid', NOW + MIN),
    ],
    [
      'a new certificate: at its renewal point',
      { now: NOW, held: fresh, pending: undefined, backoff: undefined },
      { action: 'use', reason: 'not_due', at: NOW + 35 * MIN },
    ],
    [
      'one too short: not before the backoff ends',
      { now: NOW, held: due, pending: undefined, backoff: { until: NOW + MIN, reason: 'too_short' } },
      wait('too_short', NOW + MIN),
    ],
    [
      'a backoff that ends before the renewal point does not delay it',
      { now: NOW, held: fresh, pending: undefined, backoff: { until: NOW + MIN, reason: 'too_short' } },
      { action: 'use', reason: 'not_due', at: NOW + 35 * MIN },
    ],
  ];
  for (const [name, s, expected] of rows) it(name, () => assert.deepEqual(planAfterCall(s, settings), expected));
});

describe('judgeAnswer: what a CertPair answer is worth', () => {
  const held = { ...fresh, serial: 'A' };
  const heldDue = { ...due, serial: 'A' };
  const asked = { minValidityMs: 0, minIssueIntervalMs: MIN };
  const renewalAsked = { minValidityMs: 46 * MIN, minIssueIntervalMs: MIN };
  const pair = (serial: string, notBefore: number, lifeMin: number) => ({ serial, notBefore, notAfter: notBefore + lifeMin * MIN });
  const rows: Array<[string, ReturnType<typeof pair>, Parameters<typeof judgeAnswer>[1], typeof asked, ReturnType<typeof judgeAnswer>]> = [
    ['the held certificate again, not due: unchanged', { ...fresh, serial: 'A' }, held, asked, { kind: 'unchanged' }],
    ['the held certificate again, due: refused', { ...due, serial: 'A' }, heldDue, renewalAsked, { kind: 'due_again' }],
    ['a first certificate', pair('B', NOW, 90), undefined, asked, { kind: 'new', usableAt: 'now', tooShort: undefined }],
    ['a renewal', pair('B', NOW, 90), heldDue, renewalAsked, { kind: 'new', usableAt: 'now', tooShort: undefined }],
    [
      'valid from later (the issuer clock ahead)',
      pair('B', NOW + MIN, 90),
      heldDue,
      renewalAsked,
      { kind: 'new', usableAt: 'not_before', tooShort: undefined },
    ],
    [
      'less than the min_validity asked for',
      pair('B', NOW, 45),
      heldDue,
      renewalAsked,
      { kind: 'new', usableAt: 'now', tooShort: `valid for ${45 * MIN} ms from now, less than the ${46 * MIN} ms asked for (min_validity)` },
    ],
    [
      'due sooner than the minimum interval',
      pair('B', NOW, 1),
      undefined,
      asked,
      { kind: 'new', usableAt: 'now', tooShort: 'due for renewal 30000 ms after it was obtained, sooner than the 60000 ms minimum between two issuances' },
    ],
    ['expiring no later than the held one', pair('B', NOW - 60 * MIN, 100), heldDue, asked, { kind: 'older', tooShort: undefined }],
    [
      'older and too short',
      pair('B', NOW - 60 * MIN, 100),
      heldDue,
      renewalAsked,
      { kind: 'older', tooShort: `valid for ${40 * MIN} ms from now, less than the ${46 * MIN} ms asked for (min_validity)` },
    ],
  ];
  for (const [name, answer, h, a, expected] of rows) it(name, () => assert.deepEqual(judgeAnswer(answer, h, NOW, settings.renewal, a), expected));
});
