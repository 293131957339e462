// The Tailscale Service advertisement against the real tailscaled (test/harness/tailscale.ts): certshare
// edits the node's AdvertiseServices through PATCH /localapi/v0/prefs only once it holds the certificate
// and the proxy (a loopback TLS listener here) serves it; it withdraws the Service when stopping, before
// stop() returns; every other pref, and a Service it does not manage, are left as they were.
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { createCertificateAuthority } from '../../src/pki/ca.ts';
import { get } from '../support/emulator.ts';
import { BUILD_AND_START_TIMEOUT_MS, useRealTailscaled, type RealTailscaled, servicesControlSees } from '../harness/tailscale.ts';
import { DAY, makePair } from '../support/certs.ts';
import { standaloneDaemon, useTempDir } from '../support/standalone.ts';
import { startTlsProxy } from '../support/tls-proxy.ts';
import { until } from '../support/wait.ts';

const every100ms = (l: () => void): (() => void) => {
  const timer = setInterval(l, 100);
  return () => clearInterval(timer);
};

async function prefs(ts: RealTailscaled): Promise<Record<string, unknown>> {
  const res = await ts.localApi('/localapi/v0/prefs');
  assert.equal(res.status, 200, res.body);
  return JSON.parse(res.body) as Record<string, unknown>;
}

const services = (p: Record<string, unknown>): string[] => (p.AdvertiseServices as string[] | null) ?? [];

/** The prefs but AdvertiseServices: what certshare must never change. */
function others(p: Record<string, unknown>): Record<string, unknown> {
  const { AdvertiseServices: _, ...rest } = p;
  return rest;
}

/**
 * Control's view: the node's Hostinfo carries the hash of the Services it advertises (tailscaled sends it on
 * its next map request), and the list control fetches from the node (c2n) names them as active.
 */
async function controlSees(ts: RealTailscaled, active: string[]): Promise<void> {
  const deadline = Date.now() + 30_000;
  let last = '';
  for (;;) {
    const [node] = await ts.vipServices();
    const seen = node && servicesControlSees(node);
    last = JSON.stringify(node);
    if (seen && JSON.stringify(seen) === JSON.stringify([...active].sort())) return;
    if (Date.now() > deadline) assert.fail(`control sees ${last}, not the Services ${active.join(', ')}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

describe('Tailscale Service advertisement (real tailscaled)', { timeout: BUILD_AND_START_TIMEOUT_MS }, () => {
  const realTailscaled = useRealTailscaled({ certDomainsAtStart: true });
  const dir = useTempDir();

  it('advertises after the certificate is held and served, withdraws before stop returns, leaves the other prefs alone', async () => {
    const ts = realTailscaled();
    const service = `svc:${ts.domain.split('.')[0]}`;
    // Someone else's Service, set as root through the same LocalAPI.
    const set = await get(ts.socket, '/localapi/v0/prefs', {
      method: 'PATCH',
      body: JSON.stringify({ AdvertiseServicesSet: true, AdvertiseServices: ['svc:other'] }),
    });
    assert.equal(set.status, 200, set.body);
    const before = await prefs(ts);

    const foreignCa = await createCertificateAuthority({ name: 'not pebble', now: Date.now() });
    const proxy = await startTlsProxy(await makePair(ts.domain, Date.now() - DAY, 30 * DAY, foreignCa));
    const certDir = join(dir(), 'certs');
    const daemon = await standaloneDaemon(ts, certDir, [
      '--domain',
      ts.domain,
      '--served-check',
      `127.0.0.1:${proxy.port}`,
      '--served-check-interval',
      '1s',
      '--advertise-services',
      service,
      '--advertise-failover',
      '200ms',
      '--shutdown-timeout',
      '10s',
    ]);
    try {
      await until('the certificate held and the proxy checked', () => daemon.health.details().some((l) => l.includes('never held')), [every100ms], 120_000);
      assert.deepEqual(services(await prefs(ts)), ['svc:other'], 'not advertised while the proxy serves another certificate');

      proxy.serve({
        certPem: await readFile(join(certDir, ts.domain, 'tls.crt'), 'utf8'),
        keyPem: await readFile(join(certDir, ts.domain, 'tls.key'), 'utf8'),
      });
      const deadline = Date.now() + 30_000;
      let now = await prefs(ts);
      while (!services(now).includes(service) && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 100));
        now = await prefs(ts);
      }
      assert.deepEqual(services(now), ['svc:other', service], "tailscaled's prefs advertise the Service, the other one kept");
      assert.deepEqual(others(now), others(before), 'no other pref changed');
      await controlSees(ts, [service, 'svc:other']);
    } finally {
      await daemon.stop();
      await proxy.close();
    }
    const after = await prefs(ts);
    assert.deepEqual(services(after), ['svc:other'], 'withdrawn by the time stop() returned');
    assert.deepEqual(others(after), others(before), 'no other pref changed');
    await controlSees(ts, ['svc:other']);
  });
});
