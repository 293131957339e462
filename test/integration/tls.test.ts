// --tls: the daemon serves /healthz and /metrics over HTTPS from a pair it follows (here a directory, as a
// mounted Secret), and a renewed pair is served from the next handshake on, without restart and without
// dropping a kept-alive connection (it keeps the certificate it negotiated with).
import assert from 'node:assert/strict';
import { mkdir } from 'node:fs/promises';
import { Agent } from 'node:https';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { parseFlags } from '../../src/flags/flags.ts';
import { RUN_FLAGS, daemonConfigFrom } from '../../src/config/run-options.ts';
import { DAY, makePair } from '../support/certs.ts';
import { DOMAIN, emulatorIn, standaloneDaemon, useTempDir } from '../support/standalone.ts';
import { get, writePair } from '../support/tls.ts';
import { nextEvent, until } from '../support/wait.ts';

describe('--tls', () => {
  const dir = useTempDir();

  it('serves /healthz over TLS and a renewed pair on the next handshake, keeping open connections', async () => {
    const tlsDir = join(dir(), 'tls');
    await mkdir(tlsDir);
    const first = await writePair(tlsDir, await makePair('localhost', Date.now() - 60_000, DAY));
    const emulator = await emulatorIn(dir());
    const daemon = await standaloneDaemon(emulator, join(dir(), 'certs'), ['--tls', `dir:${tlsDir}`]);
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    try {
      assert.match(daemon.address, /^https:\/\//);
      // Healthy first: the daemon's own certificate may land between two requests, and a 503 turning 200
      // then says nothing about the TLS pair under test.
      await until('the daemon healthy', () => daemon.health.isHealthy(Date.now()), [(listener) => daemon.health.onChange(listener)], 30_000);
      const url = `${daemon.address}/healthz`;
      const before = await get(url, agent);
      assert.equal(before.status, 200);
      assert.equal(before.serial, first);

      const served = nextEvent<{ serial: string }>(daemon.events, 'tlsServed', () => true, 10_000);
      const second = await writePair(tlsDir, await makePair('localhost', Date.now() - 60_000, DAY));
      assert.equal((await served).serial, second);

      // The kept-alive connection goes on (same socket, its certificate) ...
      const kept = await get(url, agent);
      assert.equal(kept.reused, true, 'the open connection was reused, not dropped');
      assert.equal(kept.socket, before.socket);
      assert.equal(kept.serial, first);
      // ... and a new handshake gets the renewed pair.
      const fresh = await get(url, false);
      assert.equal(fresh.serial, second);
      assert.equal(kept.status, 200);
      assert.equal(fresh.status, 200);
    } finally {
      agent.destroy();
      await daemon.stop();
      await emulator.close();
    }
  });

  it('refuses a bad --tls at start: malformed, a Secret without --store kube, an unreadable or mismatched pair', async () => {
    const config = (flags: string[]) => daemonConfigFrom(parseFlags(RUN_FLAGS, ['--domain', DOMAIN, '--store', `dir:${dir()}`, ...flags], {}), {});
    assert.throws(() => config(['--tls', 'certs']), { code: 'CERTSHARE_BAD_FLAG', message: /--tls: must be dir:PATH or secret:NAME/ });
    assert.throws(() => config(['--tls', 'secret:Bad_Name']), { code: 'CERTSHARE_BAD_FLAG' });
    assert.throws(() => config(['--tls', 'secret:web-tls']), { code: 'CERTSHARE_BAD_FLAG', message: /--tls secret:NAME: needs --store kube/ });
    assert.deepEqual(config(['--tls', 'dir:/etc/tls']).tls, { kind: 'dir', path: '/etc/tls' });

    await mkdir(join(dir(), 'refused'));
    const emulator = await emulatorIn(join(dir(), 'refused'));
    try {
      await assert.rejects(standaloneDaemon(emulator, join(dir(), 'certs'), ['--tls', `dir:${join(dir(), 'missing')}`]), {
        code: 'CERTSHARE_BAD_CONFIG',
        message: /--tls dir:.*cannot read tls\.crt and tls\.key/,
      });
      const mismatched = join(dir(), 'mismatched');
      await mkdir(mismatched);
      const [a, b] = [await makePair('localhost', Date.now(), DAY), await makePair('localhost', Date.now(), DAY)];
      await writePair(mismatched, { certPem: a.certPem, keyPem: b.keyPem });
      await assert.rejects(standaloneDaemon(emulator, join(dir(), 'certs'), ['--tls', `dir:${mismatched}`]), { code: 'CERTSHARE_CERT_INVALID' });
    } finally {
      await emulator.close();
    }
  });
});
