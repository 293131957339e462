// certshare (standalone, directory store) against a real tailscaled built from the tailscale.com
// module, logged in to Tailscale's test control server, certificates from pebble: everything but
// certshare runs in a loopback-only network namespace (test/harness/tailscale.ts).
// CERTSHARE_TS_TIMINGS=1 prints the measured figures (domain to files, orders) to stderr.
import assert from 'node:assert/strict';
import { X509Certificate } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import type { Daemon } from '../../src/daemon/daemon.ts';
import { splitPair } from '../support/emulator.ts';
import { BUILD_AND_START_TIMEOUT_MS, useRealTailscaled, type RealTailscaled } from '../harness/tailscale.ts';
import { standaloneDaemon, useTempDir } from '../support/standalone.ts';
import { every, nextEvent, onEvent, until } from '../support/wait.ts';

const healthy = (daemon: Daemon): boolean => daemon.health.evaluate(Date.now()).healthy;
const healthSource = (daemon: Daemon) => (l: () => void) => daemon.health.onChange(l);
const busSource = (daemon: Daemon) => (l: () => void) => daemon.watcher.onChange(l);
function report(figure: string): void {
  if (process.env.CERTSHARE_TS_TIMINGS === '1') process.stderr.write(`real tailscaled: ${figure}\n`);
}

async function filesOnDisk(certDir: string, domain: string): Promise<{ keyPem: string; certPem: string; cert: X509Certificate }> {
  const certPem = await readFile(join(certDir, domain, 'tls.crt'), 'utf8');
  const keyPem = await readFile(join(certDir, domain, 'tls.key'), 'utf8');
  return { keyPem, certPem, cert: new X509Certificate(certPem) };
}

/** tailscaled's cached pair (min_validity=0s: never a new order), split like a careful client. */
async function tailscaledPair(ts: RealTailscaled): Promise<{ keyPem: string; certPem: string }> {
  const res = await ts.localApi(`/localapi/v0/cert/${ts.domain}?type=pair&min_validity=0s`);
  assert.equal(res.status, 200, `tailscaled's pair: ${res.body}`);
  return splitPair(res.body);
}

/** The pair certshare wrote is byte for byte the pair tailscaled hands out. */
async function assertSamePair(certDir: string, ts: RealTailscaled): Promise<void> {
  const disk = await filesOnDisk(certDir, ts.domain);
  const real = await tailscaledPair(ts);
  assert.equal(disk.certPem.trim(), real.certPem.trim(), 'tls.crt is tailscaled certificate chain');
  assert.equal(disk.keyPem.trim(), real.keyPem.trim(), 'tls.key is tailscaled private key');
}

async function withDiagnostics<T>(ts: RealTailscaled, body: () => Promise<T>): Promise<T> {
  try {
    return await body();
  } catch (err) {
    const logs = ts.logs();
    process.stderr.write(`tailscaled (last lines):\n${logs.tailscaled.slice(-40).join('\n')}\n`);
    throw err;
  }
}

describe('certshare against a real tailscaled: the domain appears later, then restarts', { timeout: BUILD_AND_START_TIMEOUT_MS }, () => {
  const dir = useTempDir();
  const realTailscaled = useRealTailscaled();

  it('issues once when the domain appears, writing the pair tailscaled returns', async () => {
    const ts = realTailscaled();
    await withDiagnostics(ts, async () => {
      const certDir = join(dir(), 'late');
      assert.equal((await ts.localApi('/localapi/v0/cert-domains')).body.trim(), 'null', 'no cert domain yet');
      const daemon = await standaloneDaemon(ts, certDir);
      try {
        await until('IPN bus connected', () => daemon.watcher.connected, [every(50)], 30_000);
        assert.equal(healthy(daemon), false);
        const written = nextEvent(daemon.events, 'filesWritten', () => true, 60_000);
        const appeared = performance.now();
        await ts.enableCertDomains();
        await written;
        const ms = performance.now() - appeared;
        report(`domain appearing to certificate on disk: ${Math.round(ms)} ms`);
        await until('healthy', () => healthy(daemon), [healthSource(daemon)]);
        const stats = await ts.acmeStats();
        report(`ACME orders for the first issuance: ${stats.orders}`);
        assert.equal(stats.orders, 1, 'one ACME order');
        assert.equal(stats.finalizes, 1);
        await assertSamePair(certDir, ts);
      } finally {
        await daemon.stop();
      }
    });
  });

  it('makes no ACME order when certshare restarts with its stored certificate', async () => {
    const ts = realTailscaled();
    await withDiagnostics(ts, async () => {
      const certDir = join(dir(), 'late');
      const before = await filesOnDisk(certDir, ts.domain);
      const daemon = await standaloneDaemon(ts, certDir);
      try {
        await until('stored certificate loaded', () => daemon.manager.loop(ts.domain)?.current !== undefined, [healthSource(daemon)], 30_000);
        await until('bus knows the domain', () => daemon.watcher.current().has(ts.domain), [busSource(daemon)], 30_000);
        assert.equal(healthy(daemon), true);
        assert.equal((await ts.acmeStats()).orders, 1, 'still the one order of the first issuance');
        assert.equal((await filesOnDisk(certDir, ts.domain)).cert.serialNumber, before.cert.serialNumber);
      } finally {
        await daemon.stop();
      }
    });
  });

  it('makes no ACME order when tailscaled restarts, and certshare follows it back', async () => {
    const ts = realTailscaled();
    await withDiagnostics(ts, async () => {
      const certDir = join(dir(), 'late');
      const daemon = await standaloneDaemon(ts, certDir);
      try {
        await until('bus knows the domain', () => daemon.watcher.current().has(ts.domain), [busSource(daemon)], 30_000);
        const reconnectsBefore = daemon.watcher.reconnects;
        await ts.stopTailscaled();
        await ts.startTailscaled();
        await until('bus reconnected', () => daemon.watcher.reconnects > reconnectsBefore && daemon.watcher.connected, [every(50)], 60_000).catch(() =>
          assert.fail(
            `certshare did not reconnect to the restarted tailscaled (reconnects ${daemon.watcher.reconnects}, connected ${daemon.watcher.connected})`,
          ),
        );
        assert.equal(healthy(daemon), true);
        // tailscaled keeps its certificate in its state directory: the pair survives the restart.
        await assertSamePair(certDir, ts);
        const stats = await ts.acmeStats();
        report(`ACME orders after restarts of certshare and tailscaled: ${stats.orders}`);
        assert.equal(stats.orders, 1);
      } finally {
        await daemon.stop();
      }
    });
  });
});

describe('certshare against a real tailscaled: the domain is there when certshare starts', { timeout: BUILD_AND_START_TIMEOUT_MS }, () => {
  const dir = useTempDir();
  const realTailscaled = useRealTailscaled({ certDomainsAtStart: true });

  it('issues at once, without waiting for a netmap change', async () => {
    const ts = realTailscaled();
    await withDiagnostics(ts, async () => {
      const certDir = join(dir(), 'present');
      assert.match((await ts.localApi('/localapi/v0/cert-domains')).body, /web\.tailnet-test\.ts\.net/);
      const started = performance.now();
      const daemon = await standaloneDaemon(ts, certDir);
      try {
        await until('healthy', () => healthy(daemon), [healthSource(daemon)], 30_000);
        report(`certshare start to certificate on disk (domain present): ${Math.round(performance.now() - started)} ms`);
        assert.equal((await ts.acmeStats()).orders, 1);
        await assertSamePair(certDir, ts);
      } finally {
        await daemon.stop();
      }
    });
  });
});

describe('certshare against a real tailscaled: renewal of short-lived certificates', { timeout: BUILD_AND_START_TIMEOUT_MS }, () => {
  const dir = useTempDir();
  // 40 s certificates: certshare renews at half (under 10 days), i.e. every ~20 s.
  const VALIDITY_S = 40;
  const realTailscaled = useRealTailscaled({ certDomainsAtStart: true, certValidity: `${VALIDITY_S}s` });

  it('renews once per renewal window, through tailscaled, inside the window', async () => {
    const ts = realTailscaled();
    await withDiagnostics(ts, async () => {
      const certDir = join(dir(), 'renew');
      const daemon = await standaloneDaemon(ts, certDir, ['--check-interval', '5s']);
      const serials: Array<{ serial: string; writtenAt: number; notBefore: number; notAfter: number }> = [];
      const record = async (): Promise<void> => {
        const { cert } = await filesOnDisk(certDir, ts.domain);
        if (serials.at(-1)?.serial !== cert.serialNumber) {
          serials.push({ serial: cert.serialNumber, writtenAt: Date.now(), notBefore: Date.parse(cert.validFrom), notAfter: Date.parse(cert.validTo) });
          recorded.emit('recorded');
        }
      };
      const recorded = new EventEmitter();
      daemon.events.on('filesWritten', () => void record());
      try {
        // The first write may come before the listener: take the first certificate from disk.
        await until('healthy', () => healthy(daemon), [healthSource(daemon)], 30_000);
        await record();
        // The first certificate and two renewals.
        await until('two renewals', () => serials.length >= 3, [onEvent(recorded, 'recorded')], 3 * VALIDITY_S * 1000);
        const stats = await ts.acmeStats();
        report(`ACME orders for 1 issuance + 2 renewals (${VALIDITY_S}s certificates): ${stats.orders} (${stats.finalizes} finalized)`);
        assert.equal(new Set(serials.map((s) => s.serial)).size, serials.length, 'each write is a new certificate');
        assert.equal(stats.finalizes, serials.length, 'one issued (finalized) certificate per certificate written: no extra issuance');
        // pebble now and then fails an order itself ("Cannot update challenge with status valid, only status
        // pending", seen in CI): tailscaled's retry is a second order for the same issuance. One such, no more.
        assert.ok(stats.orders <= serials.length + 1, `${stats.orders} ACME orders for ${serials.length} certificates`);
        for (let i = 1; i < serials.length; i++) {
          const previous = serials[i - 1]!;
          const half = previous.notBefore + (previous.notAfter - previous.notBefore) / 2;
          // Inside the window: not before half the lifetime (1 s of clock rounding), before expiry.
          assert.ok(
            serials[i]!.writtenAt >= half - 1000,
            `renewal ${i} at ${serials[i]!.writtenAt - previous.notBefore} ms, window from ${half - previous.notBefore} ms`,
          );
          assert.ok(serials[i]!.writtenAt < previous.notAfter, `renewal ${i} before the previous certificate expired`);
        }
        await assertSamePair(certDir, ts);
      } finally {
        await daemon.stop();
      }
    });
  });
});

describe('certshare against a real tailscaled: the CA rate-limits new orders', { timeout: BUILD_AND_START_TIMEOUT_MS }, () => {
  const dir = useTempDir();
  const realTailscaled = useRealTailscaled({ certDomainsAtStart: true });

  // tailscaled's ACME client (golang.org/x/crypto/acme's retry loop) waits out the CA's 429 and its
  // Retry-After itself, for as long as the LocalAPI request lasts: certshare sees its own timeout,
  // never an HTTP 429, and then backs off. The limit lifts while no call is open: a call cut by
  // --cert-timeout after the CA finalized loses a certificate the CA counted (tailscaled cancels an
  // issuance whose caller went away, docs/configuration.md), and lifting it mid-call would test that chance.
  it('rides out a rate limit: timeouts and backoff, no order storm, one certificate once it lifts', async () => {
    const ts = realTailscaled();
    await withDiagnostics(ts, async () => {
      const certDir = join(dir(), 'ratelimit');
      await ts.rateLimitOrders(1000, 1);
      const attempts: string[] = [];
      const timeoutS = 5;
      const flags = ['--cert-timeout', `${timeoutS}s`, '--first-retry', '4s', '--retry-cap', '4s'];
      const daemon = await standaloneDaemon(ts, certDir, flags);
      daemon.events.on('attempt', ({ result }: { result: string }) => attempts.push(result));
      // tailscaled logs each call that ended: with as many ended as certshare cut, none is open.
      const cancelled = (): number => ts.logs().tailscaled.filter((line) => /\): getCertPEM: /.test(line)).length;
      try {
        await until('two failed attempts', () => attempts.length >= 2, [onEvent(daemon.events, 'attempt')], 60_000);
        await until('tailscaled ended both calls', () => cancelled() >= 2, [every(50)], 3_000);
        await ts.rateLimitOrders(0, 0);
        assert.deepEqual([...new Set(attempts)], ['error'], `attempts end as timeouts, not rate limits: ${attempts.join(',')}`);
        const limited = await ts.acmeStats();
        assert.equal(limited.orders, 0);
        // At most one new order a second per call (the client honours Retry-After: 1).
        const bound = (timeoutS + 1) * attempts.length;
        assert.ok(limited.rateLimited <= bound, `${limited.rateLimited} rate-limited orders in ${attempts.length} attempts`);
        await until('a certificate once the limit lifts', () => attempts.includes('success'), [onEvent(daemon.events, 'attempt')], 30_000);
        assert.deepEqual(attempts, ['error', 'error', 'success'], 'the first call after the limit issues');
        await until('healthy', () => healthy(daemon), [healthSource(daemon)], 10_000);
        const lifted = await ts.acmeStats();
        assert.equal(lifted.finalizes, 1, `one certificate once the limit lifts: ${JSON.stringify(lifted)}`);
        // Pebble may fail an order itself (ari-process.ts pebbleChallengeRaces) and tailscaled order again.
        assert.ok(lifted.orders <= 2, `at most one order again after pebble failed one: ${JSON.stringify(lifted)}`);
        await assertSamePair(certDir, ts);
      } finally {
        await daemon.stop();
      }
    });
  });
});
