// The federation home's start-up check (checkHome, src/kube/home-check.ts) against a scripted node:http2
// server: a dry-run update that conflicts (another member's writer renewed the Lease meanwhile) is read
// and tried again, and a stream reset on the way to the home is an outage (logged, the member starts on
// its local copies), never CERTSHARE_HOME_UNUSABLE; so is a refusal from a home whose /readyz says it is
// not ready (an apiserver restarting, its authorizer not yet synced). All three made members exit at start
// in the chaos run. A refusal from a ready home is the kubeconfig's: CERTSHARE_HOME_UNUSABLE. A home that
// refuses /readyz too (its policy still loading, or hardened) is asked again, and its refusal stands once it
// has lasted: a member without its rights must not run on as if the home were away.
import assert from 'node:assert/strict';
import { constants, createSecureServer, type Http2SecureServer, type ServerHttp2Stream } from 'node:http2';
import { after, before, describe, it } from 'node:test';
import { connectKube } from '../../src/kube/connection.ts';
import { checkHome } from '../../src/kube/home-check.ts';
import { DAY, makePair } from '../support/certs.ts';
import { recordingLogger } from '../support/recording-logger.ts';
import { scriptedKubeconfig } from '../support/scripted-kubeconfig.ts';
import { useTempDir } from '../support/standalone.ts';

const lease = (rv: number): string =>
  JSON.stringify({
    apiVersion: 'coordination.k8s.io/v1',
    kind: 'Lease',
    metadata: { name: 'certshare-proxy', namespace: 'n', resourceVersion: String(rv) },
    spec: {},
  });
const conflict = JSON.stringify({
  kind: 'Status',
  apiVersion: 'v1',
  status: 'Failure',
  reason: 'Conflict',
  code: 409,
  message: 'the object has been modified',
});

describe('the home start-up check against a scripted server', () => {
  const dir = useTempDir();
  let server: Http2SecureServer;
  let port: number;
  const seen: string[] = [];
  let script: (method: string, stream: ServerHttp2Stream, calls: number, path: string) => void = () => {};

  before(async () => {
    const pair = await makePair('localhost', Date.now() - 60_000, DAY);
    server = createSecureServer({ cert: pair.certPem, key: pair.keyPem });
    server.on('stream', (stream, headers) => {
      stream.on('error', () => {});
      const method = String(headers[':method']);
      seen.push(method);
      script(method, stream, seen.filter((m) => m === method).length, String(headers[':path']));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    port = (server.address() as { port: number }).port;
  });
  after(() => server.close());

  const answer = (stream: ServerHttp2Stream, status: number, body: string): void => {
    stream.respond({ ':status': status, 'content-type': 'application/json' });
    stream.end(body);
  };

  it('a conflicting dry run is read and tried again: the check passes', async () => {
    seen.length = 0;
    script = (method, stream, calls) => {
      if (method === 'GET') answer(stream, 200, lease(calls));
      else answer(stream, calls === 1 ? 409 : 200, calls === 1 ? conflict : lease(calls));
    };
    const home = await connectKube({}, { kubeconfig: await scriptedKubeconfig(dir(), 'conflict', port), namespace: 'n' });
    try {
      await checkHome(home, 'proxy', recordingLogger().logger);
    } finally {
      home.close();
    }
    assert.deepEqual(seen, ['GET', 'PUT', 'GET', 'PUT']);
  });

  it('a stream reset on the way to the home is an outage: logged, no error', async () => {
    seen.length = 0;
    script = (_method, stream) => stream.close(constants.NGHTTP2_INTERNAL_ERROR);
    const { logger, entries } = recordingLogger();
    const home = await connectKube({}, { kubeconfig: await scriptedKubeconfig(dir(), 'reset', port), namespace: 'n' });
    try {
      await checkHome(home, 'proxy', logger);
    } finally {
      home.close();
    }
    assert.ok(
      entries.some((e) => /unreachable at start/.test(e.msg ?? '')),
      JSON.stringify(entries),
    );
  });

  const forbidden = JSON.stringify({ kind: 'Status', apiVersion: 'v1', status: 'Failure', reason: 'Forbidden', code: 403, message: 'forbidden' });

  it('a refusal from a home that is not ready is an outage at start: logged, no error', async () => {
    seen.length = 0;
    const paths: string[] = [];
    script = (_method, stream, _calls, path) => {
      paths.push(path);
      if (path === '/readyz') answer(stream, 500, '[-]informer-sync failed: reason withheld\nreadyz check failed');
      else answer(stream, 403, forbidden);
    };
    const { logger, entries } = recordingLogger();
    const home = await connectKube({}, { kubeconfig: await scriptedKubeconfig(dir(), 'starting', port), namespace: 'n' });
    try {
      await checkHome(home, 'proxy', logger);
    } finally {
      home.close();
    }
    assert.deepEqual(paths, ['/apis/coordination.k8s.io/v1/namespaces/n/leases/certshare-proxy', '/readyz']);
    assert.ok(
      entries.some((e) => /not ready .* at start/.test(e.msg ?? '')),
      JSON.stringify(entries),
    );
  });

  it('a refusal from a ready home is the kubeconfig lacking rights: CERTSHARE_HOME_UNUSABLE', async () => {
    seen.length = 0;
    script = (_method, stream, _calls, path) => (path === '/readyz' ? answer(stream, 200, 'ok') : answer(stream, 403, forbidden));
    const home = await connectKube({}, { kubeconfig: await scriptedKubeconfig(dir(), 'refusing', port), namespace: 'n' });
    try {
      await assert.rejects(checkHome(home, 'proxy', recordingLogger().logger), (err: unknown) => {
        return (err as { code?: string }).code === 'CERTSHARE_HOME_UNUSABLE' && /lacks the rights/.test(String((err as Error).message));
      });
    } finally {
      home.close();
    }
  });

  it('a refusal with /readyz refused too is asked again: a home whose policy loads meanwhile passes the check', async () => {
    seen.length = 0;
    const paths: string[] = [];
    let leaseReads = 0;
    script = (method, stream, calls, path) => {
      paths.push(`${method} ${path}`);
      if (path === '/readyz') answer(stream, 403, forbidden);
      else if (method === 'GET') leaseReads++ < 2 ? answer(stream, 403, forbidden) : answer(stream, 200, lease(calls));
      else answer(stream, 200, lease(calls));
    };
    const home = await connectKube({}, { kubeconfig: await scriptedKubeconfig(dir(), 'loading', port), namespace: 'n' });
    try {
      await checkHome(home, 'proxy', recordingLogger().logger, { refusedForMs: 60_000 });
    } finally {
      home.close();
    }
    const leasePath = '/apis/coordination.k8s.io/v1/namespaces/n/leases/certshare-proxy';
    assert.deepEqual(
      [...paths],
      [`GET ${leasePath}`, 'GET /readyz', `GET ${leasePath}`, 'GET /readyz', `GET ${leasePath}`, `PUT ${leasePath}?dryRun=All`],
      'refused twice (each with /readyz), then read and dry-run',
    );
  });

  it('a refusal with /readyz refused too stands once it has lasted: CERTSHARE_HOME_UNUSABLE', async () => {
    seen.length = 0;
    script = (_method, stream) => answer(stream, 403, forbidden);
    const home = await connectKube({}, { kubeconfig: await scriptedKubeconfig(dir(), 'hardened', port), namespace: 'n' });
    try {
      await assert.rejects(checkHome(home, 'proxy', recordingLogger().logger, { refusedForMs: 600 }), (err: unknown) => {
        return (err as { code?: string }).code === 'CERTSHARE_HOME_UNUSABLE' && /lacks the rights .*\/readyz too/.test(String((err as Error).message));
      });
    } finally {
      home.close();
    }
    assert.ok(seen.length >= 4, `asked more than once: ${seen.join(', ')}`);
  });
});
