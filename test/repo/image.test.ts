// The container image without a Docker engine (its rules read statically: dockerfile-rules.test.ts): the
// Dockerfile's COPY and RUN steps replayed on the host (npm ci from the registry, the esbuild bundle) and the final stage's files started
// with the ENTRYPOINT it declares, as a non-root user on a tree it cannot write.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { chmod, chown, mkdir, readdir, readFile, stat } from 'node:fs/promises';
import { dirname, join, relative } from 'node:path';
import { createInterface } from 'node:readline';
import { after, before, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { startEmulator } from '../../src/emulator/server.ts';
import { ADVERTISE_AGENT_COMMAND, DIST_COMMAND } from '../../src/injector/sidecar.ts';
import { DOMAIN, tempDir } from '../support/standalone.ts';
import { execForm, isDistroless, lastArgs, NONROOT_UID, parseDockerfile, replayDockerfile, replayRunEnv, type ReplayedStage } from '../support/dockerfile.ts';

const REPO = fileURLToPath(new URL('../../', import.meta.url));
const DISTROLESS_NODE = '/nodejs/bin/node';

const stages = parseDockerfile(await readFile(join(REPO, 'Dockerfile'), 'utf8'));
const finalStage = stages.at(-1)!;

async function filesUnder(dir: string): Promise<string[]> {
  const entries = await readdir(dir, { recursive: true, withFileTypes: true });
  return entries.filter((e) => !e.isDirectory()).map((e) => relative(dir, join(e.parentPath, e.name)));
}

describe('the image, replayed outside Docker', { timeout: 15 * 60_000 }, () => {
  let dir: { path: string; remove(): Promise<void> };
  let final: ReplayedStage;
  let app: string;

  before(
    async () => {
      dir = await tempDir('certshare-image-');
      await chmod(dir.path, 0o755); // the non-root run below must reach the files
      const started = performance.now();
      // Node 24 (this process) first on PATH for RUN steps.
      const replayed = await replayDockerfile(stages, {
        context: REPO,
        workDir: dir.path,
        runEnv: replayRunEnv(dirname(process.execPath)),
        shellless: isDistroless,
        imageCommands: { [DISTROLESS_NODE]: process.execPath },
      });
      final = replayed.at(-1)!;
      app = join(final.root, final.workdir);
      process.stderr.write(`# image replay (npm ci, bundle): ${Math.round(performance.now() - started)} ms\n`);
    },
    { timeout: 10 * 60_000 },
  );

  after(() => dir?.remove());

  /** The final stage's ENTRYPOINT with extra arguments, node mapped to this Node 24. */
  function entrypoint(args: string[]): string[] {
    const [node, ...rest] = execForm(lastArgs(finalStage, 'ENTRYPOINT')!)!;
    assert.equal(node, DISTROLESS_NODE);
    return [process.execPath, ...rest, ...args];
  }

  it('holds dist/ only: the entry point, its chunks and package.json, no node_modules', async () => {
    assert.deepEqual(await readdir(app), ['dist']);
    const dist = await filesUnder(join(app, 'dist'));
    assert.ok(dist.includes('cli/main.js'), 'the ENTRYPOINT script');
    assert.ok(
      dist.some((f) => /^chunks\/kube-backend-\w+\.js$/.test(f)),
      'the Kubernetes backend, a chunk loaded in kube mode only',
    );
    assert.deepEqual(
      dist.filter((f) => !f.endsWith('.js') && !f.startsWith('compile-cache/')).sort(),
      ['agent/advertise-agent.cjs', 'package.json', 'snapshot/certshare-run.blob', 'snapshot/certshare-run.cjs'],
      "dist holds JavaScript, its package.json, the compile cache, the start-up snapshot (the final stage's blob) and the advertise agent's script only",
    );
    const chunks = dist.filter((f) => f.startsWith('chunks/')).length;
    // For the account the image runs as; a replay not run by root can fill only its own account's.
    const uid = process.getuid?.() === 0 ? NONROOT_UID : process.getuid?.();
    const cached = dist.filter((f) => new RegExp(`^compile-cache/${process.version}-${process.arch}-\\w+-${uid}/`).test(f));
    // Every chunk but the three the fill itself imports before it turns the cache on (the cache's own module,
    // the start-up switch of heap-saving.ts, which main.ts also loads first, and esbuild's helpers, ~1 KB each).
    assert.ok(cached.length >= chunks - 3, `the final stage's RUN cached ${cached.length} of ${chunks} chunks for Node ${process.version} and uid ${uid}`);
    assert.deepEqual(
      dist.filter((f) => f.startsWith('compile-cache/') && !cached.includes(f)),
      [],
      "no other account's or Node's cache (the build stage's is left behind)",
    );
    if (process.getuid?.() === 0) {
      // Made as 65532, handed back to root: a compromised sidecar cannot plant code for the next start.
      for (const file of cached) {
        const st = await stat(join(app, 'dist', file));
        assert.equal(st.uid, 0, `${file} is root's`);
        assert.equal(st.mode & 0o022, 0, `${file} is writable by root alone`);
      }
    }
    assert.ok(!dist.some((f) => f.includes('node_modules/')), 'no node_modules: the dependencies are bundled');
    const pkg = JSON.parse(await readFile(join(app, 'dist/package.json'), 'utf8')) as { type: string };
    assert.equal(pkg.type, 'module', 'the bundle is ES modules: dist/package.json must say so');
  });

  it('starts: run --help and emulator --help exit 0', () => {
    for (const command of ['run', 'emulator']) {
      const [file, ...args] = entrypoint([command, '--help']);
      const res = spawnSync(file!, args, { cwd: app, encoding: 'utf8', env: { PATH: '/usr/bin:/bin', ...final.env }, timeout: 30_000 });
      assert.equal(res.status, 0, `${command} --help: ${res.stderr}`);
      assert.match(res.stdout, command === 'run' ? /CERTSHARE_READINESS_GATE/ : /Usage: certshare emulator/);
    }
  });

  it("the advertise agent's command, as the injector writes it, starts from the image's tree: --help exits 0", () => {
    const [node, ...rest] = ADVERTISE_AGENT_COMMAND;
    assert.equal(node, DISTROLESS_NODE);
    const res = spawnSync(process.execPath, [...rest, '--help'], { cwd: app, encoding: 'utf8', env: { PATH: '/usr/bin:/bin', ...final.env }, timeout: 30_000 });
    assert.equal(res.status, 0, `the agent --help: ${res.stderr}`);
    assert.match(res.stdout, /--advertise-services/);
  });

  it("only run reads the compile cache: the injector's and the other commands' flags would have it refused and held", () => {
    const [node, ...rest] = DIST_COMMAND;
    assert.equal(node, DISTROLESS_NODE);
    for (const command of ['injector', 'renew', 'advertise-agent', 'emulator']) {
      const res = spawnSync(process.execPath, [...rest, command, '--help'], {
        cwd: app,
        encoding: 'utf8',
        env: { PATH: '/usr/bin:/bin', ...final.env, NODE_DEBUG_NATIVE: 'COMPILE_CACHE' },
        timeout: 30_000,
      });
      assert.equal(res.status, 0, `${command} --help: ${res.stderr}`);
      assert.doesNotMatch(res.stderr, /\[compile cache\]/, `${command} --help`);
    }
  });

  it('every chunk loads with nothing installed (kube client and emulator included)', async () => {
    const chunks = (await filesUnder(join(app, 'dist'))).filter((f) => f.startsWith('chunks/'));
    assert.ok(chunks.length > 3, `${chunks.length} chunks`);
    const script = `for (const m of ${JSON.stringify(chunks)}) await import('./dist/' + m);`;
    const res = spawnSync(process.execPath, ['--input-type=module', '-e', script], {
      cwd: app,
      encoding: 'utf8',
      env: { PATH: '/usr/bin:/bin', ...final.env },
      timeout: 60_000,
    });
    assert.equal(res.status, 0, res.stderr);
  });

  it('its emulator issues a certificate pair (the x509 stack works bundled)', async () => {
    const [file, ...args] = entrypoint(['emulator', '--listen', '127.0.0.1:0', '--domain', DOMAIN]);
    const child = spawn(file!, args, { cwd: app, env: { PATH: '/usr/bin:/bin', ...final.env }, stdio: ['ignore', 'pipe', 'inherit'] });
    try {
      let address: string | undefined;
      for await (const line of createInterface(child.stdout!)) {
        const entry = JSON.parse(line) as { msg: string; address?: string };
        if (entry.msg === 'emulator listening') {
          address = entry.address;
          break;
        }
      }
      assert.ok(address, 'the emulator logged its address');
      const res = await fetch(`${address}/localapi/v0/cert/${DOMAIN}?type=pair`, { headers: { 'Sec-Tailscale': 'localapi' } });
      const body = await res.text();
      assert.equal(res.status, 200, body);
      assert.match(body, /-----BEGIN EC PRIVATE KEY-----[\s\S]+-----BEGIN CERTIFICATE-----/);
    } finally {
      child.kill('SIGKILL');
    }
  });

  it('runs as a non-root user without writing to its tree: healthy against the emulator, exits 0 on SIGTERM', async () => {
    // The image's entry (the standalone daemon from its start-up snapshot: no chunk loaded), then the command
    // Kubernetes workloads name (dist/cli/main.js: its chunks from the compile cache).
    await runsAsNonRoot(entrypoint([]), 'snapshot');
    const [node, ...rest] = DIST_COMMAND;
    assert.equal(node, DISTROLESS_NODE);
    await runsAsNonRoot([process.execPath, ...rest], 'chunks');
  });

  async function runsAsNonRoot(command: string[], loads: 'snapshot' | 'chunks'): Promise<void> {
    const before = await filesUnder(app);
    const store = join(dir.path, `store-${loads}`);
    await mkdir(store);
    const asRoot = process.getuid?.() === 0;
    if (asRoot) await chown(store, NONROOT_UID, NONROOT_UID);
    // As uid 65532 (distroless's nonroot) when we can: the tree is root's, so any write into it fails.
    const prefix =
      asRoot && spawnSync('setpriv', ['--version']).status === 0 ? ['setpriv', `--reuid=${NONROOT_UID}`, `--regid=${NONROOT_UID}`, '--clear-groups', '--'] : [];
    const emulator = await startEmulator({ listen: '127.0.0.1:0', domains: [DOMAIN] });
    const [file, ...args] = [
      ...prefix,
      ...command,
      ...['run', '--acme-directory', 'none', '--localapi', emulator.address, '--domain', DOMAIN, '--store', `dir:${store}`, '--listen', '127.0.0.1:0'],
    ];
    const child = spawn(file!, args, {
      cwd: app,
      // The image's environment; TMPDIR and HOME point nowhere: the daemon must not need them.
      // NODE_DEBUG_NATIVE: Node says on stderr whether it took the image's compile cache.
      env: { PATH: '/usr/bin:/bin', ...final.env, HOME: '/nonexistent', TMPDIR: '/nonexistent', NODE_DEBUG_NATIVE: 'COMPILE_CACHE' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stderr = '';
    child.stderr!.setEncoding('utf8').on('data', (c: string) => (stderr += c));
    try {
      let address: string | undefined;
      for await (const line of createInterface(child.stdout!)) {
        const entry = JSON.parse(line) as { msg: string; address?: string };
        if (entry.msg === 'certshare started') address = entry.address;
        if (entry.msg === 'healthy') break;
      }
      assert.ok(address, `the daemon started and logged its address; stderr: ${stderr}`);
      const healthz = await fetch(`${address}/healthz`);
      assert.equal(healthz.status, 200);
      const metrics = await (await fetch(`${address}/metrics`)).text();
      assert.match(metrics, /certshare_certificate_expiration_timestamp_seconds\{domain="web\.tailnet-test\.ts\.net"\}/);
      const exited = once(child, 'exit');
      child.kill('SIGTERM');
      const [code] = (await exited) as [number | null];
      assert.equal(code, 0, stderr);
      // The image holds the cache of the account it runs as (65532), or of the account replaying it: a root
      // replay without setpriv runs the daemon as root, which has none and compiles as before.
      if (loads === 'snapshot') assert.doesNotMatch(stderr, /dist\/chunks\//, 'started from the snapshot: no chunk loaded');
      else if (prefix.length > 0 || !asRoot) {
        assert.match(stderr, /V8 code cache for ESM file:\S+\/dist\/chunks\/\S+ was accepted/, 'the chunks came from the compile cache');
      }
      assert.doesNotMatch(stderr, /was rejected/, 'no entry of the cache was refused');
      assert.deepEqual((await filesUnder(app)).sort(), before.sort(), 'nothing written into the image tree');
      assert.ok((await readdir(store)).includes(DOMAIN), 'certificates written to the mounted store');
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await emulator.close();
    }
  }
});
