// Renew now standalone (issue 34): `certshare renew <domain> --store dir:PATH` writes .state/<domain>.renew;
// the daemon's watch of .state/ wakes the domain's loop, which serves the request once and records the
// answer in .state/<domain>.json. Two requests while one is pending are one; a restart issues nothing more.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { X509Certificate } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, it } from 'node:test';
import { DOMAIN, emulatorIn, standaloneDaemon, useTempDir } from '../support/standalone.ts';
import { nextEvent, onEvent, until } from '../support/wait.ts';

const MAIN = fileURLToPath(new URL('../../src/cli/main.ts', import.meta.url));
const renew = (certDir: string) =>
  spawnSync(process.execPath, [MAIN, 'renew', DOMAIN, '--store', `dir:${certDir}`], { encoding: 'utf8', env: { PATH: process.env.PATH }, timeout: 30_000 });
const serialOnDisk = async (certDir: string): Promise<string> => new X509Certificate(await readFile(join(certDir, DOMAIN, 'tls.crt'))).serialNumber;

describe('renew now with the standalone directory store', () => {
  const dir = useTempDir();

  it('serves one request once, keeps a second one asked while it is pending as the same, and a restart issues nothing', async () => {
    const certDir = join(dir(), 'certs');
    const emulator = await emulatorIn(dir());
    let daemon = await standaloneDaemon(emulator, certDir);
    try {
      await until('the first certificate', () => daemon.manager.loop(DOMAIN)?.current !== undefined, [onEvent(daemon.events, 'planned')]);
      const first = await serialOnDisk(certDir);
      // Past the minimum interval (200 ms) and the second the first certificate was stamped in (the
      // emulator's validity is to the second): a wait for a known instant.
      const state = JSON.parse(await readFile(join(certDir, '.state', `${DOMAIN}.json`), 'utf8')) as { obtained: { at: string } };
      await new Promise((resolve) => setTimeout(resolve, Math.max(0, Date.parse(state.obtained.at) + 1000 - Date.now())));

      emulator.injectFault('cert:slow:delay=2s');
      const served = nextEvent<{ id: string; result: string; serial?: string }>(daemon.events, 'renewRequest', () => true, 20_000);
      const asked = renew(certDir);
      assert.equal(asked.status, 0, asked.stderr);
      const id = /renew request (\S+) written on the store directory/.exec(asked.stdout)?.[1];
      assert.ok(id, asked.stdout);
      // The writer's call takes 2 s: the second request is asked while the first is pending.
      const again = renew(certDir);
      assert.equal(again.status, 0, again.stderr);
      assert.match(again.stdout, /is already pending/);

      const answer = await served;
      assert.deepEqual([answer.id, answer.result], [id, 'issued']);
      assert.equal(emulator.stats().issuances[DOMAIN], 2, 'one order for the request');
      const renewed = await serialOnDisk(certDir);
      assert.notEqual(renewed, first);
      assert.equal(answer.serial, renewed);
      const recorded = JSON.parse(await readFile(join(certDir, '.state', `${DOMAIN}.json`), 'utf8')) as { renew: { id: string; outcome: string } };
      assert.deepEqual(recorded.renew, { id, outcome: `issued ${renewed}` });

      await daemon.stop();
      const calls = emulator.stats().certRequests[DOMAIN];
      daemon = await standaloneDaemon(emulator, certDir);
      await until('the restarted daemon holds the certificate', () => daemon.manager.loop(DOMAIN)?.current !== undefined, [onEvent(daemon.events, 'planned')]);
      assert.equal(emulator.stats().certRequests[DOMAIN], calls, 'the restart asked tailscaled again');
    } finally {
      await daemon.stop();
      await emulator.close();
    }
  });

  it('a request the young certificate cannot answer yet (tailscaled returns it again) is tried after the backoff, not in a loop', async () => {
    const certDir = join(dir(), 'young');
    const emulator = await emulatorIn(dir());
    const daemon = await standaloneDaemon(emulator, certDir);
    try {
      await until('the first certificate', () => daemon.manager.loop(DOMAIN)?.current !== undefined, [onEvent(daemon.events, 'planned')]);
      // Past the minimum interval (200 ms), inside the first second of the certificate: a wait for a known instant.
      const state = JSON.parse(await readFile(join(certDir, '.state', `${DOMAIN}.json`), 'utf8')) as { obtained: { at: string } };
      await new Promise((resolve) => setTimeout(resolve, Math.max(0, Date.parse(state.obtained.at) + 300 - Date.now())));
      const callsBefore = emulator.stats().certRequests[DOMAIN]!;
      const served = nextEvent<{ result: string }>(daemon.events, 'renewRequest', () => true, 20_000);
      assert.equal(renew(certDir).status, 0);
      assert.equal((await served).result, 'issued');
      assert.equal(emulator.stats().issuances[DOMAIN], 2, 'one order for the request');
      const calls = emulator.stats().certRequests[DOMAIN]! - callsBefore;
      // The backoff from 200 ms doubling: a handful of calls until the certificate is old enough.
      assert.ok(calls <= 5, `${calls} CertPair calls for one request`);
    } finally {
      await daemon.stop();
      await emulator.close();
    }
  });
});
