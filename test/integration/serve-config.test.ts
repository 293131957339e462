import assert from 'node:assert/strict';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { DOMAIN, emulatorIn, standaloneDaemon, useTempDir } from '../support/standalone.ts';
import { until } from '../support/wait.ts';

describe('a ServeConfig that has never been read', () => {
  const dir = useTempDir();

  it('is not "zero domains, healthy": /healthz says 503 with the reason until the file has been read once', async () => {
    const file = join(dir(), 'serve.json'); // the directory exists, the file not yet (a ConfigMap key written later)
    const emulator = await emulatorIn(dir());
    const daemon = await standaloneDaemon(emulator, join(dir(), 'certs'), ['--serve-config', file]);
    try {
      const pending = await fetch(`${daemon.address}/healthz`);
      assert.equal(pending.status, 503);
      assert.match(await pending.text(), /serve config .*serve\.json not read yet: the file does not exist/);
      assert.deepEqual(daemon.manager.domains, []);

      await writeFile(file, JSON.stringify({ Web: { [`${DOMAIN}:443`]: {} } }));
      await until('the domain from the file healthy', () => daemon.manager.domains.length === 1 && daemon.health.evaluate(Date.now()).healthy, [
        (l) => daemon.health.onChange(l),
      ]);
      const ok = await fetch(`${daemon.address}/healthz`);
      assert.equal(ok.status, 200);
      assert.equal(await ok.text(), 'ok');
    } finally {
      await daemon.stop();
      await emulator.close();
    }
  });

  it('read once with no HTTPS host is zero domains, healthy', async () => {
    const file = join(dir(), 'empty.json');
    await writeFile(file, '{}');
    const emulator = await emulatorIn(dir(), { listen: join(dir(), 'empty.sock') });
    const daemon = await standaloneDaemon(emulator, join(dir(), 'certs-empty'), ['--serve-config', file]);
    try {
      const res = await fetch(`${daemon.address}/healthz`);
      assert.equal(res.status, 200);
      assert.equal(await res.text(), 'ok');
    } finally {
      await daemon.stop();
      await emulator.close();
    }
  });
});
