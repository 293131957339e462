import assert from 'node:assert/strict';
import { request } from 'node:http';
import { mkdir, readdir, writeFile } from 'node:fs/promises';
import { join, relative } from 'node:path';
import { describe, it } from 'node:test';
import { DOMAIN, emulatorIn, standaloneDaemon, useTempDir } from '../support/standalone.ts';
import { recordingLogger } from '../support/recording-logger.ts';
import { onEvent, until } from '../support/wait.ts';

/** Every path under `root`, relative to it. */
async function tree(root: string): Promise<string[]> {
  const entries = await readdir(root, { recursive: true });
  return entries.map((e) => relative(root, join(root, e))).sort();
}

/** POST to the emulator's control API over its unix socket. */
function control(socketPath: string, path: string, body: unknown): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = request({ socketPath, path: `/certshare-emulator/v0/${path}`, method: 'POST', headers: { 'content-type': 'application/json' } }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    });
    req.on('error', reject);
    req.end(JSON.stringify(body));
  });
}

const HOSTILE = ['../../x', '..', '../escape.ts.net', 'a/b', '.hidden.ts.net', `${'a'.repeat(64)}.ts.net`, 'x..y.ts.net', 'web.ts.net/../../z'];

describe('hostile domains from a ServeConfig and from tailscaled, against the directory store', () => {
  const dir = useTempDir();

  it('refuses each with CERTSHARE_BAD_DOMAIN in the log, touches nothing outside the store, and the valid domain carries on', async () => {
    // The store sits two levels down so that `../..` from it still lands inside the temporary directory.
    const store = join(dir(), 'a', 'b', 'store');
    const confDir = join(dir(), 'conf');
    await mkdir(confDir, { recursive: true });
    await mkdir(join(store, '..'), { recursive: true });
    const serveConfig = join(confDir, 'serve.json');
    const web = Object.fromEntries([DOMAIN, ...HOSTILE].map((h) => [`${h}:443`, { Handlers: { '/': { Proxy: 'http://127.0.0.1:8080' } } }]));
    await writeFile(serveConfig, JSON.stringify({ Web: web, TCP: { '5432': { TerminateTLS: '../../tcp' } } }));
    const emulator = await emulatorIn(dir());
    // tailscaled's cert domains turn hostile too, set through the emulator's control API.
    assert.equal(await control(emulator.address, 'domains', { add: HOSTILE }), 200);
    const before = await tree(dir());
    const { logger, entries, events } = recordingLogger();
    const daemon = await standaloneDaemon(emulator, store, ['--serve-config', serveConfig], logger);
    try {
      await until('the valid domain healthy', () => daemon.health.evaluate(Date.now()).healthy, [(l) => daemon.health.onChange(l)]);
      const refusedName = (name: string) => entries.some((e) => e.code === 'CERTSHARE_BAD_DOMAIN' && (e.host === name || e.name === name));
      await until('every hostile name refused in the log', () => [...HOSTILE, '../../tcp'].every(refusedName), [onEvent(events, 'entry')]);
      for (const name of HOSTILE)
        assert.ok(
          entries.some((e) => e.code === 'CERTSHARE_BAD_DOMAIN' && e.name === name && e.level === 'error'),
          `cert domain ${name} refused`,
        );
      assert.deepEqual(daemon.manager.domains, [DOMAIN]);
      assert.deepEqual([...daemon.watcher.current()], [DOMAIN]);
      assert.deepEqual(Object.keys(emulator.stats().certRequests), [DOMAIN], 'CertPair asked for the valid domain only');
      assert.equal(emulator.stats().issuances[DOMAIN], 1);
      assert.equal((await fetch(`${daemon.address}/healthz`)).status, 200);
      const added = (await tree(dir())).filter((p) => !before.includes(p));
      const outside = added.filter((p) => !p.startsWith(`${relative(dir(), store)}/`) && p !== relative(dir(), store));
      assert.deepEqual(outside, [], 'nothing written outside the store');
      assert.ok(added.includes(join(relative(dir(), store), DOMAIN, 'tls.crt')));
    } finally {
      await daemon.stop();
      await emulator.close();
    }
  });
});
