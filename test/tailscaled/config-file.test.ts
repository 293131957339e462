// tailscaled from a config file, as Tailscale's containerboot runs it for the operator's ProxyGroups
// (tailscaled --config; on each change of the file containerboot calls POST /localapi/v0/reload-config,
// which puts the file's AdvertiseServices back). The real tailscaled 1.102.5, the file `"Locked": false` as the
// operator writes it: certshare never adds to the file's list; while its proxy serves an expired certificate it
// withdraws the Service within the check interval, again after the owner's change of the file (containerboot's
// reload puts it back: certshare sees it on the IPN bus and withdraws within milliseconds), and once the proxy
// serves the certificate held it reloads the file: the file's list again.
// Its stop edits nothing (containerboot withdraws on its own SIGTERM). Every change of the prefs is read from
// the IPN bus. Twice:
// tailscaled started with --config and the reload asked here; and the real containerboot 1.102.5 (the entrypoint
// of Tailscale's image) in config-file mode, as the operator runs a ProxyGroup Pod: TS_EXPERIMENTAL_VERSIONED_CONFIG_DIR
// names a directory laid out as the kubelet mounts a Secret (cap-<N>.hujson through the `..data` link);
// containerboot starts `tailscaled --config` from it and, when the file changes (the kubelet swaps `..data`),
// calls reload-config itself (watchTailscaledConfigChanges). A locked file (no `"Locked": false`) refuses every
// prefs edit: certshare says so once and the file's list stands.
import assert from 'node:assert/strict';
import { mkdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { BUILD_AND_START_TIMEOUT_MS, type RealTailscaled, useRealTailscaled } from '../harness/tailscale.ts';
import { watchPrefs } from '../support/advertising.ts';
import { get } from '../support/emulator.ts';
import { DAY, makePair } from '../support/certs.ts';
import { projectConfig } from '../support/projected-config.ts';
import { recordingLogger } from '../support/recording-logger.ts';
import { standaloneDaemon, useTempDir } from '../support/standalone.ts';
import { startTlsProxy } from '../support/tls-proxy.ts';
import { every, until } from '../support/wait.ts';

/** certshare's --served-check-interval here: the bound on a withdrawal after the owner's reload. */
const INTERVAL_MS = 1000;

async function advertised(ts: RealTailscaled): Promise<string> {
  const res = await ts.localApi('/localapi/v0/prefs');
  assert.equal(res.status, 200, res.body);
  return JSON.stringify((JSON.parse(res.body) as { AdvertiseServices: string[] | null }).AdvertiseServices ?? []);
}

/**
 * tailscaled runs from a file advertising `svc:<hostname>` (`"Locked": false`): certshare, told to advertise it, runs
 * beside a proxy serving an expired certificate while the owner changes the file (`change`, to the Service and
 * svc:api), then the proxy serves the certificate certshare holds, and certshare stops.
 */
async function withdrawsFromTheFile(ts: RealTailscaled, dir: string, change: (files: ReadonlyArray<string>) => Promise<void>): Promise<void> {
  const service = `svc:${ts.domain.split('.')[0]}`;
  const list = (...services: string[]) => JSON.stringify(services);
  assert.equal(await advertised(ts), list(service), 'tailscaled took the file at its start');
  const prefs = await watchPrefs(ts);
  const proxy = await startTlsProxy(await makePair(ts.domain, Date.now() - 2 * DAY, DAY)); // expired
  const log = recordingLogger();
  const certs = join(dir, 'certs');
  const flags = ['--domain', ts.domain, '--served-check', `127.0.0.1:${proxy.port}`, '--served-check-interval', `${INTERVAL_MS}ms`];
  const daemon = await standaloneDaemon(ts, certs, [...flags, '--advertise-services', service, '--advertise-failover', '200ms'], log.logger);
  const said = () => log.entries.filter((e) => e.code === 'CERTSHARE_ADVERTISE_CONFIG_FILE');
  let expiredAt: number | undefined; // the served check's first `expired`
  log.events.on('entry', (e: Record<string, unknown>) => {
    if (e.outcome === 'expired') expiredAt ??= Date.now();
  });
  let editsAtStop = 0;
  try {
    await until('config-file mode said', () => said().length === 1, [every(100)], 60_000);
    assert.match(String(said()[0]!.msg), new RegExp(`${service} left to the file's owner; certshare never adds them`));
    await until('withdrawn while the proxy serves an expired certificate', () => prefs.seen.at(-1)?.list === list(), [every(100)], 120_000);
    await change([service, 'svc:api']);
    await until('withdrawn again after the reload, svc:api kept', () => prefs.seen.at(-1)?.list === list('svc:api'), [every(100)], 30_000);
    await until('the certificate held', () => daemon.health.infoOf(ts.domain) !== undefined, [every(100)], 120_000);
    const domainDir = join(certs, ts.domain);
    proxy.serve({ certPem: await readFile(join(domainDir, 'tls.crt'), 'utf8'), keyPem: await readFile(join(domainDir, 'tls.key'), 'utf8') });
    await until('the file’s list put back', () => prefs.seen.at(-1)?.list === list(service, 'svc:api'), [every(100)], 30_000);
    editsAtStop = ts.logs().tailscaled.filter((l) => l.includes('EditPrefs:')).length;
  } catch (err) {
    process.stderr.write(`on failure: the prefs' changes ${JSON.stringify(prefs.seen)}\ncertshare's log ${JSON.stringify(log.entries.slice(0, 60))}\n`);
    throw err;
  } finally {
    await daemon.stop();
    await proxy.close();
    await new Promise((r) => setTimeout(r, 500)); // an observation window after the stop: no change may come
    await prefs.stop();
  }
  const lists = prefs.seen.map((s) => s.list);
  assert.deepEqual(lists, [list(service), list(), list(service, 'svc:api'), list('svc:api'), list(service, 'svc:api')], 'only removals, and the file');
  assert.ok(expiredAt !== undefined, 'the served check saw the expired certificate');
  const withdrawnMs = prefs.seen[1]!.at - expiredAt;
  assert.ok(withdrawnMs <= INTERVAL_MS, `withdrawn ${withdrawnMs} ms after the check saw the expired certificate: more than the check interval`);
  const backMs = prefs.seen[3]!.at - prefs.seen[2]!.at;
  assert.ok(backMs < 200, `the reload's advertisement lasted ${backMs} ms`);
  assert.equal(ts.logs().tailscaled.filter((l) => l.includes('EditPrefs:')).length, editsAtStop, 'no prefs edit at the stop');
  assert.equal(said().length, 1);
  process.stderr.write(
    `certshare under the config file: withdrawn ${withdrawnMs} ms after the check saw the expired certificate; after the owner's ` +
      `reload the Service was advertised again for ${backMs} ms (the prefs from the IPN bus)\n`,
  );
}

describe("tailscaled from a config file (real tailscaled): the file's owner advertises, certshare only withdraws", {
  timeout: BUILD_AND_START_TIMEOUT_MS,
}, () => {
  const realTailscaled = useRealTailscaled({ certDomainsAtStart: true });
  const dir = useTempDir();

  it('withdraws from the file’s list while the proxy serves an expired certificate, again after a reload, and reloads the file once served', async () => {
    const ts = realTailscaled();
    await ts.writeConfigFile({ Version: 'alpha0', Locked: false, AdvertiseServices: [`svc:${ts.domain.split('.')[0]}`] });
    await withdrawsFromTheFile(ts, dir(), async (services) => {
      // The owner changes the file; containerboot's watcher would ask tailscaled to reload it.
      await ts.writeConfigFile({ Version: 'alpha0', Locked: false, AdvertiseServices: services });
      const reload = await get(ts.socket, '/localapi/v0/reload-config', { method: 'POST' });
      assert.equal(reload.status, 200, reload.body);
      assert.match(reload.body, /"Reloaded":true/);
    });
  });
});

describe("the real containerboot with the operator's config file: the file's owner advertises, certshare only withdraws", {
  timeout: BUILD_AND_START_TIMEOUT_MS,
}, () => {
  const realTailscaled = useRealTailscaled({ certDomainsAtStart: true });
  const dir = useTempDir();

  it('withdraws from the file’s list; containerboot reloads the changed file, certshare withdraws again; the list put back once served', async () => {
    const ts = realTailscaled();
    const configDir = join(dir(), 'tsconfig');
    await mkdir(configDir);
    await projectConfig(configDir, 1, { Version: 'alpha0', Locked: false, AdvertiseServices: [`svc:${ts.domain.split('.')[0]}`] });
    await ts.startContainerboot(configDir);
    const reloads = (): number => ts.logs().tailscaled.filter((l) => l.includes('tailscaled config watch: config was reloaded')).length;
    await withdrawsFromTheFile(ts, dir(), async (services) => {
      // The operator changes the file; containerboot's watcher sees `..data` swapped and reloads tailscaled's config.
      await projectConfig(configDir, 2, { Version: 'alpha0', Locked: false, AdvertiseServices: services });
      await until('containerboot reloaded the file', () => reloads() === 1, [every(100)], 30_000);
    });
    for (const line of ts.logs().tailscaled.filter((l) => /config file|config watch|Starting tailscaled/.test(l)))
      process.stderr.write(`containerboot: ${line}\n`);
  });
});

describe('tailscaled from a locked config file (real tailscaled): every prefs edit refused', { timeout: BUILD_AND_START_TIMEOUT_MS }, () => {
  const realTailscaled = useRealTailscaled({ certDomainsAtStart: true });
  const dir = useTempDir();

  it('certshare says so once and leaves the file’s list, the proxy serving an expired certificate', async () => {
    const ts = realTailscaled();
    const service = `svc:${ts.domain.split('.')[0]}`;
    await ts.writeConfigFile({ Version: 'alpha0', AdvertiseServices: [service] });
    const proxy = await startTlsProxy(await makePair(ts.domain, Date.now() - 2 * DAY, DAY));
    const log = recordingLogger();
    const flags = ['--domain', ts.domain, '--served-check', `127.0.0.1:${proxy.port}`, '--served-check-interval', `${INTERVAL_MS}ms`];
    const daemon = await standaloneDaemon(ts, join(dir(), 'certs'), [...flags, '--advertise-services', service], log.logger);
    const locked = () => log.entries.filter((e) => /config file is locked/.test(String(e.msg)));
    try {
      await until('the locked file said', () => locked().length === 1, [every(100)], 120_000);
      await new Promise((r) => setTimeout(r, 2 * INTERVAL_MS)); // two check intervals: no retry, no second word
    } finally {
      await daemon.stop();
      await proxy.close();
    }
    assert.equal(await advertised(ts), JSON.stringify([service]), 'the file’s list stands');
    assert.equal(locked().length, 1, 'said once');
    process.stderr.write(`certshare: ${JSON.stringify(locked()[0])}\n`);
  });
});
