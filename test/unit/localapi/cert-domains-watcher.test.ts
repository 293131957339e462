import { test, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import type { CertshareError } from '../../../src/core/errors.ts';
import { NotifyMask } from '../../../src/core/ports/localapi.ts';
import { CertDomainsWatcher } from '../../../src/localapi/cert-domains-watcher.ts';
import { NETMAP_WATCH_MASK, STATUS_WATCH_MASK } from '../../../src/localapi/releases.ts';
import { createLocalApiClient } from '../../../src/localapi/client.ts';
import { FakeClock } from '../../support/fake-clock.ts';
import { FakeBus, recordingLogger } from '../../support/localapi.ts';
import type { BusConnection, Transport } from '../../support/localapi.ts';

interface Setup {
  bus: FakeBus;
  clock: FakeClock;
  watcher: CertDomainsWatcher;
  badLines: CertshareError[];
  connectionEvents: boolean[];
  reconnectCalls: number[];
  problems: (string | undefined)[];
  logLines: ReturnType<typeof recordingLogger>['lines'];
}

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

async function setup(options: { transport?: Transport; maxBusLineBytes?: number; maxRetryMs?: number } = {}): Promise<Setup> {
  const bus = await FakeBus.start(options.transport ?? 'unix');
  const clock = new FakeClock();
  const badLines: CertshareError[] = [];
  const connectionEvents: boolean[] = [];
  const reconnectCalls: number[] = [];
  const problems: (string | undefined)[] = [];
  const { logger, lines } = recordingLogger();
  const localApi = createLocalApiClient({
    address: bus.server.address,
    logger,
    onBadLine: (err) => badLines.push(err),
    maxBusLineBytes: options.maxBusLineBytes ?? 1024 * 1024,
  });
  const watcher = new CertDomainsWatcher({
    localApi,
    clock,
    logger,
    maxRetryMs: options.maxRetryMs ?? 30_000,
    random: () => 0.5, // the middle of the jitter range: delays are exactly the backoff base
    onConnectionChange: (connected) => connectionEvents.push(connected),
    onReconnect: () => reconnectCalls.push(clock.now()),
    onBadLine: (err) => badLines.push(err),
    onProblem: (message) => problems.push(message),
  });
  cleanups.push(async () => {
    await watcher.stop();
    await bus.close();
  });
  return { bus, clock, watcher, badLines, connectionEvents, reconnectCalls, problems, logLines: lines };
}

function nextChange(watcher: CertDomainsWatcher): Promise<string[]> {
  return new Promise((resolve) => {
    const off = watcher.onChange((domains) => {
      off();
      resolve([...domains].sort());
    });
  });
}

const netmap = (...domains: string[]) => ({ NetMap: { Name: 'self', DNS: { CertDomains: domains } } });

async function connectWith(s: Setup, first: object): Promise<BusConnection> {
  const conn = await s.bus.connections.shift();
  const changed = nextChange(s.watcher);
  conn.send(first);
  await changed;
  return conn;
}

test('first watch, version unknown: InitialState|NoPrivateKeys|InitialStatus, which every release accepts', async () => {
  const s = await setup();
  s.watcher.start();
  const conn = await s.bus.connections.shift();
  const mask = NotifyMask.InitialState | NotifyMask.NoPrivateKeys | NotifyMask.InitialStatus;
  assert.equal(STATUS_WATCH_MASK, mask);
  assert.equal(conn.req.url, `/localapi/v0/watch-ipn-bus?mask=${mask}`);
});

test('older tailscaled: every NetMap Notify replaces the set', async () => {
  const s = await setup();
  assert.equal(s.watcher.synced, false);
  s.watcher.start();
  const conn = await s.bus.connections.shift();
  let changed = nextChange(s.watcher);
  conn.send({ Version: '1.96.0', State: 6, ...netmap('a.tail1.ts.net') });
  assert.deepEqual(await changed, ['a.tail1.ts.net']);
  assert.equal(s.watcher.connected, true);
  assert.equal(s.watcher.synced, true);
  assert.deepEqual(s.connectionEvents, [true]);

  await s.watcher.waitFor('a.tail1.ts.net'); // already there: resolves at once
  const waiting = s.watcher.waitFor('b.tail1.ts.net', new AbortController().signal);
  conn.send({ State: 6, NetMap: null }); // a Notify without a netmap changes nothing
  conn.send(netmap('a.tail1.ts.net', 'b.tail1.ts.net'));
  await waiting;
  assert.deepEqual([...s.watcher.current()].sort(), ['a.tail1.ts.net', 'b.tail1.ts.net']);

  changed = nextChange(s.watcher);
  conn.send({ NetMap: { DNS: {} } }); // CertDomains omitted = none
  assert.deepEqual(await changed, []);
  assert.equal(s.bus.certDomainsCalls, 0);
});

test('waitFor rejects with the signal reason when aborted', async () => {
  const s = await setup();
  const controller = new AbortController();
  const waiting = s.watcher.waitFor('never.ts.net', controller.signal);
  const reason = new Error('gave up');
  controller.abort(reason);
  await assert.rejects(waiting, (err: unknown) => err === reason);
  await assert.rejects(s.watcher.waitFor('never.ts.net', AbortSignal.abort(reason)), (err: unknown) => err === reason);
});

test('v1.100+: a SelfChange triggers a cert-domains fetch', async () => {
  const s = await setup({ transport: 'tcp' });
  s.watcher.start();
  const conn = await connectWith(s, { State: 6, ...netmap('a.tail1.ts.net') });
  s.bus.certDomains = ['a.tail1.ts.net', 'new.tail1.ts.net'];
  const changed = nextChange(s.watcher);
  conn.send({ SelfChange: { Name: 'self.tail1.ts.net.' } });
  assert.deepEqual(await changed, ['a.tail1.ts.net', 'new.tail1.ts.net']);
  assert.equal(s.bus.certDomainsCalls, 1);
  assert.equal(s.bus.statusCalls, 0);
  assert.equal(s.bus.all.length, 1);
});

test('cert-domains 404 (older tailscaled): falls back to status CertDomains', async () => {
  const s = await setup();
  s.watcher.start();
  const conn = await connectWith(s, { State: 6, ...netmap('a.tail1.ts.net') });
  s.bus.certDomains = { status: 404, body: '404 page not found\n' };
  s.bus.statusCertDomains = ['s.tail1.ts.net'];
  let changed = nextChange(s.watcher);
  conn.send({ SelfChange: {} });
  assert.deepEqual(await changed, ['s.tail1.ts.net']);
  assert.equal(s.bus.certDomainsCalls, 1);
  assert.equal(s.bus.statusCalls, 1);
  // Remembered for this connection: the next SelfChange goes straight to status.
  s.bus.statusCertDomains = ['s.tail1.ts.net', 't.tail1.ts.net'];
  changed = nextChange(s.watcher);
  conn.send({ SelfChange: {} });
  assert.deepEqual(await changed, ['s.tail1.ts.net', 't.tail1.ts.net']);
  assert.equal(s.bus.certDomainsCalls, 1);
  assert.equal(s.bus.statusCalls, 2);
});

test('a failed fetch after SelfChange keeps the known set and is retried without dropping the stream', async () => {
  const s = await setup();
  s.watcher.start();
  const conn = await connectWith(s, { State: 6, ...netmap('a.tail1.ts.net') });
  s.bus.certDomains = { status: 500, body: 'internal error' };
  conn.send({ SelfChange: {} });
  assert.equal(await s.bus.fetches.shift(), 'cert-domains');
  await s.clock.waitForSleepers(1);
  assert.deepEqual(s.clock.pendingDurations(), [1000]);
  assert.deepEqual([...s.watcher.current()], ['a.tail1.ts.net']);
  assert.ok(s.logLines.some((l) => l.level === 'warn' && /fetching cert domains failed/.test(l.msg ?? '')));

  // Second failure doubles the retry delay.
  await s.clock.advance(1000);
  assert.equal(await s.bus.fetches.shift(), 'cert-domains');
  await s.clock.waitForSleepers(1);
  assert.deepEqual(s.clock.pendingDurations(), [2000]);

  s.bus.certDomains = ['a.tail1.ts.net', 'b.tail1.ts.net'];
  const changed = nextChange(s.watcher);
  await s.clock.advance(2000);
  assert.deepEqual(await changed, ['a.tail1.ts.net', 'b.tail1.ts.net']);
  assert.equal(s.bus.all.length, 1, 'the IPN bus stream was not dropped');
  assert.equal(s.watcher.connected, true);
});

test('a malformed bus line is skipped and reported; the stream goes on', async () => {
  const s = await setup();
  s.watcher.start();
  const conn = await connectWith(s, netmap('a.tail1.ts.net'));
  conn.sendRaw('{"NetMap": trunc\n');
  conn.send({ NetMap: { DNS: { CertDomains: 'not-a-list' } } });
  const changed = nextChange(s.watcher);
  conn.send(netmap('b.tail1.ts.net'));
  assert.deepEqual(await changed, ['b.tail1.ts.net']);
  assert.equal(s.badLines.length, 2);
  assert.ok(s.badLines.every((e) => e.code === 'CERTSHARE_BUS_BAD_LINE'));
  assert.equal(s.bus.all.length, 1);
});

test('a line over the limit drops the connection and reconnects; domains are kept', async () => {
  const s = await setup({ maxBusLineBytes: 4096 });
  s.watcher.start();
  const conn = await connectWith(s, netmap('a.tail1.ts.net'));
  conn.sendRaw(`{"NetMap":{"Peers":"${'x'.repeat(8000)}`);
  await conn.closed; // the client tore the request down
  await s.clock.waitForSleepers(1);
  assert.deepEqual(s.clock.pendingDurations(), [1000]);
  assert.equal(s.watcher.connected, false);
  assert.deepEqual([...s.watcher.current()], ['a.tail1.ts.net']);
  assert.ok(s.logLines.some((l) => l.level === 'warn' && (l.obj as { code?: string }).code === 'CERTSHARE_BUS_LINE_TOO_LONG'));

  await s.clock.advance(1000);
  const conn2 = await s.bus.connections.shift();
  assert.equal(s.watcher.reconnects, 1);
  const changed = nextChange(s.watcher);
  conn2.send(netmap('a.tail1.ts.net', 'c.tail1.ts.net'));
  assert.deepEqual(await changed, ['a.tail1.ts.net', 'c.tail1.ts.net']);
  assert.deepEqual(s.connectionEvents, [true, false, true]);
});

test('server drops: exponential backoff capped, reset after a healthy connection, domains kept', async () => {
  const s = await setup({ maxRetryMs: 5000 });
  s.watcher.start();
  const first = await connectWith(s, { State: 6, ...netmap('a.tail1.ts.net') });
  first.drop();

  const delays: number[] = [];
  for (let i = 0; i < 5; i++) {
    await s.clock.waitForSleepers(1);
    delays.push(...s.clock.pendingDurations());
    assert.equal(s.watcher.connected, false);
    assert.deepEqual([...s.watcher.current()], ['a.tail1.ts.net'], 'a dropped connection keeps the known domains');
    await s.clock.advanceToNext();
    const conn = await s.bus.connections.shift();
    if (i < 4)
      conn.drop(); // refused before any Notify: not healthy, the backoff grows
    else {
      const changed = nextChange(s.watcher);
      conn.send({ State: 6, ...netmap('a.tail1.ts.net', 'b.tail1.ts.net') });
      await changed;
      assert.equal(s.watcher.connected, true);
      conn.end(); // a clean end after a healthy connection
    }
  }
  assert.deepEqual(delays, [1000, 2000, 4000, 5000, 5000]);
  await s.clock.waitForSleepers(1);
  assert.deepEqual(s.clock.pendingDurations(), [1000], 'backoff reset after a healthy connection');
  assert.equal(s.watcher.reconnects, 5);
  assert.equal(s.reconnectCalls.length, 5);
  assert.deepEqual(s.connectionEvents, [true, false, true, false]);
  assert.deepEqual([...s.watcher.current()].sort(), ['a.tail1.ts.net', 'b.tail1.ts.net']);
});

test('tailscaled not running: a clear error is logged and the connection retried with backoff', async () => {
  const s = await setup();
  const address = s.bus.server.address;
  await s.bus.close();
  const clock = new FakeClock();
  const { logger, lines } = recordingLogger();
  const watcher = new CertDomainsWatcher({
    localApi: createLocalApiClient({ address, logger }),
    clock,
    logger,
    random: () => 0.5,
  });
  watcher.start();
  await clock.waitForSleepers(1);
  assert.deepEqual(clock.pendingDurations(), [1000]);
  assert.ok(lines.some((l) => l.level === 'warn' && /not reachable at .*ENOENT/.test(String((l.obj as { err?: string }).err))));
  await watcher.stop();
  assert.equal(clock.pendingSleeps(), 0);
});

test('stop() ends the stream while connected, and during a backoff sleep', async () => {
  const s = await setup();
  s.watcher.start();
  const conn = await connectWith(s, netmap('a.tail1.ts.net'));
  await s.watcher.stop();
  await conn.closed;
  assert.equal(s.watcher.connected, false);
  assert.deepEqual([...s.watcher.current()], ['a.tail1.ts.net']);

  s.watcher.start(); // restartable
  const conn2 = await s.bus.connections.shift();
  conn2.drop();
  await s.clock.waitForSleepers(1);
  await s.watcher.stop();
  assert.equal(s.clock.pendingSleeps(), 0);
});

test('start() twice is refused; a throwing listener does not break the watcher', async () => {
  const s = await setup();
  s.watcher.start();
  assert.throws(() => s.watcher.start(), /already started/);
  s.watcher.onChange(() => {
    throw new Error('listener bug');
  });
  const conn = await connectWith(s, netmap('a.tail1.ts.net'));
  const changed = nextChange(s.watcher);
  conn.send(netmap('b.tail1.ts.net'));
  assert.deepEqual(await changed, ['b.tail1.ts.net']);
  assert.ok(s.logLines.some((l) => l.level === 'error' && /listener threw/.test(l.msg ?? '')));
});

// Per-release behaviour (tailscale.com ipn/backend.go, ipn/localapi/localapi.go; see src/localapi/releases.ts).
const NO_RATE_LIMIT = 'the NotifyRateLimit IPN bus subscription bit is no longer supported';
const NO_INITIAL_NETMAP = 'the NotifyInitialNetMap IPN bus subscription bit is no longer supported; seed from NotifyInitialStatus instead';
/** tailscaled 1.104's answer to a mask (ipn.ValidateNotifyWatchOpt). */
const refuseLike104 = (mask: number): { status: number; body: string } | undefined =>
  (mask & NotifyMask.RateLimit) !== 0
    ? { status: 400, body: NO_RATE_LIMIT }
    : (mask & NotifyMask.InitialNetMap) !== 0
      ? { status: 400, body: NO_INITIAL_NETMAP }
      : undefined;

test('1.104: a domain present at start is known from the first Notify (InitialStatus), without any netmap change or fetch', async () => {
  const s = await setup();
  s.bus.version = '1.104.5-t0123456789-gabcdef';
  s.bus.refuseWatch = refuseLike104;
  s.watcher.start();
  const conn = await s.bus.connections.shift();
  assert.equal(conn.req.url, `/localapi/v0/watch-ipn-bus?mask=${STATUS_WATCH_MASK}`);
  const changed = nextChange(s.watcher);
  conn.send({ Version: s.bus.version, SessionID: 'x', State: 6, InitialStatus: { BackendState: 'Running', CertDomains: ['a.tail1.ts.net'] } });
  assert.deepEqual(await changed, ['a.tail1.ts.net']);
  await s.watcher.waitFor('a.tail1.ts.net');
  assert.equal(s.watcher.synced, true);
  assert.equal(s.watcher.tailscaledVersion, '1.104.5-t0123456789-gabcdef');
  assert.equal(s.bus.certDomainsCalls + s.bus.statusCalls, 0);
  assert.deepEqual(s.bus.watchMasks, [STATUS_WATCH_MASK]);
  assert.equal(s.clock.pendingSleeps(), 0);
});

test('every reconnect re-reads the domains; a first Notify without them means a cert-domains read, and null there means none', async () => {
  const s = await setup();
  s.bus.version = '1.104.5';
  s.watcher.start();
  const conn = await connectWith(s, { State: 6, InitialStatus: { CertDomains: ['a.tail1.ts.net'] } });
  conn.drop();
  await s.clock.waitForSleepers(1);
  await s.clock.advanceToNext();
  const conn2 = await s.bus.connections.shift();
  let changed = nextChange(s.watcher);
  conn2.send({ State: 6, InitialStatus: { CertDomains: ['a.tail1.ts.net', 'b.tail1.ts.net'] } });
  assert.deepEqual(await changed, ['a.tail1.ts.net', 'b.tail1.ts.net']);
  conn2.drop();
  await s.clock.waitForSleepers(1);
  await s.clock.advanceToNext();
  const conn3 = await s.bus.connections.shift();
  s.bus.certDomains = null; // Go's nil slice: no cert domains
  changed = nextChange(s.watcher);
  conn3.send({ State: 6 }); // e.g. an InitialStatus-less first Notify: the domains are read at once
  assert.deepEqual(await changed, []);
  assert.equal(s.bus.certDomainsCalls, 1);
  assert.equal(s.watcher.reconnects, 2);
});

test('1.98 reported: the watch switches at once to the netmap mask, whose first NetMap carries the domains', async () => {
  const s = await setup();
  s.bus.version = '1.98.10';
  s.watcher.start();
  const first = await s.bus.connections.shift();
  first.send({ Version: '1.98.10', State: 6 });
  await first.closed; // left for the mask this release needs, without a backoff sleep
  const conn = await s.bus.connections.shift();
  assert.equal(s.clock.pendingSleeps(), 0);
  assert.deepEqual(s.bus.watchMasks, [STATUS_WATCH_MASK, NETMAP_WATCH_MASK]);
  const changed = nextChange(s.watcher);
  conn.send({ Version: '1.98.10', State: 6, ...netmap('a.tail1.ts.net') });
  assert.deepEqual(await changed, ['a.tail1.ts.net']);
  // 1.98 sends SelfChange beside the resent NetMap: the NetMap says it all, no fetch.
  const again = nextChange(s.watcher);
  conn.send({ ...netmap('a.tail1.ts.net', 'b.tail1.ts.net'), SelfChange: { Name: 'self.' } });
  assert.deepEqual(await again, ['a.tail1.ts.net', 'b.tail1.ts.net']);
  assert.equal(s.bus.certDomainsCalls + s.bus.statusCalls, 0);
});

test('tailscaled upgraded to 1.104 under a netmap-mask watcher: the 400 names the bit, the next watch uses InitialStatus at once', async () => {
  const s = await setup();
  s.bus.version = '1.98.10';
  s.watcher.start();
  (await s.bus.connections.shift()).send({ Version: '1.98.10', State: 6 });
  const old = await connectWith(s, { Version: '1.98.10', State: 6, ...netmap('a.tail1.ts.net') });
  s.bus.version = '1.104.5';
  s.bus.refuseWatch = refuseLike104;
  old.drop(); // tailscaled restarts with the new release
  await s.clock.waitForSleepers(1);
  await s.clock.advanceToNext();
  const conn = await s.bus.connections.shift();
  assert.equal(s.clock.pendingSleeps(), 0, 'no backoff after the 400: the next mask differs');
  assert.deepEqual(s.bus.watchMasks, [STATUS_WATCH_MASK, NETMAP_WATCH_MASK, NETMAP_WATCH_MASK, STATUS_WATCH_MASK]);
  const changed = nextChange(s.watcher);
  conn.send({ Version: '1.104.5', State: 6, InitialStatus: { CertDomains: ['a.tail1.ts.net', 'c.tail1.ts.net'] } });
  assert.deepEqual(await changed, ['a.tail1.ts.net', 'c.tail1.ts.net']);
  assert.equal(s.watcher.tailscaledVersion, '1.104.5');
  assert.deepEqual(s.problems, [], 'a refusal that the next mask avoids is no problem');
});

test('a 400 naming a bit, from a tailscaled whose version misleads: drops the named bits one by one, then settles', async () => {
  const s = await setup();
  s.bus.version = '1.98.10'; // says 1.98 but validates like 1.104
  s.bus.refuseWatch = refuseLike104;
  s.watcher.start();
  (await s.bus.connections.shift()).send({ Version: '1.98.10', State: 6 });
  const conn = await s.bus.connections.shift();
  assert.deepEqual(s.bus.watchMasks, [STATUS_WATCH_MASK, NETMAP_WATCH_MASK, NETMAP_WATCH_MASK & ~NotifyMask.RateLimit, STATUS_WATCH_MASK]);
  assert.equal(s.clock.pendingSleeps(), 0);
  const changed = nextChange(s.watcher);
  conn.send({ State: 6, InitialStatus: { CertDomains: ['a.tail1.ts.net'] } });
  assert.deepEqual(await changed, ['a.tail1.ts.net']);
  assert.equal(s.bus.all.length, 2, 'the InitialStatus watch stays: no further switch');
});

test('an answer that cannot change is asked again only after refusedRetryMs, with the reason reported, and cleared once a watch works', async () => {
  const s = await setup();
  s.bus.version = '1.104.5';
  s.bus.refuseWatch = () => ({ status: 403, body: 'watch ipn bus access denied' });
  s.watcher.start();
  await s.clock.waitForSleepers(1);
  assert.deepEqual(s.clock.pendingDurations(), [600_000]);
  assert.equal(s.problems.length, 1);
  assert.match(
    s.problems[0]!,
    new RegExp(
      '^tailscaled LocalAPI refused GET \\/localapi\\/v0\\/watch-ipn-bus\\?mask=16402: tailscaled 1\\.104\\.5 answered ' +
        'HTTP 403: watch ipn bus access denied \\(.*TS_PERMIT_CERT_UID.*\\); asking again in 10m0s$',
    ),
  );
  assert.ok(s.logLines.some((l) => l.level === 'error' && (l.obj as { code?: string }).code === 'CERTSHARE_LOCALAPI_REFUSED'));

  // A 400 that names no bit it could drop is just as final.
  s.bus.refuseWatch = () => ({ status: 400, body: 'NotifyInProcessNoDisconnect is only valid for in-process IPN bus subscribers' });
  await s.clock.advance(600_000);
  await s.clock.waitForSleepers(1);
  assert.deepEqual(s.clock.pendingDurations(), [600_000]);
  assert.equal(s.bus.watchMasks.length, 2, 'one request per refusedRetryMs');
  assert.match(s.problems.at(-1)!, /HTTP 400: NotifyInProcessNoDisconnect/);

  s.bus.refuseWatch = undefined;
  await s.clock.advance(600_000);
  await connectWith(s, { State: 6, InitialStatus: { CertDomains: ['a.tail1.ts.net'] } });
  assert.equal(s.problems.at(-1), undefined);
  assert.equal(s.watcher.problem, undefined);
});

test('a refused cert-domains read waits refusedRetryMs and says why, without dropping the stream', async () => {
  const s = await setup();
  s.bus.version = '1.104.5';
  s.watcher.start();
  const conn = await connectWith(s, { State: 6, InitialStatus: { CertDomains: ['a.tail1.ts.net'] } });
  s.bus.certDomains = { status: 403, body: 'cert-domains access denied\n' };
  conn.send({ SelfChange: {} });
  assert.equal(await s.bus.fetches.shift(), 'cert-domains');
  await s.clock.waitForSleepers(1);
  assert.deepEqual(s.clock.pendingDurations(), [600_000]);
  assert.match(
    s.problems.at(-1)!,
    /^tailscaled LocalAPI refused GET \/localapi\/v0\/cert-domains: tailscaled 1\.104\.5 answered HTTP 403: cert-domains access denied/,
  );
  s.bus.certDomains = ['a.tail1.ts.net', 'b.tail1.ts.net'];
  const changed = nextChange(s.watcher);
  await s.clock.advance(600_000);
  assert.deepEqual(await changed, ['a.tail1.ts.net', 'b.tail1.ts.net']);
  assert.equal(s.watcher.problem, undefined);
  assert.equal(s.bus.all.length, 1);
});
