// Pure helpers of the bench (bench/lib): the figures of `npm run bench -- --domains` rest on them.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { watchRenewalsPerHour } from '../../bench/lib/apiserver.ts';
import { IMAGE_NODE_FLAGS } from '../../bench/lib/certshare.ts';
import { imageNodeFlags } from '../support/dockerfile.ts';
import { heapByConstructor } from '../../bench/lib/heap.ts';
import { cpuMs, failOnUnexpectedExit, Proc, type UnexpectedExitError } from '../../bench/lib/proc.ts';
import { linearFit } from '../../bench/lib/stats.ts';

test('linearFit: the least-squares line, NaN slope without two distinct x', () => {
  const { slope, intercept } = linearFit([
    { x: 1, y: 90 },
    { x: 100, y: 100 },
    { x: 500, y: 140 },
  ]);
  // Exact values of the normal equations for these three points.
  assert.ok(Math.abs(slope - 0.100143) < 1e-5, `slope ${slope}`);
  assert.ok(Math.abs(intercept - 89.938) < 0.001, `intercept ${intercept}`);
  assert.deepEqual(
    linearFit([
      { x: 2, y: 1 },
      { x: 4, y: 5 },
    ]),
    { slope: 2, intercept: -3 },
  );
  assert.ok(Number.isNaN(linearFit([{ x: 3, y: 1 }]).slope));
});

test('watchRenewalsPerHour: each open watch renews once per its timeoutSeconds, 2700 s when it has none', () => {
  const uri = (t?: number): string => `/api/v1/namespaces/ns/secrets?watch=true${t === undefined ? '' : `&timeoutSeconds=${t}`}`;
  assert.equal(watchRenewalsPerHour([uri(1800), uri(3600)]), 3);
  assert.ok(Math.abs(watchRenewalsPerHour([uri()]) - 3600 / 2700) < 1e-9);
  assert.equal(watchRenewalsPerHour([]), 0);
});

test('heapByConstructor: self sizes summed per type and constructor', () => {
  const snapshot = {
    snapshot: { meta: { node_fields: ['type', 'name', 'id', 'self_size'], node_types: [['hidden', 'object', 'string', 'closure']] as [string[]] } },
    // type, name (index into strings), id, self_size
    nodes: [1, 0, 1, 100, 1, 0, 2, 50, 1, 1, 3, 30, 2, 2, 4, 20, 2, 3, 5, 22, 3, 4, 6, 8],
    strings: ['Logger', 'Map', 'abc', 'def', 'run'],
  };
  assert.deepEqual(Object.fromEntries(heapByConstructor(snapshot)), { 'object:Logger': 150, 'object:Map': 30, string: 42, 'closure:run': 8 });
});

test('imageNodeFlags: the Node flags of the ENTRYPOINT; the image caps the young generation', () => {
  assert.deepEqual(imageNodeFlags('FROM x\nENTRYPOINT ["/nodejs/bin/node", "--a=1", "--b", "dist/cli/main.js"]\nCMD ["run"]\n'), ['--a=1', '--b']);
  assert.deepEqual(imageNodeFlags('FROM x\nENTRYPOINT ["/nodejs/bin/node", "dist/cli/main.js"]'), []);
  assert.deepEqual(imageNodeFlags('FROM x\nENTRYPOINT ["/nodejs/bin/node", "--a=1", "--snapshot-blob", "dist/snapshot/b.blob"]'), ['--a=1']);
  assert.throws(() => imageNodeFlags('FROM x\nENTRYPOINT node dist/cli/main.js'), /exec form/);
  // V8 would otherwise size it from the node's memory and keep what a mass renewal grew it to.
  assert.ok(
    IMAGE_NODE_FLAGS.some((f) => /^--max-semi-space-size=\d+$/.test(f)),
    `image flags: ${IMAGE_NODE_FLAGS.join(' ')}`,
  );
});

test('failOnUnexpectedExit: a process the bench needs that exits on its own is reported at once, with its stderr', async () => {
  const reported: UnexpectedExitError[] = [];
  failOnUnexpectedExit((err) => reported.push(err));
  const refusing = new Proc(
    'certshare proxy-0',
    [
      '-e',
      `console.log('{"msg":"starting"}'); console.error('certshare: --rate-limit-retry must not be above --retry-cap [CERTSHARE_BAD_FLAG]'); process.exit(2);`,
    ],
    { mustRun: true },
  );
  await refusing.exited;
  assert.equal(reported.length, 1, 'reported before anyone waiting for its exit resumes');
  assert.match(reported[0]!.message, /^certshare proxy-0 exited on its own \(code 2, signal null\) during the bench; its stderr:\n/);
  assert.match(reported[0]!.message, /--rate-limit-retry must not be above --retry-cap \[CERTSHARE_BAD_FLAG\]$/);
  assert.doesNotMatch(reported[0]!.message, /starting/, 'stderr only, not the JSON log on stdout');

  // Stopped by the bench, or not needed once done (a load generator): no report.
  const stopped = new Proc('certshare proxy-1', ['-e', 'setInterval(() => {}, 60_000)'], { mustRun: true });
  await stopped.stop();
  await new Proc('autocannon', ['-e', 'process.exit(1)']).exited;
  assert.equal(reported.length, 1);
});

test('cpuMs: the CPU time a process used, from /proc (user + system, 10 ms ticks)', async () => {
  const before = await cpuMs(process.pid);
  const spent = process.cpuUsage();
  // Busy until this process has used at least 100 ms more CPU by its own count.
  while (process.cpuUsage(spent).user < 100_000) Math.sqrt(Math.random());
  const after = await cpuMs(process.pid);
  assert.equal(before % 10, 0);
  assert.ok(after - before >= 80, `${before} -> ${after}`);
});
