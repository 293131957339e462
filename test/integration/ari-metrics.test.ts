// The ARI metrics (issue 23): the CA's window per domain as timestamps, checks by outcome from the first
// scrape on, and an exposition promtool accepts.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ARI_CHECK_OUTCOMES } from '../../src/acme/renewal-info-client.ts';
import { Metrics } from '../../src/http/daemon-metrics.ts';
import { FakeClock } from '../support/fake-clock.ts';
import { checkMetrics } from '../support/promtool.ts';

const DOMAIN = 'web.tailnet-1234.ts.net';

async function ariLines(metrics: Metrics): Promise<string[]> {
  return (await metrics.registry.metrics()).split('\n').filter((line) => /^certshare_ari_/.test(line));
}

describe('ARI metrics', () => {
  it('exports every check outcome at 0 before the first check, then counts', async () => {
    const metrics = new Metrics(new FakeClock(), { renewFraction: 1 / 3, checkIntervalMs: 86_400_000 }, { defaultMetrics: false });
    assert.deepEqual(
      await ariLines(metrics),
      ARI_CHECK_OUTCOMES.map((outcome) => `certshare_ari_checks_total{outcome="${outcome}"} 0`),
    );
    metrics.ariCheck('ok');
    metrics.ariCheck('timeout');
    metrics.ariCheck('ok');
    const lines = await ariLines(metrics);
    assert.ok(lines.includes('certshare_ari_checks_total{outcome="ok"} 2'));
    assert.ok(lines.includes('certshare_ari_checks_total{outcome="timeout"} 1'));
  });

  it("shows the window of the certificate in use, drops it with the certificate's answer or the domain", async () => {
    const metrics = new Metrics(new FakeClock(), { renewFraction: 1 / 3, checkIntervalMs: 86_400_000 }, { defaultMetrics: false });
    const window = { start: Date.UTC(2027, 0, 23, 12), end: Date.UTC(2027, 0, 25, 12) };
    metrics.ariWindow(DOMAIN, window);
    const lines = await ariLines(metrics);
    assert.ok(lines.includes(`certshare_ari_window_start_timestamp_seconds{domain="${DOMAIN}"} ${window.start / 1000}`));
    assert.ok(lines.includes(`certshare_ari_window_end_timestamp_seconds{domain="${DOMAIN}"} ${window.end / 1000}`));
    assert.equal(await checkMetrics(await metrics.registry.metrics()), '', 'promtool check metrics');
    metrics.ariWindow(DOMAIN, undefined);
    assert.equal((await ariLines(metrics)).filter((l) => l.includes('window')).length, 0);
    metrics.ariWindow(DOMAIN, window);
    metrics.stopped(DOMAIN);
    assert.equal((await ariLines(metrics)).filter((l) => l.includes('window')).length, 0);
  });
});
