// The Advertiser against a prefs API that fails when told and is edited by someone else between its calls,
// on a virtual clock, over any order of such events: it never writes its Service while the decision says
// no, never loses another client's Services, and its withdrawal ends with its Service gone whatever failed
// before (transient failures are retried within the shutdown bound).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { advertiseDecision } from '../../src/core/served/advertisement.ts';
import { LocalApiError, type IpnPrefs, type MaskedPrefs } from '../../src/core/ports/localapi.ts';
import { silentLogger, type Logger } from '../../src/core/ports/logger.ts';
import { Advertiser, type PrefsApi } from '../../src/served/advertiser.ts';
import { FakeClock } from '../support/fake-clock.ts';
import { recordingLogger } from '../support/recording-logger.ts';

const RUNS = Number(process.env.CERTSHARE_PROPERTY_RUNS ?? 100);
const SERVICE = 'svc:web';
const DAY = 86_400_000;

class FakePrefs implements PrefsApi {
  services: string[] = [];
  failures = 0;
  /** Set by the test: whether the decision allows the Service now (checked at every write). */
  allowed = false;
  writesWhileForbidden = 0;

  async prefs(): Promise<IpnPrefs> {
    this.#maybeFail();
    return { AdvertiseServices: [...this.services], Hostname: 'proxy-0' };
  }

  async editPrefs(masked: MaskedPrefs): Promise<IpnPrefs> {
    this.#maybeFail();
    if (masked.AdvertiseServices.includes(SERVICE) && !this.allowed) this.writesWhileForbidden++;
    this.services = [...masked.AdvertiseServices];
    return { AdvertiseServices: [...this.services], Hostname: 'proxy-0' };
  }

  #maybeFail(): void {
    if (this.failures > 0) {
      this.failures--;
      throw new LocalApiError({ request: 'PATCH /localapi/v0/prefs', failure: 'HTTP 500' }, { status: 500 });
    }
  }
}

type Event = { e: 'allow'; on: boolean } | { e: 'fail'; n: number } | { e: 'other'; add: string } | { e: 'tick'; ms: number };

const eventArb: fc.Arbitrary<Event> = fc.oneof(
  fc.record({ e: fc.constant('allow' as const), on: fc.boolean() }),
  fc.record({ e: fc.constant('fail' as const), n: fc.integer({ min: 1, max: 4 }) }),
  fc.record({ e: fc.constant('other' as const), add: fc.constantFrom('svc:x', 'svc:y') }),
  fc.record({ e: fc.constant('tick' as const), ms: fc.integer({ min: 0, max: 120_000 }) }),
);

function advertiserOn(api: FakePrefs, clock: FakeClock, logger: Logger = silentLogger): Advertiser {
  return new Advertiser({
    api,
    services: () => [{ service: SERVICE, domain: 'web.tailnet-0000.ts.net' }],
    decide: (_entry, now) =>
      advertiseDecision({
        held: { notBefore: now - DAY, notAfter: now + 30 * DAY },
        served: api.allowed ? { verdict: 'ok' } : { verdict: 'bad', why: 'the proxy serves an expired certificate' },
        now,
        end: (h) => h.notAfter - 60_000,
        terminating: false,
      }),
    nextEdge: () => undefined,
    clock,
    logger,
    resyncMs: 60_000,
  });
}

/** Runs the clock until `promise` settles (each pending sleep in turn). */
async function driven<T>(clock: FakeClock, promise: Promise<T>): Promise<T> {
  let done = false;
  const result = promise.finally(() => {
    done = true;
  });
  while (!done) {
    if (clock.pendingSleeps() > 0) await clock.advanceToNext();
    else await new Promise((r) => setImmediate(r));
  }
  return result;
}

describe('Advertiser over any order of decisions, failures and edits by others', () => {
  it("never writes the Service while the decision says no, keeps others' Services, and withdraws it whatever failed before", async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(eventArb, { maxLength: 25 }), fc.integer({ min: 0, max: 5 }), async (events, failuresAtStop) => {
        const clock = new FakeClock();
        const api = new FakePrefs();
        const advertiser = advertiserOn(api, clock);
        const others = new Set<string>();
        advertiser.start();
        for (const ev of events) {
          if (ev.e === 'allow') api.allowed = ev.on;
          if (ev.e === 'fail') api.failures += ev.n;
          if (ev.e === 'other') {
            others.add(ev.add);
            if (!api.services.includes(ev.add)) api.services = [...api.services, ev.add];
          }
          advertiser.notify();
          await clock.advance(ev.e === 'tick' ? ev.ms : 0);
        }
        api.failures = failuresAtStop;
        await driven(clock, advertiser.withdraw(AbortSignal.timeout(60_000)));
        api.allowed = false;
        assert.equal(api.writesWhileForbidden, 0, 'wrote the Service while the decision said no');
        assert.equal(api.services.includes(SERVICE), false, 'the Service is withdrawn');
        for (const s of others) assert.ok(api.services.includes(s), `${s} (someone else's) kept`);
        assert.equal(advertiser.advertised.size, 0);
      }),
      { numRuns: RUNS },
    );
  });

  it('advertises once allowed, after a refusal streak, and a 404 (no prefs endpoint) ends advertising for good', async () => {
    const clock = new FakeClock();
    const api = new FakePrefs();
    api.allowed = true;
    api.failures = 3;
    const advertiser = advertiserOn(api, clock);
    advertiser.start();
    for (let i = 0; i < 10 && !api.services.includes(SERVICE); i++) await clock.advance(clock.nextDueIn() ?? 0);
    assert.deepEqual(api.services, [SERVICE], 'advertised after the failures, retried with backoff');
    await driven(clock, advertiser.withdraw(AbortSignal.timeout(60_000)));

    const gone = new FakePrefs();
    gone.prefs = async () => {
      throw new LocalApiError({ request: 'GET /localapi/v0/prefs', failure: 'HTTP 404' }, { status: 404 });
    };
    const disabled = advertiserOn(gone, clock);
    disabled.start();
    await clock.advance(0);
    assert.equal(clock.pendingSleeps(), 0, 'no retry loop left');
    assert.equal(await driven(clock, disabled.withdraw(AbortSignal.timeout(1000))), false);
  });

  it('follows a list that changes (a ServeConfig): a Service listed once is managed, withdrawn while unlisted, others never touched', async () => {
    const clock = new FakeClock();
    const api = new FakePrefs();
    api.allowed = true;
    api.services = ['svc:x', 'svc:api'];
    let listed: string[] = [];
    const advertised: Array<[string, boolean]> = [];
    const advertiser = new Advertiser({
      api,
      services: () => listed.map((service) => ({ service, domain: `${service.slice(4)}.tailnet-0000.ts.net` })),
      decide: () => ({ advertise: true }),
      nextEdge: () => undefined,
      clock,
      logger: silentLogger,
      resyncMs: 60_000,
      onAdvertised: (service, is) => advertised.push([service, is]),
    });
    const step = async (next: string[]) => {
      listed = next;
      advertiser.notify();
      await clock.advance(0);
    };
    advertiser.start();
    await clock.advance(0);
    assert.deepEqual(api.services, ['svc:x', 'svc:api'], 'nothing listed yet: nothing edited, svc:api not certshare’s');
    await step([SERVICE]);
    assert.deepEqual(api.services, ['svc:x', 'svc:api', SERVICE]);
    await step([SERVICE, 'svc:api']);
    assert.deepEqual(api.services, ['svc:x', 'svc:api', SERVICE], 'svc:api, now listed, was already advertised');
    await step(['svc:api']);
    assert.deepEqual(api.services, ['svc:x', 'svc:api'], 'svc:web unlisted: withdrawn');
    await step([]);
    assert.deepEqual(api.services, ['svc:x'], 'svc:api, listed once, is managed: withdrawn once unlisted');
    await step([SERVICE]);
    assert.deepEqual(api.services, ['svc:x', SERVICE]);
    assert.deepEqual(advertised, [
      [SERVICE, true],
      ['svc:api', true],
      [SERVICE, false],
      ['svc:api', false],
      [SERVICE, true],
    ]);
    await driven(clock, advertiser.withdraw(AbortSignal.timeout(60_000)));
    assert.deepEqual(api.services, ['svc:x']);
  });
});

/** tailscaled from a config file: each reload (the owner's or the put-back) sets the prefs' list to the file's. */
class FakeFilePrefs extends FakePrefs {
  file: string[] = [SERVICE, 'svc:x'];
  reloads = 0;
  /** An edit that added a Service the prefs did not hold, or one the file does not list. */
  additions: string[][] = [];

  reload(): void {
    this.reloads++;
    this.services = [...this.file];
  }

  override async editPrefs(masked: MaskedPrefs): Promise<IpnPrefs> {
    const added = masked.AdvertiseServices.filter((s) => !this.services.includes(s) || !this.file.includes(s));
    if (added.length > 0) this.additions.push(added);
    return super.editPrefs(masked);
  }
}

type FileEvent = Event | { e: 'owner'; file: string[] };

describe('Advertiser under a config file (withdrawOnly): never adds, withdraws a refused Service, puts the file back', () => {
  const fileEventArb: fc.Arbitrary<FileEvent> = fc.oneof(
    eventArb,
    fc.record({ e: fc.constant('owner' as const), file: fc.subarray([SERVICE, 'svc:x', 'svc:api']) }),
  );

  it('over any order of decisions, failures and the owner’s reloads: no addition, and at rest the file’s list less what is refused', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(fileEventArb, { maxLength: 25 }), fc.boolean(), async (events, allowedAtRest) => {
        const clock = new FakeClock();
        const api = new FakeFilePrefs();
        api.reload(); // tailscaled --config at its start
        const advertiser = advertiserOn(api, clock);
        advertiser.withdrawOnly(async () => api.reload());
        advertiser.start();
        for (const ev of events) {
          if (ev.e === 'allow') api.allowed = ev.on;
          if (ev.e === 'fail') api.failures += ev.n;
          if (ev.e === 'other') api.services = [...api.services.filter((s) => s !== ev.add), ev.add].filter((s) => api.file.includes(s));
          if (ev.e === 'owner') {
            api.file = ev.file;
            api.reload();
          }
          if (ev.e !== 'owner' && ev.e !== 'tick') advertiser.notify();
          await clock.advance(ev.e === 'tick' ? ev.ms : 0);
        }
        api.allowed = allowedAtRest;
        api.failures = 0;
        advertiser.notify();
        await clock.advance(0);
        await clock.advance(60_000); // a resync: an owner's reload since the last read is seen
        assert.deepEqual(api.additions, [], 'an edit added a Service');
        assert.equal(api.writesWhileForbidden, 0, 'wrote the Service while the decision said no');
        const expected = api.file.filter((s) => allowedAtRest || s !== SERVICE);
        assert.deepEqual([...api.services].sort(), [...expected].sort(), 'the file’s list, less the refused Service');
        await advertiser.stop();
      }),
      { numRuns: RUNS },
    );
  });

  it('withdraws at once, again after the owner’s reload (at the next read), and reloads the file once the Service may be served', async () => {
    const clock = new FakeClock();
    const api = new FakeFilePrefs();
    api.reload();
    const advertiser = advertiserOn(api, clock);
    advertiser.withdrawOnly(async () => api.reload());
    advertiser.start();
    await clock.advance(0);
    assert.deepEqual(api.services, ['svc:x'], 'refused: withdrawn from the file’s list, svc:x kept');
    api.file = [SERVICE, 'svc:x', 'svc:api'];
    api.reload(); // the owner changed the file: containerboot reloads it
    assert.deepEqual(api.services, [SERVICE, 'svc:x', 'svc:api']);
    await clock.advance(60_000);
    assert.deepEqual(api.services, ['svc:x', 'svc:api'], 'withdrawn again at the next read');
    api.allowed = true;
    const reloads = api.reloads;
    advertiser.notify();
    await clock.advance(0);
    assert.deepEqual(api.services, [SERVICE, 'svc:x', 'svc:api'], 'the file’s list put back');
    assert.equal(api.reloads, reloads + 1, 'by one reload');
    await clock.advance(60_000);
    assert.equal(api.reloads, reloads + 1, 'and not again while nothing is withheld');
    await advertiser.stop();
  });

  it('says once per change which Services of the file’s list it does not manage (never withdrawn): an HA Ingress of another host', async () => {
    const clock = new FakeClock();
    const api = new FakeFilePrefs();
    api.allowed = true;
    api.reload();
    const { logger, entries } = recordingLogger();
    const advertiser = advertiserOn(api, clock, logger);
    advertiser.withdrawOnly(async () => api.reload());
    advertiser.start();
    await clock.advance(0);
    const said = () => entries.filter((e) => e.code === 'CERTSHARE_ADVERTISE_UNWATCHED').map((e) => e.services);
    assert.deepEqual(said(), [['svc:x']]);
    assert.match(
      entries.find((e) => e.code === 'CERTSHARE_ADVERTISE_UNWATCHED')!.msg!,
      /advertises svc:x, not in --advertise-services \(svc:web\): certshare never withdraws them/,
    );
    await clock.advance(60_000);
    assert.deepEqual(said(), [['svc:x']], 'not again while the file’s list is the same');
    api.file = [SERVICE, 'svc:x', 'svc:api'];
    api.reload();
    await clock.advance(60_000);
    api.file = [SERVICE];
    api.reload();
    await clock.advance(60_000);
    assert.deepEqual(said(), [['svc:x'], ['svc:api', 'svc:x']], 'the new list said; one of managed Services only is not');
    assert.deepEqual(api.services, [SERVICE], 'nothing else changed');
    await advertiser.stop();
  });

  it('a locked config file (tailscaled refuses every edit) ends the withdrawals: no retry loop, the file’s list stands', async () => {
    const clock = new FakeClock();
    const api = new FakeFilePrefs();
    api.reload();
    api.editPrefs = async () => {
      const body = '{"Error":"can\'t reconfigure tailscaled when using a config file; config file is locked"}';
      throw new LocalApiError({ request: 'PATCH /localapi/v0/prefs', failure: `HTTP 400: ${body}` }, { status: 400, body });
    };
    const advertiser = advertiserOn(api, clock);
    advertiser.withdrawOnly(async () => api.reload());
    advertiser.start();
    await clock.advance(0);
    assert.equal(clock.pendingSleeps(), 0, 'no retry loop left');
    assert.deepEqual(api.services, [SERVICE, 'svc:x'], 'the file’s list stands');
  });
});
