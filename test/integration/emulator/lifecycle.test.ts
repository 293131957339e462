import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { existsSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { startEmulator } from '../../../src/emulator/server.ts';
import { parseListen } from '../../../src/emulator/listen.ts';
import { BusReader, certPath, get, openRequest, testEnv, waitEvent, type TestEnv } from '../../support/emulator.ts';

const A = 'a.tailnet-1234.ts.net';
const HOLD = new URL('../../fixtures/emulator/hold-socket.ts', import.meta.url).pathname;

describe('listening', () => {
  let env: TestEnv;
  before(async () => {
    env = await testEnv();
  });
  after(() => env.cleanup());

  test('parseListen: TCP when there is a colon and no slash', () => {
    assert.deepEqual(parseListen('127.0.0.1:0'), { kind: 'tcp', host: '127.0.0.1', port: 0 });
    assert.deepEqual(parseListen('[::1]:8080'), { kind: 'tcp', host: '::1', port: 8080 });
    assert.deepEqual(parseListen(':9000'), { kind: 'tcp', host: '127.0.0.1', port: 9000 });
    assert.deepEqual(parseListen('./tailscaled.sock'), { kind: 'unix', path: './tailscaled.sock' });
    assert.deepEqual(parseListen('/tmp/a:b.sock'), { kind: 'unix', path: '/tmp/a:b.sock' });
    assert.throws(() => parseListen('host:port'));
    assert.throws(() => parseListen('127.0.0.1:70000'));
  });

  test('a stale socket file is removed; a live one is not stolen; a regular file is refused', async () => {
    const path = join(env.dir, 'stale.sock');
    const child = spawn(process.execPath, [HOLD, path], { stdio: ['ignore', 'pipe', 'inherit'] });
    await once(child.stdout, 'data');
    await assert.rejects(startEmulator({ listen: path, domains: [A] }), /address already in use/);
    child.kill('SIGKILL');
    await once(child, 'exit');
    assert.ok(existsSync(path), 'the killed process left its socket file');
    const em = await startEmulator({ listen: path, domains: [A] });
    assert.equal((await get(em.address, certPath(A))).status, 200);
    await em.close();
    assert.ok(!existsSync(path), 'close removes the socket file');

    const file = join(env.dir, 'not-a-socket');
    await writeFile(file, 'x');
    await assert.rejects(startEmulator({ listen: file }), /not a socket/);
  });
});

describe('close', () => {
  test('ends hanging requests, slow requests and bus streams promptly', async () => {
    const env = await testEnv();
    try {
      const em = await env.start({ domains: [A], faults: ['cert:hang', { target: 'cert', kind: 'slow', delayMs: 60_000 }] });
      const hanging = waitEvent(em, 'certResponse', (e: { status: unknown }) => e.status === 'hang');
      const hangReq = openRequest(em.address, certPath(A));
      await hanging;
      const slowSeen = waitEvent(em, 'fault', (e: { fault: { kind: string } }) => e.fault.kind === 'slow');
      const slowReq = openRequest(em.address, certPath(A));
      await slowSeen;
      const bus = await BusReader.open(em.address, 16386);
      await bus.next();
      // A keep-alive idle connection too.
      await get(em.address, '/localapi/v0/status');

      const t0 = performance.now();
      await em.close();
      const elapsed = performance.now() - t0;
      assert.ok(elapsed < 2000, `close took ${elapsed} ms`);
      await assert.rejects(hangReq);
      await assert.rejects(slowReq);
      await bus.ended;
      assert.equal(em.stats().issuancesTotal, 0, 'the slow request never issued');
      await em.close(); // idempotent
    } finally {
      await env.cleanup();
    }
  });
});

describe('stats', () => {
  test('counts requests, issuances, responses and bus connections', async () => {
    const env = await testEnv();
    try {
      const em = await env.start({ domains: [A], id: 'stats-emu' });
      const bus = await BusReader.open(em.address, 2);
      await bus.next();
      await get(em.address, certPath(A));
      await get(em.address, certPath(A));
      await get(em.address, certPath('x.example.com'));
      em.injectFault('cert:error_500');
      await get(em.address, certPath(A));
      const s = em.stats();
      assert.equal(s.id, 'stats-emu');
      assert.equal(s.address, em.address);
      assert.deepEqual(s.issuances, { [A]: 1 });
      assert.equal(s.issuancesTotal, 1);
      assert.deepEqual(s.certRequests, { [A]: 3, 'x.example.com': 1 });
      assert.deepEqual(s.certResponses, { [A]: { '200': 2, '500': 1 }, 'x.example.com': { '500': 1 } });
      assert.equal(s.busConnections, 1);
      assert.equal(s.busConnectionsTotal, 1);
      assert.deepEqual(s.faultsApplied, { 'cert:error_500': 1 });
      bus.close();
    } finally {
      await env.cleanup();
    }
  });
});
