// The Dockerfile's rules, read statically (milliseconds; the fast tier runs them). image.test.ts replays the
// same Dockerfile on the host (npm ci, the bundle, the entry point started): that one is in the slow tier.
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { envOf, execForm, instructions, lastArgs, NONROOT_UID, parseDockerfile, parseDockerignore } from '../support/dockerfile.ts';

const REPO = fileURLToPath(new URL('../../', import.meta.url));
const DISTROLESS = 'gcr.io/distroless/nodejs24-debian13:nonroot';
const DISTROLESS_NODE = '/nodejs/bin/node';

const stages = parseDockerfile(await readFile(join(REPO, 'Dockerfile'), 'utf8'));
const finalStage = stages.at(-1)!;

describe('Dockerfile', () => {
  it('ends on distroless Node 24 as nonroot (uid 65532, numeric), starting node directly in exec form (never npm)', () => {
    assert.equal(finalStage.image, DISTROLESS);
    assert.equal(lastArgs(finalStage, 'USER'), `${NONROOT_UID}:${NONROOT_UID}`, 'numeric: the kubelet checks runAsNonRoot against a number only');
    assert.equal(envOf(finalStage).NODE_ENV, 'production');
    const entrypoint = execForm(lastArgs(finalStage, 'ENTRYPOINT') ?? '');
    const cmd = execForm(lastArgs(finalStage, 'CMD') ?? '');
    // The young generation capped: V8 would size it from the node's memory. No --optimize-for-size: the daemon
    // sets it at 50 domains (src/http/heap-saving.ts). bench/lib/certshare.ts runs the same flags.
    // The default entry starts the standalone daemon from its start-up snapshot (test/repo/entry-commands.test.ts:
    // every other workload names dist/cli/main.js).
    assert.deepEqual(
      entrypoint,
      [DISTROLESS_NODE, '--max-semi-space-size=1', '--snapshot-blob', 'dist/snapshot/certshare-run.blob'],
      'exec-form ENTRYPOINT on node',
    );
    assert.deepEqual(cmd, ['run'], 'exec-form CMD');
    for (const arg of [...entrypoint!, ...cmd!]) assert.doesNotMatch(arg, /\bnpm\b|\bnpx\b/);
    // No shell in a distroless stage: its RUNs are Node itself, filling the compile cache (src/cli/compile-cache.ts) for
    // the account the image runs as (Node keeps one per uid), and building the start-up snapshot's blob with the Node
    // the image ships (a blob from another Node is refused at start).
    assert.deepEqual(
      instructions(finalStage, 'RUN').map((i) => execForm(i.args)),
      [
        [DISTROLESS_NODE, 'dist/cli/fill-compile-cache.js', String(NONROOT_UID)],
        [DISTROLESS_NODE, 'dist/cli/build-snapshot.js'],
      ],
      'the final stage runs only the compile-cache fill and the snapshot build, in exec form',
    );
  });

  it('copies only dist/ (the bundle) from the build stage into the final stage', () => {
    const copies = instructions(finalStage, 'COPY').map((i) => i.args.split(/\s+/));
    for (const tokens of copies) assert.match(tokens[0]!, /^--from=/, `final stage copies from build stages only: ${tokens.join(' ')}`);
    const sources = copies.map(([from, src]) => `${from!.slice('--from='.length)}:${src}`).sort();
    assert.deepEqual(sources, ['build:/app/dist']);
  });

  it('builds on a Debian Node 24 image: npm ci, then npm run build', () => {
    const build = stages.find((s) => s.name === 'build');
    assert.ok(build, 'stage "build"');
    assert.match(build.image, /^node:24(\.[\d.]+)?-(bookworm|trixie)-slim(@sha256:[0-9a-f]{64})?$/);
    const runs = instructions(build, 'RUN').map((i) => i.args);
    assert.ok(runs.some((r) => /^npm ci\b/.test(r) && !/--omit=dev/.test(r)));
    assert.ok(runs.includes('npm run build'));
  });

  it('keeps the pinned node binary, the compiler and the bundler out: all devDependencies', async () => {
    const pkg = JSON.parse(await readFile(join(REPO, 'package.json'), 'utf8')) as {
      dependencies: Record<string, string>;
      devDependencies: Record<string, string>;
      scripts: Record<string, string>;
    };
    const lock = JSON.parse(await readFile(join(REPO, 'package-lock.json'), 'utf8')) as { packages: Record<string, { dev?: boolean }> };
    for (const name of ['node', 'typescript', 'esbuild']) {
      assert.ok(pkg.devDependencies[name], `${name} is a devDependency`);
      assert.equal(pkg.dependencies[name], undefined);
      assert.equal(lock.packages[`node_modules/${name}`]?.dev, true, `${name} is dev-only in the lockfile`);
    }
    assert.equal(pkg.scripts.build, 'node scripts/build.ts');
  });

  it('.dockerignore sends only the sources and package files as build context', async () => {
    const ignored = parseDockerignore(await readFile(join(REPO, '.dockerignore'), 'utf8'));
    for (const path of [
      'node_modules/fastify/package.json',
      'dist/cli/main.js',
      '.git/HEAD',
      'test/repo/image.test.ts',
      'manifests/base/rbac.yaml',
      '.cluster/kubeconfig',
      'Dockerfile',
    ]) {
      assert.ok(ignored(path), `${path} stays out of the context`);
    }
    for (const path of ['tsconfig.build.json', 'scripts/check-node.js']) assert.ok(ignored(path), `${path} stays out of the context`);
    for (const path of ['package.json', 'package-lock.json', 'tsconfig.json', 'scripts/build.ts', 'src/cli/main.ts', 'src/kube/kube-backend.ts']) {
      assert.ok(!ignored(path), `${path} is in the context`);
    }
  });
});
