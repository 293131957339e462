// The served check on a virtual clock, with a proxy the test describes: rechecks after a change until the
// new leaf is served, the stale warning past --served-stale-after, and the served leaf leaving rotation
// at its end without another TLS answer.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { silentLogger } from '../../src/core/ports/logger.ts';
import type { ServedLeaf, ServedProbe } from '../../src/core/served/served-certificate.ts';
import type { StoredCert } from '../../src/core/ports/store.ts';
import { ServedChecker, type ServedReport } from '../../src/served/served-checker.ts';
import { servedStatus } from '../../src/served/served-metrics.ts';
import { FakeClock } from '../support/fake-clock.ts';

const DOMAIN = 'web.tailnet-0000.ts.net';
const HOUR = 3_600_000;
const LEAD = 60_000;

function held(fingerprint256: string, notBefore: number, notAfter: number): StoredCert {
  return { info: { domain: DOMAIN, notBefore, notAfter, serial: fingerprint256, fingerprint256 } } as unknown as StoredCert;
}

function leaf(fingerprint256: string, notBefore: number, notAfter: number): ServedLeaf {
  return { fingerprint256, serial: fingerprint256, notBefore, notAfter, coversName: true };
}

function setup() {
  const clock = new FakeClock();
  let served: ServedProbe = { failure: 'refused', detail: 'nothing listens' };
  const probes: number[] = [];
  const reports: ServedReport[] = [];
  const checker = new ServedChecker({
    probe: async () => {
      probes.push(clock.now());
      return served;
    },
    clock,
    logger: silentLogger,
    intervalMs: 60_000,
    staleAfterMs: 5 * 60_000,
    end: (h) => h.notAfter - LEAD,
    onChange: (_domain, report) => reports.push(report),
  });
  return { clock, checker, probes, reports, serve: (p: ServedProbe) => (served = p) };
}

/** The proxy serves A, the certificate held; then certshare takes B: A is the previous one from then on. */
async function renewedWhileServing(s: ReturnType<typeof setup>, a: [number, number], b: [number, number]): Promise<void> {
  s.checker.start();
  s.checker.certificate(DOMAIN, held('A', ...a));
  s.serve({ leaf: leaf('A', ...a) });
  await s.clock.advance(0);
  s.checker.certificate(DOMAIN, held('B', ...b));
  await s.clock.advance(0);
}

describe('ServedChecker', () => {
  it('rechecks a changed certificate at 250 ms, doubling, until the proxy serves it; then every interval', async () => {
    const { clock, checker, probes, serve } = setup();
    const t0 = clock.now();
    checker.start();
    checker.certificate(DOMAIN, held('A', t0 - HOUR, t0 + 10 * HOUR));
    serve({ leaf: leaf('OLD', t0 - HOUR, t0 + 10 * HOUR) });
    await clock.advance(0);
    await clock.advance(2000);
    assert.deepEqual(
      probes.map((t) => t - t0),
      [0, 250, 750, 1750],
      'rechecks while something else is served',
    );
    serve({ leaf: leaf('A', t0 - HOUR, t0 + 10 * HOUR) });
    await clock.advance(62_000);
    const afterServed = probes.filter((t) => t - t0 > 2000).map((t) => t - t0);
    assert.deepEqual(afterServed, [3750, 63750], 'found at the next recheck, then the steady interval');
    await checker.stop();
  });

  it('warns once the previous certificate is still served past the stale bound, and takes the replica out at the served leaf end', async () => {
    const { clock, checker, reports, serve } = setup();
    const t0 = clock.now();
    checker.start();
    checker.certificate(DOMAIN, held('A', t0 - HOUR, t0 + 2 * HOUR));
    serve({ leaf: leaf('A', t0 - HOUR, t0 + 2 * HOUR) });
    await clock.advance(0);
    assert.equal(reports.at(-1)?.outcome, 'current');
    checker.certificate(DOMAIN, held('B', t0, t0 + 10 * HOUR));
    await clock.advance(4 * 60_000);
    assert.equal(reports.at(-1)?.outcome, 'previous');
    assert.equal(reports.at(-1)?.stale, false);
    assert.equal(checker.verdict(DOMAIN, clock.now()).verdict, 'ok', 'a previous valid certificate keeps the replica in');
    await clock.advance(2 * 60_000);
    assert.equal(reports.at(-1)?.stale, true, 'stale past 5 minutes');
    // The proxy stops answering; the last leaf seen reaches its end (2 h less the lead): out, without an answer.
    serve({ failure: 'timeout', detail: 'no TLS handshake' });
    await clock.advance(2 * HOUR - LEAD - (clock.now() - t0) - 1);
    assert.equal(checker.verdict(DOMAIN, clock.now()).verdict, 'ok');
    await clock.advance(1);
    const last = reports.at(-1)!;
    assert.equal(last.outcome, 'unknown');
    assert.equal(last.verdict.verdict, 'bad', 'the served leaf reached its end');
    await checker.stop();
  });

  it("checks at once after certshare's own reload of the proxy, not at the next recheck", async () => {
    const { clock, checker, probes, reports, serve } = setup();
    const t0 = clock.now();
    checker.start();
    checker.certificate(DOMAIN, held('A', t0 - HOUR, t0 + 10 * HOUR));
    serve({ leaf: leaf('EXPIRED', t0 - 2 * HOUR, t0 - HOUR) });
    await clock.advance(0);
    await clock.advance(5 * 60_000); // the rechecks have grown to the interval
    assert.equal(reports.at(-1)?.outcome, 'expired');
    const before = probes.length;
    serve({ leaf: leaf('A', t0 - HOUR, t0 + 10 * HOUR) });
    checker.reloaded();
    await clock.advance(0);
    assert.deepEqual(probes.slice(before), [clock.now()], 'one check at the moment the reload ended');
    assert.equal(reports.at(-1)?.outcome, 'current');
    await checker.stop();
  });

  it("counts no handshake made while certshare reloads the proxy (nginx's old workers still serve the replaced leaf then)", async () => {
    const { clock, checker, probes, reports, serve } = setup();
    const t0 = clock.now();
    checker.start();
    checker.certificate(DOMAIN, held('A', t0 - HOUR, t0 + 10 * HOUR));
    serve({ leaf: leaf('OLD', t0 - HOUR, t0 + 10 * HOUR) });
    await clock.advance(0);
    assert.equal(reports.at(-1)?.outcome, 'other');
    checker.reloading();
    serve({ leaf: leaf('A', t0 - HOUR, t0 + 10 * HOUR) }); // a new worker answered this one
    await clock.advance(2000);
    assert.ok(probes.length > 1, 'checked during the reload');
    assert.equal(reports.at(-1)?.outcome, 'other', 'nothing counted during the reload');
    checker.reloaded();
    await clock.advance(0);
    assert.equal(reports.at(-1)?.outcome, 'current', 'counted once it ended');
    await checker.stop();
  });

  it('scales the stale bound to a short-lived certificate: the warning comes before its previous leaf leaves rotation', async () => {
    const s = setup();
    const { clock, checker, reports } = s;
    const t0 = clock.now();
    // A 6-minute certificate renewed at t0, 2 minutes before its expiry: its end (the lead before it) is t0 + 1 min.
    await renewedWhileServing(s, [t0 - 4 * 60_000, t0 + 2 * 60_000], [t0, t0 + 6 * 60_000]);
    assert.equal(reports.at(-1)?.outcome, 'previous');
    await clock.advance(31_000);
    assert.equal(reports.at(-1)?.stale, true, 'stale halfway to the served leaf end, well before the 5-minute bound');
    assert.equal(checker.verdict(DOMAIN, clock.now()).verdict, 'ok', 'still in rotation when the warning comes');
    await checker.stop();
  });

  it('reports previous_expiring, not previous, while a previous leaf inside its lead holds the replica out (the alert matches it)', async () => {
    const s = setup();
    const { clock, checker, reports } = s;
    const t0 = clock.now();
    await renewedWhileServing(s, [t0 - HOUR, t0 + 2 * HOUR], [t0, t0 + 10 * HOUR]);
    const inRotation = reports.at(-1)!;
    assert.equal(servedStatus(inRotation.outcome, inRotation.verdict), 'previous');
    await clock.advance(2 * HOUR - LEAD);
    const out = reports.at(-1)!;
    assert.equal(out.verdict.verdict, 'bad');
    assert.equal(servedStatus(out.outcome, out.verdict), 'previous_expiring');
    await checker.stop();
  });
  it('takes the replica out when the proxy still serves, past the reload window, a leaf the CA asked to replace now, whatever follows', async () => {
    const s = setup();
    const { clock, checker, reports } = s;
    const t0 = clock.now();
    checker.start();
    checker.certificate(DOMAIN, held('A', t0 - HOUR, t0 + 10 * HOUR));
    s.serve({ leaf: leaf('A', t0 - HOUR, t0 + 10 * HOUR) });
    await clock.advance(0);
    // The writer's loop replaces A because ARI answered a window already over (a revocation); its reload then fails.
    checker.decided(DOMAIN, { action: 'issue', reason: 'ca_requested_now', at: t0 });
    checker.certificate(DOMAIN, held('B', t0, t0 + 10 * HOUR));
    await clock.advance(0);
    assert.equal(checker.verdict(DOMAIN, clock.now()).verdict, 'ok', 'inside the reload window: the proxy may not have reloaded yet');
    await clock.advance(5 * 60_000);
    const out = reports.at(-1)!;
    assert.equal(out.verdict.verdict, 'bad', 'past --served-stale-after, the replaced leaf takes the replica out');
    assert.match(out.verdict.verdict === 'bad' ? out.verdict.why : '', /CA asked to replace now/);
    assert.equal(servedStatus(out.outcome, out.verdict, out.replacedNow), 'previous_replaced_now');
    // Each certificate opened a new reload window for every previous leaf: a second renewal while the proxy's reload
    // kept failing put the replica back in rotation, serving the revoked leaf, for up to --served-stale-after.
    checker.certificate(DOMAIN, held('C', clock.now(), clock.now() + 10 * HOUR));
    await clock.advance(0);
    assert.equal(checker.verdict(DOMAIN, clock.now()).verdict, 'bad', 'a later certificate opens no new window for A');
    s.serve({ leaf: leaf('C', t0, t0 + 10 * HOUR) });
    checker.reloaded();
    await clock.advance(0);
    assert.equal(checker.verdict(DOMAIN, clock.now()).verdict, 'ok', 'back once the proxy serves the newest');
    await checker.stop();
  });

  it('keeps a replica in rotation when a record names the serial of the leaf it holds now (a stolen token), or an unheld one', async () => {
    const s = setup();
    const { clock, checker, reports } = s;
    const t0 = clock.now();
    await renewedWhileServing(s, [t0 - HOUR, t0 + 10 * HOUR], [t0, t0 + 10 * HOUR]);
    s.serve({ leaf: leaf('B', t0, t0 + 10 * HOUR) });
    checker.reloaded();
    await clock.advance(0);
    checker.replacedNow(DOMAIN, ['b', 'C']);
    await clock.advance(HOUR);
    assert.equal(reports.at(-1)?.outcome, 'current');
    assert.equal(checker.verdict(DOMAIN, clock.now()).verdict, 'ok', 'the current leaf never counts against the replica');
    await checker.stop();
    // Without the CA's word, a previous leaf served for long is a warning only.
    const u = setup();
    await renewedWhileServing(u, [t0 - HOUR, t0 + 10 * HOUR], [t0, t0 + 10 * HOUR]);
    u.checker.replacedNow(DOMAIN, ['C']);
    await u.clock.advance(HOUR);
    assert.equal(u.reports.at(-1)?.outcome, 'previous');
    assert.equal(u.reports.at(-1)?.stale, true);
    assert.equal(u.checker.verdict(DOMAIN, u.clock.now()).verdict, 'ok');
    await u.checker.stop();
  });
});
