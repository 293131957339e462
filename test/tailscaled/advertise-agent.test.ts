// Privilege separation of the Tailscale Service advertisement against the real tailscaled, set up as the
// injector ships it: tailscaled reads the injector's passwd file (tailscaledPasswd(), bind-mounted over its
// /etc/passwd), is told `--operator=certshare-advertise` (containerboot's TS_EXTRA_ARGS) and lets certshare's
// uid fetch certificates (TS_PERMIT_CERT_UID). certshare's uid (65532) is refused every prefs edit and every
// other operator-only write (403), yet still fetches its certificate; the advertise agent, as its own uid
// (65533), advertises the Service on certshare's request once the certificate is held and served, keeps
// another Service and every other pref, and withdraws it before certshare's stop returns. Needs root (setpriv,
// a mount namespace for tailscaled).
import assert from 'node:assert/strict';
import { chmod, chown, mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { ADVERTISE_AGENT_UID, SIDECAR_SECURITY_CONTEXT } from '../../src/injector/sidecar.ts';
import { OPERATOR_USER, tailscaledPasswd } from '../../src/injector/tailscale-operator.ts';
import type { Daemon } from '../../src/daemon/daemon.ts';
import { BUILD_AND_START_TIMEOUT_MS, useRealTailscaled } from '../harness/tailscale.ts';
import { advertisedIn as services, advertisedOnceServed, asUid, otherPrefs as others, prefsOf as prefs, startInjectedAgent } from '../support/advertising.ts';
import { certPath, get } from '../support/emulator.ts';
import { useTempDir } from '../support/standalone.ts';
import type { TestProxy } from '../support/tls-proxy.ts';

const CERTSHARE_UID = SIDECAR_SECURITY_CONTEXT.runAsUser!;
const asRoot = process.getuid?.() === 0;

describe('the advertisement without the operator right in certshare (real tailscaled, the shipped grant)', {
  timeout: BUILD_AND_START_TIMEOUT_MS,
  skip: !asRoot && "needs root (setpriv to certshare's and the agent's uids, a mount namespace for tailscaled)",
}, () => {
  const realTailscaled = useRealTailscaled({
    certDomainsAtStart: true,
    passwd: tailscaledPasswd(),
    operator: OPERATOR_USER,
    permitCertUid: String(CERTSHARE_UID),
  });
  const dir = useTempDir();

  it("refuses certshare's uid every prefs edit (403) while the agent's uid advertises on certshare's request", async () => {
    const ts = realTailscaled();
    // The socket's and the exchange's directories reachable by the two uids, as shared volumes are in a Pod.
    await chmod(ts.dir, 0o711);
    await chmod(dir(), 0o711);

    const edits: Array<[string, string, unknown]> = [
      ['PATCH', '/localapi/v0/prefs', { AdvertiseServicesSet: true, AdvertiseServices: ['svc:web'] }],
      ['PATCH', '/localapi/v0/prefs', { WantRunningSet: true, WantRunning: false }],
      ['PATCH', '/localapi/v0/prefs', { ShieldsUpSet: true, ShieldsUp: true }],
      ['PATCH', '/localapi/v0/prefs', { OperatorUserSet: true, OperatorUser: 'nobody' }],
      ['PATCH', '/localapi/v0/prefs', { AdvertiseRoutesSet: true, AdvertiseRoutes: ['10.0.0.0/8'] }],
      ['POST', '/localapi/v0/logout', undefined],
      ['POST', `/localapi/v0/set-dns?name=_acme-challenge.${ts.domain}&value=x`, undefined],
    ];
    const before = await prefs(ts);
    for (const [method, path, body] of edits) {
      const answer = await asUid(CERTSHARE_UID, ts.socket, method, path, body);
      assert.equal(answer.status, 403, `${method} ${path} ${JSON.stringify(body)} as certshare's uid: ${answer.body}`);
    }
    assert.deepEqual(await prefs(ts), before, 'nothing changed');
    const cert = await asUid(CERTSHARE_UID, ts.socket, 'GET', certPath(ts.domain));
    assert.equal(cert.status, 200, `certshare's uid still fetches its certificate: ${cert.body}`);

    // Someone else's Service, set as root: the agent must keep it.
    const set = await get(ts.socket, '/localapi/v0/prefs', {
      method: 'PATCH',
      body: JSON.stringify({ AdvertiseServicesSet: true, AdvertiseServices: ['svc:other'] }),
    });
    assert.equal(set.status, 200, set.body);
    const withOther = await prefs(ts);

    const exchange = join(dir(), 'exchange');
    await mkdir(join(exchange, 'request'), { recursive: true });
    await mkdir(join(exchange, 'status'));
    await chown(join(exchange, 'status'), ADVERTISE_AGENT_UID, ADVERTISE_AGENT_UID);
    const service = `svc:${ts.domain.split('.')[0]}`;
    const agent = await startInjectedAgent(ts, dir(), service, exchange);
    let parts: { daemon: Daemon; proxy: TestProxy } | undefined;
    const flags = ['--advertise-agent', exchange, '--advertise-failover', '200ms', '--shutdown-timeout', '15s'];
    try {
      const explain = (): string => `; the agent said:\n${agent.lines.join('\n')}`;
      const now = await advertisedOnceServed(ts, join(dir(), 'certs'), service, flags, (started) => (parts = started), explain);
      assert.deepEqual(services(now), ['svc:other', service], 'advertised by the agent, the other Service kept');
      assert.deepEqual(others(now), others(withOther), 'no other pref changed');
    } finally {
      await parts?.daemon.stop();
      await parts?.proxy.close();
    }
    try {
      assert.deepEqual(services(await prefs(ts)), ['svc:other'], "withdrawn through the agent by the time certshare's stop returned");
    } finally {
      await agent.terminate(15_000);
    }
    assert.deepEqual(services(await prefs(ts)), ['svc:other']);
  });
});
