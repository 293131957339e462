import assert from 'node:assert/strict';
import { X509Certificate } from 'node:crypto';
import { readFile, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import type { Daemon } from '../../src/daemon/daemon.ts';
import { DOMAIN, emulatorIn, standaloneDaemon, useTempDir } from '../support/standalone.ts';
import { recordingLogger, type LogEntry } from '../support/recording-logger.ts';
import { nextEvent, until } from '../support/wait.ts';

const serialOnDisk = async (certDir: string, domain = DOMAIN): Promise<string> =>
  new X509Certificate(await readFile(join(certDir, domain, 'tls.crt'))).serialNumber;

const healthy = (daemon: Daemon): boolean => daemon.health.evaluate(Date.now()).healthy;
const healthSource = (daemon: Daemon) => (l: () => void) => daemon.health.onChange(l);

async function healthz(daemon: Daemon): Promise<Response> {
  return fetch(`${daemon.address}/healthz`);
}

// The cases run at once: each has its own emulator socket and certificate directory, and mostly waits.
describe('standalone daemon against the emulator over a unix socket', { concurrency: true }, () => {
  const dir = useTempDir();

  it('waits for a late domain, issues once, writes files 0600 and turns /healthz to 200 with Pod IP headers', async () => {
    const certDir = join(dir(), 'late');
    // The domain appears when the test says (an hour's delay otherwise): /healthz is read before, however slow the start.
    const emulator = await emulatorIn(join(dir()), { listen: join(dir(), 'late.sock'), domainDelayMs: 3_600_000 });
    const requestBeforeDomain = nextEvent(emulator.events, 'certRequest', () => emulator.certDomains().length === 0, 900).then(
      () => true,
      () => false,
    );
    const daemon = await standaloneDaemon(emulator, certDir);
    try {
      const before = await healthz(daemon);
      assert.equal(before.status, 503);
      assert.match(await before.text(), /web\.tailnet-test\.ts\.net: no certificate yet/);
      assert.equal(before.headers.get('pod-ipv4'), '10.1.2.3');
      assert.equal(before.headers.get('pod-ipv6'), 'fd00::3');
      emulator.addCertDomain(DOMAIN);
      await until('healthy', () => healthy(daemon), [healthSource(daemon)]);
      assert.equal(await requestBeforeDomain, false, 'no CertPair call before the domain appeared');
      const ok = await healthz(daemon);
      assert.equal(ok.status, 200);
      assert.equal(await ok.text(), 'ok');
      assert.equal(emulator.stats().issuances[DOMAIN], 1);
      assert.equal((await stat(join(certDir, DOMAIN, 'tls.key'))).mode & 0o777, 0o600);
      const metrics = await (await fetch(`${daemon.address}/metrics`)).text();
      assert.match(metrics, /certshare_issuance_attempts_total\{domain="web\.tailnet-test\.ts\.net",result="success",reason="no_certificate"\} 1/);
      assert.match(metrics, /certshare_certificate_ready_status\{domain="web\.tailnet-test\.ts\.net",condition="True"\} 1/);
      assert.match(metrics, /certshare_certificate_expiration_timestamp_seconds\{domain="web\.tailnet-test\.ts\.net"\} \d+/);
      assert.match(metrics, /certshare_ipn_bus_connected 1/);
      assert.match(metrics, /process_resident_memory_bytes/);
    } finally {
      await daemon.stop();
      await emulator.close();
    }
  });

  it('issues nothing after a restart with a valid stored certificate and a fresh tailscaled', async () => {
    const certDir = join(dir(), 'restart');
    const first = await emulatorIn(dir(), { listen: join(dir(), 'r1.sock') });
    const daemon1 = await standaloneDaemon(first, certDir);
    await until('first daemon healthy', () => healthy(daemon1), [healthSource(daemon1)]);
    const serial = await serialOnDisk(certDir);
    await daemon1.stop();
    await first.close();

    const fresh = await emulatorIn(dir(), { listen: join(dir(), 'r2.sock') });
    const daemon2 = await standaloneDaemon(fresh, certDir);
    try {
      await until('stored certificate loaded', () => daemon2.manager.loop(DOMAIN)?.current !== undefined, [healthSource(daemon2)]);
      await until('bus knows the domain', () => daemon2.watcher.current().has(DOMAIN), [(l) => daemon2.watcher.onChange(l)]);
      assert.equal((await healthz(daemon2)).status, 200);
      assert.deepEqual(fresh.stats().certRequests, {}, 'no CertPair call at all');
      assert.equal(await serialOnDisk(certDir), serial);
    } finally {
      await daemon2.stop();
      await fresh.close();
    }
  });

  it('survives bus drops and malformed lines, and still sees a domain added afterwards', async () => {
    const certDir = join(dir(), 'bus');
    const second = 'api.tailnet-test.ts.net';
    const emulator = await emulatorIn(dir(), { listen: join(dir(), 'bus.sock'), netmapStyle: 'resend' });
    const daemon = await standaloneDaemon(emulator, certDir, ['--domain', DOMAIN, '--domain', second]);
    try {
      await until('first domain healthy', () => daemon.health.infoOf(DOMAIN) !== undefined, [healthSource(daemon)]);
      emulator.injectFault('bus:malformed_line');
      const reconnected = nextEvent(emulator.events, 'busConnect');
      emulator.dropBusConnections();
      await reconnected;
      emulator.addCertDomain(second);
      await until('second domain healthy', () => healthy(daemon), [healthSource(daemon)]);
      assert.ok(daemon.watcher.reconnects >= 1);
      assert.equal(emulator.stats().issuances[second], 1);
      assert.equal(emulator.stats().issuances[DOMAIN], 1);
    } finally {
      await daemon.stop();
      await emulator.close();
    }
  });

  it('honours Retry-After exactly: no call before it', async () => {
    const certDir = join(dir(), 'ratelimit');
    const emulator = await emulatorIn(dir(), { listen: join(dir(), 'rl.sock'), faults: ['cert:rate_limit_429:retry_after=2'] });
    const times: number[] = [];
    emulator.events.on('certRequest', () => times.push(performance.now()));
    const daemon = await standaloneDaemon(emulator, certDir);
    try {
      await until('healthy after the rate limit', () => healthy(daemon), [healthSource(daemon)], 60_000);
      assert.equal(times.length, 2, 'exactly one call after the 429');
      assert.ok(times[1]! - times[0]! >= 1990, `second call ${Math.round(times[1]! - times[0]!)} ms after the 429`);
      const metrics = await (await fetch(`${daemon.address}/metrics`)).text();
      assert.match(metrics, /result="rate_limited",reason="no_certificate"\} 1/);
    } finally {
      await daemon.stop();
      await emulator.close();
    }
  });

  it('rejects garbage and mismatched pairs at renewal and keeps serving the old certificate', async () => {
    const certDir = join(dir(), 'garbage');
    // 4 s lifetime: renewal due at half (2 s), well before expiry.
    const emulator = await emulatorIn(dir(), { listen: join(dir(), 'g.sock'), certLifetimeMs: 4000 });
    const daemon = await standaloneDaemon(emulator, certDir);
    try {
      await until('healthy', () => healthy(daemon), [healthSource(daemon)]);
      const original = await serialOnDisk(certDir);
      emulator.injectFault('cert:garbage');
      emulator.injectFault('cert:mismatched');
      const rejected: string[] = [];
      emulator.events.on('certResponse', ({ status }: { status: string }) => rejected.push(String(status)));
      await nextEvent(emulator.events, 'issued', () => true, 10_000);
      // A renewed certificate held, not merely the original gone: on a loaded machine the two rejected calls and
      // their backoff can outlast the 4 s original, and an expired one held is no certificate at all.
      const renewedHeld = (): boolean => {
        const serial = daemon.manager.loop(DOMAIN)?.current?.info.serial;
        return serial !== undefined && serial !== original;
      };
      await until('renewed certificate in use', renewedHeld, [healthSource(daemon)]);
      const metrics = await (await fetch(`${daemon.address}/metrics`)).text();
      // Both pairs rejected: made for the renewal, or, when the load stretched the backoff past the original's
      // expiry, for a certificate no longer usable or no longer held (an expired one is none).
      const rejections = [...metrics.matchAll(/result="rejected",reason="(expiry|stored_unusable|no_certificate)"\} (\d+)/g)];
      const rejectedCalls = rejections.reduce((sum, m) => sum + Number(m[2]), 0);
      assert.equal(rejectedCalls, 2, metrics);
      assert.notEqual(await serialOnDisk(certDir), original);
    } finally {
      await daemon.stop();
      await emulator.close();
    }
  });

  it('starts and stops loops as the serve config changes, keeping the last good config on a malformed file', async () => {
    const certDir = join(dir(), 'serve');
    const file = join(dir(), 'serve.json');
    const other = 'db.tailnet-test.ts.net';
    const config = (hosts: string[]) =>
      JSON.stringify({
        Services: Object.fromEntries(
          hosts.map((h, i) => [
            `svc:s${i}`,
            { TCP: { '443': { HTTPS: true } }, Web: { [`${h}:443`]: { Handlers: { '/': { Proxy: 'http://127.0.0.1:8080' } } } } },
          ]),
        ),
      });
    await writeFile(file, config([DOMAIN, other]));
    const emulator = await emulatorIn(dir(), { listen: join(dir(), 's.sock'), domains: [DOMAIN, other] });
    const daemon = await standaloneDaemon(emulator, certDir, ['--serve-config', file]);
    try {
      await until('both domains healthy', () => healthy(daemon) && daemon.manager.domains.length === 2, [healthSource(daemon)]);
      await writeFile(file, '{"Services": {');
      await writeFile(file, config([DOMAIN]));
      await until('domain removed', () => daemon.manager.domains.join() === DOMAIN, [healthSource(daemon)]);
      assert.equal(daemon.health.evaluate(Date.now()).healthy, true);
      const metrics = await (await fetch(`${daemon.address}/metrics`)).text();
      assert.doesNotMatch(metrics, /db\.tailnet-test\.ts\.net/, 'metrics of the removed domain are gone');
      await writeFile(file, 'not json');
      await writeFile(file, config([DOMAIN, other]));
      await until('domain back', () => daemon.manager.domains.length === 2 && healthy(daemon), [healthSource(daemon)]);
      assert.equal(emulator.stats().issuances[other], 1, 'the re-added domain reuses its stored certificate');
    } finally {
      await daemon.stop();
      await emulator.close();
    }
  });
  it('counts a reload command that fails, and one that succeeds, in certshare_reload_command_runs_total{method="command",result}', async () => {
    const runs = async (reload: string, file: string) => {
      const certDir = join(dir(), `reload-${file}`);
      const emulator = await emulatorIn(dir(), { listen: join(dir(), `reload-${file}.sock`) });
      const { logger, events } = recordingLogger();
      const outcome = nextEvent<LogEntry>(events, 'entry', (e) => /^reload command (succeeded|failed; trying again)$/.test(e.msg ?? ''), 15_000);
      const daemon = await standaloneDaemon(emulator, certDir, ['--reload-command', reload], logger);
      try {
        await outcome;
        return await (await fetch(`${daemon.address}/metrics`)).text();
      } finally {
        await daemon.stop();
        await emulator.close();
      }
    };
    // The JSON array form: no shell, the same in every image.
    const failed = await runs(JSON.stringify([process.execPath, '-e', 'process.exit(3)']), 'fails');
    // The first failure, and any retry's since (from 1 s).
    assert.match(failed, /^certshare_reload_command_runs_total\{method="command",result="failure"\} [1-9]$/m);
    assert.doesNotMatch(failed, /result="success"\} [1-9]/);
    const succeeded = await runs(JSON.stringify([process.execPath, '-e', '0']), 'succeeds');
    assert.match(succeeded, /^certshare_reload_command_runs_total\{method="command",result="success"\} 1$/m);
    assert.doesNotMatch(succeeded, /result="failure"\} [1-9]/);
  });
});
