// nginx from Debian's package with a stock configuration (a plain ssl_certificate path, read at start and
// at reload): certshare reloads it with a signal to the master its pid file names.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { X509Certificate } from 'node:crypto';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { appendFile, chmod, mkdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { silentLogger } from '../../src/core/ports/logger.ts';
import type { ReloadOutcome } from '../../src/delivery/reload-command.ts';
import { SignalReload } from '../../src/delivery/reload-signal.ts';
import { makePair } from '../support/certs.ts';
import { control } from '../support/emulator.ts';
import { recordingLogger } from '../support/recording-logger.ts';
import { DOMAIN, emulatorIn, standaloneDaemon, useTempDir } from '../support/standalone.ts';
import { every, nextEvent, until } from '../support/wait.ts';
import { HandshakeLoop, handshake, heldAndServed, pidInFile, proveRenewalsServed, servedSerial, startNginx, tlsSession, waitServing } from './proxies.ts';

const RENEWALS = 3;

/** The worker processes of an nginx master (its children, as Linux lists them). */
function workersOf(master: number): number[] {
  return readFileSync(`/proc/${master}/task/${master}/children`, 'utf8').split(' ').filter(Boolean).map(Number);
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

const REPO = join(import.meta.dirname, '../..');

describe('nginx (Debian 12 package) with a stock configuration, reloaded by a signal', { concurrency: true }, () => {
  const dir = useTempDir();

  it(`serves each of ${RENEWALS} renewals within 2 s of certshare holding it, with no failed handshake and the same master`, async (t) => {
    const base = join(dir(), 'renewals');
    const certDir = join(base, 'store');
    const pidFile = join(base, 'nginx.pid');
    const emulator = await emulatorIn(dir(), { listen: join(dir(), 'renewals.sock'), certLifetimeMs: 6000 });
    const daemon = await standaloneDaemon(emulator, certDir, ['--reload-signal', 'HUP', '--reload-pidfile', pidFile]);
    const firstFiles = nextEvent(daemon.events, 'filesWritten');
    let nginx: Awaited<ReturnType<typeof startNginx>> | undefined;
    try {
      await firstFiles;
      // certshare's first write has no nginx to reload yet: nginx reads the files when it starts.
      nginx = await startNginx(base, { certPath: join(certDir, DOMAIN, 'tls.crt'), keyPath: join(certDir, DOMAIN, 'tls.key'), pidFile });
      await waitServing(nginx, DOMAIN);
      await proveRenewalsServed(t, { daemon, certDir, domain: DOMAIN, proxy: nginx, pidFile, method: 'signal', count: RENEWALS });
    } finally {
      await daemon.stop();
      await nginx?.stop();
      await emulator.close();
    }
  });

  for (const version of ['TLSv1.2', 'TLSv1.3'] as const) {
    it(`resumes no ${version} session across the reload that serves a replaced certificate (a revocation)`, async () => {
      const base = join(dir(), `resumption-${version}`);
      await mkdir(base, { recursive: true });
      const [certPath, keyPath, pidFile] = [join(base, 'tls.crt'), join(base, 'tls.key'), join(base, 'nginx.pid')];
      const [revoked, replacement] = [await makePair(DOMAIN, Date.now(), 3_600_000), await makePair(DOMAIN, Date.now(), 3_600_000)];
      const files = async (pair: typeof revoked): Promise<void> => {
        await writeFile(keyPath, pair.keyPem, { mode: 0o600 });
        await writeFile(certPath, pair.certPem);
      };
      await files(revoked);
      const nginx = await startNginx(base, { certPath, keyPath, pidFile });
      try {
        await waitServing(nginx, DOMAIN);
        const established = await tlsSession(nginx.port, DOMAIN, version);
        await files(replacement);
        const replacementSerial = new X509Certificate(replacement.certPem).serialNumber;
        const master = await pidInFile(pidFile);
        const oldWorkers = workersOf(master);
        const loop = new HandshakeLoop(nginx.port, DOMAIN);
        try {
          const served = nextEvent(loop, 'serial', (serial: string) => serial === replacementSerial);
          process.kill(master, 'SIGHUP');
          await served;
        } finally {
          await loop.stop();
        }
        // The master lets its old worker accept for a moment after the new one starts (it signals it to quit about
        // 100 ms later): that worker serves the replaced certificate, and resumes its sessions, until it is gone.
        await until('the old worker gone', () => oldWorkers.every((pid) => !alive(pid)), [every(50)], 15_000);
        const next = await tlsSession(nginx.port, DOMAIN, version, established.session);
        assert.equal(next.resumed, false, 'a reload makes new ticket keys: the session of the replaced certificate is not resumed');
      } finally {
        await nginx.stop();
      }
    });
  }

  it('reports a signal reload done only once no worker from before it accepts: no handshake after gets the replaced certificate', async (t) => {
    const base = join(dir(), 'reload-window');
    await mkdir(base, { recursive: true });
    const [certPath, keyPath, pidFile] = [join(base, 'tls.crt'), join(base, 'tls.key'), join(base, 'nginx.pid')];
    const files = async (): Promise<string> => {
      const pair = await makePair(DOMAIN, Date.now(), 3_600_000);
      await writeFile(keyPath, pair.keyPem, { mode: 0o600 });
      await writeFile(certPath, pair.certPem);
      return new X509Certificate(pair.certPem).serialNumber;
    };
    let replaced = await files();
    const nginx = await startNginx(base, { certPath, keyPath, pidFile });
    try {
      await waitServing(nginx, DOMAIN);
      const figures: string[] = [];
      for (let reload = 0; reload < 5; reload++) {
        const replacement = await files();
        // Four clients opening connection after connection, across the reload and after it: each stops once it
        // has completed three begun after the report (a time window instead saw none begin at load).
        const seen: Array<{ start: number; serial: string | undefined }> = [];
        let done = Infinity;
        const clients = Array.from({ length: 4 }, async () => {
          for (let after = 0; after < 3; ) {
            const start = performance.now();
            seen.push({ start, serial: (await handshake(nginx.port, DOMAIN)).serial });
            if (start >= done) after++;
          }
        });
        const signalled = performance.now();
        const outcome = await new Promise<ReloadOutcome>(
          (resolve) => void new SignalReload('SIGHUP', pidFile, { logger: silentLogger, onOutcome: resolve }).request(DOMAIN),
        );
        done = performance.now();
        await Promise.all(clients);
        assert.equal(outcome.ok, true);
        const firstNew = Math.min(...seen.filter((h) => h.serial === replacement).map((h) => h.start));
        const oldAfterDone = seen.filter((h) => h.serial === replaced && h.start >= done).length;
        figures.push(
          `reported after ${Math.round(done - signalled)} ms; the replaced one served to ` +
            `${seen.filter((h) => h.serial === replaced && h.start > firstNew).length} handshakes begun after the first that got the new one, ` +
            `${oldAfterDone} after the report`,
        );
        assert.equal(oldAfterDone, 0, `handshakes begun after the reload was reported got the replaced certificate (${figures.at(-1)})`);
        assert.ok(
          seen.some((h) => h.serial === replacement && h.start >= done),
          'the replacement is served after the report',
        );
        replaced = replacement;
      }
      t.diagnostic(figures.join('; '));
    } finally {
      await nginx.stop();
    }
  });

  it('takes the Pod out of rotation, past the reload window, while nginx (its reload failed) serves a revoked leaf; back once a retry lands', async (t) => {
    const base = join(dir(), 'revoked');
    const certDir = join(base, 'store');
    const [certPath, keyPath, pidFile] = [join(certDir, DOMAIN, 'tls.crt'), join(certDir, DOMAIN, 'tls.key'), join(base, 'nginx.pid')];
    // nginx first, on an expired pair of the test's (the daemon replaces it): the daemon's --served-check needs its port.
    await mkdir(join(certDir, DOMAIN), { recursive: true });
    const bootstrap = await makePair(DOMAIN, Date.now() - 7_200_000, 3_600_000);
    await writeFile(keyPath, bootstrap.keyPem, { mode: 0o600 });
    await writeFile(certPath, bootstrap.certPem);
    const nginx = await startNginx(base, { certPath, keyPath, pidFile });
    const emulator = await emulatorIn(dir(), { listen: join(dir(), 'revoked.sock'), acmeListen: '127.0.0.1:0', certLifetimeMs: 3_600_000 });
    assert.ok(emulator.acmeDirectoryUrl);
    const daemon = await standaloneDaemon(emulator, certDir, [
      ...['--reload-signal', 'HUP', '--reload-pidfile', pidFile, '--reload-timeout', '3s'],
      ...['--acme-directory', emulator.acmeDirectoryUrl, '--ari-interval', '1s'],
      ...['--served-check', `127.0.0.1:${nginx.port}`, '--served-check-interval', '1s', '--served-stale-after', '3s'],
    ]);
    const healthy = (): boolean => daemon.health.evaluate(Date.now()).healthy;
    const onHealth = (l: () => void): (() => void) => daemon.health.onChange(l);
    const held = (): string | undefined => daemon.manager.loop(DOMAIN)?.current?.info.serial.toUpperCase();
    try {
      const revoked = await heldAndServed(daemon, nginx.port, DOMAIN);
      // A configuration error: nginx's master refuses the next reload and keeps its workers and the revoked leaf.
      const conf = join(base, 'nginx/nginx.conf');
      const sound = await readFile(conf, 'utf8');
      await appendFile(conf, 'garbage;\n');
      const failedReload = nextEvent(daemon.events, 'reloaded', (o: ReloadOutcome) => !o.ok, 30_000);
      const res = await control(emulator.address, 'ari/revoke', { serial: revoked });
      assert.equal(res.status, 200, res.body);
      await failedReload;
      const failedAt = Date.now();
      assert.notEqual(held(), revoked, 'the writer replaced the revoked certificate');
      assert.equal((await servedSerial(nginx.port, DOMAIN))?.toUpperCase(), revoked, 'nginx still serves the revoked leaf');
      // On 7bfef67 the check counted it as "previous" (in rotation, a warning past --served-stale-after): healthy 30 s later.
      await until('the Pod out of rotation', () => !healthy(), [onHealth], 30_000);
      const reason = daemon.health.evaluate(Date.now()).reason;
      t.diagnostic(`out of rotation ${Date.now() - failedAt} ms after the failed reload (--served-stale-after 3s): ${reason}`);
      assert.match(reason, /CA asked to replace now/);
      const metrics = await (await fetch(`${daemon.address}/metrics`)).text();
      assert.match(metrics, /certshare_served_certificate_status\{domain="web\.tailnet-test\.ts\.net",outcome="previous_replaced_now"\} 1/);
      // The configuration put right: a retry of the failed reload lands, with no renewal (on 8b351b2 the Pod stayed out).
      const replacement = held();
      await writeFile(conf, sound);
      const fixedAt = Date.now();
      await until('the Pod back in rotation', healthy, [onHealth], 30_000);
      t.diagnostic(`back in rotation ${Date.now() - fixedAt} ms after nginx.conf was put right`);
      assert.equal(held(), replacement, 'no renewal in between');
      assert.equal((await servedSerial(nginx.port, DOMAIN))?.toUpperCase(), replacement, 'nginx serves the replacement');
    } finally {
      await daemon.stop();
      await nginx.stop();
      await emulator.close();
    }
  });

  it("cannot signal a master of another uid: certshare's uid gets EPERM from root's nginx, and says what to change", {
    skip: process.getuid?.() !== 0 && 'needs root (nginx as root, the signal sent as uid 65532)',
  }, async () => {
    const base = join(dir(), 'other-uid');
    const certDir = join(base, 'store');
    const pidFile = join(base, 'nginx.pid');
    const emulator = await emulatorIn(dir(), { listen: join(dir(), 'other-uid.sock') });
    const daemon = await standaloneDaemon(emulator, certDir);
    let nginx: Awaited<ReturnType<typeof startNginx>> | undefined;
    try {
      await until('certificate held', () => daemon.health.evaluate(Date.now()).healthy, [(l) => daemon.health.onChange(l)]);
      nginx = await startNginx(base, { certPath: join(certDir, DOMAIN, 'tls.crt'), keyPath: join(certDir, DOMAIN, 'tls.key'), pidFile });
      await waitServing(nginx, DOMAIN);
      // The pid file readable by uid 65532, as in a volume both containers mount.
      for (const d of [dir(), base]) await chmod(d, 0o755);
      // certshare's reload, as its container runs it: uid 65532, no capability.
      const reload = `import { SignalReload } from ${JSON.stringify(join(REPO, 'src/delivery/reload-signal.ts'))};
        const errors = [];
        const logger = { debug() {}, info() {}, warn() {}, error: (o) => errors.push(o.err), child: () => logger };
        const outcome = await new Promise((r) => void new SignalReload('SIGHUP', process.argv[1], { logger, onOutcome: r }).request('x'));
        console.log(JSON.stringify({ ok: outcome.ok, error: errors[0] }));
        process.exit(); // not waiting for the failed reload's retry`;
      const ran = spawnSync(
        'setpriv',
        ['--reuid=65532', '--regid=65532', '--clear-groups', '--', process.execPath, '--input-type=module', '-e', reload, pidFile],
        {
          encoding: 'utf8',
          timeout: 30_000,
        },
      );
      assert.equal(ran.status, 0, ran.stderr);
      const result = JSON.parse(ran.stdout) as { ok: boolean; error: string };
      assert.equal(result.ok, false);
      assert.match(result.error, /not permitted to send SIGHUP to pid \d+\b.*run the proxy's master as uid 65532/);
      assert.equal(nginx.exited, undefined);
    } finally {
      await daemon.stop();
      await nginx?.stop();
      await emulator.close();
    }
  });

  /** A pid that was a process's and is no more: a child that has exited and been reaped. */
  async function deadPid(): Promise<number> {
    const child = spawn(process.execPath, ['-e', '0'], { stdio: 'ignore' });
    await once(child, 'exit');
    return child.pid!;
  }

  for (const [name, content, error] of [
    ['garbage', async () => 'nginx\n', /does not hold one positive integer/],
    ['two pids', async () => '123 456\n', /does not hold one positive integer/],
    ['pid 1', async () => '1\n', /names pid 1/],
    ["certshare's own pid", async () => `${process.pid}\n`, /certshare's own pid/],
    ['the pid of a process that is gone', async () => `${await deadPid()}\n`, /is not running/],
  ] as const) {
    it(`refuses a pid file with ${name}: CERTSHARE_RELOAD_FAILED, counted, nothing signalled`, async () => {
      const base = join(dir(), name.replace(/\W+/g, '-'));
      const pidFile = `${base}.pid`;
      await writeFile(pidFile, await content());
      const { logger, entries } = recordingLogger();
      const emulator = await emulatorIn(dir(), { listen: `${base}.sock` });
      const daemon = await standaloneDaemon(emulator, join(base, 'store'), ['--reload-signal', 'HUP', '--reload-pidfile', pidFile], logger);
      try {
        // The first write of the certificate asks for a reload.
        const outcome: ReloadOutcome = await nextEvent(daemon.events, 'reloaded', () => true, 20_000);
        assert.equal(outcome.ok, false);
        assert.equal(outcome.method, 'signal');
        const logged = entries.find((e) => e.code === 'CERTSHARE_RELOAD_FAILED');
        assert.ok(logged, 'an error with CERTSHARE_RELOAD_FAILED is logged');
        assert.match(String(logged.err), error);
        const metrics = await (await fetch(`${daemon.address}/metrics`)).text();
        // The first failure, and any retry's since (from 1 s).
        assert.match(metrics, /certshare_reload_command_runs_total\{method="signal",result="failure"\} [1-9]/);
        assert.equal(daemon.health.evaluate(Date.now()).healthy, true, 'a failed reload takes nothing else down');
      } finally {
        await daemon.stop();
        await emulator.close();
      }
    });
  }
});
