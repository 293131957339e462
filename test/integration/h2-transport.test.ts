// The HTTP/2 transport's stream-level behaviour against a scripted node:http2 server: a reset stream
// fails alone, a refused one is sent again, failed connects back off.
import assert from 'node:assert/strict';
import { constants, createSecureServer, type Http2SecureServer, type ServerHttp2Stream } from 'node:http2';
import { after, before, describe, it } from 'node:test';
import { CoreV1Api } from '../../src/kube/transport/client-node.ts';
import { connectKube } from '../../src/kube/connection.ts';
import { kubeSessionStats, makeApi, refusedRetryWaitMs, setKubeSessionLiveness, watchOnce } from '../../src/kube/transport/https-transport.ts';
import { DAY, makePair } from '../support/certs.ts';
import { freePort } from '../support/processes.ts';
import { scriptedKubeconfig } from '../support/scripted-kubeconfig.ts';
import { useTempDir } from '../support/standalone.ts';

const secretJson = (name: string) => JSON.stringify({ apiVersion: 'v1', kind: 'Secret', metadata: { name, namespace: 'n' } });

describe('HTTP/2 transport against a scripted server', () => {
  const dir = useTempDir();
  let server: Http2SecureServer;
  let port: number;
  let sessions = 0;
  const seen: string[] = [];
  /** Per secret name: what the server does with a request for it. */
  let script: (name: string, stream: ServerHttp2Stream, attempt: number) => void = () => {};

  before(async () => {
    const pair = await makePair('localhost', Date.now() - 60_000, DAY);
    server = createSecureServer({ cert: pair.certPem, key: pair.keyPem });
    server.on('session', () => sessions++);
    server.on('stream', (stream, headers) => {
      stream.on('error', () => {}); // the resets this server makes itself
      const name = String(headers[':path']).split('/').pop()!.split('?')[0]!;
      seen.push(name);
      script(name, stream, seen.filter((n) => n === name).length);
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    port = (server.address() as { port: number }).port;
  });
  after(() => server.close());

  it('a stream the server resets fails alone; its sibling on the same connection answers', async () => {
    let held: ServerHttp2Stream | undefined;
    script = (name, stream) => {
      if (name === 'slow') held = stream;
      else if (name === 'reset') {
        stream.close(constants.NGHTTP2_INTERNAL_ERROR);
        held?.respond({ ':status': 200, 'content-type': 'application/json' });
        held?.end(secretJson('slow'));
      }
    };
    sessions = 0;
    const connection = await connectKube({ KUBECONFIG: await scriptedKubeconfig(dir(), 'reset', port), POD_NAMESPACE: 'n' });
    const api = makeApi(connection.config, CoreV1Api);
    const slow = api.readNamespacedSecret({ name: 'slow', namespace: 'n' });
    await new Promise<void>((resolve) => {
      const check = () => (held ? resolve() : setImmediate(check));
      check();
    });
    await assert.rejects(api.readNamespacedSecret({ name: 'reset', namespace: 'n' }), /NGHTTP2_INTERNAL_ERROR|code 2/);
    assert.equal((await slow).metadata?.name, 'slow');
    assert.equal(sessions, 1);
    connection.close();
  });

  it("a stream refused unprocessed (REFUSED_STREAM) is sent again, up to 7 times as Go's transport does", async () => {
    script = (name, stream, attempt) => {
      if (attempt <= (name === 'refused-thrice' ? 3 : 1)) return stream.close(constants.NGHTTP2_REFUSED_STREAM);
      stream.respond({ ':status': 200, 'content-type': 'application/json' });
      stream.end(secretJson(name));
    };
    const connection = await connectKube({ KUBECONFIG: await scriptedKubeconfig(dir(), 'refused', port), POD_NAMESPACE: 'n' });
    const api = makeApi(connection.config, CoreV1Api);
    assert.equal((await api.readNamespacedSecret({ name: 'refused-once', namespace: 'n' })).metadata?.name, 'refused-once');
    assert.equal(seen.filter((n) => n === 'refused-once').length, 2);
    // Refused on several sessions in a row (an apiserver sending GOAWAY under load): still answered.
    assert.equal((await api.readNamespacedSecret({ name: 'refused-thrice', namespace: 'n' })).metadata?.name, 'refused-thrice');
    assert.equal(seen.filter((n) => n === 'refused-thrice').length, 4);
    // Refused every time: 7 attempts, then the error.
    script = (_name, stream) => stream.close(constants.NGHTTP2_REFUSED_STREAM);
    await assert.rejects(api.readNamespacedSecret({ name: 'always-refused', namespace: 'n' }), /NGHTTP2_REFUSED_STREAM/);
    assert.equal(seen.filter((n) => n === 'always-refused').length, 7);
    connection.close();
  });

  it("waits before a refused stream's next attempt: none for the second, then 100 ms doubling, jittered by 10 %", () => {
    assert.equal(refusedRetryWaitMs(2), 0);
    for (const [attempt, base] of [
      [3, 100],
      [4, 200],
      [5, 400],
      [7, 1600],
    ] as const) {
      const wait = refusedRetryWaitMs(attempt);
      assert.ok(wait >= base * 0.9 && wait <= base * 1.1, `attempt ${attempt}: ${wait} ms`);
    }
  });

  it("a refused stream's retries end with the request's deadline", async () => {
    script = (_name, stream) => stream.close(constants.NGHTTP2_REFUSED_STREAM);
    const connection = await connectKube({ KUBECONFIG: await scriptedKubeconfig(dir(), 'refused-deadline', port), POD_NAMESPACE: 'n' });
    const api = makeApi(connection.config, CoreV1Api, 250);
    await assert.rejects(api.readNamespacedSecret({ name: 'refused-until-deadline', namespace: 'n' }), { code: 'CERTSHARE_KUBE_TIMEOUT' });
    assert.ok(seen.filter((n) => n === 'refused-until-deadline').length < 7, 'stopped by the deadline, not by the attempt count');
    connection.close();
  });

  it('after a failed connect, calls fail at once with its error instead of each opening a connection', async () => {
    const closed = await freePort();
    const connection = await connectKube({ KUBECONFIG: await scriptedKubeconfig(dir(), 'refused-port', closed), POD_NAMESPACE: 'n' });
    // A first wait of a minute: the second call comes within it however loaded the machine.
    setKubeSessionLiveness(connection.config, { reconnectFirstMs: 60_000 });
    const api = makeApi(connection.config, CoreV1Api);
    await assert.rejects(api.readNamespacedSecret({ name: 's', namespace: 'n' }), { code: 'ECONNREFUSED' });
    await assert.rejects(api.readNamespacedSecret({ name: 's', namespace: 'n' }), { code: 'ECONNREFUSED' });
    assert.equal(kubeSessionStats(connection.config).connects, 1, 'the second call waited out the backoff instead of connecting');
    connection.close();
  });
});

describe('HTTP/2 transport: a full connection', () => {
  const dir = useTempDir();
  let server: Http2SecureServer;
  let port: number;
  let sessions = 0;
  const held: ServerHttp2Stream[] = [];

  before(async () => {
    const pair = await makePair('localhost', Date.now() - 60_000, DAY);
    // Two streams per connection, as kube-apiserver's 100 but small enough to fill in a test.
    server = createSecureServer({ cert: pair.certPem, key: pair.keyPem, settings: { maxConcurrentStreams: 2 } });
    server.on('session', () => sessions++);
    server.on('stream', (stream, headers) => {
      stream.on('error', () => {});
      const path = String(headers[':path']);
      stream.respond({ ':status': 200, 'content-type': 'application/json' });
      if (path.includes('watch=true'))
        held.push(stream); // a watch: open until the test ends it
      else setImmediate(() => stream.end(secretJson(path.split('/').pop()!.split('?')[0]!)));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    port = (server.address() as { port: number }).port;
  });
  after(() => server.close());

  it('a burst of requests waits for a free stream instead of opening connections; watches that fill it get another', async () => {
    const connection = await connectKube({ KUBECONFIG: await scriptedKubeconfig(dir(), 'full', port), POD_NAMESPACE: 'n' });
    const api = makeApi(connection.config, CoreV1Api);
    const names = Array.from({ length: 40 }, (_, i) => `burst-${i}`);
    const answers = await Promise.all(names.map((name) => api.readNamespacedSecret({ name, namespace: 'n' })));
    assert.deepEqual(
      answers.map((s) => s.metadata?.name),
      names,
    );
    assert.equal(sessions, 1, '40 requests on a 2-stream connection: one connection');
    // Two watches take both streams for good: a request now needs (and gets) a second connection.
    const stop = new AbortController();
    const watches = [1, 2].map(() =>
      watchOnce(connection.config, '/api/v1/namespaces/n/secrets', { fieldSelector: 'metadata.name=w' }, () => {}, {
        signal: stop.signal,
        inactivityMs: 60_000,
      }),
    );
    await new Promise<void>((resolve) => {
      const check = () => (held.length === 2 ? resolve() : setImmediate(check));
      check();
    });
    assert.equal((await api.readNamespacedSecret({ name: 'after-watches', namespace: 'n' })).metadata?.name, 'after-watches');
    assert.equal(sessions, 2);
    stop.abort();
    await Promise.all(watches);
    connection.close();
  });
});
