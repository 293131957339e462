// tailscaled from a config file, as Tailscale's containerboot runs it for the operator's ProxyGroups
// (tailscaled --config; on each change of the file containerboot calls POST /localapi/v0/reload-config,
// which puts the file's AdvertiseServices back). The real tailscaled 1.102.5: certshare sees config-file
// mode, says so once, and never edits the prefs; the owner's change of the file is the only change of
// AdvertiseServices seen, sampled every 100 ms, and certshare's stop withdraws nothing. Twice: tailscaled
// started with --config and the reload asked here; and the real containerboot 1.102.5 (the entrypoint of
// Tailscale's image) in config-file mode, as the operator runs a ProxyGroup Pod: TS_EXPERIMENTAL_VERSIONED_CONFIG_DIR
// names a directory laid out as the kubelet mounts a Secret (cap-<N>.hujson through the `..data` link);
// containerboot starts `tailscaled --config` from it and, when the file changes (the kubelet swaps `..data`),
// calls reload-config itself (watchTailscaledConfigChanges).
import assert from 'node:assert/strict';
import { mkdir, rename, symlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { BUILD_AND_START_TIMEOUT_MS, type RealTailscaled, useRealTailscaled } from '../harness/tailscale.ts';
import { get } from '../support/emulator.ts';
import { DAY, makePair } from '../support/certs.ts';
import { recordingLogger } from '../support/recording-logger.ts';
import { standaloneDaemon, useTempDir } from '../support/standalone.ts';
import { startTlsProxy } from '../support/tls-proxy.ts';
import { until } from '../support/wait.ts';

/** The file name containerboot 1.102.5 looks for: cap-<version> up to tailscaled's capability version (142). */
const CONFIG_FILE = 'cap-142.hujson';

const every100ms = (l: () => void): (() => void) => {
  const timer = setInterval(l, 100);
  return () => clearInterval(timer);
};

async function advertised(ts: RealTailscaled): Promise<string> {
  const res = await ts.localApi('/localapi/v0/prefs');
  assert.equal(res.status, 200, res.body);
  return JSON.stringify((JSON.parse(res.body) as { AdvertiseServices: string[] | null }).AdvertiseServices ?? []);
}

/**
 * tailscaled runs from a file advertising `svc:<hostname>`: certshare, told to advertise it, runs while the owner
 * changes the file (`change`, to the Service and svc:api) and stops. Asserts: config-file mode said once, the owner's
 * change the only one in the prefs sampled every 100 ms, no prefs edit of certshare's.
 */
async function ownerAdvertisesThroughout(ts: RealTailscaled, dir: string, change: (files: ReadonlyArray<string>) => Promise<void>): Promise<void> {
  const service = `svc:${ts.domain.split('.')[0]}`;
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
  const daemon = await standaloneDaemon(ts, join(dir, 'certs'), [...flags, '--advertise-services', service, '--advertise-failover', '200ms'], log.logger);
  const said = (): number => log.entries.filter((e) => e.code === 'CERTSHARE_ADVERTISE_CONFIG_FILE').length;
  try {
    await until('config-file mode said', () => said() === 1, [every100ms], 60_000);
    await until('the certificate held and the proxy checked', () => daemon.health.details().some((l) => l.includes('expired')), [every100ms], 120_000);
    await change([service, 'svc:api']);
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
}

/**
 * The operator's config as the kubelet projects a Secret: the content in a directory of its own, `..data` linking
 * to it, the file a link through `..data`. A new version is a new directory and `..data` renamed over (atomic).
 */
async function projectConfig(dir: string, version: number, config: Record<string, unknown>): Promise<void> {
  const data = join(dir, `..v${version}`);
  await mkdir(data, { recursive: true });
  await writeFile(join(data, CONFIG_FILE), JSON.stringify(config));
  await symlink(`..v${version}`, join(dir, '..data_tmp'));
  await rename(join(dir, '..data_tmp'), join(dir, '..data'));
  if (version === 1) await symlink(join('..data', CONFIG_FILE), join(dir, CONFIG_FILE));
}

describe("tailscaled from a config file (real tailscaled): the file's owner advertises", { timeout: BUILD_AND_START_TIMEOUT_MS }, () => {
  const realTailscaled = useRealTailscaled({ certDomainsAtStart: true });
  const dir = useTempDir();

  it('certshare leaves AdvertiseServices to the file: said once, no prefs edit, no flap through a change of the file and the stop', async () => {
    const ts = realTailscaled();
    await ts.writeConfigFile({ Version: 'alpha0', Locked: false, AdvertiseServices: [`svc:${ts.domain.split('.')[0]}`] });
    await ownerAdvertisesThroughout(ts, dir(), async (services) => {
      // The owner changes the file; containerboot's watcher would ask tailscaled to reload it.
      await ts.writeConfigFile({ Version: 'alpha0', Locked: false, AdvertiseServices: services });
      const reload = await get(ts.socket, '/localapi/v0/reload-config', { method: 'POST' });
      assert.equal(reload.status, 200, reload.body);
      assert.match(reload.body, /"Reloaded":true/);
    });
  });
});

describe("the real containerboot with the operator's config file: the file's owner advertises", { timeout: BUILD_AND_START_TIMEOUT_MS }, () => {
  const realTailscaled = useRealTailscaled({ certDomainsAtStart: true });
  const dir = useTempDir();

  it('certshare says config-file mode once and edits nothing; containerboot reloads the changed file; no flap', async () => {
    const ts = realTailscaled();
    const configDir = join(dir(), 'tsconfig');
    await mkdir(configDir);
    await projectConfig(configDir, 1, { Version: 'alpha0', Locked: false, AdvertiseServices: [`svc:${ts.domain.split('.')[0]}`] });
    await ts.startContainerboot(configDir);
    const reloads = (): number => ts.logs().tailscaled.filter((l) => l.includes('tailscaled config watch: config was reloaded')).length;
    await ownerAdvertisesThroughout(ts, dir(), async (services) => {
      // The operator changes the file; containerboot's watcher sees `..data` swapped and reloads tailscaled's config.
      await projectConfig(configDir, 2, { Version: 'alpha0', Locked: false, AdvertiseServices: services });
      await until('containerboot reloaded the file', () => reloads() === 1, [every100ms], 30_000);
    });
    for (const line of ts.logs().tailscaled.filter((l) => /config file|config watch|Starting tailscaled/.test(l)))
      process.stderr.write(`containerboot: ${line}\n`);
  });
});
