import assert from 'node:assert/strict';
import { beforeEach, describe, it } from 'node:test';
import { CertLoop, type CertLoopDeps } from '../../src/core/loop/cert-loop.ts';
import { LoopSupervisor } from '../../src/core/loop/loop-supervisor.ts';
import { inspectCertPair, validateCertPair, type CertInfo } from '../../src/core/certificates/certificate.ts';
import { breakGlassPoint } from '../../src/core/federation/home-verdicts.ts';
import { rotationExitTime } from '../../src/core/renewal/renewal.ts';
import type { Clock } from '../../src/core/ports/clock.ts';
import { LocalApiError, type CertPair, type CertPairOptions } from '../../src/core/ports/localapi.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import { fanOut, type AttemptResult } from '../../src/core/ports/observer.ts';
import { staticRole, type LoadOptions, type StoredCert } from '../../src/core/ports/store.ts';
import { ariRenewalDone, holding, NO_ARI_STATE, withAnswer, type AriState, type AriStateSource } from '../../src/core/renewal/renewal-info.ts';
import type { IssueReason } from '../../src/core/issuance/issuance-policy.ts';

const alwaysWriter = staticRole('writer-0', true);
const alwaysReader = staticRole('reader-1', false);
import { StartupGrace } from '../../src/core/loop/startup-grace.ts';
import { makePair } from '../support/certs.ts';
import { recordingLogger, type LogEntry } from '../support/recording-logger.ts';
import { FakeClock } from '../support/fake-clock.ts';
import { MemoryStore } from '../support/memory-store.ts';

const domain = 'proxy.tailnet-9.ts.net';
const MIN = 60_000;
const LIFETIME = 90 * MIN; // scaled down; under 10 days, so renewal is due at half the lifetime (45 minutes)

/** A clock the test sets by hand; loops are driven turn by turn, so nothing sleeps. */
class ManualClock implements Clock {
  t = Math.floor(Date.now() / 1000) * 1000;
  now = (): number => this.t;
  sleep = (): Promise<void> => Promise.reject(new Error('turn-by-turn tests never sleep'));
}

interface Harness {
  loop: CertLoop;
  store: MemoryStore;
  clock: ManualClock;
  calls: CertPairOptions[];
  responses: Array<() => Promise<CertPair>>;
  attempts: AttemptResult[];
}

function harness(overrides: Partial<CertLoopDeps> = {}): Harness {
  const clock = new ManualClock();
  const store = new MemoryStore();
  const calls: CertPairOptions[] = [];
  const responses: Array<() => Promise<CertPair>> = [];
  const attempts: AttemptResult[] = [];
  const loop = new CertLoop(domain, {
    localApi: {
      certPair: async (_d, options) => {
        calls.push(options);
        const next = responses.shift();
        if (!next) throw new Error('unexpected CertPair call');
        return next();
      },
    },
    store,
    role: alwaysWriter,
    availability: { waitFor: async () => {} },
    clock,
    renewal: { renewFraction: 1 / 3, checkIntervalMs: 24 * 60 * MIN },
    backoff: { firstRetryMs: MIN, retryCapMs: 24 * 60 * MIN, rateLimitFirstRetryMs: 60 * MIN },
    observer: fanOut([{ attempt: (_d, r) => attempts.push(r) }]),
    logger: silentLogger,
    intentTtlMs: 10 * MIN,
    ...overrides,
  });
  return { loop, store, clock, calls, responses, attempts };
}

const signal = new AbortController().signal;

/** Records, per load() of `store`, whether it asked for the store itself (LoadOptions.fresh). */
function freshFlags(store: MemoryStore): boolean[] {
  const flags: boolean[] = [];
  const load = store.load.bind(store);
  Object.assign(store, {
    load: (d: string, _signal: AbortSignal, options?: LoadOptions) => {
      flags.push(options?.fresh === true);
      return load(d);
    },
  });
  return flags;
}
const fresh = (h: Harness): Promise<CertPair> => makePair(domain, h.clock.now(), LIFETIME);

describe('CertLoop', () => {
  let h: Harness;
  beforeEach(() => {
    h = harness();
  });

  it('issues when nothing is stored, stores it, and waits until the renewal point', async () => {
    const pair = await fresh(h);
    h.responses.push(async () => pair);
    const wait = await h.loop.turn(signal);
    assert.equal(h.calls.length, 1);
    assert.equal(h.calls[0]!.minValidityMs, 0);
    assert.equal(h.store.serial(domain), validateCertPair(pair, domain, h.clock.now()).serial);
    assert.equal(wait, 45 * MIN);
    assert.deepEqual(h.attempts, ['success']);
  });

  it('uses a valid stored certificate as is: a restart issues nothing', async () => {
    const pair = await fresh(h);
    h.store.content.set(domain, { state: 'valid', cert: { pair, info: validateCertPair(pair, domain, h.clock.now()) } });
    h.clock.t += 10 * MIN;
    assert.equal(await h.loop.turn(signal), 35 * MIN);
    assert.equal(h.calls.length, 0);
    assert.equal(h.loop.current?.pair, pair);
  });

  it('renews at the renewal point, asking tailscaled for the remaining share', async () => {
    h.responses.push(() => fresh(h));
    await h.loop.turn(signal);
    const first = h.store.serial(domain);
    h.clock.t += 45 * MIN;
    h.responses.push(() => fresh(h));
    await h.loop.turn(signal);
    assert.equal(h.calls.length, 2);
    assert.ok(h.calls[1]!.minValidityMs > 45 * MIN);
    assert.notEqual(h.store.serial(domain), first);
  });

  it('never answers a failed store read with an issuance', async () => {
    h.store.failReads = true;
    const wait = await h.loop.turn(signal);
    assert.equal(h.calls.length, 0);
    assert.equal(wait, MIN);
    assert.equal(await h.loop.turn(signal), 2 * MIN, 'store retries back off');
  });

  it('honours Retry-After exactly: no call before it, one after', async () => {
    h.responses.push(async () => {
      throw new LocalApiError({ request: 'GET /localapi/v0/cert/x', failure: 'cert' }, { status: 429, body: 'rateLimited', retryAfterMs: 17 * MIN });
    });
    assert.equal(await h.loop.turn(signal), 17 * MIN);
    h.clock.t += 17 * MIN - 1;
    assert.equal(await h.loop.turn(signal), 1);
    assert.equal(h.calls.length, 1);
    h.clock.t += 1;
    h.responses.push(() => fresh(h));
    await h.loop.turn(signal);
    assert.equal(h.calls.length, 2);
    assert.deepEqual(h.attempts, ['rate_limited', 'success']);
  });

  it('backs off 1m, 2m, 4m on errors and resets after a success', async () => {
    const waits: number[] = [];
    for (let i = 0; i < 3; i++) {
      h.responses.push(async () => {
        throw new LocalApiError({ request: 'GET /localapi/v0/cert/x', failure: 'cert' }, { status: 500, body: 'acme: internal error' });
      });
      const wait = await h.loop.turn(signal);
      waits.push(wait);
      h.clock.t += wait;
    }
    assert.deepEqual(waits, [MIN, 2 * MIN, 4 * MIN]);
    h.responses.push(() => fresh(h));
    await h.loop.turn(signal);
    h.clock.t += 45 * MIN;
    h.responses.push(async () => {
      throw new LocalApiError({ request: 'GET /localapi/v0/cert/x', failure: 'cert' }, { status: 500, body: 'acme: internal error' });
    });
    assert.equal(await h.loop.turn(signal), MIN);
  });

  it('refuses garbage and mismatched pairs and keeps the previous certificate', async () => {
    h.responses.push(() => fresh(h));
    await h.loop.turn(signal);
    const kept = h.store.serial(domain);
    h.clock.t += 45 * MIN;
    const other = await fresh(h);
    h.responses.push(async () => ({ keyPem: other.keyPem, certPem: (await fresh(h)).certPem }));
    await h.loop.turn(signal);
    h.clock.t += MIN;
    h.responses.push(async () => ({ keyPem: 'junk', certPem: 'more junk' }));
    await h.loop.turn(signal);
    assert.equal(h.store.serial(domain), kept);
    assert.equal(h.loop.current?.info.serial, kept);
    assert.deepEqual(h.attempts, ['success', 'rejected', 'rejected']);
  });

  it('refuses the same certificate again when it is due, and an older one', async () => {
    const pair = await fresh(h);
    h.responses.push(async () => pair);
    await h.loop.turn(signal);
    h.clock.t += 45 * MIN;
    h.responses.push(async () => pair);
    await h.loop.turn(signal);
    assert.deepEqual(h.attempts, ['success', 'rejected']);
    h.clock.t += MIN;
    h.responses.push(() => makePair(domain, h.clock.now() - 60 * MIN, 70 * MIN));
    await h.loop.turn(signal);
    assert.deepEqual(h.attempts, ['success', 'rejected', 'too_short'], 'an older one has less than min_validity asked for');
    assert.equal(h.store.serial(domain), h.loop.current?.info.serial);
    assert.equal(h.loop.current?.pair, pair, 'the older one is not taken');
  });

  it('restores a deleted or garbage Secret from memory without issuing', async () => {
    h.responses.push(() => fresh(h));
    await h.loop.turn(signal);
    const serial = h.store.serial(domain);
    h.store.content.delete(domain);
    assert.equal(await h.loop.turn(signal), 0);
    assert.equal(h.store.serial(domain), serial);
    h.store.content.set(domain, { state: 'unusable', reason: 'hand-edited' });
    await h.loop.turn(signal);
    assert.equal(h.store.serial(domain), serial);
    assert.equal(h.calls.length, 1);
  });

  it("becoming the writer, restores the store's newest valid pair instead of its own older one, issuing nothing", async () => {
    // The 50-domain chaos run: a reader holding O; the writer stored the renewal N and someone wrote garbage
    // over it at once; both reached this replica's watch together (its loop never read N), then it became
    // the writer. Restoring O, already due, meant renewing it: an extra issuance in the window N covered.
    let writer = false;
    h = harness({ role: { identity: 'replica-1', canIssue: () => writer } });
    const old = await fresh(h);
    h.store.content.set(domain, { state: 'valid', cert: { pair: old, info: validateCertPair(old, domain, h.clock.now()) } });
    await h.loop.turn(signal);
    h.clock.t += LIFETIME / 2; // O is due
    const renewed = await fresh(h);
    const n: StoredCert = { pair: renewed, info: validateCertPair(renewed, domain, h.clock.now()), obtainedAt: h.clock.now() };
    h.store.content.set(domain, { state: 'unusable', reason: 'hand-edited', lastValid: n });
    writer = true;
    assert.equal(await h.loop.turn(signal), 0);
    assert.equal(h.store.serial(domain), n.info.serial, 'N restored');
    assert.equal(h.loop.current, n);
    assert.equal(await h.loop.turn(signal), 45 * MIN, 'N is stored and not due: wait for its renewal point');
    assert.equal(h.calls.length, 0);
  });

  it('restores the newest valid pair over an older valid one written by hand, and never goes backwards', async () => {
    let writer = false;
    h = harness({ role: { identity: 'replica-1', canIssue: () => writer } });
    const stored = async (at: number): Promise<StoredCert> => {
      const pair = await makePair(domain, at, LIFETIME);
      return { pair, info: validateCertPair(pair, domain, h.clock.now()) };
    };
    const older = await stored(h.clock.now() - 10 * MIN);
    const newest = await stored(h.clock.now());
    h.store.content.set(domain, { state: 'valid', cert: older, lastValid: newest });
    writer = true;
    await h.loop.turn(signal);
    assert.equal(h.store.serial(domain), newest.info.serial, 'an older valid pair in the store is not what the store last saw');
    // A last valid pair older than the one held is never restored.
    h.store.content.set(domain, { state: 'unusable', reason: 'hand-edited', lastValid: older });
    await h.loop.turn(signal);
    assert.equal(h.store.serial(domain), newest.info.serial);
    // Nor an expired one: the loop has nothing left, and issues.
    h.clock.t += LIFETIME;
    h.store.content.set(domain, { state: 'absent', lastValid: newest });
    h.responses.push(() => fresh(h));
    await h.loop.turn(signal);
    assert.equal(h.calls.length, 1);
    assert.notEqual(h.store.serial(domain), newest.info.serial);
  });

  it('keeps an issued certificate when the save fails and stores it later without reissuing', async () => {
    h.store.failWrites = true;
    h.responses.push(() => fresh(h));
    await h.loop.turn(signal);
    assert.ok(h.loop.current, 'held in memory');
    h.store.failWrites = false;
    await h.loop.turn(signal);
    assert.equal(h.store.serial(domain), h.loop.current?.info.serial);
    assert.equal(h.calls.length, 1);
  });

  it('never calls CertPair as a reader, and picks up what the writer stored', async () => {
    h = harness({ role: alwaysReader });
    assert.equal(await h.loop.turn(signal), MIN, 'no certificate yet: look again at the first-retry pace');
    const pair = await fresh(h);
    h.store.content.set(domain, { state: 'valid', cert: { pair, info: validateCertPair(pair, domain, h.clock.now()) } });
    await h.loop.turn(signal);
    assert.equal(h.loop.current?.pair, pair);
    assert.equal(h.calls.length, 0);
  });

  it('takes the pair the store holds at an equal notAfter (two certificates of one second), never one expiring earlier', async () => {
    h = harness({ role: alwaysReader });
    const store = (pair: CertPair): void => {
      h.store.content.set(domain, { state: 'valid', cert: { pair, info: validateCertPair(pair, domain, h.clock.now()) } });
    };
    const [own, record] = [await fresh(h), await fresh(h)];
    store(own);
    await h.loop.turn(signal);
    store(record);
    await h.loop.turn(signal);
    assert.equal(h.loop.current?.pair, record, "what the store holds now (a member's break-glass pair and the home's renewal tie)");
    store(await makePair(domain, h.clock.now() - 1000, LIFETIME));
    await h.loop.turn(signal);
    assert.equal(h.loop.current?.pair, record, 'an earlier expiry never replaces it');
  });

  it('reads the store itself, not the watched copy, once its certificate stayed due a first-retry interval', async () => {
    h = harness({ role: alwaysReader });
    const loads = freshFlags(h.store);
    const pair = await fresh(h);
    h.store.content.set(domain, { state: 'valid', cert: { pair, info: validateCertPair(pair, domain, h.clock.now()) } });
    await h.loop.turn(signal);
    h.clock.t += LIFETIME / 2; // due (renewal at a third of the lifetime), the writer's renewal not seen yet
    await h.loop.turn(signal);
    h.clock.t += MIN - 1;
    await h.loop.turn(signal);
    h.clock.t += 1;
    await h.loop.turn(signal);
    assert.deepEqual(loads, [false, false, false, true], 'the copy while the writer may be renewing; the store after a first-retry interval');
    const renewed = await fresh(h);
    h.store.content.set(domain, { state: 'valid', cert: { pair: renewed, info: validateCertPair(renewed, domain, h.clock.now()) } });
    await h.loop.turn(signal);
    await h.loop.turn(signal);
    assert.deepEqual(loads.slice(4), [true, false], 'the renewal read, the copy again');
  });

  it('retries failed store reads at least every half of what the certificate held has left, not a backoff step past its expiry', async () => {
    h = harness({ role: alwaysReader, backoff: { firstRetryMs: MIN, retryCapMs: 24 * 60 * MIN, rateLimitFirstRetryMs: 60 * MIN } });
    const pair = await fresh(h);
    h.store.content.set(domain, { state: 'valid', cert: { pair, info: validateCertPair(pair, domain, h.clock.now()) } });
    await h.loop.turn(signal);
    h.store.failReads = true;
    const waits: number[] = [];
    // Far from expiry the transient backoff doubles (1, 2, 4, 8 minutes, its cap); near it, half of what is left.
    h.clock.t += LIFETIME - 22 * MIN;
    for (let i = 0; i < 6; i++) {
      const wait = await h.loop.turn(signal);
      waits.push(wait);
      h.clock.t += wait;
    }
    assert.deepEqual(
      waits.map((w) => w / MIN),
      [1, 2, 4, 7.5, 3.75, 1.875],
      'doubling until half the remaining validity is sooner',
    );
    h.store.failReads = false;
    assert.equal(h.loop.current?.pair, pair, 'still served: valid until its notAfter');
  });

  it('reads the store itself after a first-retry interval when the stored certificate is unusable (expired), not when none was ever stored', async () => {
    h = harness({ role: alwaysReader });
    const loads = freshFlags(h.store);
    // Never issued (a first issuance, which may wait days in the budget's queue): the watch is enough.
    for (let i = 0; i < 3; i++) h.clock.t += await h.loop.turn(signal);
    assert.deepEqual(loads, [false, false, false]);
    // A restarted reader finds the certificate expired in the store: the writer's renewal is overdue.
    h.store.content.set(domain, { state: 'unusable', reason: 'expired' });
    loads.length = 0;
    for (let i = 0; i < 3; i++) h.clock.t += await h.loop.turn(signal);
    assert.deepEqual(loads, [false, true, true], 'the store itself once a first-retry interval passed');
  });

  it('drops an expired certificate instead of serving it', async () => {
    h = harness({ role: alwaysReader });
    const pair = await fresh(h);
    h.store.content.set(domain, { state: 'valid', cert: { pair, info: validateCertPair(pair, domain, h.clock.now()) } });
    await h.loop.turn(signal);
    h.clock.t += LIFETIME;
    await h.loop.turn(signal);
    assert.equal(h.loop.current, undefined);
  });
});

describe('CertLoop start-up: an empty Secret while the first issuance runs is said plainly, damage warns at once', () => {
  const EMPTY = { state: 'unusable', reason: 'Secret holds no tls.crt / tls.key', empty: true } as const;
  const GRACE = 30_000;
  /** A reader with a 30 s start-up grace that began at the harness clock's now, and its log lines about the store. */
  function startingReader(): Harness & { lines: () => Array<[LogEntry['level'], string | undefined]> } {
    const { logger, entries } = recordingLogger();
    const clock = new ManualClock();
    const h = harness({ role: alwaysReader, clock, logger, startup: new StartupGrace(clock, GRACE) });
    const about = /stored|first issuance/;
    return { ...h, clock, lines: () => entries.filter((e) => about.test(e.msg ?? '')).map((e) => [e.level, e.msg]) };
  }
  const waiting: [LogEntry['level'], string] = ['info', 'no certificate stored yet; waiting for the first issuance'];
  const unusable: [LogEntry['level'], string] = ['warn', 'stored certificate unusable'];

  it('logs an empty Secret at info within the grace, once, and warns once the grace has passed', async () => {
    const h = startingReader();
    h.store.content.set(domain, EMPTY);
    await h.loop.turn(signal);
    h.clock.t += GRACE - 1;
    await h.loop.turn(signal);
    assert.deepEqual(h.lines(), [waiting], 'info, once');
    h.clock.t += 1;
    await h.loop.turn(signal);
    await h.loop.turn(signal);
    assert.deepEqual(h.lines(), [waiting, unusable], 'then one warning');
  });

  it('warns at once for garbage or half a pair, even at start-up', async () => {
    for (const read of [
      { state: 'unusable', reason: 'tls.crt is not PEM' },
      { state: 'unusable', reason: 'Secret lacks tls.key' },
    ] as const) {
      const h = startingReader();
      h.store.content.set(domain, read);
      await h.loop.turn(signal);
      assert.deepEqual(h.lines(), [unusable], read.reason);
    }
  });

  it('warns at once for an empty Secret once a certificate was held: later it is damage, not start-up', async () => {
    const h = startingReader();
    const pair = await fresh(h);
    h.store.content.set(domain, { state: 'valid', cert: { pair, info: validateCertPair(pair, domain, h.clock.now()) } });
    await h.loop.turn(signal);
    h.store.content.set(domain, EMPTY);
    await h.loop.turn(signal);
    assert.deepEqual(h.lines(), [unusable]);
  });

  it('warns at once without a start-up grace (a loop on its own)', async () => {
    const { logger, entries } = recordingLogger();
    const h = harness({ role: alwaysReader, logger });
    h.store.content.set(domain, EMPTY);
    await h.loop.turn(signal);
    assert.deepEqual(
      entries.filter((e) => e.level !== 'debug').map((e) => [e.level, e.msg]),
      [unusable],
    );
  });

  it('decides as before: only the log level depends on the grace', async () => {
    const graced = startingReader();
    const plain = harness({ role: alwaysReader });
    for (const h of [graced, plain]) h.store.content.set(domain, EMPTY);
    assert.equal(await graced.loop.turn(signal), await plain.loop.turn(signal));
  });
});

describe('CertLoop coordination between writers', () => {
  it("waits for another writer's fresh intent, and takes over once it lapses", async () => {
    const h = harness();
    h.store.coordination.set(domain, { intent: { holder: 'writer-1', at: h.clock.now() - MIN } });
    assert.equal(await h.loop.turn(signal), 9 * MIN);
    assert.equal(h.calls.length, 0);
    h.clock.t += 9 * MIN;
    h.responses.push(() => fresh(h));
    await h.loop.turn(signal);
    assert.equal(h.calls.length, 1);
    assert.deepEqual(h.store.intents, [{ domain, holder: 'writer-0' }], 'the intent is recorded before the call');
  });

  it('goes ahead over its own intent (a restart mid-issuance: its tailscaled has the result cached)', async () => {
    const h = harness();
    h.store.coordination.set(domain, { intent: { holder: 'writer-0', at: h.clock.now() } });
    h.responses.push(() => fresh(h));
    await h.loop.turn(signal);
    assert.equal(h.calls.length, 1);
  });

  it('honours a rate limit recorded by another replica, and records its own', async () => {
    const h = harness();
    h.store.coordination.set(domain, { retryNotBefore: h.clock.now() + 30 * MIN });
    assert.equal(await h.loop.turn(signal), 30 * MIN);
    assert.equal(h.calls.length, 0);
    h.clock.t += 30 * MIN;
    h.responses.push(async () => {
      throw new LocalApiError(
        { request: 'GET /localapi/v0/cert/x', failure: 'cert' },
        { status: 500, body: 'urn:ietf:params:acme:error:rateLimited: too many certificates' },
      );
    });
    assert.equal(await h.loop.turn(signal), 60 * MIN, 'no Retry-After: an hour');
    assert.equal(h.store.coordination.get(domain)?.retryNotBefore, h.clock.now() + 60 * MIN);
    const restarted = harness();
    restarted.store.coordination = h.store.coordination;
    restarted.clock.t = h.clock.t + 5 * MIN;
    assert.equal(await restarted.loop.turn(signal), 55 * MIN, 'a restarted writer does not retry early');
    assert.equal(restarted.calls.length, 0);
  });

  it('ignores a retry date past the retry cap, or an intent stamped in the future, and reports each (a hostile writer)', async () => {
    const reported: string[] = [];
    const h = harness({ observer: fanOut([{ outOfBounds: (_w, v) => reported.push(v.field) }]) });
    const year9999 = Date.parse('9999-12-31T00:00:00Z');
    h.store.coordination.set(domain, { retryNotBefore: year9999, intent: { holder: 'writer-1', at: year9999 } });
    h.responses.push(() => fresh(h));
    await h.loop.turn(signal);
    assert.equal(h.calls.length, 1, 'issued on time: neither date held the writer');
    assert.deepEqual(reported, ['retry-not-before', 'issuing']);
  });

  it('ignores an obtained-at in the future: the renewal point is measured from notBefore, not pushed to expiry', async () => {
    const reported: string[] = [];
    const h = harness({ observer: fanOut([{ outOfBounds: (_w, v) => reported.push(v.field) }]) });
    const pair = await fresh(h);
    const info = validateCertPair(pair, domain, h.clock.now());
    h.store.content.set(domain, { state: 'valid', cert: { pair, info, obtainedAt: Date.parse('9999-12-31T00:00:00Z') } });
    assert.equal(await h.loop.turn(signal), 45 * MIN, 'as for a certificate read without obtained-at');
    assert.deepEqual(reported, ['obtained-at']);
  });

  it('still honours a retry date at the retry cap, and an intent stamped within the clock skew', async () => {
    const h = harness();
    h.store.coordination.set(domain, { retryNotBefore: h.clock.now() + 24 * 60 * MIN });
    assert.equal(await h.loop.turn(signal), 24 * 60 * MIN);
    const other = harness();
    other.store.coordination.set(domain, { intent: { holder: 'writer-1', at: other.clock.now() + 30_000 } });
    assert.equal(await other.loop.turn(signal), 10 * MIN + 30_000);
    assert.equal(h.calls.length + other.calls.length, 0);
  });

  it('records a Retry-After longer than the retry cap as the cap, keeping its own exact wait', async () => {
    const h = harness();
    h.responses.push(async () => {
      throw new LocalApiError(
        { request: 'GET /localapi/v0/cert/x', failure: 'cert' },
        { status: 429, body: 'urn:ietf:params:acme:error:rateLimited', retryAfterMs: 7 * 24 * 60 * MIN },
      );
    });
    assert.equal(await h.loop.turn(signal), 7 * 24 * 60 * MIN, "the CA's word holds for this loop");
    assert.equal(h.store.coordination.get(domain)?.retryNotBefore, h.clock.now() + 24 * 60 * MIN, 'what other replicas believe');
  });

  it('does not issue when the intent cannot be recorded', async () => {
    const h = harness();
    h.store.failIntents = true;
    assert.equal(await h.loop.turn(signal), MIN);
    assert.equal(h.calls.length, 0);
  });
});

/** What the LoopSupervisor tests share: an hour's timings on `clock`, a silent logger, no observer. */
function managerDefaults(clock: Clock): Omit<CertLoopDeps, 'localApi' | 'store' | 'role'> {
  return {
    availability: { waitFor: async () => {} },
    clock,
    renewal: { renewFraction: 1 / 3, checkIntervalMs: 60 * MIN },
    backoff: { firstRetryMs: MIN, retryCapMs: 60 * MIN, rateLimitFirstRetryMs: 60 * MIN },
    observer: fanOut([]),
    logger: silentLogger,
    intentTtlMs: MIN,
  };
}

describe('LoopSupervisor', () => {
  it('restarts a loop that crashed, and never runs two loops for one domain', async () => {
    const clock = new FakeClock();
    let calls = 0;
    let inFlight = 0;
    let maxInFlight = 0;
    const store = new MemoryStore();
    const manager = new LoopSupervisor({
      localApi: {
        certPair: async () => {
          throw new Error('unreachable in this test');
        },
      },
      store: {
        kind: 'crashy',
        async load(d) {
          inFlight++;
          maxInFlight = Math.max(maxInFlight, inFlight);
          try {
            if (++calls === 1) throw new TypeError('bug');
            return store.load(d);
          } finally {
            inFlight--;
          }
        },
        save: (d, c) => store.save(d, c),
      },
      role: staticRole('reader', false),
      ...managerDefaults(clock),
    });
    manager.setDomains([domain]);
    await clock.waitForSleepers(1);
    assert.deepEqual(clock.pendingDurations(), [MIN], 'the crashed loop waits the first-retry delay');
    await clock.advance(MIN);
    await clock.waitForSleepers(1);
    assert.equal(calls, 2, 'restarted');
    manager.setDomains([]);
    manager.setDomains([domain]);
    await manager.stop();
    assert.equal(maxInFlight, 1);
  });
});

describe('LoopSupervisor.stopIssuing', () => {
  it('starts no CertPair call once stopping, and settles only when the call under way is stored', async () => {
    const clock = new FakeClock();
    const store = new MemoryStore();
    const called: string[] = [];
    let answer: ((pair: CertPair) => void) | undefined;
    let callMade: (() => void) | undefined;
    const firstCall = new Promise<void>((resolve) => {
      callMade = resolve;
    });
    const manager = new LoopSupervisor({
      localApi: {
        certPair: (d) => {
          called.push(d);
          callMade?.();
          return new Promise<CertPair>((resolve) => {
            answer = resolve;
          });
        },
      },
      store,
      role: alwaysWriter,
      ...managerDefaults(clock),
    });
    manager.setDomains([domain]);
    await firstCall;
    const settled = manager.stopIssuing();
    let done = false;
    void settled.then(() => {
      done = true;
    });
    // A second domain appears while stopping: it must not be issued.
    const other = 'other.tailnet-9.ts.net';
    manager.setDomains([domain, other]);
    await clock.waitForSleepers(1);
    assert.equal(done, false, 'not settled while tailscaled is still answering');
    answer!(await makePair(domain, clock.now() - MIN, LIFETIME));
    await settled;
    assert.equal(store.content.get(domain)?.state, 'valid', 'the certificate under way is stored before stopIssuing settles');
    assert.deepEqual(called, [domain], 'no CertPair call started after stopIssuing');
    await manager.stop();
  });
});

describe('LoopSupervisor.verifyStored: a stopping writer puts back what the store lost before handing over', () => {
  it('reads the store itself and restores the certificate a hand edit replaced, without a CertPair call', async () => {
    const clock = new FakeClock();
    const store = new MemoryStore();
    const pair = await makePair(domain, clock.now() - MIN, LIFETIME);
    store.content.set(domain, { state: 'valid', cert: { pair, info: validateCertPair(pair, domain, clock.now()) } });
    const fresh = freshFlags(store);
    const manager = new LoopSupervisor({
      localApi: {
        certPair: () => Promise.reject(new Error('no CertPair call expected')),
      },
      store,
      role: alwaysWriter,
      ...managerDefaults(clock),
    });
    manager.setDomains([domain]);
    await clock.waitForSleepers(1); // holding the stored certificate, asleep until its renewal point
    // A hand edit the loop's watch did not deliver (no wake): garbage in the store.
    store.content.set(domain, { state: 'unusable', reason: 'garbage' });
    await manager.stopIssuing();
    fresh.length = 0;
    await manager.verifyStored(new AbortController().signal);
    assert.deepEqual(fresh, [true], 'the store itself, not a watched copy');
    const stored = store.content.get(domain);
    assert.equal(stored?.state === 'valid' && stored.cert.pair, pair, 'the certificate held is back');

    // Through a flaky API server: failed reads are tried again until the budget ends, not given up on.
    store.content.set(domain, { state: 'unusable', reason: 'garbage' });
    store.failReads = true;
    fresh.length = 0;
    const verified = manager.verifyStored(new AbortController().signal);
    await clock.waitForSleepers(2); // the loop's own sleep and the verification's retry
    assert.ok(fresh.length >= 1, 'tried');
    store.failReads = false;
    await clock.advance(100);
    await verified;
    const again = store.content.get(domain);
    assert.equal(again?.state === 'valid' && again.cert.pair, pair, 'restored on a later try');

    // Refused (a Role without get, or without update): given up at once, not retried for the whole budget.
    for (const refused of ['reads', 'writes'] as const) {
      store.content.set(domain, { state: 'unusable', reason: 'garbage' });
      if (refused === 'reads') store.failReads = 'refused';
      else store.failWrites = 'refused';
      fresh.length = 0;
      const outcome = await Promise.race([
        manager.verifyStored(new AbortController().signal).then(() => 'gave up'),
        clock.waitForSleepers(2).then(() => 'asleep before retrying'), // beside the loop's own sleep
      ]);
      assert.equal(outcome, 'gave up', `${refused} refused: no retry`);
      assert.deepEqual(fresh, [true], `one read when ${refused} are refused`);
      store.failReads = false;
      store.failWrites = false;
    }

    // Once stopping, the loop itself still restores (the role is held, only issuing stopped).
    store.content.set(domain, { state: 'absent' });
    manager.loop(domain)!.wake();
    await clock.waitForSleepers(1);
    assert.equal(store.content.get(domain)?.state, 'valid', 'restored by the loop of a stopping writer');
    await manager.stop();
  });
});

describe('CertLoop intent after a failure', () => {
  it('withdraws its intent when tailscaled answered with an error, keeps it after a timeout', async () => {
    const h = harness();
    h.responses.push(async () => {
      throw new LocalApiError({ request: 'GET /localapi/v0/cert/x', failure: 'cert' }, { status: 500, body: 'acme: internal error' });
    });
    await h.loop.turn(signal);
    assert.equal(h.store.coordination.get(domain)?.intent, undefined, 'withdrawn: nobody needs to wait for it');
    h.clock.t += MIN;
    h.responses.push(async () => {
      throw new LocalApiError({ request: 'GET /localapi/v0/cert/x', failure: 'cert timed out' }, { timedOut: true });
    });
    await h.loop.turn(signal);
    assert.equal(h.store.coordination.get(domain)?.intent?.holder, 'writer-0', 'tailscaled may still be issuing');
  });
});

describe('CertLoop against backdating, short and skewed issuers', () => {
  it('renews a backdated certificate over the validity it had when obtained, asking no more than a fresh one has', async () => {
    const h = harness();
    // Valid 45 minutes from issuance, notBefore 60 minutes back (lifetime 105 minutes).
    const backdated = (): Promise<CertPair> => makePair(domain, h.clock.now() - 60 * MIN, 105 * MIN);
    h.responses.push(backdated);
    assert.equal(await h.loop.turn(signal), 22.5 * MIN, 'due at half of the 45 minutes it had, not at once');
    h.clock.t += 22.5 * MIN;
    h.responses.push(backdated);
    await h.loop.turn(signal);
    assert.equal(h.calls.length, 2);
    assert.ok(h.calls[1]!.minValidityMs > 22.5 * MIN && h.calls[1]!.minValidityMs <= 45 * MIN, `min_validity ${h.calls[1]!.minValidityMs}`);
    assert.deepEqual(h.attempts, ['success', 'success']);
  });

  it('calls a renewal that returns less than asked CERTSHARE_CERT_TOO_SHORT, logs what it got, and backs off', async () => {
    const warnings: object[] = [];
    const logger = { ...silentLogger, warn: (obj: object) => warnings.push(obj), child: () => logger };
    const h = harness({ logger });
    h.responses.push(() => fresh(h));
    await h.loop.turn(signal);
    const held = h.loop.current;
    h.clock.t += 45 * MIN;
    // The issuer now hands out 30-minute certificates: less than the ~45 minutes asked for.
    h.responses.push(() => makePair(domain, h.clock.now(), 30 * MIN));
    const wait = await h.loop.turn(signal);
    assert.deepEqual(h.attempts, ['success', 'too_short']);
    assert.equal(h.loop.current, held, 'it expires before the held one: not taken');
    assert.equal(wait, MIN, 'backs off from --first-retry');
    const line = warnings.find((w) => (w as { code?: string }).code === 'CERTSHARE_CERT_TOO_SHORT') as Record<string, unknown> | undefined;
    assert.ok(line, 'logged with its code');
    assert.equal(line.minValidityMs, h.calls[1]!.minValidityMs);
    assert.equal(line.lifetimeMs, 30 * MIN);
    assert.equal(line.validFromNowMs, 30 * MIN);
    // The next call asks for no more than the renewal share of what this issuer now gives.
    h.clock.t += MIN;
    h.responses.push(() => makePair(domain, h.clock.now(), 30 * MIN));
    await h.loop.turn(signal);
    assert.ok(h.calls[2]!.minValidityMs <= 16 * MIN, `min_validity ${h.calls[2]!.minValidityMs}`);
  });

  it('keeps a pair whose notBefore is ahead of our clock and uses it from then, without asking again', async () => {
    const h = harness();
    h.responses.push(() => makePair(domain, h.clock.now() + 2 * MIN, LIFETIME));
    assert.equal(await h.loop.turn(signal), 2 * MIN, 'waits for its notBefore');
    assert.equal(h.loop.current, undefined, 'not valid yet: not in use');
    h.clock.t += 2 * MIN;
    assert.equal(await h.loop.turn(signal), 0, 'stores it');
    const adopted = h.loop.current as StoredCert | undefined; // the assertion above narrowed the getter
    assert.equal(h.store.serial(domain), adopted?.info.serial);
    assert.equal(await h.loop.turn(signal), 45 * MIN);
    assert.equal(h.calls.length, 1);
    assert.deepEqual(h.attempts, ['success']);
  });

  it('stores a pair valid only later at once, beside the served one: a writer started in its place waits for it and orders nothing', async () => {
    const h = harness();
    h.responses.push(() => fresh(h));
    await h.loop.turn(signal);
    const first = h.store.serial(domain);
    h.clock.t += 45 * MIN;
    h.responses.push(() => makePair(domain, h.clock.now() + 2 * MIN, LIFETIME));
    assert.equal(await h.loop.turn(signal), 2 * MIN, 'waits for its notBefore');
    const renewal = h.store.pending.get(domain)?.info.serial;
    assert.ok(renewal !== undefined, 'stored at once, as the pair for later');
    assert.equal(h.store.serial(domain), first, 'not served before its notBefore');
    // The writer dies; its successor reads the store.
    const successor = harness({ store: h.store });
    successor.clock.t = h.clock.t + MIN;
    assert.equal(await successor.loop.turn(signal), MIN, "waits for the stored pair's notBefore");
    assert.equal(successor.loop.current?.info.serial, first, 'serves the old copy until then');
    successor.clock.t += MIN;
    assert.equal(await successor.loop.turn(signal), 0, 'moves it into the served pair');
    assert.equal(h.store.serial(domain), renewal);
    assert.equal(h.store.pending.get(domain), undefined, 'one write: served, no longer for later');
    assert.equal(await successor.loop.turn(signal), 45 * MIN);
    assert.equal(successor.calls.length, 0, 'the window has one renewal');
  });

  /** A loop with a readiness lead of 2 minutes, its store holding a fresh pair; what it counts as out of bounds. */
  async function holdingWithLead(): Promise<{ h: Harness; reported: string[]; pair: CertPair; info: CertInfo; exit: number }> {
    const reported: string[] = [];
    const h = harness({ observer: fanOut([{ outOfBounds: (_w, v) => reported.push(v.field) }]), ...lead });
    const pair = await fresh(h);
    const info = validateCertPair(pair, domain, h.clock.now());
    h.store.content.set(domain, { state: 'valid', cert: { pair, info } });
    return { h, reported, pair, info, exit: rotationExitTime(info, { renewFraction: 1 / 3 }, lead.readinessLeadMs) };
  }
  const lead = { readinessLeadMs: 2 * MIN };

  it('a pair stored for later that starts past the readiness exit of the certificate held counts for nothing (a stolen token)', async () => {
    const { h, reported, pair, info, exit } = await holdingWithLead();
    h.clock.t += 45 * MIN;
    const late = await makePair(domain, exit + 1000, LIFETIME); // whole seconds
    h.store.pending.set(domain, { pair: late, info: inspectCertPair(late, domain) });
    h.responses.push(() => fresh(h));
    await h.loop.turn(signal);
    assert.equal(h.calls.length, 1, 'renewed on time: the pair starting later held nothing');
    assert.deepEqual(reported, ['pending-not-before']);
    // One starting past the safety point but before the exit is waited for: a writer that renewed late in the window
    // with a CA clock ahead, then died (before: its successor renewed again, a second issuance in the window).
    const other = harness(lead);
    other.store.content.set(domain, { state: 'valid', cert: { pair, info } });
    other.clock.t = h.clock.t;
    const inTime = await makePair(domain, breakGlassPoint(info, { renewFraction: 1 / 3 }, lead.readinessLeadMs) + 1000, LIFETIME);
    other.store.pending.set(domain, { pair: inTime, info: inspectCertPair(inTime, domain) });
    const inTimeStart = inspectCertPair(inTime, domain).notBefore;
    assert.equal(await other.loop.turn(signal), inTimeStart - other.clock.now(), 'waits for it');
    assert.equal(other.calls.length, 0);
  });

  it('a pair stored for later that started past the readiness exit is served once valid: nothing more ordered', async () => {
    // Its writer died before its notBefore; its successor looks once the pair is valid, the copy still valid but out
    // of rotation. Served at once, as tls.crt would be (before: never believed; a second renewal of the window).
    const { h, reported, info, exit } = await holdingWithLead();
    const late = await makePair(domain, exit + 1000, LIFETIME);
    const lateInfo = inspectCertPair(late, domain);
    h.store.pending.set(domain, { pair: late, info: lateInfo });
    h.clock.t = lateInfo.notBefore + 1000;
    assert.ok(h.clock.now() < info.notAfter, 'the copy held is still valid');
    await h.loop.turn(signal);
    assert.equal(h.loop.current?.info.serial, lateInfo.serial, 'the pair valid now is served');
    assert.equal(h.store.serial(domain), lateInfo.serial, 'moved into the served pair');
    assert.equal(h.calls.length, 0, 'nothing ordered');
    assert.deepEqual(reported, [], 'a pair valid now is no value out of its bound');
  });

  it('with nothing held, a pair stored for later counts only if it starts within the retry cap', async () => {
    const reported: string[] = [];
    const h = harness({ observer: fanOut([{ outOfBounds: (_w, v) => reported.push(v.field) }]) });
    const late = await makePair(domain, h.clock.now() + 24 * 60 * MIN + 1000, LIFETIME);
    h.store.pending.set(domain, { pair: late, info: inspectCertPair(late, domain) });
    h.responses.push(() => fresh(h));
    await h.loop.turn(signal);
    assert.equal(h.calls.length, 1);
    assert.deepEqual(reported, ['pending-not-before']);
  });

  it('a restart right after an issuance keeps the minimum interval, counted from the stored certificate', async () => {
    const h = harness();
    // Issued 10 s before the restart, 20 s long: due already, but the last issuance was 10 s ago.
    const pair = await makePair(domain, h.clock.now() - 10_000, 20_000);
    h.store.content.set(domain, { state: 'valid', cert: { pair, info: validateCertPair(pair, domain, h.clock.now()) } });
    assert.equal(await h.loop.turn(signal), 50_000, 'waits out the minute');
    assert.equal(h.calls.length, 0);
  });

  it('never calls CertPair twice within the minimum interval, whatever the certificates look like', async () => {
    const h = harness({ minIssueIntervalMs: 10 * MIN });
    const start = h.clock.t;
    // 4-minute certificates: due after 2 minutes, sooner than the 10-minute floor.
    h.responses.push(() => makePair(domain, h.clock.now(), 4 * MIN));
    await h.loop.turn(signal);
    assert.deepEqual(h.attempts, ['too_short']);
    while (h.clock.t < start + 10 * MIN) {
      const wait = await h.loop.turn(signal);
      assert.ok(wait > 0);
      h.clock.t = Math.min(h.clock.t + Math.min(wait, MIN), start + 10 * MIN);
    }
    assert.equal(h.calls.length, 1, 'no second call inside the floor');
    h.responses.push(() => makePair(domain, h.clock.now(), 4 * MIN));
    await h.loop.turn(signal);
    assert.equal(h.calls.length, 2, 'one once it has passed');
  });
});

describe('CertLoop and the CA word (ACME Renewal Information)', () => {
  /** The daemon's checker reduced to its state per serial; `revoke` gives a serial a window an hour ago. */
  function ariSource(now: () => number): AriStateSource & { revoke(serial: string): void; done: string[] } {
    const states = new Map<string, AriState>();
    const done: string[] = [];
    return {
      done,
      revoke: (serial) => {
        const held = holding(NO_ARI_STATE, `k.${serial}`, now() - MIN);
        states.set(
          serial,
          withAnswer(held, { certId: `k.${serial}`, window: { start: now() - 60 * MIN, end: now() - 59 * MIN }, fetchedAt: now() }, () => 0.5),
        );
      },
      stateFor: (_d, serial) => states.get(serial),
      renewalDone: (_d, serial) => {
        done.push(serial);
        const state = states.get(serial);
        if (state) states.set(serial, ariRenewalDone(state));
      },
    };
  }

  function ariHarness(role = alwaysWriter): Harness & { ari: ReturnType<typeof ariSource>; reasons: IssueReason[] } {
    const reasons: IssueReason[] = [];
    let clockRef: ManualClock | undefined;
    const ari = ariSource(() => clockRef!.now());
    const attempt = (_d: string, result: AttemptResult, why: IssueReason): void => {
      h.attempts.push(result);
      reasons.push(why);
    };
    const h = harness({ renewalInfo: ari, role, observer: fanOut([{ attempt }]) });
    clockRef = h.clock;
    return { ...h, ari, reasons };
  }

  /** A first certificate, revoked 2 minutes later (ARI); returns its serial and the wait of the turn that renews it. */
  async function revokedAndRenewed(h: ReturnType<typeof ariHarness>): Promise<{ revoked: string; wait: number }> {
    h.responses.push(() => fresh(h));
    await h.loop.turn(signal);
    const revoked = h.loop.current!.info.serial;
    h.clock.t += 2 * MIN;
    h.ari.revoke(revoked);
    h.responses.push(() => fresh(h));
    return { revoked, wait: await h.loop.turn(signal) };
  }

  it('names the certificate the CA asked to replace now in the record; a reader passes on only a value in its bound', async () => {
    const h = ariHarness();
    const { revoked } = await revokedAndRenewed(h);
    assert.deepEqual(h.store.replacedNow, [revoked], 'stored with the replacement, naming the revoked serial');
    const named: string[][] = [];
    const refused: string[] = [];
    const r = harness({
      role: alwaysReader,
      observer: fanOut([{ replacedNow: (_d, s) => named.push([...s]), outOfBounds: (_w, v) => refused.push(v.field) }]),
    });
    const pair = await fresh(r);
    const cert = { pair, info: validateCertPair(pair, domain, r.clock.now()) };
    r.store.content.set(domain, { state: 'valid', cert, replacedNow: 'ABC,0DEF' });
    await r.loop.turn(signal);
    assert.deepEqual(named, [['ABC', '0DEF']]);
    r.store.content.set(domain, { state: 'valid', cert, replacedNow: 'ABC,0DEF,1,2,3' });
    await r.loop.turn(signal);
    assert.deepEqual(named, [['ABC', '0DEF']], 'five serials: ignored whole');
    assert.deepEqual(refused, ['replaced-now']);
  });

  it('renews a certificate the CA revoked at once, with a min_validity above what it has left, and only once', async () => {
    const h = ariHarness();
    const { revoked, wait } = await revokedAndRenewed(h);
    assert.equal(h.calls.length, 2);
    assert.equal(h.calls[1]!.minValidityMs, 88 * MIN + 1000, 'one second more than the 88 minutes left');
    assert.deepEqual(h.reasons, ['no_certificate', 'ca_requested_now']);
    assert.deepEqual(h.ari.done, [revoked]);
    assert.notEqual(h.loop.current!.info.serial, revoked);
    assert.equal(wait, 45 * MIN, 'the new certificate: its own renewal point');
    assert.equal(await h.loop.turn(signal), 45 * MIN);
    assert.equal(h.calls.length, 2);
  });

  it('the same pair back from tailscaled counts as the one order: no second call for that certificate', async () => {
    const h = ariHarness();
    const pair = await fresh(h);
    h.responses.push(
      async () => pair,
      async () => pair,
    );
    await h.loop.turn(signal);
    h.clock.t += 2 * MIN;
    h.ari.revoke(h.loop.current!.info.serial);
    await h.loop.turn(signal);
    assert.deepEqual(h.attempts, ['success', 'unchanged']);
    assert.equal(await h.loop.turn(signal), 43 * MIN, 'back to the expiry rule');
    assert.equal(h.calls.length, 2);
  });

  it('a reader never acts on it', async () => {
    const h = ariHarness(alwaysReader);
    const pair = await fresh(h);
    const info = validateCertPair(pair, domain, h.clock.now());
    h.store.content.set(domain, { state: 'valid', cert: { pair, info } });
    h.clock.t += 2 * MIN;
    h.ari.revoke(info.serial);
    await h.loop.turn(signal);
    assert.equal(h.calls.length, 0);
  });
});

describe('CertLoop: a copy that reaches the store during a CertPair call', () => {
  /**
   * A CertPair call that hangs until its signal aborts; `started` resolves once it is under way. `cancelled()`
   * answers whether the call was cancelled once the watch's read has been answered, and ends it otherwise (so a
   * loop that never cancels fails the test rather than hanging it).
   */
  function hangingCall(h: Harness): { started: Promise<void>; cancelled: () => Promise<boolean> } {
    let begun!: () => void;
    let fail!: (err: Error) => void;
    const started = new Promise<void>((resolve) => {
      begun = resolve;
    });
    h.responses.push(() => {
      const { signal: callSignal } = h.calls.at(-1)!;
      begun();
      return new Promise<CertPair>((_resolve, reject) => {
        fail = reject;
        callSignal?.addEventListener('abort', () => reject(callSignal.reason));
      });
    });
    const cancelled = async (): Promise<boolean> => {
      await new Promise(setImmediate); // the watcher's store read and its verdict are promise steps, no timer
      const aborted = h.calls.at(-1)?.signal?.aborted === true;
      if (!aborted) fail(new Error('the call went on'));
      return aborted;
    };
    return { started, cancelled };
  }
  const stored = async (h: Harness, at: number): Promise<StoredCert> => {
    const pair = await makePair(domain, at, LIFETIME);
    return { pair, info: validateCertPair(pair, domain, h.clock.now()) };
  };

  it('cancels the call when the copy covers the window, and uses it at once (a member pushed its break-glass certificate)', async () => {
    const h = harness();
    const expiring = await stored(h, h.clock.now() - 80 * MIN);
    h.store.content.set(domain, { state: 'valid', cert: expiring });
    const { started, cancelled } = hangingCall(h);
    const turn = h.loop.turn(signal);
    await started;
    const pushed = await stored(h, h.clock.now() - MIN);
    h.store.content.set(domain, { state: 'valid', cert: pushed });
    h.store.changed(domain);
    assert.ok(await cancelled(), 'the call is cancelled');
    assert.equal(await turn, 0, 'the next turn at once');
    assert.deepEqual(h.attempts, ['superseded']);
    assert.equal(h.store.watchers(domain), 0, 'the watch ends with the call');
    assert.equal(await h.loop.turn(signal), 44 * MIN, 'the pushed copy is held: its renewal point');
    assert.equal(h.loop.current?.info.serial, pushed.info.serial);
    assert.equal(h.calls.length, 1, 'no second call');
  });

  it('also after the certificate held ran out', async () => {
    const h = harness();
    h.store.content.set(domain, { state: 'unusable', reason: 'expired' });
    const { started, cancelled } = hangingCall(h);
    const turn = h.loop.turn(signal);
    await started;
    const pushed = await stored(h, h.clock.now());
    h.store.content.set(domain, { state: 'valid', cert: pushed });
    h.store.changed(domain);
    assert.ok(await cancelled(), 'the call is cancelled');
    assert.equal(await turn, 0);
    assert.equal(h.attempts.at(-1), 'superseded');
    await h.loop.turn(signal);
    assert.equal(h.loop.current?.info.serial, pushed.info.serial);
  });

  it('leaves the call alone for a copy that does not supersede it: due itself, or no later than the one it replaces', async () => {
    const h = harness();
    const expiring = await stored(h, h.clock.now() - 80 * MIN);
    h.store.content.set(domain, { state: 'valid', cert: expiring });
    let answer!: (pair: CertPair) => void;
    let begun!: () => void;
    const started = new Promise<void>((resolve) => {
      begun = resolve;
    });
    h.responses.push(() => {
      begun();
      return new Promise<CertPair>((resolve) => {
        answer = resolve;
      });
    });
    const turn = h.loop.turn(signal);
    await started;
    // Due as well (past its renewal point), and then the very certificate the call replaces, each told by the watch.
    h.store.content.set(domain, { state: 'valid', cert: await stored(h, h.clock.now() - 70 * MIN) });
    h.store.changed(domain);
    h.store.content.set(domain, { state: 'valid', cert: expiring });
    h.store.changed(domain);
    await new Promise(setImmediate); // the watcher's reads and verdicts are promise steps, no timer
    assert.equal(h.calls[0]!.signal?.aborted, false, 'the call goes on');
    const renewed = await fresh(h);
    answer(renewed);
    await turn;
    assert.deepEqual(h.attempts, ['success']);
    assert.equal(h.store.serial(domain), validateCertPair(renewed, domain, h.clock.now()).serial);
  });
});
