// The standalone daemon started from the image's V8 startup snapshot (dist/snapshot/, the Dockerfile's
// ENTRYPOINT) behaves as dist/'s does: it issues,
// answers /healthz, renews, reports its own start time (a module's load-time state is the snapshot build's
// unless the build moves it), and hands every other command line to dist/. Nothing is timed here:
// bench/snapshot/compare.ts measures.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { cp, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, before, describe, it } from 'node:test';
import { buildDist, CertFileWatch, type EmulatorProc, IMAGE_NODE_FLAGS, imageEntry, startEmulator } from '../../bench/lib/certshare.ts';
import { freePort, httpRequest, pollHealthy } from '../../bench/lib/http.ts';
import { cleanEnv, Proc, stopAll } from '../../bench/lib/proc.ts';
import { SNAPSHOT_SCRIPT } from '../../src/config/snapshot-files.ts';

const DOMAIN = 'snap.tailnet-0000.ts.net';

describe('the standalone daemon started from a V8 startup snapshot', () => {
  let dir: string;
  let blob: string;
  let builtAt: number;
  let emulator: EmulatorProc;

  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'certshare-snapshot-test-'));
    await buildDist(join(dir, 'dist'));
    builtAt = Date.now();
    const [flag, path] = imageEntry();
    assert.equal(flag, '--snapshot-blob', "the Dockerfile's ENTRYPOINT starts from the snapshot");
    blob = path!;
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

  it("holds none of the certificate authority's packages, which the standalone daemon never loads", async () => {
    // Every snapshot-started heap deserializes what the script evaluated: @peculiar/x509 and its ASN.1 and
    // dependency-injection packages are only the emulator's and the injector's (src/pki/ca.ts).
    const script = await readFile(join(dir, 'dist', SNAPSHOT_SCRIPT), 'utf8');
    assert.deepEqual(script.match(/@peculiar\/[\w-]+|asn1js|tsyringe|reflect-metadata/g) ?? [], []);
  });

  it('a process that cannot use the blob starts nothing: a missing blob, a corrupt one, one from another Node', async () => {
    const certDir = join(dir, 'refused-certs');
    const daemonArgs = ['run', '--name-limit', '0', '--localapi', emulator.socket, '--store', `dir:${certDir}`, '--domain', DOMAIN, '--listen', '127.0.0.1:0'];
    const corrupt = join(dir, 'corrupt.blob');
    await writeFile(corrupt, 'not a V8 startup snapshot\n'.repeat(100));
    const blobs: Array<[string, string]> = [
      ['missing', join(dir, 'no-such.blob')],
      ['corrupt', corrupt],
    ];
    // A blob from another Node: the machine's own node, when it is another version than this one.
    const other = spawnSync('node', ['--version'], { encoding: 'utf8', env: { PATH: '/usr/local/bin:/usr/bin:/bin' } });
    if (other.status === 0 && other.stdout.trim() !== process.version) {
      const otherBlob = join(dir, 'other-node.blob');
      const script = join(dir, 'other-node.cjs');
      await writeFile(script, "require('node:v8').startupSnapshot.setDeserializeMainFunction(() => {});\n");
      const built = spawnSync('node', ['--snapshot-blob', otherBlob, '--build-snapshot', script], {
        encoding: 'utf8',
        env: { PATH: '/usr/local/bin:/usr/bin:/bin' },
      });
      assert.equal(built.status, 0, built.stderr);
      blobs.push([`from Node ${other.stdout.trim()}`, otherBlob]);
    }
    for (const [what, path] of blobs) {
      const res = spawnSync(process.execPath, [...IMAGE_NODE_FLAGS, '--snapshot-blob', path, ...daemonArgs], {
        // cwd: the temporary directory, where a core dump of the corrupt blob's abort would go, were dumps on.
        cwd: dir,
        encoding: 'utf8',
        timeout: 30_000,
        env: cleanEnv(),
      });
      assert.notEqual(res.status, 0, `${what}: exits non-zero (${res.status ?? res.signal})`);
      assert.equal(res.stdout, '', `${what}: nothing of certshare ran (no log line)`);
      assert.ok(!existsSync(certDir), `${what}: no store made, nothing issued`);
    }
  });

  it('hands nothing to a dist/ without its entry: CERTSHARE_SNAPSHOT_UNUSABLE, and the build refuses such a blob', async () => {
    const broken = join(dir, 'broken-dist');
    await cp(join(dir, 'dist'), broken, { recursive: true });
    await rm(join(broken, 'cli/main.js'));
    const handed = spawnSync(process.execPath, ['--snapshot-blob', join(broken, 'snapshot/certshare-run.blob'), 'emulator', '--help'], {
      encoding: 'utf8',
      timeout: 30_000,
    });
    assert.equal(handed.status, 1);
    assert.match(handed.stderr, /^certshare: start-up snapshot .*cli\/main\.js, which is missing \[CERTSHARE_SNAPSHOT_UNUSABLE\]\n$/);
    // What the image's final stage runs: it starts the blob once and fails the build.
    const built = spawnSync(process.execPath, [join(broken, 'cli/build-snapshot.js')], { encoding: 'utf8', timeout: 120_000 });
    assert.equal(built.status, 1, built.stderr);
    assert.match(built.stderr, /^certshare: start-up snapshot \S+certshare-run\.blob: Node v\S+ could not start it .*\[CERTSHARE_SNAPSHOT_UNUSABLE\]\n$/s);
    assert.ok(!existsSync(join(broken, 'snapshot/certshare-run.blob')), 'the unusable blob is removed');
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
