import assert from 'node:assert/strict';
import { Agent, request } from 'node:https';
import type { TLSSocket } from 'node:tls';
import { after, before, describe, it } from 'node:test';
import { createInjectorCa, issueServingLeaf } from '../../../src/injector/pki.ts';
import { admissionReviewResponse } from '../../../src/injector/mutate.ts';
import type { InjectionDefaults } from '../../../src/config/injection-defaults.ts';
import { FakeClock } from '../../support/fake-clock.ts';
import { MAX_BODY_BYTES, MAX_IN_FLIGHT_PER_PEER, startTlsServer, type ServingPair, type TlsServer } from '../../../src/injector/tls-server.ts';

const HOUR = 3_600_000;

interface Answer {
  status: number;
  body: unknown;
  serial: string;
  socket: TLSSocket;
  reused: boolean;
}

function post(port: number, agent: Agent, path: string, body: unknown): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path, method: 'POST', agent, headers: { 'content-type': 'application/json' } }, (res) => {
      // Read now: a kept-alive socket goes back to the agent (res.socket = null) once the body ended.
      const socket = res.socket as TLSSocket;
      const serial = socket.getPeerCertificate().serialNumber;
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        resolve({ status: res.statusCode ?? 0, body: JSON.parse(Buffer.concat(chunks).toString()), serial, socket, reused: req.reusedSocket });
      });
    });
    req.on('error', reject);
    req.end(JSON.stringify(body));
  });
}

describe('webhook TLS server with hot reload', () => {
  let server: TlsServer;
  let first: ServingPair & { serial: string };
  let second: ServingPair & { serial: string };
  let cas: string[];
  const agents: Agent[] = [];
  const agent = (): Agent => {
    const a = new Agent({ keepAlive: true, maxSockets: 1, ca: cas });
    agents.push(a);
    return a;
  };

  before(async () => {
    const now = Date.now();
    const [caA, caB] = await Promise.all([
      createInjectorCa({ notBefore: now, notAfter: now + HOUR }),
      createInjectorCa({ notBefore: now, notAfter: now + HOUR }),
    ]);
    cas = [caA.certPem, caB.certPem];
    const names = { dnsNames: ['hook'], ipAddresses: ['127.0.0.1'] };
    const [a, b] = await Promise.all([
      issueServingLeaf(caA, names, { notBefore: now, notAfter: now + HOUR }),
      issueServingLeaf(caB, names, { notBefore: now, notAfter: now + HOUR }),
    ]);
    first = { certPem: a.chainPem, keyPem: a.keyPem, serial: a.serial };
    second = { certPem: b.chainPem, keyPem: b.keyPem, serial: b.serial };
    server = await startTlsServer({
      host: '127.0.0.1',
      port: 0,
      pair: first,
      routes: {
        '/echo': (body) => ({ echo: body }),
        // The webhook's handler; a body without request.uid never reaches the defaults.
        '/review': (body) => admissionReviewResponse(body, {} as InjectionDefaults),
        '/broken': () => {
          throw new Error('a bug of the handler');
        },
      },
    });
  });

  after(async () => {
    for (const a of agents) a.destroy();
    await server?.close();
  });

  it('serves a new leaf to new connections while a kept-alive connection opened before the swap keeps working', async () => {
    const keepAlive = agent();
    const before = await post(server.port, keepAlive, '/echo', { n: 1 });
    assert.deepEqual([before.status, before.body, before.serial], [200, { echo: { n: 1 } }, first.serial]);

    server.setPair(second);
    assert.equal(server.serial, second.serial);

    const sameConnection = await post(server.port, keepAlive, '/echo', { n: 2 });
    assert.equal(sameConnection.reused, true, 'the request went over the connection opened before the swap');
    assert.equal(sameConnection.socket, before.socket);
    assert.deepEqual([sameConnection.status, sameConnection.body, sameConnection.serial], [200, { echo: { n: 2 } }, first.serial]);

    const fresh = await post(server.port, agent(), '/echo', { n: 3 });
    assert.deepEqual([fresh.reused, fresh.status, fresh.serial], [false, 200, second.serial]);
  });

  it('refuses a pair whose key does not match and keeps serving the current one', async () => {
    assert.throws(() => server.setPair({ certPem: first.certPem, keyPem: second.keyPem }), { code: 'CERTSHARE_CERT_INVALID' });
    assert.throws(() => server.setPair({ certPem: 'not a certificate', keyPem: second.keyPem }), { code: 'CERTSHARE_CERT_INVALID' });
    assert.equal(server.serial, second.serial);
    const fresh = await post(server.port, agent(), '/echo', {});
    assert.equal(fresh.serial, second.serial);
  });

  it('drains on close: responses say Connection: close, so clients leave kept-alive connections before the listener goes', async () => {
    const other = await startTlsServer({ host: '127.0.0.1', port: 0, pair: first, routes: { '/echo': (body) => body } });
    const a = agent();
    const before = await post(other.port, a, '/echo', {});
    assert.equal(before.socket.destroyed, false);
    const closing = other.close({ drainMs: 300 });
    const during = await post(other.port, a, '/echo', {});
    assert.equal(during.reused, true, 'still answering on the kept-alive connection while draining');
    assert.equal(during.status, 200);
    await closing;
    assert.equal(during.socket.destroyed, true, 'the client closed the connection after the Connection: close response');
  });

  it('refuses a body declared too large before reading it, and more requests in flight than its bound with 503 Retry-After', async () => {
    // Headers only, the body never sent: the answer cannot have waited for it.
    const large = await new Promise<{ status: number }>((resolve, reject) => {
      const req = request(
        { host: '127.0.0.1', port: server.port, path: '/echo', method: 'POST', agent: agent(), headers: { 'content-length': String(MAX_BODY_BYTES + 1) } },
        (res) => {
          res.resume();
          resolve({ status: res.statusCode ?? 0 });
        },
      );
      req.on('error', reject);
      req.flushHeaders();
    });
    assert.equal(large.status, 413);

    // Slow bodies (a slow-loris caller), each sent half and held open, as many as one address may have read at
    // once. Their body timeout runs on a clock that stands still: they hold their slots until they go, however
    // long the machine takes to bring them in (on the system clock they were answered 408 after 2 s, and at load
    // the 503 was looked for after they had gone).
    const clock = new FakeClock();
    const held = await startTlsServer({ host: '127.0.0.1', port: 0, pair: first, routes: { '/echo': (body) => body }, clock });
    try {
      const slow = Array.from({ length: MAX_IN_FLIGHT_PER_PEER }, () => {
        const req = request({ host: '127.0.0.1', port: held.port, path: '/echo', method: 'POST', agent: agent(), headers: { 'content-length': '100' } });
        const answered = new Promise<number>((resolve) => {
          req.on('response', (res) => {
            res.resume();
            resolve(res.statusCode ?? 0);
          });
          req.on('error', () => resolve(-1));
        });
        req.write('{"half":');
        return { req, answered };
      });
      // Each admitted body waits for its timeout on the clock: all of them are being read.
      await clock.waitForSleepers(MAX_IN_FLIGHT_PER_PEER);
      const refused = await postEmpty(held.port, agent());
      assert.equal(refused.status, 503);
      assert.equal(refused.retryAfter, '1');
      for (const { req } of slow) req.destroy();
      assert.deepEqual(await Promise.all(slow.map((s) => s.answered)), Array(MAX_IN_FLIGHT_PER_PEER).fill(-1), 'none answered before it went');
      const after = await until200(held.port, agent());
      assert.equal(after, 200, 'served again once the slow callers are gone');
    } finally {
      await held.close();
    }
  });

  it('answers a body that is not JSON with 400 and an unknown path with 404, and stays up', async () => {
    const a = agent();
    const bad = await new Promise<number>((resolve, reject) => {
      const req = request({ host: '127.0.0.1', port: server.port, path: '/echo', method: 'POST', agent: a }, (res) => {
        res.resume();
        resolve(res.statusCode ?? 0);
      });
      req.on('error', reject);
      req.end('{not json');
    });
    assert.equal(bad, 400);
    assert.equal((await post(server.port, a, '/nope', {})).status, 404);
    assert.equal((await post(server.port, a, '/echo', { ok: true })).status, 200);
  });

  it('answers JSON that is no AdmissionReview with 400, and a handler that fails with 500', async () => {
    const a = agent();
    const notReview = await post(server.port, a, '/review', { k0: 0, k1: 1 });
    assert.equal(notReview.status, 400, JSON.stringify(notReview.body));
    assert.match(JSON.stringify(notReview.body), /not an AdmissionReview request \(no request\.uid\)/);
    assert.equal((await post(server.port, a, '/broken', {})).status, 500);
    assert.equal((await post(server.port, a, '/echo', { ok: true })).status, 200, 'still serving');
  });
});

/** An empty JSON object posted to /echo: the status and Retry-After of the answer. */
function postEmpty(port: number, a: Agent): Promise<{ status: number; retryAfter: string | undefined }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path: '/echo', method: 'POST', agent: a }, (r) => {
      r.resume();
      resolve({ status: r.statusCode ?? 0, retryAfter: r.headers['retry-after'] as string | undefined });
    });
    req.on('error', reject);
    req.end('{}');
  });
}

async function until200(port: number, a: Agent): Promise<number> {
  for (let i = 0; i < 100; i++) {
    const status = await post(port, a, '/echo', { ok: true }).then(
      (r) => r.status,
      () => 0,
    );
    if (status === 200) return status;
    await new Promise((r) => setTimeout(r, 20));
  }
  return 0;
}
