// The Tailscale Service advertisement against the real tailscaled (test/harness/tailscale.ts): certshare
// edits the node's AdvertiseServices through PATCH /localapi/v0/prefs only once it holds the certificate
// and the proxy (a loopback TLS listener here) serves it; it withdraws the Service when stopping, before
// stop() returns; every other pref, and a Service it does not manage, are left as they were.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import type { Daemon } from '../../src/daemon/daemon.ts';
import { get } from '../support/emulator.ts';
import { BUILD_AND_START_TIMEOUT_MS, useRealTailscaled, type RealTailscaled, servicesControlSees } from '../harness/tailscale.ts';
import { advertisedIn as services, advertisedOnceServed, otherPrefs as others, prefsOf as prefs } from '../support/advertising.ts';
import { useTempDir } from '../support/standalone.ts';
import type { TestProxy } from '../support/tls-proxy.ts';

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
    let parts: { daemon: Daemon; proxy: TestProxy } | undefined;
    const flags = ['--advertise-failover', '200ms', '--shutdown-timeout', '10s'];
    try {
      const now = await advertisedOnceServed(ts, join(dir(), 'certs'), service, flags, (started) => {
        parts = started;
      });
      assert.deepEqual(services(now), ['svc:other', service], "tailscaled's prefs advertise the Service, the other one kept");
      assert.deepEqual(others(now), others(before), 'no other pref changed');
      await controlSees(ts, [service, 'svc:other']);
    } finally {
      await parts?.daemon.stop();
      await parts?.proxy.close();
    }
    const after = await prefs(ts);
    assert.deepEqual(services(after), ['svc:other'], 'withdrawn by the time stop() returned');
    assert.deepEqual(others(after), others(before), 'no other pref changed');
    await controlSees(ts, ['svc:other']);
  });
});
