import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { NotifyMask } from '../../../src/core/ports/localapi.ts';
import { BusReader, certPath, get, getJson, testEnv, waitEvent, type TestEnv } from '../../support/emulator.ts';

const A = 'a.tailnet-1234.ts.net';
const B = 'b.tailnet-1234.ts.net';
const C = 'c.tailnet-1234.ts.net';
// The netmap mask (releases before v1.104) and the InitialStatus mask (v1.100+).
const INITIAL = NotifyMask.InitialState | NotifyMask.InitialNetMap | NotifyMask.NoPrivateKeys;
const STATUS = NotifyMask.InitialState | NotifyMask.NoPrivateKeys | NotifyMask.InitialStatus;
const LEGACY = INITIAL | NotifyMask.RateLimit; // what certshare asked for until 0.1.0: mask=282

// The 400 texts, verbatim from tailscale.com ipn/backend.go ValidateNotifyWatchOpt (v1.102.5, v1.104.5).
const NO_RATE_LIMIT = 'the NotifyRateLimit IPN bus subscription bit is no longer supported';
const NO_INITIAL_NETMAP = 'the NotifyInitialNetMap IPN bus subscription bit is no longer supported; seed from NotifyInitialStatus instead';
const INCOMPATIBLE = 'NotifyRateLimit is incompatible with new-style IPN bus subscription bits';

describe('IPN bus', () => {
  let env: TestEnv;
  before(async () => {
    env = await testEnv();
  });
  after(() => env.cleanup());

  test('bad mask is 400 "bad mask"', async () => {
    const em = await env.start({ domains: [A] });
    const r = await get(em.address, '/localapi/v0/watch-ipn-bus?mask=lots');
    assert.equal(r.status, 400);
    assert.equal(r.body, 'bad mask\n');
  });

  test('which masks each release refuses, with the real texts and the Tailscale-Version header', async () => {
    const cases: Array<[version: string, mask: number, body: string | undefined]> = [
      ['1.104.5', LEGACY, NO_RATE_LIMIT],
      ['1.104.5', NotifyMask.RateLimit | NotifyMask.InitialStatus, NO_RATE_LIMIT],
      ['1.104.5', INITIAL, NO_INITIAL_NETMAP],
      ['1.104.5', STATUS, undefined],
      ['1.104.5', NotifyMask.InProcessNoDisconnect | STATUS, 'NotifyInProcessNoDisconnect is only valid for in-process IPN bus subscribers'],
      ['1.104.0', 8, NO_INITIAL_NETMAP],
      ['1.102.5', LEGACY, undefined],
      ['1.102.5', STATUS, undefined],
      ['1.102.5', NotifyMask.RateLimit | STATUS, `${INCOMPATIBLE} ipn.NotifyInitialStatus`],
      [
        '1.102.5',
        NotifyMask.RateLimit | NotifyMask.PeerChanges | NotifyMask.InitialStatus,
        `${INCOMPATIBLE} (ipn.NotifyPeerChanges | ipn.NotifyInitialStatus)`,
      ],
      ['1.100.0', NotifyMask.RateLimit | STATUS, undefined],
      ['1.100.0', NotifyMask.InProcessNoDisconnect | STATUS, undefined],
      ['1.98.10', LEGACY, undefined],
      ['1.98.10', STATUS, undefined],
      ['1.96.5', STATUS, undefined],
    ];
    for (const [version, mask, refused] of cases) {
      const em = await env.start({ domains: [A], tailscaledVersion: version });
      const name = `${version} mask=${mask}`;
      if (refused === undefined) {
        const bus = await BusReader.open(em.address, mask);
        assert.equal(bus.res.headers['tailscale-version'], version, name);
        assert.equal((await bus.nextJson()).Version, version, name);
        bus.close();
      } else {
        const r = await get(em.address, `/localapi/v0/watch-ipn-bus?mask=${mask}`);
        assert.equal(r.status, 400, name);
        assert.equal(r.body, `${refused}\n`, name);
        assert.equal(r.headers['content-type'], 'text/plain; charset=utf-8', name);
        assert.equal(r.headers['content-length'], String(Buffer.byteLength(r.body)), `${name}: a short body has a Content-Length, as Go sends it`);
        assert.equal(r.headers['tailscale-version'], version, name);
        assert.equal(em.stats().busRefusals, 1, name);
      }
      await em.close();
    }
  });

  test('1.104.5 (the default): InitialStatus.CertDomains in the first Notify, no NetMap field; SelfChange after a change', async () => {
    const em = await env.start({ domains: [B, A] });
    assert.equal(em.version, '1.104.5');
    const bus = await BusReader.open(em.address, STATUS);
    assert.equal(bus.res.headers['tailscale-version'], '1.104.5');
    const first = await bus.nextJson();
    assert.equal(first.Version, '1.104.5');
    assert.equal(first.State, 6);
    assert.deepEqual(first.InitialStatus.CertDomains, [A, B]);
    assert.ok(!('NetMap' in first), 'v1.104 removed Notify.NetMap');
    em.addCertDomain(C);
    const change = await bus.nextJson();
    assert.ok(change.SelfChange);
    assert.ok(!('NetMap' in change));
    assert.ok(!('InitialStatus' in change), 'InitialStatus only in the first Notify');
    assert.deepEqual(await getJson(em.address, '/localapi/v0/cert-domains'), [A, B, C]);
    bus.close();
  });

  test('cert-domains is null, not [], when there are none; the cert endpoint says the account cannot get certs', async () => {
    const em = await env.start({ domains: [A], domainDelayMs: 60_000 });
    const r = await get(em.address, '/localapi/v0/cert-domains');
    assert.equal(r.status, 200);
    assert.equal(r.body, 'null\n');
    const bus = await BusReader.open(em.address, STATUS);
    assert.equal((await bus.nextJson()).InitialStatus.CertDomains, null);
    bus.close();
    const cert = await get(em.address, certPath(A));
    assert.equal(cert.status, 500);
    assert.equal(cert.body, 'your Tailscale account does not support getting TLS certs\n');
  });

  test('1.102.5: initial Notify with Version, State, NetMap and SelfChange; a new domain arrives as SelfChange', async () => {
    const em = await env.start({ domains: [B, A], tailscaledVersion: '1.102.5' });
    const bus = await BusReader.open(em.address, INITIAL);
    assert.equal(bus.res.headers['content-type'], 'application/json');
    assert.equal(bus.res.headers['transfer-encoding'], 'chunked');
    assert.equal(bus.res.headers['tailscale-version'], '1.102.5');
    const first = await bus.nextJson();
    assert.equal(first.Version, '1.102.5');
    assert.equal(first.State, 6);
    assert.equal(typeof first.SessionID, 'string');
    assert.equal(first.ErrMessage, null, 'Go writes nil pointers as null');
    assert.deepEqual(first.NetMap.DNS.CertDomains, [A, B]);
    assert.equal(first.NetMap.Domain, 'tailnet-1234.ts.net');
    assert.equal(first.NetMap.SelfNode.Name, 'b.tailnet-1234.ts.net.', 'named after the first configured domain');
    assert.equal(first.SelfChange.StableID, first.NetMap.SelfNode.StableID, 'v1.100+ puts the self node beside the initial NetMap');
    assert.deepEqual(await getJson(em.address, '/localapi/v0/cert-domains'), [A, B]);

    em.addCertDomain(C);
    const change = await bus.nextJson();
    assert.equal(change.NetMap, null, 'v1.100+ sends no netmap after the first Notify');
    assert.equal(change.SelfChange.StableID, first.NetMap.SelfNode.StableID);
    assert.equal(change.Version, '1.102.5');
    assert.deepEqual(await getJson(em.address, '/localapi/v0/cert-domains'), [A, B, C]);

    em.removeCertDomain(A);
    assert.ok((await bus.nextJson()).SelfChange);
    assert.deepEqual(await getJson(em.address, '/localapi/v0/cert-domains'), [B, C]);
    assert.equal(em.stats().busConnections, 1);
    bus.close();
  });

  test('1.98: every change is a full NetMap with a SelfChange beside it; /cert-domains exists; no InitialStatus', async () => {
    const em = await env.start({ domains: [A], tailscaledVersion: '1.98.10' });
    assert.equal(em.stats().netmapStyle, 'resend');
    const bus = await BusReader.open(em.address, STATUS | NotifyMask.InitialNetMap);
    const first = await bus.nextJson();
    assert.equal(first.InitialStatus, undefined, 'v1.98 ignores the InitialStatus bit');
    assert.deepEqual(first.NetMap.DNS.CertDomains, [A]);
    em.addCertDomain(B);
    const change = await bus.nextJson();
    assert.deepEqual(change.NetMap.DNS.CertDomains, [A, B]);
    assert.ok(change.SelfChange);
    assert.deepEqual(await getJson(em.address, '/localapi/v0/cert-domains'), [A, B]);
    bus.close();
  });

  test('resend style (1.96): every change is a full NetMap; /cert-domains does not exist', async () => {
    const em = await env.start({ domains: [A], netmapStyle: 'resend' });
    const bus = await BusReader.open(em.address, INITIAL);
    const first = await bus.nextJson();
    assert.equal(first.Version, '1.96.4');
    assert.deepEqual(first.NetMap.DNS.CertDomains, [A]);
    em.addCertDomain(B);
    const change = await bus.nextJson();
    assert.equal(change.SelfChange, undefined);
    assert.deepEqual(change.NetMap.DNS.CertDomains, [A, B]);
    assert.equal(change.State, null);
    em.removeCertDomain(A);
    em.removeCertDomain(B);
    await bus.nextJson();
    const empty = await bus.nextJson();
    assert.ok(!('CertDomains' in empty.NetMap.DNS), 'omitted when empty, like omitempty');
    const r = await get(em.address, '/localapi/v0/cert-domains');
    assert.equal(r.status, 404);
    assert.equal((await getJson<Record<string, any>>(em.address, '/localapi/v0/status')).CertDomains, null);
    bus.close();
  });

  test('a style that contradicts the version is refused', async () => {
    await assert.rejects(env.start({ netmapStyle: 'resend', tailscaledVersion: '1.104.5' }), /contradicts tailscaled 1\.104\.5/);
    await assert.rejects(env.start({ tailscaledVersion: 'latest' }), /must look like 1\.104\.5/);
  });

  test('splitInitialNotify: Version, State and NetMap as three lines', async () => {
    const em = await env.start({ domains: [A], splitInitialNotify: true, tailscaledVersion: '1.102.5' });
    const bus = await BusReader.open(em.address, INITIAL);
    const v = await bus.nextJson();
    assert.equal(v.Version, '1.102.5');
    assert.equal(v.State, null);
    assert.equal(v.NetMap, null);
    assert.equal((await bus.nextJson()).State, 6);
    assert.deepEqual((await bus.nextJson()).NetMap.DNS.CertDomains, [A]);
    bus.close();
  });

  test('a mask without initial bits gets no initial Notify, only later ones', async () => {
    const em = await env.start({ domains: [A], netmapStyle: 'resend' });
    const connected = waitEvent(em, 'busConnect');
    const bus = await BusReader.open(em.address, 0);
    await connected;
    em.addCertDomain(B);
    const line = await bus.nextJson();
    assert.deepEqual(line.NetMap.DNS.CertDomains, [A, B]);
    bus.close();
  });

  test('domainDelayMs: the domains appear later, announced in the active style', async (t) => {
    for (const version of ['1.102.5', '1.96.4'] as const) {
      const style = version === '1.96.4' ? 'resend' : 'selfchange';
      // The delay's timer is the test's to fire: the early answers are read before it, however slow the machine.
      t.mock.timers.enable({ apis: ['setTimeout'] });
      const em = await env.start({ domains: [A], tailscaledVersion: version, domainDelayMs: 200 });
      const bus = await BusReader.open(em.address, INITIAL);
      const first = await bus.nextJson();
      assert.equal(first.State, 6);
      assert.ok(!('CertDomains' in first.NetMap.DNS), `${style}: no cert domains at first`);
      const early = await get(em.address, certPath(A));
      assert.equal(early.status, 500);
      assert.equal(early.body, 'your Tailscale account does not support getting TLS certs\n');
      t.mock.timers.tick(200);
      t.mock.timers.reset();
      const change = await bus.nextJson();
      if (style === 'selfchange') {
        assert.ok(change.SelfChange);
        assert.deepEqual(await getJson(em.address, '/localapi/v0/cert-domains'), [A]);
      } else {
        assert.deepEqual(change.NetMap.DNS.CertDomains, [A]);
      }
      assert.equal((await get(em.address, certPath(A))).status, 200);
      bus.close();
    }
  });

  test('netmapPadBytes: a multi-megabyte NetMap line with realistic Peers', async () => {
    const em = await env.start({ domains: [A], netmapPadBytes: 3 * 1024 * 1024, netmapStyle: 'resend' });
    const bus = await BusReader.open(em.address, INITIAL);
    const line = await bus.next();
    assert.ok(line.length >= 3 * 1024 * 1024, `line is ${line.length} bytes`);
    const n = JSON.parse(line) as Record<string, any>;
    assert.ok(n.NetMap.Peers.length > 1000);
    assert.deepEqual(n.NetMap.DNS.CertDomains, [A]);
    em.addCertDomain(B);
    const again = JSON.parse(await bus.next()) as Record<string, any>;
    assert.deepEqual(again.NetMap.DNS.CertDomains, [A, B]);
    bus.close();
  });
});

describe('bus faults', () => {
  let env: TestEnv;
  before(async () => {
    env = await testEnv();
  });
  after(() => env.cleanup());

  test('disconnect ends the open streams at once; dropBusConnections too', async () => {
    const em = await env.start({ domains: [A] });
    const b1 = await BusReader.open(em.address, STATUS);
    const b2 = await BusReader.open(em.address, STATUS);
    await b1.next();
    await b2.next();
    assert.equal(em.stats().busConnections, 2);
    em.injectFault('bus:disconnect');
    await Promise.all([b1.ended, b2.ended]);
    assert.equal(em.stats().busConnections, 0);
    assert.equal(em.stats().pendingFaults.length, 0, 'the single application was used by the open streams');
    assert.equal(em.stats().faultsApplied['bus:disconnect'], 1);

    const b3 = await BusReader.open(em.address, STATUS);
    await b3.next();
    assert.equal(em.dropBusConnections(), 1);
    await b3.ended;
    assert.equal(em.stats().busConnectionsTotal, 3);
  });

  test('a bus fault injected with no stream open hits the next stream, after its initial Notify', async () => {
    const em = await env.start({ domains: [A], faults: ['bus:disconnect:count=2'] });
    for (let i = 0; i < 2; i++) {
      const bus = await BusReader.open(em.address, STATUS);
      assert.equal((await bus.nextJson()).State, 6);
      await bus.ended;
    }
    const bus = await BusReader.open(em.address, STATUS);
    await bus.next();
    em.addCertDomain(B);
    assert.ok((await bus.nextJson()).SelfChange, 'third stream stays open');
    bus.close();
  });

  test('disconnect:abrupt=true destroys the connection', async () => {
    const em = await env.start({ domains: [A] });
    const bus = await BusReader.open(em.address, STATUS);
    await bus.next();
    em.injectFault('bus:disconnect:abrupt=true');
    await bus.ended;
    assert.ok(bus.res.destroyed);
  });

  test('malformed_line: one line that is not JSON, then the stream goes on', async () => {
    const em = await env.start({ domains: [A] });
    const bus = await BusReader.open(em.address, STATUS);
    await bus.next();
    em.injectFault('bus:malformed_line');
    const bad = await bus.next();
    assert.throws(() => JSON.parse(bad));
    em.addCertDomain(B);
    assert.ok((await bus.nextJson()).SelfChange);
    bus.close();
  });

  test('huge_line: a valid JSON line of exactly `bytes` bytes', async () => {
    const em = await env.start({ domains: [A] });
    const bus = await BusReader.open(em.address, STATUS);
    await bus.next();
    em.injectFault({ target: 'bus', kind: 'huge_line', bytes: 2_000_000 });
    const line = await bus.next();
    assert.equal(Buffer.byteLength(line), 2_000_000);
    const n = JSON.parse(line) as Record<string, any>;
    assert.equal(n.Version, '1.104.5');
    assert.ok(!('NetMap' in n), 'no NetMap field on v1.104');
    em.addCertDomain(B);
    assert.ok((await bus.nextJson()).SelfChange);
    bus.close();
  });
});
