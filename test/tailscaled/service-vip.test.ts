// A tailnet client through a Tailscale Service's VIP, against the real tailscaled 1.102.5: tsenv's control
// (--service-vips) gives svc:web a VIP, tells its hosts (their self node's `service-host` capability) and puts the
// VIP in the AllowedIPs of one host, as Tailscale's control does. Two hosts, proxy-0 and proxy-1, forward the
// Service's TCP 443 (their ServeConfig) to a TLS server each, serving a certificate for web.<tailnet> of its own;
// a third tailscaled, the client, dials web.<tailnet>:443 through the tailnet and completes the TLS handshake: the
// leaf says which host answered. A host withdrawn (AdvertiseServices without the Service, the masked prefs edit of
// certshare's advertiser, through certshare's own LocalAPI client) still answers until control moves the VIP to the
// other host, which gets every later connection; with neither advertising the client has no route to the VIP at all.
import assert from 'node:assert/strict';
import { X509Certificate } from 'node:crypto';
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { connect } from 'node:tls';
import { silentLogger } from '../../src/core/ports/logger.ts';
import { createLocalApiClient } from '../../src/localapi/client.ts';
import { BUILD_AND_START_TIMEOUT_MS, TS_MAGICDNS, type TailnetNode, useRealTailscaled } from '../harness/tailscale.ts';
import { DAY, makePair, testCa } from '../support/certs.ts';
import { get } from '../support/emulator.ts';
import type { Daemon } from '../../src/daemon/daemon.ts';
import { projectConfig } from '../support/projected-config.ts';
import { recordingLogger } from '../support/recording-logger.ts';
import { standaloneDaemon, useTempDir } from '../support/standalone.ts';
import { startTcpProxy } from '../support/tcp-proxy.ts';
import { startTlsProxy, type TestProxy } from '../support/tls-proxy.ts';

const SERVICE = 'svc:web';
const SERVICE_DOMAIN = `web.${TS_MAGICDNS}`;

type Outcome = { leaf: string } | { error: string };

/** One connection of the client to `host`:443 through the tailnet and a verified handshake for the Service's domain. */
async function handshake(client: TailnetNode, host: string, ca: string): Promise<Outcome> {
  let conn: Awaited<ReturnType<TailnetNode['dial']>>;
  try {
    conn = await client.dial(host, 443);
  } catch (err) {
    return { error: (err as Error).message };
  }
  return new Promise((resolve) => {
    const tls = connect({ socket: conn, servername: SERVICE_DOMAIN, ca }, () => {
      resolve({ leaf: tls.getPeerX509Certificate()!.fingerprint256 });
      tls.destroy();
    });
    tls.once('error', (err) => {
      conn.destroy();
      resolve({ error: err.message });
    });
    tls.setTimeout(2000, () => tls.destroy(new Error('no handshake within 2 s')));
  });
}

/** A host's ServeConfig: the Service's TCP 443 forwarded to `target` (`unix:<path>`). */
const forwarding = (target: string) => ({ Services: { [SERVICE]: { TCP: { '443': { TCPForward: target } } } } });

/** Sets a host's ServeConfig to `forwarding(target)`. */
async function forwardService(socket: string, target: string): Promise<void> {
  const res = await get(socket, '/localapi/v0/serve-config', { method: 'POST', body: JSON.stringify(forwarding(target)) });
  assert.equal(res.status, 200, res.body);
}

/** Tries every 100 ms until `done` holds for a result; returns the results, the last one `done`'s, and the time taken. */
async function tryUntil<T>(what: string, attempt: () => Promise<T>, done: (t: T) => boolean): Promise<{ outcomes: T[]; ms: number }> {
  const start = performance.now();
  const outcomes: T[] = [];
  for (;;) {
    const o = await attempt();
    outcomes.push(o);
    if (done(o)) return { outcomes, ms: Math.round(performance.now() - start) };
    if (performance.now() - start > 30_000) assert.fail(`${what}: not within 30 s; last: ${JSON.stringify(outcomes.slice(-5))}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

describe("a tailnet client through a Tailscale Service's VIP (real tailscaled)", { timeout: BUILD_AND_START_TIMEOUT_MS }, () => {
  const realTailscaled = useRealTailscaled({ serviceVips: true, hostname: 'proxy-0' });
  const dir = useTempDir();

  it("reaches the advertising hosts' proxies, the next connections move off a withdrawn host, none without a host", async () => {
    const ts = realTailscaled();
    const [proxy1, client] = await Promise.all([ts.addNode('proxy-1'), ts.addNode('client')]);
    const ca = (await testCa()).certPem;
    const hosts = [
      { name: 'proxy-0', socket: ts.socket },
      { name: 'proxy-1', socket: proxy1.socket },
    ];
    const proxies: TestProxy[] = [];
    const leaf: Record<string, string> = {};
    const signal = AbortSignal.timeout(60_000);
    const advertise = (socket: string, services: string[]) =>
      createLocalApiClient({ address: socket, logger: silentLogger }).editPrefs!({ AdvertiseServicesSet: true, AdvertiseServices: services }, signal);
    try {
      for (const host of hosts) {
        // Each host's proxy: a certificate for the Service's domain of its own, on a unix socket its ServeConfig forwards to.
        const pair = await makePair(SERVICE_DOMAIN, Date.now() - DAY, 30 * DAY);
        leaf[host.name] = new X509Certificate(pair.certPem).fingerprint256;
        const path = join(dir(), `${host.name}.sock`);
        proxies.push(await startTlsProxy(pair, path));
        await forwardService(host.socket, `unix:${path}`);
        await advertise(host.socket, [SERVICE]);
      }
      const who = (o: Outcome) => ('leaf' in o ? (Object.keys(leaf).find((h) => leaf[h] === o.leaf) ?? `an unknown leaf ${o.leaf}`) : `error: ${o.error}`);
      const toName = () => handshake(client, SERVICE_DOMAIN, ca);

      // Both host it: the client's connections go to the primary, the oldest host.
      await tryUntil(
        'control sees both hosts',
        () => ts.serviceVips(),
        ([v]) => v?.Hosts.join() === 'proxy-0,proxy-1',
      );
      const first = await tryUntil('the client reaches the Service', toName, (o) => 'leaf' in o);
      assert.equal(who(first.outcomes.at(-1)!), 'proxy-0');
      const [vip] = await ts.serviceVips();
      assert.deepEqual({ ...vip, Addrs: vip!.Addrs.length }, { Service: SERVICE, Addrs: 2, Hosts: ['proxy-0', 'proxy-1'], Primary: 'proxy-0' });
      for (const host of hosts) {
        const self = JSON.parse((await get(host.socket, '/localapi/v0/status?peers=false')).body) as { Self: { CapMap?: Record<string, unknown> } };
        assert.deepEqual(self.Self.CapMap?.['service-host'], [{ [SERVICE]: vip!.Addrs }], `${host.name} told its VIP`);
      }
      for (const address of vip!.Addrs) assert.equal(who(await handshake(client, address, ca)), 'proxy-0', `through ${address}`);
      for (let i = 0; i < 3; i++) assert.equal(who(await toName()), 'proxy-0');

      // proxy-0 withdraws: it still answers what reaches it until control moves the VIP (then a connection across
      // the move may break); from then on the client's connections reach proxy-1.
      await advertise(ts.socket, []);
      const moved = await tryUntil('the connections move to proxy-1', toName, (o) => who(o) === 'proxy-1');
      for (const o of moved.outcomes) assert.match(who(o), /^(proxy-[01]|error: .*)$/);
      for (let i = 0; i < 5; i++) assert.equal(who(await toName()), 'proxy-1');
      assert.equal((await ts.serviceVips())[0]!.Primary, 'proxy-1');

      // Neither advertises: once control takes the VIP back, the client has no route to it.
      await advertise(proxy1.socket, []);
      const gone = await tryUntil('no route without a host', toName, (o) => who(o).includes('Dial-Self'));
      for (let i = 0; i < 3; i++) assert.match(who(await toName()), /Dial-Self/);
      assert.equal((await ts.serviceVips())[0]!.Primary, '');

      // proxy-1 advertises again: reached again.
      await advertise(proxy1.socket, [SERVICE]);
      const back = await tryUntil('reached again', toName, (o) => who(o) === 'proxy-1');
      const count = (r: { outcomes: Outcome[] }, what: RegExp) => r.outcomes.filter((o) => what.test(who(o))).length;
      process.stderr.write(
        `service VIP ${vip!.Addrs.join(' ')}: reached after ${first.ms} ms; proxy-0 withdrawn: the client reached proxy-1 after ${moved.ms} ms ` +
          `(before: ${count(moved, /proxy-0/)} connections still to proxy-0, ${count(moved, /error/)} failed); both withdrawn: no route after ` +
          `${gone.ms} ms (before: ${count(gone, /proxy-1/)} to proxy-1); proxy-1 back: reached after ${back.ms} ms\n`,
      );
    } finally {
      await Promise.all(proxies.map((p) => p.close()));
    }
  });
});

// containerboot, as the example's Pods run it (no config file, the ServeConfig from TS_SERVE_CONFIG), advertises the
// serve config's Services itself at every netmap change unless TS_EXPERIMENTAL_SERVICE_AUTO_ADVERTISEMENT=false (which
// the injector sets on tailscaled's container of a Pod whose certshare advertises). Here proxy-0's proxy serves an
// expired certificate, so certshare would never advertise it and withdraws it: with the variable false, nothing
// advertises it and a tailnet client has no route to the Service; unset, containerboot advertises it at start, again
// after the withdrawal as soon as a peer joins, and the client's handshake through the Service's name gets the expired leaf.
describe("containerboot's own advertisement of the serve config's Services (real containerboot 1.102.5)", { timeout: BUILD_AND_START_TIMEOUT_MS }, () => {
  const realTailscaled = useRealTailscaled({ serviceVips: true, hostname: 'proxy-0' });
  const dir = useTempDir();

  it('undoes a withdrawal at the next netmap change, sending clients to an expired certificate, unless turned off', async () => {
    const ts = realTailscaled();
    const client = await ts.addNode('client');
    const ca = (await testCa()).certPem;
    const expired = await makePair(SERVICE_DOMAIN, Date.now() - 3 * DAY, DAY);
    const socket = join(dir(), 'proxy-0.sock');
    const proxy = await startTlsProxy(expired, socket);
    const serveConfig = join(dir(), 'serve-config.json');
    await writeFile(serveConfig, JSON.stringify(forwarding(`unix:${socket}`)));
    const advertised = async () => JSON.parse((await get(ts.socket, '/localapi/v0/prefs')).body).AdvertiseServices ?? [];
    const withdraw = () =>
      createLocalApiClient({ address: ts.socket, logger: silentLogger }).editPrefs!(
        { AdvertiseServicesSet: true, AdvertiseServices: [] },
        AbortSignal.timeout(10_000),
      );
    const peerJoins = async (name: string) => {
      const joined = performance.now();
      await ts.addNode(name);
      return joined;
    };
    try {
      // Off: the serve config is applied, nothing advertises it, and a peer joining changes nothing.
      await ts.startContainerbootServing(serveConfig, { TS_EXPERIMENTAL_SERVICE_AUTO_ADVERTISEMENT: 'false' });
      await tryUntil(
        'the serve config applied',
        async () => JSON.parse((await get(ts.socket, '/localapi/v0/serve-config')).body),
        (c) => !!c?.Services?.[SERVICE],
      );
      await peerJoins('peer-1');
      // An observation window for what must not happen: with the variable unset it happened within it (below).
      const quietFrom = performance.now();
      const quiet = await tryUntil(
        '5 s of prefs after the netmap change',
        async () => ({ at: performance.now(), services: await advertised() }),
        (o) => o.services.length > 0 || o.at - quietFrom > 5000,
      );
      assert.deepEqual(quiet.outcomes.at(-1)!.services, [], 'nothing advertised the Service');
      assert.match(JSON.stringify(await handshake(client, SERVICE_DOMAIN, ca)), /Dial-Self|resolve/, 'the client has no route to the Service');

      // Unset: containerboot advertises the Service itself; withdrawn, it is back once a peer joins, and clients with it.
      await ts.startContainerbootServing(serveConfig);
      const atStart = await tryUntil('containerboot advertises the Service itself', advertised, (l) => l.includes(SERVICE));
      await withdraw();
      assert.deepEqual(await advertised(), []);
      const joined = await peerJoins('peer-2');
      const back = await tryUntil('containerboot advertises it again after a peer joined', advertised, (l) => l.includes(SERVICE));
      const backAt = performance.now();
      const reached = await tryUntil(
        'the client reaches the withdrawn host',
        () => handshake(client, SERVICE_DOMAIN, ca),
        (o) => 'error' in o && /expired/.test(o.error),
      );
      process.stderr.write(
        `containerboot (auto-advertisement on): advertised ${atStart.ms} ms after start; after certshare's withdrawal, again ` +
          `${Math.round(backAt - joined)} ms after a peer joined (${back.outcomes.length} samples); ` +
          `the client's handshake: ${JSON.stringify(reached.outcomes.at(-1))}\n`,
      );
    } finally {
      await proxy.close();
    }
  });
});

// A ProxyGroup replica as Tailscale's operator runs it: containerboot from the operator's config file (`"Locked":
// false`, AdvertiseServices svc:web, swapped as the kubelet swaps a mounted Secret), the ServeConfig from
// TS_SERVE_CONFIG, its own advertisement off (as the operator sets it); its proxy serves an expired certificate for
// the Service's name, while proxy-1 hosts the Service with a valid one. Before certshare runs, a tailnet client
// through the Service's name gets the expired leaf (proxy-0, the oldest host, carries the VIP); certshare, as root
// (the right to edit prefs), withdraws proxy-0 from the file's list, the client's connections move to proxy-1, and
// the owner's change of the file (containerboot's reload puts svc:web back) sends the client no expired leaf.
describe("a replica run from the operator's config file, serving an expired certificate (real containerboot 1.102.5)", {
  timeout: BUILD_AND_START_TIMEOUT_MS,
}, () => {
  // The Service's domain granted to its hosts: certshare holds its certificate, which its served check compares with.
  const realTailscaled = useRealTailscaled({ serviceVips: true, serviceHostsOnly: true, hostname: 'proxy-0' });
  const dir = useTempDir();

  it('certshare withdraws it: a client through the Service’s name gets no expired leaf, through the owner’s reload too', async () => {
    const ts = realTailscaled();
    const [proxy1, client] = await Promise.all([ts.addNode('proxy-1'), ts.addNode('client')]);
    const ca = (await testCa()).certPem;
    const valid = await makePair(SERVICE_DOMAIN, Date.now() - DAY, 30 * DAY);
    const validLeaf = new X509Certificate(valid.certPem).fingerprint256;
    // proxy-0's proxy on a unix socket (tailscaled runs in a network namespace of its own), reached by certshare's
    // served check through a TCP relay, as a Pod's containers share one loopback.
    const expiredPath = join(dir(), 'proxy-0.sock');
    const expiredProxy = await startTlsProxy(await makePair(SERVICE_DOMAIN, Date.now() - 3 * DAY, DAY), expiredPath);
    const loopback = await startTcpProxy({ path: expiredPath });
    const validPath = join(dir(), 'proxy-1.sock');
    const validProxy = await startTlsProxy(valid, validPath);
    const serveConfig = join(dir(), 'serve-config.json');
    await writeFile(serveConfig, JSON.stringify(forwarding(`unix:${expiredPath}`)));
    const configDir = join(dir(), 'tsconfig');
    await mkdir(configDir);
    await projectConfig(configDir, 1, { Version: 'alpha0', Locked: false, AdvertiseServices: [SERVICE] });
    let daemon: Daemon | undefined;
    try {
      await ts.startContainerboot(configDir, { TS_SERVE_CONFIG: serveConfig, TS_EXPERIMENTAL_SERVICE_AUTO_ADVERTISEMENT: 'false' });
      await forwardService(proxy1.socket, `unix:${validPath}`);
      await createLocalApiClient({ address: proxy1.socket, logger: silentLogger }).editPrefs!(
        { AdvertiseServicesSet: true, AdvertiseServices: [SERVICE] },
        AbortSignal.timeout(10_000),
      );
      await tryUntil(
        'control sees both hosts, proxy-0 first',
        () => ts.serviceVips(),
        ([v]) => v?.Hosts.join() === 'proxy-0,proxy-1' && v.Primary === 'proxy-0',
      );
      const outcome = async () => {
        const o = await handshake(client, SERVICE_DOMAIN, ca);
        return 'leaf' in o ? (o.leaf === validLeaf ? 'proxy-1' : `an unknown leaf ${o.leaf}`) : o.error;
      };
      const before = await tryUntil('the client gets the expired leaf', outcome, (o) => /expired/.test(o));

      const log = recordingLogger();
      const flags = ['--domain', SERVICE_DOMAIN, '--served-check', `127.0.0.1:${loopback.port}`, '--served-check-interval', '1s'];
      const started = performance.now();
      daemon = await standaloneDaemon(ts, join(dir(), 'certs'), [...flags, '--advertise-services', SERVICE, '--advertise-failover', '200ms'], log.logger);
      const moved = await tryUntil('the connections move to proxy-1', outcome, (o) => o === 'proxy-1').catch((err: unknown) => {
        process.stderr.write(`on failure: certshare's log ${JSON.stringify(log.entries.slice(0, 60))}\n`);
        throw err;
      });
      const movedMs = Math.round(performance.now() - started);
      assert.equal((await ts.serviceVips())[0]!.Primary, 'proxy-1');

      // The owner changes the file: containerboot reloads it, svc:web back in proxy-0's prefs until certshare withdraws it again.
      const reloads = () => ts.logs().tailscaled.filter((l) => l.includes('tailscaled config watch: config was reloaded')).length;
      await projectConfig(configDir, 2, { Version: 'alpha0', Locked: false, AdvertiseServices: [SERVICE, 'svc:api'] });
      const reloadedFrom = performance.now();
      const through = await tryUntil(
        'containerboot reloaded, certshare withdrew again, then 3 s of connections',
        async () => ({ o: await outcome(), reloaded: reloads() === 1, at: performance.now() }),
        (r) => r.reloaded && r.at - reloadedFrom > 3000,
      );
      const prefs = JSON.parse((await get(ts.socket, '/localapi/v0/prefs')).body) as { AdvertiseServices: string[] | null };
      assert.deepEqual(prefs.AdvertiseServices, ['svc:api'], 'withdrawn again, svc:api of the file kept');
      assert.deepEqual(
        through.outcomes.map((r) => r.o).filter((o) => o !== 'proxy-1'),
        [],
        'every connection after the move to proxy-1: no expired leaf',
      );
      process.stderr.write(
        `config-file replica serving an expired certificate: before certshare, the client got ${JSON.stringify(before.outcomes.at(-1))}; ` +
          `with certshare, its connections reached proxy-1 ${movedMs} ms after certshare started (${moved.outcomes.length} handshakes, ` +
          `${moved.outcomes.filter((o) => /expired/.test(o)).length} of them expired before the move); through the owner's reload: ` +
          `${through.outcomes.length} handshakes, all to proxy-1\n`,
      );
    } finally {
      await daemon?.stop();
      await Promise.all([expiredProxy.close(), validProxy.close(), loopback.close()]);
    }
  });
});
