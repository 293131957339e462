// The standalone daemon started from bench/snapshot/'s V8 startup snapshot behaves as dist/'s does: it issues,
// answers /healthz, renews, reports its own start time (a module's load-time state is the snapshot build's
// unless the build moves it), and hands every other command line to dist/. Nothing is timed here:
// bench/snapshot/compare.ts measures.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, before, describe, it } from 'node:test';
import { buildDist, CertFileWatch, type EmulatorProc, IMAGE_NODE_FLAGS, startEmulator } from '../../bench/lib/certshare.ts';
import { freePort, httpRequest, pollHealthy } from '../../bench/lib/http.ts';
import { cleanEnv, Proc, stopAll } from '../../bench/lib/proc.ts';
import { buildSnapshot } from '../../bench/snapshot/build.ts';

const DOMAIN = 'snap.tailnet-0000.ts.net';

describe('the standalone daemon started from a V8 startup snapshot', () => {
  let dir: string;
  let blob: string;
  let builtAt: number;
  let emulator: EmulatorProc;

  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'certshare-snapshot-test-'));
    const dist = join(dir, 'dist');
    ({ blob } = await buildSnapshot(join(dir, 'snapshot'), join(dist, 'cli/main.js')));
    builtAt = Date.now();
    await buildDist(dist);
    // Certificates of 20 s: renewed at half their lifetime, seconds into the test.
    emulator = await startEmulator(join(dir, 'emulator'), 'snapshot', ['--domain', DOMAIN, '--cert-lifetime', '20s']);
  });

  after(async () => {
    await stopAll();
    await rm(dir, { recursive: true, force: true });
  });

  const fromSnapshot = (args: string[]) => spawnSync(process.execPath, ['--snapshot-blob', blob, ...args], { encoding: 'utf8', timeout: 30_000 });

  it('issues, answers /healthz, renews, and says when it started, not when the snapshot was built', async () => {
    // process_start_time_seconds is whole seconds: a start two seconds after the build tells the two apart
    // (building dist/ and starting the emulator usually took longer already).
    await sleep(Math.max(0, builtAt + 2000 - Date.now()));
    const certDir = join(dir, 'certs');
    const files = await CertFileWatch.start(certDir, DOMAIN);
    const port = await freePort();
    const startedAt = Date.now();
    const flags = ['--name-limit', '0', '--first-retry', '1s', '--acme-directory', 'none', '--localapi', emulator.socket];
    const daemon = new Proc(
      'daemon from the snapshot',
      [...IMAGE_NODE_FLAGS, '--snapshot-blob', blob, 'run', ...flags, '--store', `dir:${certDir}`, '--domain', DOMAIN, '--listen', `127.0.0.1:${port}`],
      { env: cleanEnv(), mustRun: true },
    );
    try {
      const first = await files.next(30_000);
      await pollHealthy(port, 20_000, () => daemon.exitInfo === undefined);
      const renewed = await files.next(60_000);
      assert.notEqual(renewed.pem, first.pem, 'a renewal writes a new certificate');
      const metrics = await httpRequest({ port }, 'GET', '/metrics');
      const started = Number(/^process_start_time_seconds (\d+)$/m.exec(metrics.body)?.[1]);
      assert.ok(started >= Math.floor(startedAt / 1000) - 1, `process_start_time_seconds ${started}, started at ${startedAt / 1000}`);
    } finally {
      await daemon.stop();
      files.close();
    }
    assert.equal(daemon.exitInfo?.code, 0, 'SIGTERM: a clean stop');
  });

  it('hands other commands, and command lines it refuses, to dist/', () => {
    const help = fromSnapshot(['emulator', '--help']);
    assert.equal(help.status, 0, help.stderr);
    assert.match(help.stdout, /^Usage: certshare emulator /);
    const wrong = fromSnapshot(['run', '--domain', DOMAIN, '--no-such-flag']);
    assert.equal(wrong.status, 2);
    assert.match(wrong.stderr, /^certshare: .*Unknown option '--no-such-flag' \[CERTSHARE_BAD_FLAG\]\n$/);
  });
});
