// Control grants a Tailscale Service's domain only to the Service's hosts (Tailscale issue #20716): the
// emulator's serviceHosts rule makes `web.tailnet-test.ts.net` a cert domain only while the prefs advertise
// `svc:web`. certshare names that wait, and with --advertise-bootstrap advertises to obtain the domain, issues
// once, and from then on advertises only while the proxy serves the certificate.
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import type { Daemon } from '../../src/daemon/daemon.ts';
import type { Emulator } from '../../src/emulator/server.ts';
import { createCertificateAuthority } from '../../src/pki/ca.ts';
import { DAY, makePair } from '../support/certs.ts';
import { recordingLogger } from '../support/recording-logger.ts';
import { DOMAIN, emulatorIn, standaloneDaemon, tempDir } from '../support/standalone.ts';
import { startNotTlsProxy, startTlsProxy, type TestProxy } from '../support/tls-proxy.ts';
import { every, onEvent, until } from '../support/wait.ts';

const SERVICE = 'svc:web';

/** The pair certshare wrote for DOMAIN, for the proxy to serve. */
async function heldPair(certDir: string): Promise<{ certPem: string; keyPem: string }> {
  return {
    certPem: await readFile(join(certDir, DOMAIN, 'tls.crt'), 'utf8'),
    keyPem: await readFile(join(certDir, DOMAIN, 'tls.key'), 'utf8'),
  };
}

interface Setup {
  emulator: Emulator;
  daemon: Daemon;
  certDir: string;
  log: ReturnType<typeof recordingLogger>;
  /** The cert domains the emulator listed, in order of change. */
  grants: string[][];
  done(): Promise<void>;
}

async function setup(proxy: TestProxy, flags: string[], tags: string[] = []): Promise<Setup> {
  const dir = await tempDir();
  const emulator = await emulatorIn(dir.path, { serviceHosts: { domains: [DOMAIN], tags } });
  const grants: string[][] = [];
  emulator.events.on('certDomains', ({ domains }: { domains: string[] }) => grants.push(domains));
  const certDir = join(dir.path, 'certs');
  const log = recordingLogger();
  const daemon = await standaloneDaemon(
    emulator,
    certDir,
    [
      '--served-check',
      `127.0.0.1:${proxy.port}`,
      '--served-check-interval',
      '1s',
      '--served-check-timeout',
      '500ms',
      '--advertise-services',
      SERVICE,
      '--advertise-failover',
      '100ms',
      ...flags,
    ],
    log.logger,
  );
  const done = async (): Promise<void> => {
    for (const close of [() => daemon.stop(), () => proxy.close(), () => emulator.close(), () => dir.remove()]) await close();
  };
  return { emulator, daemon, certDir, log, grants, done };
}

const advertised = (s: Setup): boolean => s.emulator.prefs.advertiseServices.includes(SERVICE);
const logged = (s: Setup, text: string): boolean => s.log.entries.some((e) => e.msg?.includes(text));

describe("a Service's domain granted only to its hosts (emulator)", () => {
  it('names the wait within a minute: /healthz, a log line with its code; nothing issued, nothing advertised', async () => {
    const proxy = await startNotTlsProxy('http');
    const s = await setup(proxy, []);
    try {
      await until('the wait named', () => /waiting for control to grant this node the domain of svc:web/.test(s.daemon.health.evaluate(Date.now()).reason), [
        every(50),
      ]);
      const reason = s.daemon.health.evaluate(Date.now()).reason;
      assert.match(reason, /must host the Service: approve it as a host with matching tags/);
      assert.ok(s.log.entries.some((e) => e.code === 'CERTSHARE_SERVICE_DOMAIN_NOT_GRANTED' && e.level === 'warn'));
      assert.equal(advertised(s), false, 'bootstrap is off by default');
      assert.equal(s.emulator.stats().issuancesTotal, 0);
    } finally {
      await s.done();
    }
  });

  it('--advertise-bootstrap: advertises to obtain the domain, issues once, then advertises only while served', async () => {
    const proxy = await startTlsProxy(await makePair(DOMAIN, Date.now() - 2 * DAY, DAY)); // expired: nothing valid served
    const s = await setup(proxy, ['--advertise-bootstrap']);
    try {
      await until('the certificate held', () => s.emulator.stats().issuancesTotal === 1 && s.daemon.health.infoOf(DOMAIN) !== undefined, [
        onEvent(s.emulator.events, 'issued'),
        every(50),
      ]);
      assert.deepEqual(s.grants[0], [DOMAIN], 'control granted the domain once the Service was advertised');
      assert.ok(logged(s, 'advertising to obtain it costs no client anything'));
      await until('withdrawn: the proxy does not serve the certificate held', () => !advertised(s), [every(50)]);
      await until('control took the domain back', () => !s.emulator.certDomains().includes(DOMAIN), [every(50)]);

      proxy.serve(await heldPair(s.certDir));
      await until('advertised while served', () => advertised(s), [every(50)]);
      await until('the domain granted again', () => s.emulator.certDomains().includes(DOMAIN), [every(50)]);
      assert.equal(s.daemon.health.evaluate(Date.now()).healthy, true);
      assert.equal(s.emulator.stats().issuancesTotal, 1, 'one issuance through the bootstrap and the grants that followed');
      assert.deepEqual(
        s.grants.map((g) => g.includes(DOMAIN)),
        [true, false, true],
      );
    } finally {
      await s.done();
    }
  });

  it('--advertise-bootstrap stays off while the proxy serves a valid certificate certshare never held (another cluster’s copy)', async () => {
    const otherCa = await createCertificateAuthority({ name: 'another cluster', now: Date.now() });
    const proxy = await startTlsProxy(await makePair(DOMAIN, Date.now() - DAY, 30 * DAY, otherCa));
    const s = await setup(proxy, ['--advertise-bootstrap']);
    try {
      await until('the proxy asked', () => logged(s, 'the proxy serves a valid certificate for the Service domain: no bootstrap'), [every(50)]);
      await until('the wait named', () => /waiting for control to grant/.test(s.daemon.health.evaluate(Date.now()).reason), [every(50)]);
      assert.equal(advertised(s), false);
      assert.equal(s.emulator.stats().issuancesTotal, 0);
    } finally {
      await s.done();
    }
  });

  it('with tags: control grants the domain only while the node also advertises a matching tag', async () => {
    const proxy = await startNotTlsProxy('http');
    const s = await setup(proxy, ['--advertise-bootstrap'], ['tag:web']);
    try {
      await until('advertised to obtain the domain', () => advertised(s), [every(50)]);
      assert.equal(s.emulator.certDomains().includes(DOMAIN), false, 'no matching tag: not granted');
      s.emulator.prefs.setAdvertiseTags(['tag:web']);
      await until('issued once granted', () => s.emulator.stats().issuancesTotal === 1, [onEvent(s.emulator.events, 'issued'), every(50)]);
    } finally {
      await s.done();
    }
  });
});

describe('tailscaled from a config file (emulator): the file owns AdvertiseServices', () => {
  /** certshare beside a tailscaled run from a file listing `svc:web` and svc:x, its proxy serving a foreign certificate. */
  async function fromFile(file: { Locked?: boolean }) {
    const otherCa = await createCertificateAuthority({ name: 'not the tailnet CA', now: Date.now() });
    const proxy = await startTlsProxy(await makePair(DOMAIN, Date.now() - DAY, 30 * DAY, otherCa));
    const dir = await tempDir();
    const emulator = await emulatorIn(dir.path);
    emulator.prefs.configFile = { ...file, AdvertiseServices: [SERVICE, 'svc:x'] };
    emulator.prefs.reloadConfig(); // tailscaled --config at its start
    const log = recordingLogger();
    const flags = ['--served-check', `127.0.0.1:${proxy.port}`, '--served-check-interval', '1s', '--advertise-services', SERVICE];
    const certDir = join(dir.path, 'certs');
    const daemon = await standaloneDaemon(emulator, certDir, [...flags, '--advertise-failover', '100ms'], log.logger);
    const said = () => log.entries.filter((e) => e.code === 'CERTSHARE_ADVERTISE_CONFIG_FILE');
    const done = async () => {
      for (const close of [() => daemon.stop(), () => proxy.close(), () => emulator.close(), () => dir.remove()]) await close();
    };
    return { proxy, emulator, daemon, certDir, log, said, done };
  }

  it(
    '"Locked": false: withdraws the Service from the file’s list while the proxy serves a foreign certificate, ' +
      'again after the owner’s reload, and reloads the file once it serves the held one',
    async () => {
      const s = await fromFile({ Locked: false });
      const prefs = s.emulator.prefs;
      // Every value the prefs' list takes, in order (a reload to the same list is no change): an edit of certshare's
      // may only remove from the file's list.
      const seen: string[][] = [prefs.advertiseServices];
      prefs.onEdit = () => {
        if (seen.at(-1)!.join() !== prefs.advertiseServices.join()) seen.push(prefs.advertiseServices);
      };
      try {
        await until('config-file mode said', () => s.said().length === 1, [every(50)]);
        assert.match(String(s.said()[0]!.msg), /svc:web left to the file's owner; certshare never adds them, withdraws them only while/);
        await until('withdrawn: the proxy serves a certificate certshare never held', () => prefs.advertiseServices.join() === 'svc:x', [every(50)]);
        // The owner changes the file; containerboot reloads it: svc:web is back, until certshare's next read.
        prefs.configFile = { Locked: false, AdvertiseServices: [SERVICE, 'svc:x', 'svc:api'] };
        prefs.reloadConfig();
        await until('withdrawn again after the reload', () => prefs.advertiseServices.join() === 'svc:x,svc:api', [every(50)]);
        await until('the certificate held', () => s.daemon.health.infoOf(DOMAIN) !== undefined, [every(50)]);
        s.proxy.serve(await heldPair(s.certDir));
        await until('the file’s list put back', () => prefs.advertiseServices.join() === 'svc:web,svc:x,svc:api', [every(50)]);
        const edits = prefs.edits;
        await s.daemon.stop();
        assert.equal(prefs.edits, edits, 'no withdrawal on stop: the file’s owner (containerboot) withdraws on its own');
        assert.deepEqual(seen, [[SERVICE, 'svc:x'], ['svc:x'], [SERVICE, 'svc:x', 'svc:api'], ['svc:x', 'svc:api'], [SERVICE, 'svc:x', 'svc:api']]);
        assert.equal(s.said().length, 1, 'said once');
      } finally {
        await s.done();
      }
    },
  );

  it('locked (tailscaled refuses every prefs edit): leaves the file’s list as it is, says why once, through a change of the file and the stop', async () => {
    const s = await fromFile({});
    const prefs = s.emulator.prefs;
    try {
      await until('config-file mode said', () => s.said().length === 1, [every(50)]);
      await until('the locked file said', () => s.log.entries.some((e) => /config file is locked/.test(String(e.msg))), [every(50)]);
      prefs.configFile = { AdvertiseServices: [SERVICE, 'svc:api'] };
      prefs.reloadConfig();
      await until('the proxy checked: a certificate certshare never held', () => s.daemon.health.details().some((l) => l.includes('never held')), [every(50)]);
      await s.daemon.stop();
      assert.equal(prefs.edits, 0, 'no prefs edit');
      assert.deepEqual(prefs.advertiseServices, [SERVICE, 'svc:api'], 'what the file says');
      assert.equal(s.log.entries.filter((e) => /config file is locked/.test(String(e.msg))).length, 1, 'said once');
    } finally {
      await s.done();
    }
  });

  it('told by the injector (--advertise-left-to-file, its uid cannot ask tailscaled): says so once at start, never advertises', async () => {
    const proxy = await startNotTlsProxy('http');
    const dir = await tempDir();
    const emulator = await emulatorIn(dir.path);
    const edits = emulator.prefs.edits;
    const log = recordingLogger();
    const flags = ['--served-check', `127.0.0.1:${proxy.port}`, '--served-check-interval', '1s', '--advertise-left-to-file', SERVICE];
    const daemon = await standaloneDaemon(emulator, join(dir.path, 'certs'), flags, log.logger);
    const said = () => log.entries.filter((e) => e.code === 'CERTSHARE_ADVERTISE_CONFIG_FILE');
    try {
      await until('said at start', () => said().length === 1, [every(50)]);
      assert.match(String(said()[0]!.msg), new RegExp(`${SERVICE} left to the file's owner`));
      await until('a certificate held', () => emulator.stats().issuancesTotal === 1, [onEvent(emulator.events, 'issued'), every(50)]);
      await daemon.stop();
      assert.equal(emulator.prefs.edits, edits, 'no prefs edit');
      assert.equal(said().length, 1, 'said once');
    } finally {
      await daemon.stop();
      await proxy.close();
      await emulator.close();
      await dir.remove();
    }
  });
});
