// The fence around @kubernetes/client-node (src/kube/transport/client-node.ts): every internal it imports
// is there and has the shape certshare relies on, and a request made the way certshare makes them
// (makeApi, withSignal, setHeaderOptions, V1MicroTime) reaches a server as it should. A client-node
// upgrade that moves a dist/ path fails the import; one that reshapes a seam fails here, by name.
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { createServer, type IncomingMessage } from 'node:http';
import { after, before, describe, it } from 'node:test';
import * as fence from '../../src/kube/transport/client-node.ts';
import { makeApi, withSignal } from '../../src/kube/transport/https-transport.ts';

const {
  CoordinationV1Api,
  CoreV1Api,
  EventsV1Api,
  HttpMethod,
  KubeConfig,
  PatchStrategy,
  RequestContext,
  ResponseContext,
  ServerConfiguration,
  V1MicroTime,
  createConfiguration,
  of,
  setHeaderMiddleware,
  setHeaderOptions,
  wrapHttpLibrary,
} = fence;

/** `names` are methods of `proto` (the ones certshare calls). */
function hasMethods(what: string, proto: object, names: string[]): void {
  for (const name of names) assert.equal(typeof (proto as Record<string, unknown>)[name], 'function', `${what}.${name} is a method`);
}

describe('the client-node fence', () => {
  it('exports every value certshare uses, each a function or an enum', () => {
    for (const [name, value] of Object.entries(fence)) {
      assert.ok(value !== undefined && value !== null, `${name} is defined`);
    }
    for (const api of [CoordinationV1Api, CoreV1Api, EventsV1Api, fence.CustomObjectsApi]) assert.equal(typeof api, 'function');
    assert.equal(PatchStrategy.MergePatch, 'application/merge-patch+json');
    assert.equal(HttpMethod.GET, 'GET');
  });

  it('KubeConfig has the methods connection.ts and https-transport.ts call', () => {
    hasMethods('KubeConfig', KubeConfig.prototype, [
      'loadFromFile',
      'loadFromCluster',
      'loadFromClusterAndUser',
      'getCurrentCluster',
      'getCurrentContext',
      'getContextObject',
      'applyToHTTPSOptions',
    ]);
  });

  it("the generated HTTP layer's seams have the shape the transport plugs into", async () => {
    hasMethods('RequestContext', RequestContext.prototype, [
      'getUrl',
      'getHttpMethod',
      'getHeaders',
      'getBody',
      'setHeaderParam',
      'getSignal',
      'setSignal',
      'getDispatcher',
      'setDispatcher',
    ]);
    const context = new RequestContext('https://example.invalid/api/v1', HttpMethod.GET);
    const options = { marker: true };
    context.setDispatcher(options as unknown as Parameters<typeof context.setDispatcher>[0]);
    assert.equal(context.getDispatcher(), options, 'the dispatcher slot carries our request options unchanged');
    // A library wrapped by wrapHttpLibrary answers through the observable stub (`of`, toPromise).
    const response = new ResponseContext(200, { a: 'b' }, { text: async () => 't', binary: async () => Buffer.from('t'), stream: () => null });
    const library = wrapHttpLibrary({ send: async () => response });
    assert.equal(await library.send(context).toPromise(), response);
    assert.equal(await of(7).toPromise(), 7);
    const configuration = createConfiguration({
      baseServer: new ServerConfiguration('https://example.invalid', {}),
      httpApi: library,
      middleware: [setHeaderMiddleware('User-Agent', 'x')],
    });
    assert.equal(configuration.httpApi, library);
    assert.equal(typeof configuration.baseServer.makeRequestContext, 'function');
    const merged = setHeaderOptions('Content-Type', PatchStrategy.MergePatch);
    assert.ok(Array.isArray(merged.middleware) && merged.middleware.length === 1, 'setHeaderOptions gives one middleware');
  });

  describe('a request made as certshare makes them', () => {
    const seen: { method: string; url: string; headers: IncomingMessage['headers']; body: string }[] = [];
    const server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        seen.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers, body: Buffer.concat(chunks).toString('utf8') });
        res.writeHead(200, { 'content-type': 'application/json' });
        const kind = req.url?.includes('/events') ? 'Event' : 'Secret';
        res.end(JSON.stringify({ apiVersion: 'v1', kind, metadata: { name: 'n', namespace: 'ns' } }));
      });
    });
    const config = new KubeConfig();
    before(async () => {
      server.listen(0, '127.0.0.1');
      await once(server, 'listening');
      const { port } = server.address() as { port: number };
      config.loadFromClusterAndUser({ name: 'c', server: `http://127.0.0.1:${port}`, skipTLSVerify: true }, { name: 'u', token: 'tok' });
    });
    after(() => server.close());

    it('carries the token, our User-Agent, a patch content type, and a MicroTime with microseconds', async () => {
      const core = makeApi(config, CoreV1Api);
      const read = await core.readNamespacedSecret({ name: 'n', namespace: 'ns' }, withSignal(AbortSignal.timeout(5000)));
      assert.equal(read.metadata?.name, 'n');
      await core.patchNamespacedSecret(
        { name: 'n', namespace: 'ns', body: { metadata: { labels: { a: 'b' } } } },
        withSignal(AbortSignal.timeout(5000), setHeaderOptions('Content-Type', PatchStrategy.MergePatch)),
      );
      const events = makeApi(config, EventsV1Api);
      await events.createNamespacedEvent({
        namespace: 'ns',
        body: { metadata: { name: 'e' }, eventTime: new V1MicroTime(Date.UTC(2026, 0, 2, 3, 4, 5, 678)) },
      });
      const [get, patch, event] = seen;
      assert.deepEqual([get?.method, get?.url], ['GET', '/api/v1/namespaces/ns/secrets/n']);
      assert.equal(get?.headers.authorization, 'Bearer tok');
      assert.equal(get?.headers['user-agent'], 'certshare');
      assert.equal(patch?.method, 'PATCH');
      assert.equal(patch?.headers['content-type'], 'application/merge-patch+json');
      assert.deepEqual(JSON.parse(patch?.body ?? '{}'), { metadata: { labels: { a: 'b' } } });
      assert.equal(JSON.parse(event?.body ?? '{}').eventTime, '2026-01-02T03:04:05.678000Z');
    });
  });
});
