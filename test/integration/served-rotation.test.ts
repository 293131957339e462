// The served check and the Tailscale Service advertisement, end to end in one process: certshare
// standalone against the emulator (whose /localapi/v0/prefs keeps AdvertiseServices) and a loopback TLS
// listener standing for the proxy, whose certificate the test sets.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import type { Daemon } from '../../src/daemon/daemon.ts';
import type { Emulator } from '../../src/emulator/server.ts';
import { DAY, makePair } from '../support/certs.ts';
import { recordingLogger } from '../support/recording-logger.ts';
import { DOMAIN, emulatorIn, standaloneDaemon, tempDir } from '../support/standalone.ts';
import { startNotTlsProxy, startTlsProxy, type TestProxy } from '../support/tls-proxy.ts';
import { every, until } from '../support/wait.ts';
import { createCertificateAuthority } from '../../src/pki/ca.ts';

const SERVICE = 'svc:web';

async function metric(daemon: Daemon, name: string, labels: string): Promise<number | undefined> {
  const text = await daemon.metrics.registry.metrics();
  const line = text.split('\n').find((l) => l.startsWith(`${name}{`) && l.includes(labels));
  return line === undefined ? undefined : Number(line.split(' ').pop());
}

/** The metric once it reads `want`, or what it reads after 5 s. */
async function metricSettled(daemon: Daemon, name: string, labels: string, want: number): Promise<number | undefined> {
  const deadline = Date.now() + 5000;
  let value = await metric(daemon, name, labels);
  while (value !== want && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 50));
    value = await metric(daemon, name, labels);
  }
  return value;
}

async function heldPair(certDir: string): Promise<{ certPem: string; keyPem: string }> {
  return {
    certPem: await readFile(join(certDir, DOMAIN, 'tls.crt'), 'utf8'),
    keyPem: await readFile(join(certDir, DOMAIN, 'tls.key'), 'utf8'),
  };
}

interface Setup {
  emulator: Emulator;
  daemon: Daemon;
  proxy: TestProxy;
  certDir: string;
  log: ReturnType<typeof recordingLogger>;
  done(): Promise<void>;
}

async function setup(proxy: TestProxy, flags: string[] = [], emulatorOptions: Parameters<typeof emulatorIn>[1] = {}): Promise<Setup> {
  const dir = await tempDir();
  const emulator = await emulatorIn(dir.path, emulatorOptions);
  // Someone else's Service: certshare must leave it alone.
  emulator.prefs.setAdvertiseServices(['svc:other']);
  const certDir = join(dir.path, 'certs');
  const log = recordingLogger();
  const daemon = await standaloneDaemon(
    emulator,
    certDir,
    ['--served-check', `127.0.0.1:${proxy.port}`, '--served-check-interval', '1s', '--served-check-timeout', '500ms', ...flags],
    log.logger,
  );
  return {
    emulator,
    daemon,
    proxy,
    certDir,
    log,
    done: async () => {
      await daemon.stop();
      await proxy.close();
      await emulator.close();
      await dir.remove();
    },
  };
}

const advertised = (s: Setup): boolean => s.emulator.prefs.advertiseServices.includes(SERVICE);

describe('served check and Service advertisement (emulator)', () => {
  it('advertises only once the proxy serves the certificate held, withdraws on an expired one, and first of all on stop', async () => {
    const foreignCa = await createCertificateAuthority({ name: 'not the tailnet CA', now: Date.now() });
    const proxy = await startTlsProxy(await makePair(DOMAIN, Date.now() - DAY, 30 * DAY, foreignCa));
    const s = await setup(proxy, ['--advertise-services', SERVICE, '--advertise-failover', '300ms', '--shutdown-timeout', '5s']);
    try {
      await until('a certificate held and the proxy checked', () => s.daemon.health.details().some((l) => l.includes('never held')), [every(50)]);
      assert.equal(advertised(s), false, 'not advertised while the proxy serves a certificate certshare never held');
      assert.match(s.daemon.health.evaluate(Date.now()).reason, /never held/);
      assert.equal(await metric(s.daemon, 'certshare_served_certificate_status', 'outcome="other"'), 1);

      proxy.serve(await heldPair(s.certDir));
      await until('advertised', () => advertised(s), [every(50)]);
      assert.deepEqual(s.emulator.prefs.advertiseServices, ['svc:other', SERVICE], 'the other Service kept, in its place');
      assert.equal(s.daemon.health.evaluate(Date.now()).healthy, true);
      // The gauge follows the edit's answer, a moment after tailscaled (the emulator) applied it.
      assert.equal(await metricSettled(s.daemon, 'certshare_service_advertised', `service="${SERVICE}"`, 1), 1);

      // Someone else edits the prefs meanwhile: their change survives certshare's next edit.
      s.emulator.prefs.setAdvertiseServices(['svc:other', SERVICE, 'svc:third']);

      proxy.serve(await makePair(DOMAIN, Date.now() - 2 * DAY, DAY));
      await until('withdrawn after the proxy served an expired certificate', () => !advertised(s), [every(50)]);
      assert.deepEqual(s.emulator.prefs.advertiseServices, ['svc:other', 'svc:third']);
      assert.match(s.daemon.health.evaluate(Date.now()).reason, /expired certificate/);

      proxy.serve(await heldPair(s.certDir));
      await until('advertised again', () => advertised(s), [every(50)]);
      const stopping = s.daemon.stop();
      await until('withdrawn while stopping', () => !advertised(s), [every(50)]);
      await stopping;
      const failoverWaited = s.log.entries.some((e) => e.msg?.includes('waiting for control to move clients'));
      assert.ok(failoverWaited, 'the failover wait was logged');
      assert.deepEqual(s.emulator.prefs.advertiseServices, ['svc:other', 'svc:third'], 'only certshare’s Service withdrawn');
    } finally {
      await s.done();
    }
  });

  it("--advertise-services serve-config: advertises the ServeConfig's Services, follows the file, withdraws what leaves it", async () => {
    const dir = await tempDir();
    const file = join(dir.path, 'serve.json');
    const serveConfig = (services: Record<string, unknown>) => JSON.stringify({ Web: { [`${DOMAIN}:443`]: {} }, Services: services });
    // svc:web is served under DOMAIN (web.tailnet-test.ts.net); svc:api has no managed domain; "web" is no Service name.
    await writeFile(file, serveConfig({ [SERVICE]: { Web: { [`${DOMAIN}:443`]: {} } }, 'svc:api': {}, web: {} }));
    const proxy = await startTlsProxy(await makePair(DOMAIN, Date.now() - DAY, 30 * DAY));
    const s = await setup(proxy, ['--serve-config', file, '--advertise-services', 'serve-config', '--advertise-failover', '300ms', '--shutdown-timeout', '5s']);
    try {
      await until('the certificate held', () => s.daemon.health.infoOf(DOMAIN) !== undefined, [every(50)]);
      proxy.serve(await heldPair(s.certDir));
      await until('advertised', () => advertised(s), [every(50)]);
      assert.deepEqual(s.emulator.prefs.advertiseServices, ['svc:other', SERVICE], 'svc:api (no certificate) not advertised, svc:other kept');
      assert.ok(s.log.entries.some((e) => e.msg?.includes('serve config Service refused') && e.service === 'web'));

      // Gone from the file's Services (its domain still managed): withdrawn; back: advertised again.
      await writeFile(file, serveConfig({ 'svc:api': {} }));
      await until('withdrawn once unlisted', () => !advertised(s), [every(50)]);
      assert.deepEqual(s.emulator.prefs.advertiseServices, ['svc:other']);
      await writeFile(file, serveConfig({ [SERVICE]: {} }));
      await until('advertised again once listed', () => advertised(s), [every(50)]);

      // A file that turns to garbage, or lists too many Services, changes nothing: the last good list stands.
      for (const text of ['{"Services": ', JSON.stringify({ Services: Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`svc:s${i}`, {}])) })]) {
        const errors = s.log.entries.filter((e) => e.msg?.includes('serve config unusable')).length;
        await writeFile(file, text);
        await until('the file refused', () => s.log.entries.filter((e) => e.msg?.includes('serve config unusable')).length > errors, [every(50)]);
        assert.deepEqual(s.emulator.prefs.advertiseServices, ['svc:other', SERVICE]);
      }

      const stopping = s.daemon.stop();
      await until('withdrawn while stopping', () => !advertised(s), [every(50)]);
      await stopping;
      assert.deepEqual(s.emulator.prefs.advertiseServices, ['svc:other']);
    } finally {
      await s.done();
      await dir.remove();
    }
  });

  it('a port that is not TLS, or hangs in the handshake, is "unknown": never a reason to leave rotation', async () => {
    for (const behaviour of ['http', 'hang'] as const) {
      const proxy = await startNotTlsProxy(behaviour);
      const s = await setup(proxy);
      try {
        await until(`checked (${behaviour})`, () => s.daemon.health.details().some((l) => l.includes('no TLS answer')), [every(50)]);
        assert.equal(s.daemon.health.evaluate(Date.now()).healthy, true, 'healthy: the check could not run');
        const detail = s.daemon.health.details().join('\n');
        assert.match(detail, behaviour === 'http' ? /not a TLS listener|closed during the TLS handshake/ : /no TLS handshake within 500 ms/);
        assert.equal(await metric(s.daemon, 'certshare_served_certificate_status', 'outcome="unknown"'), 1);
      } finally {
        await s.done();
      }
    }
  });

  it('through an agent whose status says a config file owns the list: certshare asks only to withdraw what it must not serve', async () => {
    const request = (exchange: string): Promise<string | undefined> => readFile(join(exchange, 'request', 'advertise.json'), 'utf8').catch(() => undefined);
    const proxies = {
      'no TLS answer': () => startNotTlsProxy('http'),
      'an expired certificate': async () => startTlsProxy(await makePair(DOMAIN, Date.now() - 2 * DAY, DAY)),
    };
    for (const [behaviour, start] of Object.entries(proxies)) {
      const proxy = await start();
      const dir = await tempDir();
      const exchange = join(dir.path, 'exchange');
      await mkdir(join(exchange, 'request'), { recursive: true });
      await mkdir(join(exchange, 'status'));
      // The agent's word (advertise-agent.ts under a config file): the file's list advertises the Service.
      await writeFile(join(exchange, 'status', 'advertised.json'), JSON.stringify({ advertised: [SERVICE], stopped: false, fromFile: true }));
      const s = await setup(proxy, ['--advertise-services', SERVICE, '--advertise-agent', exchange, '--advertise-failover', '0s']);
      try {
        await until(`the certificate held (${behaviour})`, () => s.daemon.health.infoOf(DOMAIN) !== undefined, [every(50)]);
        if (behaviour === 'no TLS answer') {
          await until('checked', () => s.daemon.health.details().some((l) => l.includes('no TLS answer')), [every(50)]);
          await new Promise((r) => setTimeout(r, 2500)); // two check intervals and more: the advertiser's resyncs
          assert.equal(await request(exchange), undefined, 'not confirmed yet is no reason to withdraw from the file');
        } else {
          await until('a withdrawal asked', () => existsSync(join(exchange, 'request', 'advertise.json')), [every(50)]);
          assert.deepEqual(JSON.parse((await request(exchange))!).advertise, []);
        }
      } finally {
        await writeFile(join(exchange, 'status', 'advertised.json'), JSON.stringify({ advertised: [], stopped: true }));
        await s.done();
        await dir.remove();
      }
    }
  });

  it('a tailscaled that refuses the prefs edit (403) gets one warning and a counter, never a crash or an advertisement', async () => {
    const proxy = await startTlsProxy(await makePair(DOMAIN, Date.now() - DAY, 30 * DAY));
    const s = await setup(proxy, ['--advertise-services', SERVICE], { prefsWrite: 'denied' });
    try {
      await until('the certificate held', () => s.daemon.health.infoOf(DOMAIN) !== undefined, [every(50)]);
      proxy.serve(await heldPair(s.certDir));
      const refusals = (): Promise<number | undefined> => metric(s.daemon, 'certshare_advertise_errors_total', 'CERTSHARE_LOCALAPI_REFUSED');
      await until('the edit refused', () => s.log.entries.some((e) => e.msg?.includes('Tailscale Services advertisement')), [every(50)]);
      // The retry (1 s later) is refused again: counted, not warned about again.
      for (let i = 0; i < 100 && ((await refusals()) ?? 0) < 2; i++) await new Promise((r) => setTimeout(r, 50));
      assert.ok(((await refusals()) ?? 0) >= 2, 'each refusal counted');
      assert.equal(advertised(s), false);
      assert.equal(s.daemon.health.evaluate(Date.now()).healthy, true);
      const warnings = s.log.entries.filter((e) => e.level === 'warn' && e.msg?.includes('Tailscale Services advertisement'));
      assert.equal(warnings.length, 1, 'one warning for a refusal that repeats');
      assert.match(String(warnings[0]?.err), /operator/);
    } finally {
      await s.done();
    }
  });
});
