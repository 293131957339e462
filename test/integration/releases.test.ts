// The daemon against the emulator playing each tailscaled release certshare supports (the emulator follows
// tailscale.com's source per release: src/localapi/releases.ts). Requests are counted on the emulator.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import type { Daemon } from '../../src/daemon/daemon.ts';
import type { Emulator } from '../../src/emulator/server.ts';
import { DOMAIN, emulatorIn, standaloneDaemon, useTempDir } from '../support/standalone.ts';
import { nextEvent, until } from '../support/wait.ts';

const WATCH = '/localapi/v0/watch-ipn-bus';
const healthy = (daemon: Daemon): boolean => daemon.health.evaluate(Date.now()).healthy;
const healthSource = (daemon: Daemon) => (l: () => void) => daemon.health.onChange(l);
const knows = (daemon: Daemon, domain: string): Promise<void> =>
  until(`the daemon knows ${domain}`, () => daemon.watcher.current().has(domain), [(l) => daemon.watcher.onChange(l)]);

// Watch requests a first connection takes: releases without InitialStatus learn the version from the first
// answer and switch to the netmap mask once.
const RELEASES: Array<{ version: string; watches: number }> = [
  { version: '1.104.5', watches: 1 },
  { version: '1.102.5', watches: 1 },
  { version: '1.98.10', watches: 2 },
  { version: '1.96.4', watches: 2 },
];

describe('daemon against each tailscaled release (emulated)', () => {
  const dir = useTempDir();

  for (const { version, watches } of RELEASES) {
    it(`${version}: a domain present at start gets its certificate without any netmap change; a restart asks for nothing`, async () => {
      const certDir = join(dir(), `present-${version}`);
      const emulator = await emulatorIn(dir(), { listen: join(dir(), `p-${version}.sock`), tailscaledVersion: version });
      const changes: unknown[] = [];
      emulator.events.on('certDomains', (e) => changes.push(e));
      let daemon = await standaloneDaemon(emulator, certDir);
      try {
        await until('healthy', () => healthy(daemon), [healthSource(daemon)]);
        const stats = emulator.stats();
        assert.deepEqual(changes, [], 'the domain never changed');
        assert.equal(stats.issuances[DOMAIN], 1);
        assert.equal(stats.requests[WATCH], watches, `watch requests on ${version}`);
        assert.equal(stats.busRefusals, 0);
        assert.equal(daemon.watcher.tailscaledVersion, version);
        await daemon.stop();

        daemon = await standaloneDaemon(emulator, certDir);
        await knows(daemon, DOMAIN);
        await until('healthy after the restart', () => healthy(daemon), [healthSource(daemon)]);
        assert.deepEqual(emulator.stats().certRequests, { [DOMAIN]: 1 }, 'no CertPair call after the restart');
      } finally {
        await daemon.stop();
        await emulator.close();
      }
    });

    it(`${version}: a domain appearing later is issued once it appears, never before`, async () => {
      const certDir = join(dir(), `late-${version}`);
      const emulator = await emulatorIn(dir(), { listen: join(dir(), `l-${version}.sock`), tailscaledVersion: version, domainDelayMs: 500 });
      const early = nextEvent(emulator.events, 'certRequest', () => emulator.certDomains().length === 0, 700).then(
        () => true,
        () => false,
      );
      const daemon = await standaloneDaemon(emulator, certDir);
      try {
        await until('healthy', () => healthy(daemon), [healthSource(daemon)]);
        assert.equal(await early, false, 'no CertPair call before the domain appeared');
        assert.equal(emulator.stats().issuances[DOMAIN], 1);
        assert.equal(emulator.stats().busRefusals, 0);
      } finally {
        await daemon.stop();
        await emulator.close();
      }
    });
  }

  it('tailscaled upgraded from 1.98 to 1.104.5 under the daemon: one 400 on the obsolete bits, then the InitialStatus watch', async () => {
    const certDir = join(dir(), 'upgrade');
    const socket = join(dir(), 'upgrade.sock');
    const other = 'api.tailnet-test.ts.net';
    const old: Emulator = await emulatorIn(dir(), { listen: socket, tailscaledVersion: '1.98.10' });
    const daemon = await standaloneDaemon(old, certDir, ['--domain', DOMAIN, '--domain', other]);
    let current: Emulator = old;
    try {
      await until('first domain issued', () => daemon.health.infoOf(DOMAIN) !== undefined, [healthSource(daemon)]);
      assert.equal(daemon.watcher.plan().mask, 282, 'the netmap mask on 1.98');
      await old.close();
      current = await emulatorIn(dir(), { listen: socket, tailscaledVersion: '1.104.5', domains: [DOMAIN, other] });
      await until('both domains healthy', () => healthy(daemon), [healthSource(daemon)], 30_000);
      const stats = current.stats();
      assert.equal(stats.busRefusals, 1, 'the remembered netmap mask is refused once');
      assert.equal(stats.requests[WATCH], 2, 'then one InitialStatus watch: no loop');
      assert.equal(stats.issuances[other], 1);
      assert.equal(daemon.watcher.tailscaledVersion, '1.104.5');
      assert.equal(daemon.health.evaluate(Date.now()).reason, 'ok');
    } finally {
      await daemon.stop();
      await current.close();
    }
  });
});
