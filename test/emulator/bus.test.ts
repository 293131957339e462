import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { NotifyMask } from '../../src/core/localapi.ts';
import { BusReader, certPath, get, getJson, testEnv, waitEvent, type TestEnv } from './helpers.ts';

const A = 'a.tailnet-1234.ts.net';
const B = 'b.tailnet-1234.ts.net';
const C = 'c.tailnet-1234.ts.net';
const INITIAL = NotifyMask.InitialState | NotifyMask.InitialNetMap | NotifyMask.NoPrivateKeys;

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
    const rl = await get(em.address, `/localapi/v0/watch-ipn-bus?mask=${NotifyMask.RateLimit | NotifyMask.NoNetMap}`);
    assert.equal(rl.status, 400);
  });

  test('selfchange style: initial Notify with Version, State and NetMap; a new domain arrives as SelfChange', async () => {
    const em = await env.start({ domains: [B, A], netmapStyle: 'selfchange' });
    const bus = await BusReader.open(em.address, INITIAL);
    assert.equal(bus.res.headers['content-type'], 'application/json');
    assert.equal(bus.res.headers['transfer-encoding'], 'chunked');
    assert.equal(bus.res.headers['tailscale-version'], '1.102.3');
    const first = await bus.nextJson();
    assert.equal(first.Version, '1.102.3');
    assert.equal(first.State, 6);
    assert.equal(typeof first.SessionID, 'string');
    assert.equal(first.ErrMessage, null, 'Go writes nil pointers as null');
    assert.deepEqual(first.NetMap.DNS.CertDomains, [A, B]);
    assert.equal(first.NetMap.Domain, 'tailnet-1234.ts.net');
    assert.equal(first.NetMap.SelfNode.Name, 'b.tailnet-1234.ts.net.', 'named after the first configured domain');
    assert.deepEqual(await getJson(em.address, '/localapi/v0/cert-domains'), [A, B]);

    em.addCertDomain(C);
    const change = await bus.nextJson();
    assert.equal(change.NetMap, null, 'v1.100+ sends no netmap after the first Notify');
    assert.equal(change.SelfChange.StableID, first.NetMap.SelfNode.StableID);
    assert.equal(change.Version, '1.102.3');
    assert.deepEqual(await getJson(em.address, '/localapi/v0/cert-domains'), [A, B, C]);

    em.removeCertDomain(A);
    assert.ok((await bus.nextJson()).SelfChange);
    assert.deepEqual(await getJson(em.address, '/localapi/v0/cert-domains'), [B, C]);
    assert.equal(em.stats().busConnections, 1);
    bus.close();
  });

  test('resend style: every change is a full NetMap; /cert-domains does not exist', async () => {
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

  test('splitInitialNotify: Version, State and NetMap as three lines', async () => {
    const em = await env.start({ domains: [A], splitInitialNotify: true });
    const bus = await BusReader.open(em.address, INITIAL);
    const v = await bus.nextJson();
    assert.equal(v.Version, '1.102.3');
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

  test('domainDelayMs: the domains appear later, announced in the active style', async () => {
    for (const style of ['selfchange', 'resend'] as const) {
      const em = await env.start({ domains: [A], netmapStyle: style, domainDelayMs: 200 });
      const bus = await BusReader.open(em.address, INITIAL);
      const first = await bus.nextJson();
      assert.equal(first.State, 6);
      assert.ok(!('CertDomains' in first.NetMap.DNS), `${style}: no cert domains at first`);
      const early = await get(em.address, certPath(A));
      assert.equal(early.status, 500);
      assert.equal(early.body, 'your Tailscale account does not support getting TLS certs\n');
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
    const b1 = await BusReader.open(em.address, INITIAL);
    const b2 = await BusReader.open(em.address, INITIAL);
    await b1.next();
    await b2.next();
    assert.equal(em.stats().busConnections, 2);
    em.injectFault('bus:disconnect');
    await Promise.all([b1.ended, b2.ended]);
    assert.equal(em.stats().busConnections, 0);
    assert.equal(em.stats().pendingFaults.length, 0, 'the single application was used by the open streams');
    assert.equal(em.stats().faultsApplied['bus:disconnect'], 1);

    const b3 = await BusReader.open(em.address, INITIAL);
    await b3.next();
    assert.equal(em.dropBusConnections(), 1);
    await b3.ended;
    assert.equal(em.stats().busConnectionsTotal, 3);
  });

  test('a bus fault injected with no stream open hits the next stream, after its initial Notify', async () => {
    const em = await env.start({ domains: [A], faults: ['bus:disconnect:count=2'] });
    for (let i = 0; i < 2; i++) {
      const bus = await BusReader.open(em.address, INITIAL);
      assert.equal((await bus.nextJson()).State, 6);
      await bus.ended;
    }
    const bus = await BusReader.open(em.address, INITIAL);
    await bus.next();
    em.addCertDomain(B);
    assert.ok((await bus.nextJson()).SelfChange, 'third stream stays open');
    bus.close();
  });

  test('disconnect:abrupt=true destroys the connection', async () => {
    const em = await env.start({ domains: [A] });
    const bus = await BusReader.open(em.address, INITIAL);
    await bus.next();
    em.injectFault('bus:disconnect:abrupt=true');
    await bus.ended;
    assert.ok(bus.res.destroyed);
  });

  test('malformed_line: one line that is not JSON, then the stream goes on', async () => {
    const em = await env.start({ domains: [A] });
    const bus = await BusReader.open(em.address, INITIAL);
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
    const bus = await BusReader.open(em.address, INITIAL);
    await bus.next();
    em.injectFault({ target: 'bus', kind: 'huge_line', bytes: 2_000_000 });
    const line = await bus.next();
    assert.equal(Buffer.byteLength(line), 2_000_000);
    const n = JSON.parse(line) as Record<string, any>;
    assert.equal(n.Version, '1.102.3');
    assert.equal(n.NetMap, null);
    em.addCertDomain(B);
    assert.ok((await bus.nextJson()).SelfChange);
    bus.close();
  });
});
