import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import type { Daemon } from '../../src/daemon/daemon.ts';
import type { IssuedEvent } from '../../src/emulator/issuer.ts';
import { emulatorIn, standaloneDaemon, useTempDir } from '../support/standalone.ts';
import { onEvent, until } from '../support/wait.ts';

const TAILNET = 'tailnet-budget.ts.net';
const DOMAINS = Array.from({ length: 8 }, (_, i) => `web${i + 1}.${TAILNET}`);
/**
 * Let's Encrypt's 50 per 168 h, scaled: 3 first issuances per 10 s. The five queued loops must all report their
 * wait within one window, on a loaded machine too.
 */
const COUNT = 3;
const WINDOW_MS = 10_000;

describe('issuance budget end to end: the daemon against a CA that enforces the limit', () => {
  const dir = useTempDir();

  it('issues 8 domains 3 per window in name order, through a restart, without one CA refusal', async () => {
    const limit = `${COUNT}/${WINDOW_MS / 1000}s`;
    const emulator = await emulatorIn(dir(), { domains: DOMAINS, limits: { newCertsPerRegisteredDomain: { count: COUNT, windowMs: WINDOW_MS } } });
    const issued: Array<IssuedEvent & { at: number }> = [];
    emulator.events.on('issued', (e: IssuedEvent) => issued.push({ ...e, at: Date.now() }));
    const certDir = join(dir(), 'certs');
    const flags = ['--issuance-budget', limit, ...DOMAINS.flatMap((d) => ['--domain', d])];
    let daemon: Daemon | undefined = await standaloneDaemon(emulator, certDir, flags);
    try {
      await until('the first window used', () => issued.length >= COUNT, [onEvent(emulator.events, 'issued')], 60_000);
      // The rest wait: reported by the metric and /healthz, with the next slot named.
      // Every queued domain, not the first to report: under load web5's loop may plan before web4's.
      const queued = DOMAINS.slice(COUNT);
      await until(
        'the queue reported for every waiting domain',
        () => {
          const { reason } = daemon!.health.evaluate(Date.now());
          return queued.every((d) => reason.includes(`${d}: waiting for the issuance budget`));
        },
        [onEvent(daemon.events, 'planned')],
        60_000,
      );
      const metrics = await daemon.metrics.registry.metrics();
      assert.match(metrics, new RegExp(`certshare_issuance_queued\\{registered_domain="${TAILNET.replace(/\./g, '\\.')}"\\} 5`));
      assert.match(
        daemon.health.evaluate(Date.now()).reason,
        /web4\.tailnet-budget\.ts\.net: waiting for the issuance budget \(3 per 10s .*next slot frees at 20/,
      );
      // A restart in the middle: the ledger in .state/ keeps the slots taken.
      await daemon.stop();
      daemon = await standaloneDaemon(emulator, certDir, flags);
      const restarted = daemon;
      await until(
        'every domain has a certificate',
        () => DOMAINS.every((d) => restarted.manager.loop(d)?.current),
        [onEvent(daemon.events, 'attempt')],
        30_000,
      );
    } finally {
      await daemon?.stop();
      await emulator.close();
    }
    const stats = emulator.stats();
    assert.deepEqual(stats.rateLimitRefusals, { newCerts: 0, orders: 0 }, 'the CA refused an order');
    assert.ok(!Object.values(stats.certResponses).some((r) => r['429']), 'a 429 reached certshare');
    assert.equal(issued.length, DOMAINS.length);
    // In name order, batch by batch (within a batch, whichever loop asked first).
    const batches = [DOMAINS.slice(0, 3), DOMAINS.slice(3, 6), DOMAINS.slice(6)];
    let i = 0;
    for (const batch of batches) {
      const got = issued.slice(i, i + batch.length);
      assert.deepEqual(got.map((e) => e.domain).sort(), [...batch].sort());
      i += batch.length;
    }
    for (let k = COUNT; k < issued.length; k++)
      assert.ok(issued[k]!.at - issued[k - COUNT]!.at >= WINDOW_MS, `issuances ${k - COUNT} and ${k} closer than the window`);
    const ledger = JSON.parse(await readFile(join(certDir, '.state', 'ledger.json'), 'utf8')) as { entries: Array<{ domain: string; issued: boolean }> };
    assert.deepEqual(ledger.entries.map((e) => e.domain).sort(), [...DOMAINS].sort());
    assert.ok(ledger.entries.every((e) => e.issued));
  });
});
