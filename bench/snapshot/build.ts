// A V8 startup snapshot of the standalone daemon (a prototype, not in the image: docs/performance.md's
// Start-up). `node --build-snapshot` runs one CommonJS script and serializes the heap it leaves; a process
// started with `--snapshot-blob` then begins with fastify, pino, prom-client, @peculiar/x509 and certshare's
// standalone modules already evaluated, and runs bench/snapshot/entry.ts's main function.
//   node bench/snapshot/build.ts DIR   # DIR/certshare-run.cjs and DIR/certshare-run.blob, for dist/
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { mkdir, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { build, type Plugin } from 'esbuild';
import { DIST, productionBundleOptions } from '../../scripts/build.ts';

/**
 * Node built-ins that cannot be loaded while a snapshot is built (Node 24.21): node:http's parser binding
 * leaves a global handle V8 cannot serialize ("global handle not serialized: ... HTTPParser", then
 * "CheckGlobalAndEternalHandles failed" and a crash); https and tls load it too. Each becomes an object of
 * getters that loads the real module at the first read, after deserialization. The data fastify reads at
 * load (STATUS_CODES, METHODS) is copied in as constants.
 */
const LAZY_BUILTINS = /^(node:)?(http|https|tls)$/;
const CONSTANT_EXPORTS = ['STATUS_CODES', 'METHODS'];

const lazyBuiltins: Plugin = {
  name: 'lazy-builtins',
  setup(b) {
    b.onResolve({ filter: LAZY_BUILTINS }, (args) => ({ path: args.path.replace(/^node:/, ''), namespace: 'lazy-builtin' }));
    b.onLoad({ filter: /.*/, namespace: 'lazy-builtin' }, (args) => {
      const real = createRequire(import.meta.url)(`node:${args.path}`) as Record<string, unknown>;
      const lazy = Object.keys(real).filter((name) => !CONSTANT_EXPORTS.includes(name));
      const constants = CONSTANT_EXPORTS.filter((name) => name in real).map((name) => `exports.${name} = ${JSON.stringify(real[name])};`);
      return {
        loader: 'js',
        contents: [
          `let real;\nconst load = () => (real ??= process.getBuiltinModule('node:${args.path}'));`,
          `for (const name of ${JSON.stringify(lazy)}) {`,
          '  Object.defineProperty(exports, name, { enumerable: true, configurable: true, get: () => load()[name] });',
          '}',
          ...constants,
        ].join('\n'),
      };
    });
  },
};

/**
 * The Kubernetes code stays out of the script (its source would sit in every snapshot-started heap): Kubernetes
 * mode and `--tls secret:` are not started from the snapshot (entry.ts hands them to dist/).
 */
const withoutKube: Plugin = {
  name: 'without-kube',
  setup(b) {
    b.onResolve({ filter: /^\.{1,2}\/(kube\/)?(kube-backend|tls-secret)\.ts$/ }, (args) =>
      args.kind === 'dynamic-import' && /\/src\/(daemon|kube)\/[\w-]+\.ts$/.test(args.importer) ? { path: args.path, namespace: 'without-kube' } : undefined,
    );
    b.onLoad({ filter: /.*/, namespace: 'without-kube' }, () => ({
      loader: 'js',
      contents:
        "const absent = () => { throw new Error('Kubernetes mode is not in the snapshot'); };\nexport { absent as createKubeBackend, absent as TlsSecret };\n",
    }));
  },
};

/**
 * State a module takes at load time is the build's in a snapshot. prom-client's process_start_time_seconds
 * is computed when its module loads: read at the first scrape instead (process.uptime() is the running
 * process's). pino's hostname (its default `base`, which certshare replaces) and the start of its
 * nanosecond clock (isoTimeNano, unused) are the build's as well.
 */
const startTimeAtRunTime: Plugin = {
  name: 'start-time-at-run-time',
  setup(b) {
    b.onLoad({ filter: /prom-client\/lib\/metrics\/processStartTime\.js$/ }, async (args) => {
      const { readFile } = await import('node:fs/promises');
      const source = await readFile(args.path, 'utf8');
      const computed = 'const startInSeconds = Math.round(Date.now() / 1000 - process.uptime());';
      const read = 'this.set(labels, startInSeconds);';
      if (!source.includes(computed) || !source.includes(read)) throw new Error(`bench/snapshot/build.ts: ${args.path} changed shape`);
      const contents = source
        .replace(computed, 'let startInSeconds;')
        .replace(read, 'this.set(labels, (startInSeconds ??= Math.round(Date.now() / 1000 - process.uptime())));');
      return { loader: 'js', contents };
    });
  },
};

export interface SnapshotBuild {
  script: string;
  blob: string;
}

/** Bundles entry.ts into `dir` as one CommonJS script and builds its snapshot with this Node; `distMain` serves the rest. */
export async function buildSnapshot(dir: string, distMain: string = join(DIST, 'cli/main.js')): Promise<SnapshotBuild> {
  await mkdir(dir, { recursive: true });
  const script = join(dir, 'certshare-run.cjs');
  const blob = join(dir, 'certshare-run.blob');
  const options = productionBundleOptions();
  await build({
    ...options,
    format: 'cjs',
    banner: {},
    splitting: false,
    define: { CERTSHARE_DIST_MAIN: JSON.stringify(resolve(distMain)) },
    entryPoints: [join(import.meta.dirname, 'entry.ts')],
    outfile: script,
    plugins: [lazyBuiltins, withoutKube, startTimeAtRunTime, ...(options.plugins ?? []).filter((p) => p.name !== 'node-http-without-undici')],
  });
  // withoutCodeCache: Node's code cache for its built-ins is most of a default blob, and a started process's
  // anonymous memory grows by about its blob's size: that costs more than the compiling it saves
  // (docs/performance.md).
  const config = join(dir, 'snapshot-config.json');
  await writeFile(config, `${JSON.stringify({ builder: script, withoutCodeCache: true })}\n`);
  const built = spawnSync(process.execPath, ['--snapshot-blob', blob, '--build-snapshot-config', config], { encoding: 'utf8', timeout: 120_000 });
  if (built.status !== 0) throw new Error(`node --build-snapshot-config ${config} exited ${built.status ?? built.signal}: ${built.stderr.slice(-2000)}`);
  return { script, blob };
}

if (import.meta.main) {
  const [dir, ...more] = process.argv.slice(2);
  if (!dir || dir.startsWith('-') || more.length > 0) {
    process.stderr.write('Usage: node bench/snapshot/build.ts DIR   (the snapshot of the standalone daemon, for dist/)\n');
    process.exit(2);
  }
  const { blob } = await buildSnapshot(resolve(dir));
  process.stdout.write(`${blob}\n`);
}
