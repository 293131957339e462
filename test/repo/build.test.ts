// The production bundle (scripts/build.ts) imports node:http through its CommonJS exports: the ES facade of
// node:http would load Node's bundled undici (WebSocket, fetch's engine), ~2.4 MB of RSS and tens of ms of
// start-up in every process for a client nothing uses (issue 19).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { createRequire } from 'node:module';
import { build } from 'esbuild';
import { buildDist, buildOtherKubeModels, KUBE_MODEL_ROOTS, kubeModelsOnDemand, modelClosure, REQUIRE_BANNER } from '../../scripts/build.ts';

describe('the production bundle and node:http', () => {
  let dir: string;
  let chunks: string[];
  let packages: Map<string, number>;
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'certshare-build-'));
    ({ packages } = await buildDist(join(dir, 'dist')));
    chunks = (await readdir(join(dir, 'dist/chunks'))).map((f) => join(dir, 'dist/chunks', f));
  });
  after(() => rm(dir, { recursive: true, force: true }));

  it('has no ES import of node:http in any chunk (ours or a package’s)', async () => {
    for (const file of [join(dir, 'dist/cli/main.js'), ...chunks]) {
      assert.doesNotMatch(await readFile(file, 'utf8'), /\bfrom\s*["'](node:)?http["']/, file);
    }
  });

  it('loads every chunk (kube backend and injector included) without Node’s bundled undici', () => {
    const script = `for (const f of ${JSON.stringify(chunks)}) await import(f);
process.stdout.write(String(process.moduleLoadList.includes('NativeModule internal/deps/undici/undici')));
process.exit(0);`;
    const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 60_000 });
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.stdout, 'false');
  });

  it("leaves out fastify's schema compilers and inject(), which certshare never reaches (~300 KB every start compiled)", () => {
    assert.ok(packages.has('fastify'));
    for (const name of ['ajv', 'ajv-formats', 'fast-uri', '@fastify/ajv-compiler', '@fastify/fast-json-stringify-compiler', 'light-my-request']) {
      assert.equal(packages.has(name), false, `${name} is bundled`);
    }
  });

  it("leaves out prom-client's exemplars and Summary and pino's transports, which certshare never asks for", () => {
    assert.ok(packages.has('prom-client') && packages.has('pino'));
    for (const name of ['@opentelemetry/api', 'tdigest', 'bintrees', 'thread-stream']) assert.equal(packages.has(name), false, `${name} is bundled`);
  });

  // scripts/build.ts kubeCoreOperationsUsed: ~2.8 MB of every Kubernetes process for ~200 operations never called.
  it("keeps the CoreV1Api operations src/ calls, and drops the others' methods", async () => {
    const texts = await Promise.all(chunks.map((f) => readFile(f, 'utf8')));
    const client = texts.filter((t) => t.includes('CoreV1ApiRequestFactory'));
    assert.equal(client.length, 1, 'one chunk holds the generated CoreV1Api');
    const called = new Set<string>();
    for (const file of await readdir(join(import.meta.dirname, '../../src'), { recursive: true })) {
      if (!file.endsWith('.ts')) continue;
      for (const [, op] of (await readFile(join(import.meta.dirname, '../../src', file), 'utf8')).matchAll(/\bcore\.(\w+)\(/g)) called.add(op!);
    }
    assert.ok(called.has('readNamespacedSecret') && called.has('patchNamespacedPodStatus'), [...called].join(' '));
    for (const op of called) assert.match(client[0]!, new RegExp(`\\b${op}WithHttpInfo\\(`), `${op} kept`);
    for (const op of ['connectDeleteNamespacedPodProxy', 'listNode', 'deleteNamespacedSecret', 'readNamespacedPodLog']) {
      assert.doesNotMatch(client[0]!, new RegExp(`\\b${op}(WithHttpInfo)?\\(`), `${op} dropped`);
    }
  });
});

// scripts/build.ts kubeModelsOnDemand: the bundle defines only the Kubernetes models certshare's calls use;
// a lookup of any other model's name loads the rest (kube-models.js) and (de)serializes as the package does.
describe("the production bundle and the Kubernetes client's models", () => {
  let dir: string;
  type Serializer = { deserialize(data: unknown, type: string, format: string): unknown; serialize(data: unknown, type: string, format: string): unknown };
  let bundled: Serializer;
  let original: Serializer;
  const loadedOthers = () => Object.keys(createRequire(import.meta.url).cache).some((file) => file.endsWith('kube-models.js'));
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'certshare-build-'));
    await writeFile(join(dir, 'package.json'), '{ "type": "module" }\n');
    await buildOtherKubeModels(dir);
    await build({
      absWorkingDir: join(import.meta.dirname, '../..'),
      stdin: { contents: "export { ObjectSerializer } from '@kubernetes/client-node/dist/gen/models/ObjectSerializer.js';", resolveDir: '.', loader: 'js' },
      outfile: join(dir, 'serializer.mjs'),
      bundle: true,
      format: 'esm',
      platform: 'node',
      banner: { js: REQUIRE_BANNER },
      plugins: [kubeModelsOnDemand(modelClosure(KUBE_MODEL_ROOTS))],
      logLevel: 'warning',
    });
    ({ ObjectSerializer: bundled } = await import(join(dir, 'serializer.mjs')));
    ({ ObjectSerializer: original } = await import('@kubernetes/client-node/dist/gen/models/ObjectSerializer.js'));
  });
  after(() => rm(dir, { recursive: true, force: true }));

  const metadata = { name: 'x', creationTimestamp: '2026-01-02T03:04:05Z', labels: { a: 'b' } };
  const same = (type: string, data: unknown) => {
    const got = bundled.deserialize(data, type, '') as { metadata: { creationTimestamp: unknown } };
    assert.ok(got.metadata.creationTimestamp instanceof Date, type);
    // Class instances of two copies of the package: compared by their JSON, Dates (checked above) as strings.
    const json = (value: unknown) => JSON.parse(JSON.stringify(value)) as unknown;
    assert.deepEqual(json(got), json(original.deserialize(data, type, '')));
    assert.deepEqual(json(bundled.serialize(got, type, '')), json(original.serialize(original.deserialize(data, type, ''), type, '')));
  };

  it('keeps the models of Secrets, Leases and Pods in the bundle', () => {
    same('V1Secret', { apiVersion: 'v1', kind: 'Secret', metadata, data: { 'tls.crt': 'eA==' } });
    same('V1Lease', { metadata, spec: { holderIdentity: 'a', renewTime: '2026-01-02T03:04:05.000000Z' } });
    same('V1Pod', { metadata, spec: { containers: [{ name: 'c', image: 'i' }] }, status: { conditions: [{ type: 'Ready', status: 'True' }] } });
    assert.equal(loadedOthers(), false);
  });

  it('loads any other model on its first lookup', () => {
    same('V1Namespace', { apiVersion: 'v1', kind: 'Namespace', metadata, spec: { finalizers: ['kubernetes'] } });
    assert.equal(loadedOthers(), true);
  });
});
