// A Service's domain granted only to its hosts, against the real tailscaled 1.102.5: tsenv's control
// (--service-hosts-only) lists `web.tailnet-test.ts.net` among the cert domains only while a node advertises
// `svc:web` (it asks the node over c2n, as the real control does). The node itself is `proxy-0`, whose own
// domain control always grants. certshare, managing the Service's domain, names the wait; with
// --advertise-bootstrap it advertises, pebble issues once, and it withdraws until the proxy serves it.
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { BUILD_AND_START_TIMEOUT_MS, TS_MAGICDNS, type RealTailscaled, useRealTailscaled } from '../harness/tailscale.ts';
import { DAY, makePair } from '../support/certs.ts';
import { recordingLogger } from '../support/recording-logger.ts';
import { standaloneDaemon, useTempDir } from '../support/standalone.ts';
import { startTlsProxy } from '../support/tls-proxy.ts';
import { every, until } from '../support/wait.ts';

const SERVICE = 'svc:web';
const SERVICE_DOMAIN = `web.${TS_MAGICDNS}`;

async function advertised(ts: RealTailscaled): Promise<string[]> {
  const res = await ts.localApi('/localapi/v0/prefs');
  assert.equal(res.status, 200, res.body);
  return (JSON.parse(res.body) as { AdvertiseServices: string[] | null }).AdvertiseServices ?? [];
}

async function certDomains(ts: RealTailscaled): Promise<string[]> {
  const res = await ts.localApi('/localapi/v0/status?peers=false');
  return (JSON.parse(res.body) as { CertDomains?: string[] | null }).CertDomains ?? [];
}

/** Polls an async fact (the LocalAPI) until it holds. */
async function eventually(what: string, fact: () => Promise<boolean>, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await fact())) {
    if (Date.now() > deadline) assert.fail(`timed out waiting for: ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

describe("a Service's domain granted only to its hosts (real tailscaled)", { timeout: BUILD_AND_START_TIMEOUT_MS }, () => {
  const realTailscaled = useRealTailscaled({ certDomainsAtStart: true, serviceHostsOnly: true, hostname: 'proxy-0' });
  const dir = useTempDir();

  it('names the wait, then with --advertise-bootstrap advertises, issues once, and advertises only while served', async () => {
    const ts = realTailscaled();
    assert.equal((await certDomains(ts)).includes(SERVICE_DOMAIN), false, 'not granted before the node hosts the Service');
    const proxy = await startTlsProxy(await makePair(SERVICE_DOMAIN, Date.now() - 2 * DAY, DAY)); // expired: nothing valid
    const log = recordingLogger();
    const flags = ['--domain', SERVICE_DOMAIN, '--served-check', `127.0.0.1:${proxy.port}`, '--served-check-interval', '1s'];
    const more = ['--advertise-services', SERVICE, '--advertise-failover', '200ms', '--shutdown-timeout', '10s'];

    // Without the bootstrap: the wait is named; nothing is ordered, nothing advertised.
    const waiting = await standaloneDaemon(ts, join(dir(), 'certs-1'), [...flags, ...more], log.logger);
    try {
      await until(
        'the wait named',
        () => /waiting for control to grant this node the domain of svc:web/.test(waiting.health.evaluate(Date.now()).reason),
        [every(200)],
        60_000,
      );
      assert.deepEqual(await advertised(ts), []);
      assert.equal((await ts.acmeStats()).orders, 0);
    } finally {
      await waiting.stop();
    }

    const certDir = join(dir(), 'certs-2');
    const daemon = await standaloneDaemon(ts, certDir, [...flags, ...more, '--advertise-bootstrap'], log.logger);
    try {
      await until('the certificate held', () => daemon.health.infoOf(SERVICE_DOMAIN) !== undefined, [every(200)], 120_000);
      await eventually('withdrawn after the issuance (the proxy does not serve it)', async () => !(await advertised(ts)).includes(SERVICE));
      await eventually('control took the domain back', async () => !(await certDomains(ts)).includes(SERVICE_DOMAIN));
      proxy.serve({
        certPem: await readFile(join(certDir, SERVICE_DOMAIN, 'tls.crt'), 'utf8'),
        keyPem: await readFile(join(certDir, SERVICE_DOMAIN, 'tls.key'), 'utf8'),
      });
      await eventually('advertised while served', async () => (await advertised(ts)).includes(SERVICE));
      await eventually('granted again', async () => (await certDomains(ts)).includes(SERVICE_DOMAIN));
      const stats = await ts.acmeStats();
      assert.deepEqual(stats.newOrders, { [SERVICE_DOMAIN]: 1 }, 'one order through the bootstrap and the grants after it');
    } finally {
      await daemon.stop();
      await proxy.close();
      // The bootstrap's story as the report quotes it: certshare's lines, then tailscaled's and control's.
      const ours = log.entries.filter((e) => e.component === 'service-domains' || e.component === 'advertise' || e.msg === 'tailscaled cert domains');
      for (const e of ours) process.stderr.write(`certshare: ${JSON.stringify(e)}\n`);
      const { tailscaled, tsenv } = ts.logs();
      for (const l of tsenv.filter((l) => l.includes('service domains granted'))) process.stderr.write(`tsenv: ${l}\n`);
      for (const l of tailscaled.filter((l) => /cert|acme|AdvertiseServices|vip/i.test(l)).slice(-40)) process.stderr.write(`tailscaled: ${l}\n`);
    }
  });
});
