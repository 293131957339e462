// `npm run build`: the production build, dist/, as a bundle: dist/cli/main.js (the entry point), chunks
// loaded on demand (the Kubernetes backend, the emulator, the demo, the Kubernetes models certshare does
// not use: kubeModelsOnDemand), dist/package.json, and the standalone daemon's start-up snapshot
// (dist/snapshot/: the script, and its blob for the Node building). dist/ runs with no node_modules at all: the image
// copies it alone.
//
// Why a bundle and not tsc's one-file-per-module output: memory. Node keeps per-module state for every
// ES/CommonJS module it loads, and @kubernetes/client-node alone is ~1,000 of them (its generated models
// and API groups, loaded in full by KubeConfig). Bundled and minified, the kube reader's idle RSS drops by
// about 40 MB (see `npm run bench`). Type checking stays with `tsc --noEmit` (npm test).
import { readdirSync, readFileSync } from 'node:fs';
import { mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { createRequire } from 'node:module';
import { spawnSync } from 'node:child_process';
import { build, type BuildOptions, type Metafile, type Plugin } from 'esbuild';
import { ADVERTISE_AGENT_SCRIPT, SNAPSHOT_SCRIPT } from '../src/config/snapshot-files.ts';

const REPO = resolve(import.meta.dirname, '..');
export const DIST = join(REPO, 'dist');

export interface BuildResult {
  /** Packages bundled into dist/ (name -> bytes of their source taken in). */
  packages: Map<string, number>;
}

/** The package a bundled file belongs to (`node_modules/@scope/name/...` -> `@scope/name`), or undefined for ours. */
function packageOf(input: string): string | undefined {
  const at = input.lastIndexOf('node_modules/');
  if (at < 0) return undefined;
  const [first, second] = input.slice(at + 'node_modules/'.length).split('/');
  return first!.startsWith('@') ? `${first}/${second}` : first;
}

/**
 * Names of the packages only `npm ci` (not `npm ci --omit=dev`) installs, from the lockfile. They stay
 * out of the bundle, so it holds exactly the production dependencies and our code: a production
 * package's optional require() of one (debug -> supports-color) stays a require() that fails and is
 * caught at run time, as it would with `npm ci --omit=dev`.
 */
async function devOnlyPackages(): Promise<string[]> {
  const lock = JSON.parse(await readFile(join(REPO, 'package-lock.json'), 'utf8')) as { packages: Record<string, { dev?: boolean }> };
  const production = new Set<string>();
  const dev = new Set<string>();
  for (const [path, entry] of Object.entries(lock.packages)) {
    const name = path ? packageOf(path) : undefined;
    if (name) (entry.dev ? dev : production).add(name);
  }
  return [...dev].filter((name) => !production.has(name));
}

/** Imports of dev-only packages from our own code: they would fail in the image. */
function devImportsFromSource(metafile: Metafile, devOnly: Set<string>): string[] {
  const found: string[] = [];
  for (const [input, { imports }] of Object.entries(metafile.inputs)) {
    if (!input.startsWith('src/')) continue;
    for (const i of imports) {
      const name = i.path.startsWith('@') ? i.path.split('/').slice(0, 2).join('/') : i.path.split('/')[0]!;
      if (i.external && devOnly.has(name)) found.push(`${input} imports ${i.path}`);
    }
  }
  return found;
}

function bundledPackages(metafile: Metafile): Map<string, number> {
  const packages = new Map<string, number>();
  for (const [input, { bytes }] of Object.entries(metafile.inputs)) {
    const name = packageOf(input);
    if (name) packages.set(name, (packages.get(name) ?? 0) + bytes);
  }
  return packages;
}

/** node:http's exports that are lazy getters loading Node's bundled undici (Node 24). */
const UNDICI_BACKED_HTTP_EXPORTS = new Set(['WebSocket', 'CloseEvent', 'MessageEvent']);

/**
 * Every ES import of node:http in the bundle (ours, @kubernetes/client-node's) goes through a module that
 * takes node:http's CommonJS exports instead. Node 24 builds the ES facade of a built-in by reading each
 * export, and three of node:http's are lazy getters that load Node's bundled undici (WebSocket, fetch's
 * engine): about 30 ms of start-up and 2.4 MB of RSS in every process, for a client nothing here uses.
 * require('node:http') (the bundled CommonJS packages') never touched them. Importing one of those three
 * fails the build.
 */
const httpWithoutUndici: Plugin = {
  name: 'node-http-without-undici',
  setup(b) {
    b.onResolve({ filter: /^(node:)?http$/ }, (args) =>
      args.kind === 'import-statement' || args.kind === 'dynamic-import' ? { path: 'node:http', namespace: 'node-http-cjs' } : undefined,
    );
    b.onLoad({ filter: /.*/, namespace: 'node-http-cjs' }, () => {
      const names = Object.keys(createRequire(import.meta.url)('node:http')).filter((name) => !UNDICI_BACKED_HTTP_EXPORTS.has(name));
      return {
        loader: 'js',
        contents: `const http = process.getBuiltinModule('node:http');\nexport default http;\nexport const { ${names.join(', ')} } = http;\n`,
      };
    });
  },
};

/**
 * Modules some bundled package requires at load time for a feature certshare never uses: each becomes a
 * stand-in, so the process never pays for it. fastify's server.js requires node:http2 for its `http2`
 * option (off here): loading it costs ~9 MB of RSS and ~15 ms of start-up in standalone mode, which has
 * no other use for it; the stand-in loads the real one at the first property read. prom-client's index
 * requires its Pushgateway (node:zlib, node:https); its stand-in fails if ever constructed.
 */
const LOAD_TIME_STAND_INS: Array<{ importer: RegExp; path: RegExp; contents: string }> = [
  {
    importer: /node_modules\/fastify\/lib\/server\.js$/,
    path: /^node:http2$/,
    contents: "let http2;\nmodule.exports = new Proxy({}, { get: (_, name) => (http2 ??= require('node:http2'))[name] });\n",
  },
  {
    importer: /node_modules\/prom-client\/index\.js$/,
    path: /^\.\/lib\/pushgateway$/,
    contents:
      'module.exports = class Pushgateway {\n' +
      "  constructor() { throw new Error('prom-client Pushgateway is left out of the certshare bundle (scripts/build.ts)'); }\n" +
      '};\n',
  },
  {
    // nodejs_gc_duration_seconds: a PerformanceObserver that runs JavaScript after every garbage collection
    // (~35-50 us each; with 1 MB semi-spaces a scavenge every ~130 /healthz responses under load, ~2% of
    // the daemon's CPU there). collectNodeMetrics (src/http/daemon-metrics.ts) drops the metric from the sources' runs.
    importer: /node_modules\/prom-client\/lib\/defaultMetrics\.js$/,
    path: /^\.\/metrics\/gc$/,
    contents: 'module.exports = () => {};\nmodule.exports.metricNames = [];\n',
  },
  {
    // fastify's default schema compilers (ajv, ajv-formats, fast-json-stringify, fast-uri: ~300 KB of the
    // chunk every mode compiles at start-up). fastify requires them only when its compilersFactory lacks
    // one, and certshare gives both (src/http/no-schemas.ts NO_SCHEMAS).
    importer: /node_modules\/fastify\/lib\/schema-controller\.js$/,
    path: /^@fastify\/(ajv-compiler|fast-json-stringify-compiler)$/,
    contents:
      "module.exports = () => { throw new Error('fastify schema compilers are left out of the certshare bundle " +
      "(scripts/build.ts; src/http/no-schemas.ts NO_SCHEMAS)'); };\n",
  },
  {
    // prom-client's exemplars (a trace's IDs beside a sample, from @opentelemetry/api, loaded by every process
    // with a registry): read only for a metric made with enableExemplars, which certshare never asks for.
    importer: /node_modules\/prom-client\/lib\/metrics\/processCpuTotal\.js$/,
    path: /^@opentelemetry\/api$/,
    contents:
      "module.exports = new Proxy({}, { get: () => { throw new Error('prom-client exemplars are left out of the certshare bundle " +
      "(scripts/build.ts)'); } });\n",
  },
  {
    // prom-client's Summary (its quantiles are t-digests): certshare's metrics have no Summary.
    importer: /node_modules\/prom-client\/lib\/timeWindowQuantiles\.js$/,
    path: /^tdigest$/,
    contents:
      "module.exports.TDigest = class TDigest { constructor() { throw new Error('prom-client Summary is left out of the certshare bundle " +
      "(scripts/build.ts)'); } };\n",
  },
  {
    // pino's transports (a worker thread fed through thread-stream): certshare's loggers write to a stream of
    // their own (src/logging/pino-logger.ts).
    importer: /node_modules\/pino\/lib\/transport\.js$/,
    path: /^thread-stream$/,
    contents:
      "module.exports = class ThreadStream { constructor() { throw new Error('pino transports are left out of the certshare bundle " +
      "(scripts/build.ts)'); } };\n",
  },
  {
    // fastify.inject() (light-my-request), required on its first call: certshare's code never calls it (its
    // tests run the sources, not the bundle).
    importer: /node_modules\/fastify\/fastify\.js$/,
    path: /^light-my-request$/,
    contents: "module.exports = () => { throw new Error('fastify.inject is left out of the certshare bundle (scripts/build.ts)'); };\n",
  },
];

const standIns: Plugin = {
  name: 'load-time-stand-ins',
  setup(b) {
    // Every stand-in's path (each anchored): esbuild asks the plugin about those imports only.
    const replaced = new RegExp(LOAD_TIME_STAND_INS.map((s) => s.path.source).join('|'));
    b.onResolve({ filter: replaced }, (args) => {
      const i = LOAD_TIME_STAND_INS.findIndex((s) => s.importer.test(args.importer) && s.path.test(args.path));
      return i < 0 ? undefined : { path: String(i), namespace: 'stand-in' };
    });
    b.onLoad({ filter: /.*/, namespace: 'stand-in' }, (args) => ({
      loader: 'js',
      contents: LOAD_TIME_STAND_INS[Number(args.path)]!.contents,
    }));
  },
};

const KUBE_MODELS_DIR = join(REPO, 'node_modules/@kubernetes/client-node/dist/gen/models');
/**
 * The Kubernetes types certshare reads or writes through the generated client (src/kube, src/injector):
 * Secrets, ConfigMaps, Leases, the Pod its readiness gate patches, Events, and errors' Status.
 */
export const KUBE_MODEL_ROOTS = ['V1Secret', 'V1SecretList', 'V1ConfigMap', 'V1Lease', 'V1Pod', 'EventsV1Event', 'V1Status'];
/** Where the rest of the models go, beside the chunk that holds the client (dist/chunks/). */
const OTHER_KUBE_MODELS = './kube-models.js';

/** `roots` and every model their fields name, transitively (a field's type is e.g. `Array<V1Container>`). */
export function modelClosure(roots: string[]): Set<string> {
  const kept = new Set<string>();
  const visit = (name: string): void => {
    if (kept.has(name)) return;
    let source: string;
    try {
      source = readFileSync(join(KUBE_MODELS_DIR, `${name}.js`), 'utf8');
    } catch {
      return; // a primitive or a map/array type's syntax, not a model
    }
    kept.add(name);
    for (const [, type] of source.matchAll(/"type": "([^"]+)"/g)) for (const id of type!.match(/\w+/g) ?? []) visit(id);
  };
  roots.forEach(visit);
  for (const root of roots) if (!kept.has(root)) throw new Error(`scripts/build.ts: no Kubernetes model ${root} in ${KUBE_MODELS_DIR}`);
  return kept;
}

/** Replaces every match of `pattern` in `source`, failing the build unless it matched `expected(count)`. */
function rewrite(source: string, pattern: RegExp, replace: (match: string, name: string) => string, what: string, expected: (n: number) => boolean): string {
  let count = 0;
  const out = source.replace(pattern, (match, name: string) => {
    count++;
    return replace(match, name);
  });
  if (!expected(count)) throw new Error(`scripts/build.ts: @kubernetes/client-node's ${what} changed shape (${count} matches): see kubeModelsOnDemand`);
  return out;
}

/**
 * @kubernetes/client-node's ObjectSerializer imports all of its ~760 generated model classes (and the
 * package's index re-exports them) to map a type name to the class that (de)serializes it. Defining them
 * all costs ~10 MB of RSS in every process that loads the client (the injector idle: 82-85 -> 72 MB), for
 * the ~140 that certshare's calls read or write. The bundle keeps those (KUBE_MODEL_ROOTS and the models
 * their fields name) and puts the rest in dist/chunks/kube-models.js (an ES module: Node 24 require()s
 * one), which the serializer's type map loads on the first lookup of any other model's name: a type
 * outside the roots still (de)serializes as before, it only costs the memory.
 */
export function kubeModelsOnDemand(kept: Set<string>): Plugin {
  return {
    name: 'kube-models-on-demand',
    setup(b) {
      b.onResolve({ filter: /^\.\/kube-models\.js$/ }, (args) =>
        args.importer.endsWith('ObjectSerializer.js') ? { path: OTHER_KUBE_MODELS, external: true } : undefined,
      );
      b.onLoad({ filter: /@kubernetes\/client-node\/dist\/gen\/models\/all\.js$/ }, async (args) => {
        const source = await readFile(args.path, 'utf8');
        const exported = /^export \* from '\.\.\/models\/(\w+)\.js';\n/gm;
        return {
          loader: 'js',
          contents: rewrite(
            source,
            exported,
            (line, name) => (kept.has(name) ? line : ''),
            'models/all.js',
            (n) => n > 500,
          ),
        };
      });
      b.onLoad({ filter: /@kubernetes\/client-node\/dist\/gen\/models\/ObjectSerializer\.js$/ }, async (args) => {
        let source = await readFile(args.path, 'utf8');
        source = rewrite(
          source,
          /^export \* from '\.\.\/models\/(\w+)\.js';\n/gm,
          () => '',
          'ObjectSerializer re-exports',
          (n) => n > 500,
        );
        const all: string[] = [];
        source = rewrite(
          source,
          /^import \{ (\w+) \} from '\.\.\/models\/\w+\.js';\n/gm,
          (line, name) => {
            all.push(name);
            return kept.has(name) ? line : '';
          },
          'ObjectSerializer imports',
          (n) => n > 500,
        );
        source = rewrite(
          source,
          /^ {4}"\w+": (\w+),\n/gm,
          (line, name) => (kept.has(name) ? line : ''),
          'ObjectSerializer typeMap',
          (n) => n === all.length,
        );
        const others = all.filter((name) => !kept.has(name));
        source += `
const certshareOtherModels = new Set(${JSON.stringify(others)});
let certshareLoadedModels;
typeMap = new Proxy(typeMap, {
  get: (kept, name) =>
    kept[name] ?? (certshareOtherModels.has(name) ? (certshareLoadedModels ??= require(${JSON.stringify(OTHER_KUBE_MODELS)}))[name] : undefined),
});
`;
        return { loader: 'js', contents: source };
      });
    },
  };
}

const KUBE_GEN_DIR = join(REPO, 'node_modules/@kubernetes/client-node/dist/gen');
const SRC_DIR = join(REPO, 'src');

/** Every word of certshare's sources (src/): an operation named nowhere in them is never called. */
function sourceWords(): Set<string> {
  const words = new Set<string>();
  for (const entry of readdirSync(SRC_DIR, { recursive: true, withFileTypes: true })) {
    if (entry.isFile() && entry.name.endsWith('.ts')) for (const [w] of readFileSync(join(entry.parentPath, entry.name), 'utf8').matchAll(/\w+/g)) words.add(w);
  }
  return words;
}

/** Drops the methods of `classes` in `source` whose operation (name less WithHttpInfo) `keep` refuses; the constructor stays. */
function keepOperations(source: string, classes: string[], keep: (operation: string) => boolean, what: string): string {
  const lines = source.split('\n');
  const out: string[] = [];
  let inClass = false;
  let dropping = false;
  let dropped = 0;
  for (const line of lines) {
    if (/^export class (\w+)/.test(line)) inClass = classes.includes(/^export class (\w+)/.exec(line)![1]!);
    else if (line === '}') inClass = false;
    const method = inClass ? /^ {4}(?:async )?(\w+)\(/.exec(line) : null;
    if (method && method[1] !== 'constructor' && !keep(method[1]!.replace(/WithHttpInfo$/, ''))) {
      dropping = true;
      dropped++;
    }
    if (!dropping) out.push(line);
    else if (line === '    }') dropping = false;
  }
  if (dropped < 100)
    throw new Error(`scripts/build.ts: @kubernetes/client-node's ${what} changed shape (${dropped} methods dropped): see kubeCoreOperationsUsed`);
  return out.join('\n');
}

/**
 * The generated CoreV1Api (a request factory, a response processor and three wrappers, each with a method
 * per operation: about 200 operations, two methods each) costs every process that loads the client ~2.8 MB;
 * certshare calls about a dozen of them. The bundle keeps the operations whose names appear in src/ (so a
 * new call keeps its operation with no list to update) and drops the others' methods.
 */
function kubeCoreOperationsUsed(): Plugin {
  return {
    name: 'kube-core-operations-used',
    setup(b) {
      let keep: ((operation: string) => boolean) | undefined;
      b.onLoad({ filter: /@kubernetes\/client-node\/dist\/gen\/(apis\/CoreV1Api|types\/(Observable|Promise|ObjectParam)API)\.js$/ }, async (args) => {
        if (!keep) {
          const words = sourceWords();
          const operations = [...readFileSync(join(KUBE_GEN_DIR, 'apis/CoreV1Api.js'), 'utf8').matchAll(/^ {4}async (\w+)\(/gm)].map((m) => m[1]!);
          const used = new Set(operations.filter((o) => !o.endsWith('WithHttpInfo') && words.has(o)));
          if (used.size === 0) throw new Error('scripts/build.ts: no CoreV1Api operation named in src/: see kubeCoreOperationsUsed');
          keep = (operation) => used.has(operation);
        }
        const classes = ['CoreV1ApiRequestFactory', 'CoreV1ApiResponseProcessor', 'ObservableCoreV1Api', 'PromiseCoreV1Api', 'ObjectCoreV1Api'];
        return { loader: 'js', contents: keepOperations(await readFile(args.path, 'utf8'), classes, keep, args.path.slice(KUBE_GEN_DIR.length + 1)) };
      });
    },
  };
}

/** Every model, for the serializer's lookups of those the bundle leaves out (kubeModelsOnDemand), into `dir`. */
export async function buildOtherKubeModels(dir: string): Promise<void> {
  await build({
    absWorkingDir: REPO,
    stdin: { contents: "export * from './all.js';", resolveDir: KUBE_MODELS_DIR, loader: 'js' },
    outfile: join(dir, OTHER_KUBE_MODELS),
    bundle: true,
    format: 'esm',
    platform: 'node',
    target: 'node24',
    minify: true,
    keepNames: true,
    legalComments: 'eof',
    logLevel: 'warning',
  });
}

/** Bundled CommonJS packages call require() for Node built-ins; an ES module has none of its own. */
export const REQUIRE_BANNER =
  "import { createRequire as __certshareCreateRequire } from 'node:module'; const require = __certshareCreateRequire(import.meta.url);";

/**
 * How every production file is bundled: dist/ (buildDist) and the bench's bare fastify baseline
 * (bench/lib/baseline.ts), so that the baseline pays for exactly what the bundle makes the daemon pay.
 */
export function productionBundleOptions(): BuildOptions {
  return {
    absWorkingDir: REPO,
    bundle: true,
    format: 'esm',
    platform: 'node',
    target: 'node24',
    // The ES builds where packages have one: @peculiar/x509's CommonJS build loses its named exports
    // (cryptoProvider) when wrapped.
    mainFields: ['module', 'main'],
    // certshare's Kubernetes transport is node:https (src/kube/transport/https-transport.ts); undici stays out.
    alias: { undici: './src/kube/transport/undici-unavailable.ts' },
    minify: true,
    // Class and function names survive minification: logged errors keep their type (e.g. ApiException).
    keepNames: true,
    legalComments: 'eof',
    banner: { js: REQUIRE_BANNER },
    logLevel: 'warning',
    plugins: [httpWithoutUndici, standIns, kubeModelsOnDemand(modelClosure(KUBE_MODEL_ROOTS)), kubeCoreOperationsUsed()],
  };
}

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
 * The Kubernetes code stays out of the snapshot's script (its source would sit in every snapshot-started heap,
 * 1.7 MB): Kubernetes mode and `--tls secret:` are not started from the snapshot (snapshot-main.ts hands them
 * to dist/).
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
        "const absent = () => { throw new Error('Kubernetes mode is not in the start-up snapshot'); };\n" +
        'export { absent as createKubeBackend, absent as TlsSecret };\n',
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
      const source = await readFile(args.path, 'utf8');
      const computed = 'const startInSeconds = Math.round(Date.now() / 1000 - process.uptime());';
      const read = 'this.set(labels, startInSeconds);';
      if (!source.includes(computed) || !source.includes(read)) throw new Error(`scripts/build.ts: ${args.path} changed shape`);
      const contents = source
        .replace(computed, 'let startInSeconds;')
        .replace(read, 'this.set(labels, (startInSeconds ??= Math.round(Date.now() / 1000 - process.uptime())));');
      return { loader: 'js', contents };
    });
  },
};

/**
 * The script of the image's start-up snapshot (src/cli/snapshot-main.ts, src/cli/snapshot-blob.ts): one CommonJS
 * file, as `node --build-snapshot` takes, with the standalone daemon's code and nothing of Kubernetes mode.
 */
async function buildSnapshotScript(outdir: string, devOnly: string[]): Promise<void> {
  const options = productionBundleOptions();
  await build({
    ...options,
    external: devOnly,
    format: 'cjs',
    banner: {},
    splitting: false,
    entryPoints: ['src/cli/snapshot-main.ts'],
    outfile: join(outdir, SNAPSHOT_SCRIPT),
    plugins: [lazyBuiltins, withoutKube, startTimeAtRunTime, ...(options.plugins ?? []).filter((p) => p !== httpWithoutUndici)],
  });
}

/**
 * What the advertise agent's script may take in: certshare's own modules and these built-ins. The agent runs
 * beside certshare in every Pod that advertises, so each package or built-in it loads is paid per replica
 * (node:crypto alone is measured in docs/performance.md, the advertise agent); a new one fails the build until it is
 * measured and added here.
 */
const ADVERTISE_AGENT_BUILTINS = new Set(['node:fs', 'node:fs/promises', 'node:http', 'node:path', 'node:util']);

/**
 * The advertise agent's own script (src/cli/advertise-agent-main.ts): one CommonJS file, without the rest of
 * the bundle (fastify, pino, prom-client, the Kubernetes client), which `dist/cli/main.js advertise-agent` would
 * load. CommonJS: Node's ES loader costs the idle process more for the same code (docs/performance.md). Returns what it took in.
 */
export async function buildAdvertiseAgent(outdir: string): Promise<Metafile> {
  const options = productionBundleOptions();
  const { metafile } = await build({
    ...options,
    metafile: true,
    format: 'cjs',
    banner: {},
    splitting: false,
    entryPoints: ['src/cli/advertise-agent-main.ts'],
    outfile: join(outdir, ADVERTISE_AGENT_SCRIPT),
    // node:http as it is: the ES facade the plugin avoids is not built for a require().
    plugins: (options.plugins ?? []).filter((p) => p !== httpWithoutUndici),
  });
  // <runtime>: esbuild's own helpers (its CommonJS interop).
  const taken = Object.keys(metafile.inputs).filter((input) => !input.startsWith('src/') && input !== '<runtime>');
  const builtins = Object.values(metafile.inputs).flatMap(({ imports }) => imports.filter((i) => i.external && i.path !== '<runtime>').map((i) => i.path));
  const unexpected = [...taken, ...builtins.filter((path) => !ADVERTISE_AGENT_BUILTINS.has(path))];
  if (unexpected.length > 0)
    throw new Error(`scripts/build.ts: the advertise agent's script takes in ${[...new Set(unexpected)].join(', ')}: see ADVERTISE_AGENT_BUILTINS`);
  return metafile;
}

export async function buildDist(outdir: string = DIST): Promise<BuildResult> {
  await rm(outdir, { recursive: true, force: true });
  const devOnly = await devOnlyPackages();
  const result = await build({
    ...productionBundleOptions(),
    metafile: true,
    external: devOnly,
    entryPoints: {
      'cli/main': 'src/cli/main.ts',
      'cli/fill-compile-cache': 'src/cli/fill-compile-cache.ts',
      'cli/build-snapshot': 'src/cli/build-snapshot.ts',
    },
    outdir,
    chunkNames: 'chunks/[name]-[hash]',
    // Dynamic imports (kube backend, emulator, demo) become chunks: standalone never loads the Kubernetes client.
    splitting: true,
  });
  await buildOtherKubeModels(join(outdir, 'chunks'));
  await buildSnapshotScript(outdir, devOnly);
  await buildAdvertiseAgent(outdir);
  // The chunks are ES modules; this marks them so without relying on a package.json above dist/.
  await mkdir(outdir, { recursive: true });
  await writeFile(join(outdir, 'package.json'), `${JSON.stringify({ type: 'module', private: true }, null, 2)}\n`);
  const devImports = devImportsFromSource(result.metafile, new Set(devOnly));
  if (devImports.length > 0) {
    await rm(outdir, { recursive: true, force: true });
    throw new Error(`src/ imports packages that are devDependencies (move them to "dependencies"): ${devImports.join('; ')}`);
  }
  // Node's compile cache for the Node building (src/cli/compile-cache.ts): the bench and the tests run
  // dist/ with it, as the image does with its own Node's (the Dockerfile fills it again there).
  const fill = spawnSync(process.execPath, [join(outdir, 'cli/fill-compile-cache.js')], { encoding: 'utf8', timeout: 120_000 });
  if (fill.status !== 0) throw new Error(`dist/cli/fill-compile-cache.js exited ${fill.status ?? fill.signal}: ${fill.stderr}`);
  // The start-up snapshot for the Node building, as the image's final stage builds its own.
  const snapshot = spawnSync(process.execPath, [join(outdir, 'cli/build-snapshot.js')], { encoding: 'utf8', timeout: 240_000 });
  if (snapshot.status !== 0) throw new Error(`dist/cli/build-snapshot.js exited ${snapshot.status ?? snapshot.signal}: ${snapshot.stderr}`);
  return { packages: bundledPackages(result.metafile) };
}

if (import.meta.main) {
  const started = performance.now();
  const { packages } = await buildDist(process.argv[2] ? resolve(process.argv[2]) : DIST);
  process.stdout.write(`built ${process.argv[2] ?? 'dist/'} in ${Math.round(performance.now() - started)} ms (${packages.size} production packages bundled)\n`);
}
