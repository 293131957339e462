// The chaos fault proxy speaks HTTP/2 as kube-apiserver does: one client connection carries many watches,
// a dropped connection takes them all (after a GOAWAY), a reset of one request resets its stream only,
// and HTTP/1.1 clients are still served.
import assert from 'node:assert/strict';
import { connect, type ClientHttp2Session, type ClientHttp2Stream } from 'node:http2';
import { createServer, request as httpsRequest, type Server } from 'node:https';
import { after, before, describe, it } from 'node:test';
import { createControlPlanePki } from '../harness/pki.ts';
import { FaultProxy } from './fault-proxy.ts';
import { Rng } from './rng.ts';

/** Resolves when `stream` ends or closes (a reset included): how it went. */
function closed(stream: ClientHttp2Stream): Promise<string> {
  return new Promise((resolve) => {
    stream.on('error', (err: NodeJS.ErrnoException) => resolve(`error ${err.code}`));
    stream.on('close', () => resolve(`closed ${stream.rstCode}`));
  });
}

function get(session: ClientHttp2Session, path: string, token?: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const stream = session.request({ ':path': path, ...(token ? { authorization: `Bearer ${token}` } : {}) });
    let status = 0;
    let body = '';
    stream.setEncoding('utf8');
    stream.on('response', (headers) => (status = Number(headers[':status'])));
    stream.on('data', (chunk: string) => (body += chunk));
    stream.on('end', () => resolve({ status, body }));
    stream.on('error', reject);
    stream.end();
  });
}

describe('chaos fault proxy over HTTP/2', () => {
  let upstream: Server;
  let proxy: FaultProxy;
  let upstreamHost = '';
  const timers = new Set<NodeJS.Timeout>();

  before(async () => {
    const pki = await createControlPlanePki();
    // A stand-in for kube-apiserver: /echo returns the request headers it got; ?watch=1 streams a line every 50 ms.
    upstream = createServer({ cert: pki.serving.certPem, key: pki.serving.keyPem }, (req, res) => {
      if (req.url?.endsWith('/busy')) {
        res.writeHead(503, { 'content-type': 'application/json' }).end('{}');
        return;
      }
      if (req.url?.includes('watch=1')) {
        res.writeHead(200, { 'content-type': 'application/json' });
        const t = setInterval(() => res.write('{"type":"BOOKMARK"}\n'), 50);
        timers.add(t);
        res.on('close', () => clearInterval(t));
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json', connection: 'keep-alive' }).end(JSON.stringify(req.headers));
    });
    await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', resolve));
    const port = (upstream.address() as { port: number }).port;
    upstreamHost = `127.0.0.1:${port}`;
    proxy = new FaultProxy({ upstream: `https://127.0.0.1:${port}`, upstreamCaPem: pki.ca.certPem, rng: new Rng(1) });
    await proxy.start();
  });

  after(async () => {
    for (const t of timers) clearInterval(t);
    await proxy.close();
    upstream.closeAllConnections();
    await new Promise<void>((resolve) => upstream.close(() => resolve()));
  });

  it('multiplexes requests and watches over one connection; a dropped connection takes every watch after a GOAWAY', async () => {
    const session = connect(proxy.url, { ca: proxy.caPem });
    try {
      await new Promise<void>((resolve, reject) => session.once('connect', () => resolve()).once('error', reject));
      assert.equal(session.alpnProtocol, 'h2');
      const echo = await get(session, '/api/v1/namespaces/x/secrets/a');
      assert.equal(echo.status, 200);
      const seen = JSON.parse(echo.body) as Record<string, string>;
      assert.ok(!Object.keys(seen).some((k) => k.startsWith(':')), `pseudo-headers forwarded: ${echo.body}`);
      assert.equal(seen.host, upstreamHost, 'the upstream gets its own Host');

      const watches = ['a', 'b', 'c'].map((name) => session.request({ ':path': `/api/v1/namespaces/x/secrets?watch=1&fieldSelector=metadata.name%3D${name}` }));
      await Promise.all(watches.map((w) => new Promise((resolve) => w.once('data', resolve))));
      assert.equal(proxy.http2Sessions, 1, 'three watches and a request over one connection');

      const goaway = new Promise<void>((resolve) => session.once('goaway', () => resolve()));
      const ends = watches.map(closed);
      assert.equal(proxy.dropConnections(100), 1);
      await goaway;
      const outcomes = await Promise.all(ends);
      assert.equal(outcomes.length, 3, outcomes.join(', '));
      await new Promise<void>((resolve) => (session.closed ? resolve() : session.once('close', () => resolve())));
      assert.equal(proxy.applied.get('dropConnection'), 1);
    } finally {
      session.destroy();
    }
  });

  it('resets one stream, not the connection, and still serves HTTP/1.1 clients', async () => {
    const session = connect(proxy.url, { ca: proxy.caPem });
    try {
      proxy.setFaults({ resetBefore: 1 });
      await assert.rejects(get(session, '/api/v1/namespaces/x/secrets/a'), (err: NodeJS.ErrnoException) => err.code === 'ERR_HTTP2_STREAM_ERROR');
      proxy.clear();
      assert.equal((await get(session, '/api/v1/namespaces/x/secrets/a')).status, 200, 'the same connection serves the next request');

      const status = await new Promise<number>((resolve, reject) => {
        const req = httpsRequest(`${proxy.url}/api/v1/namespaces/x/secrets/a`, { ca: proxy.caPem, agent: false }, (res) => {
          res.resume();
          resolve(res.statusCode ?? 0);
        });
        req.on('error', reject);
        req.end();
      });
      assert.equal(status, 200);
    } finally {
      session.destroy();
    }
  });

  it("follows each client's requests for Secrets: failed (injected or the API server's own), then through again", async () => {
    const session = connect(proxy.url, { ca: proxy.caPem });
    try {
      const secret = '/api/v1/namespaces/x/secrets/a';
      assert.equal((await get(session, secret, 'one')).status, 200);
      assert.equal(proxy.secretsReachableSince('one'), 0, 'never failed');
      proxy.setFaults({ throttle429: 1 });
      assert.equal((await get(session, secret, 'one')).status, 429);
      assert.equal((await get(session, '/api/v1/namespaces/x/secrets?watch=1', 'two')).status, 429);
      proxy.clear();
      // Another client's success, or a request for something else, is not this client getting through.
      assert.equal((await get(session, secret, 'three')).status, 200);
      assert.equal((await get(session, '/apis/coordination.k8s.io/v1/namespaces/x/leases/l', 'one')).status, 200);
      assert.equal(proxy.secretsReachableSince('one'), Number.POSITIVE_INFINITY);
      assert.equal(proxy.secretsReachableSince('two'), Number.POSITIVE_INFINITY);
      const before = Date.now();
      assert.equal((await get(session, secret, 'one')).status, 200);
      const since = proxy.secretsReachableSince('one');
      assert.ok(since >= before && since <= Date.now(), `through again at ${since}`);
      assert.equal(proxy.secretsReachableSince('two'), Number.POSITIVE_INFINITY, 'two has not tried again');
      assert.equal((await get(session, '/api/v1/namespaces/x/secrets/busy', 'one')).status, 503);
      assert.equal(proxy.secretsReachableSince('one'), Number.POSITIVE_INFINITY, "the API server's own 503");
    } finally {
      session.destroy();
    }
  });
});
