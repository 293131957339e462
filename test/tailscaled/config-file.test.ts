// tailscaled from a config file, as Tailscale's containerboot runs it for the operator's ProxyGroups
// (tailscaled --config; on each change of the file containerboot calls POST /localapi/v0/reload-config,
// which puts the file's AdvertiseServices back). The real tailscaled 1.102.5: certshare sees config-file
// mode, says so once, and never edits the prefs; the owner's change of the file is the only change of
// AdvertiseServices seen, sampled every 100 ms, and certshare's stop withdraws nothing.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { BUILD_AND_START_TIMEOUT_MS, type RealTailscaled, useRealTailscaled } from '../harness/tailscale.ts';
import { get } from '../support/emulator.ts';
import { DAY, makePair } from '../support/certs.ts';
import { recordingLogger } from '../support/recording-logger.ts';
import { standaloneDaemon, useTempDir } from '../support/standalone.ts';
import { startTlsProxy } from '../support/tls-proxy.ts';
import { until } from '../support/wait.ts';

const every100ms = (l: () => void): (() => void) => {
  const timer = setInterval(l, 100);
  return () => clearInterval(timer);
};

async function advertised(ts: RealTailscaled): Promise<string> {
  const res = await ts.localApi('/localapi/v0/prefs');
  assert.equal(res.status, 200, res.body);
  return JSON.stringify((JSON.parse(res.body) as { AdvertiseServices: string[] | null }).AdvertiseServices ?? []);
}

describe("tailscaled from a config file (real tailscaled): the file's owner advertises", { timeout: BUILD_AND_START_TIMEOUT_MS }, () => {
  const realTailscaled = useRealTailscaled({ certDomainsAtStart: true });
  const dir = useTempDir();

  it('certshare leaves AdvertiseServices to the file: said once, no prefs edit, no flap through a change of the file and the stop', async () => {
    const ts = realTailscaled();
    const service = `svc:${ts.domain.split('.')[0]}`;
    await ts.writeConfigFile({ Version: 'alpha0', Locked: false, AdvertiseServices: [service] });
    assert.equal(await advertised(ts), JSON.stringify([service]), 'tailscaled took the file at its start');
    const editsBefore = ts.logs().tailscaled.filter((l) => l.includes('EditPrefs:')).length;

    // Sampled every 100 ms from the prefs: each distinct value in order.
    const seen: string[] = [];
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        const now = await advertised(ts);
        if (seen.at(-1) !== now) seen.push(now);
        await new Promise((r) => setTimeout(r, 100));
      }
    })();

    const proxy = await startTlsProxy(await makePair(ts.domain, Date.now() - 2 * DAY, DAY)); // expired: certshare would withdraw
    const log = recordingLogger();
    const flags = ['--domain', ts.domain, '--served-check', `127.0.0.1:${proxy.port}`, '--served-check-interval', '1s'];
    const daemon = await standaloneDaemon(ts, join(dir(), 'certs'), [...flags, '--advertise-services', service, '--advertise-failover', '200ms'], log.logger);
    const said = (): number => log.entries.filter((e) => e.code === 'CERTSHARE_ADVERTISE_CONFIG_FILE').length;
    try {
      await until('config-file mode said', () => said() === 1, [every100ms], 60_000);
      await until('the certificate held and the proxy checked', () => daemon.health.details().some((l) => l.includes('expired')), [every100ms], 120_000);
      // The owner changes the file; containerboot's watcher asks tailscaled to reload it.
      await ts.writeConfigFile({ Version: 'alpha0', Locked: false, AdvertiseServices: [service, 'svc:api'] });
      const reload = await get(ts.socket, '/localapi/v0/reload-config', { method: 'POST' });
      assert.equal(reload.status, 200, reload.body);
      assert.match(reload.body, /"Reloaded":true/);
      await until('the file’s list in the prefs', () => seen.at(-1) === JSON.stringify([service, 'svc:api']), [every100ms], 30_000);
    } finally {
      await daemon.stop();
      await proxy.close();
      await new Promise((r) => setTimeout(r, 500)); // a few samples after the stop
      sampling = false;
      await sampler;
    }
    assert.deepEqual(seen, [JSON.stringify([service]), JSON.stringify([service, 'svc:api'])], 'only the owner’s change, no flap');
    assert.equal(ts.logs().tailscaled.filter((l) => l.includes('EditPrefs:')).length, editsBefore, 'no prefs edit of certshare’s');
    assert.equal(said(), 1);
    for (const e of log.entries.filter((e) => e.code === 'CERTSHARE_ADVERTISE_CONFIG_FILE')) process.stderr.write(`certshare: ${JSON.stringify(e)}\n`);
  });
});
