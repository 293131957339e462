// All Kubernetes API traffic of a connection, requests and watches, over one HTTP/2 connection to the
// real kube-apiserver: counted at a TCP relay in front of it. Then what production throws at it: the
// apiserver's own GOAWAYs (--goaway-chance), a dropped or black-holed connection, a server without h2.
import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { readFile, writeFile } from 'node:fs/promises';
import { createServer as createHttpsServer } from 'node:https';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { CoreV1Api } from '../../src/kube/transport/client-node.ts';
import { systemClock } from '../../src/core/ports/clock.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import { connectKube, type KubeConnection } from '../../src/kube/connection.ts';
import { kubeSessionStats, makeApi, setKubeSessionLiveness, watchOnce, withSignal, type WatchEvent } from '../../src/kube/transport/https-transport.ts';
import { SecretWatch } from '../../src/kube/secret-watch.ts';
import type { ControlPlane } from '../harness/control-plane.ts';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { makePair, DAY } from '../support/certs.ts';
import { must } from '../support/kube.ts';
import { scriptedKubeconfig } from '../support/scripted-kubeconfig.ts';
import { useTempDir } from '../support/standalone.ts';
import { startTcpProxy, type TcpProxy } from '../support/tcp-proxy.ts';
import { onEvent, until } from '../support/wait.ts';

let namespaces = 0;

/** A namespace, and an admin connection to the apiserver through a TCP relay that counts connections. */
async function relayedAdmin(cp: ControlPlane, dir: string): Promise<{ relay: TcpProxy; connection: KubeConnection; ns: string }> {
  const ns = `h2-${process.pid}-${++namespaces}`;
  await must(cp.kubectl(['create', 'namespace', ns]));
  const relay = await startTcpProxy(cp.port);
  const text = (await readFile(cp.adminKubeconfigPath, 'utf8')).replace(/server: .*/, `server: "https://127.0.0.1:${relay.port}"`);
  const kubeconfig = join(dir, `${ns}.kubeconfig`);
  await writeFile(kubeconfig, text, { mode: 0o600 });
  return { relay, connection: await connectKube({ KUBECONFIG: kubeconfig, POD_NAMESPACE: ns }), ns };
}

const secret = (name: string, data: Record<string, string> = {}) => ({
  metadata: { name },
  data: Object.fromEntries(Object.entries(data).map(([k, v]) => [k, Buffer.from(v).toString('base64')])),
});

/** SecretWatches (resuming like the daemon's) over `names`, counting each one's changes. */
function watchAll(connection: KubeConnection, names: string[]) {
  const changes = new Map(names.map((n) => [n, 0]));
  const changed = new EventEmitter();
  const watches = names.map(
    (name) =>
      new SecretWatch({
        connection,
        name,
        clock: systemClock,
        logger: silentLogger,
        firstRetryMs: 100,
        maxRetryMs: 1000,
        onChange: () => {
          changes.set(name, changes.get(name)! + 1);
          changed.emit('change');
        },
      }),
  );
  for (const w of watches) w.start();
  return {
    changes,
    changed: onEvent(changed, 'change'),
    /** Every watch saw a change after this snapshot. */
    snapshot: () => new Map(changes),
    stop: () => Promise.all(watches.map((w) => w.stop())),
  };
}

/** Updates every Secret and waits until each watch has reported a change since. */
async function everyWatchSeesAnUpdate(core: CoreV1Api, ns: string, names: string[], watched: ReturnType<typeof watchAll>, timeoutMs: number, tag: string) {
  const before = watched.snapshot();
  // Retried once, as every caller does: an update may meet the connection that has just been dropped.
  const update = (name: string) => core.replaceNamespacedSecret({ name, namespace: ns, body: secret(name, { tag }) });
  // In batches: never more than kube-apiserver's 100 streams per connection at once with the watches.
  for (let i = 0; i < names.length; i += 30) await Promise.all(names.slice(i, i + 30).map((name) => update(name).catch(() => update(name))));
  await until(`every watch sees "${tag}"`, () => names.every((n) => watched.changes.get(n)! > before.get(n)!), [watched.changed], timeoutMs);
}

describe('HTTP/2 to the real kube-apiserver', () => {
  const cp = useControlPlane();
  const dir = useTempDir();

  it('parallel watches and requests share one TCP connection; a cancelled stream leaves its siblings alone', { timeout: 120_000 }, async () => {
    const { relay, connection, ns } = await relayedAdmin(cp(), dir());
    const names = Array.from({ length: 60 }, (_, i) => `s-${i}`);
    // Never more than kube-apiserver's 100 streams per connection at once (see the next test).
    for (let i = 0; i < names.length; i += 30) {
      await Promise.all(names.slice(i, i + 30).map((name) => connection.core.createNamespacedSecret({ namespace: ns, body: secret(name) })));
    }
    const watched = watchAll(connection, names);
    try {
      await until('every watch sees its Secret', () => names.every((n) => watched.changes.get(n)! >= 1), [watched.changed], 30_000);
      for (let round = 0; round < 5; round++) {
        const reads = await Promise.all(names.slice(0, 30).map((name) => connection.core.readNamespacedSecret({ name, namespace: ns })));
        assert.equal(reads.length, 30);
      }

      // One more watch, then cancelled; and a request cancelled in flight.
      const cancelled = new AbortController();
      const extra: WatchEvent[] = [];
      const arrived = new EventEmitter();
      const ended = watchOnce(
        connection.config,
        `/api/v1/namespaces/${ns}/secrets`,
        { fieldSelector: 'metadata.name=s-0' },
        (e) => {
          extra.push(e);
          arrived.emit('event');
        },
        { signal: cancelled.signal, inactivityMs: 60_000 },
      );
      await until('the extra watch has its ADDED', () => extra.length >= 1, [onEvent(arrived, 'event')], 10_000);
      cancelled.abort();
      await ended;
      const stop = new AbortController();
      const inFlight = connection.core.listNamespacedSecret({ namespace: ns }, withSignal(stop.signal));
      stop.abort();
      await assert.rejects(inFlight, { name: 'AbortError' });

      await everyWatchSeesAnUpdate(connection.core, ns, names, watched, 30_000, 'after-cancel');
      assert.equal(relay.accepted, 1, 'one TCP connection for 61 watches and ~330 requests');
      assert.deepEqual(kubeSessionStats(connection.config), { connects: 1, sessions: 1, http1Only: 0 });
    } finally {
      await watched.stop();
      connection.close();
      await relay.close();
    }
  });

  it("past the apiserver's 100 concurrent streams per connection (its default), a second connection opens", { timeout: 120_000 }, async () => {
    const { relay, connection, ns } = await relayedAdmin(cp(), dir());
    const stop = new AbortController();
    const delivered = new Set<number>();
    const arrived = new EventEmitter();
    const watches = Array.from({ length: 150 }, (_, i) =>
      watchOnce(
        connection.config,
        `/api/v1/namespaces/${ns}/secrets`,
        { fieldSelector: `metadata.name=cap-${i}` },
        () => {
          delivered.add(i);
          arrived.emit('event');
        },
        { signal: stop.signal, inactivityMs: 120_000 },
      ),
    );
    try {
      // Every watch delivers its Secret's ADDED: all 150 are open at once (with at most 25 requests).
      for (let i = 0; i < 150; i += 25) {
        await Promise.all(Array.from({ length: 25 }, (_, j) => connection.core.createNamespacedSecret({ namespace: ns, body: secret(`cap-${i + j}`) })));
      }
      await until('every watch has its event', () => delivered.size === 150, [onEvent(arrived, 'event')], 60_000);
      assert.equal(kubeSessionStats(connection.config).sessions, 2, 'two HTTP/2 sessions for 150 watches');
      assert.equal(relay.accepted, 2);
    } finally {
      stop.abort();
      await Promise.all(watches);
      connection.close();
      await relay.close();
    }
  });

  it('a 5 MB list arrives whole; one over 16 MiB fails with CERTSHARE_KUBE_RESPONSE_TOO_LARGE', { timeout: 120_000 }, async () => {
    const { relay, connection, ns } = await relayedAdmin(cp(), dir());
    try {
      const blob = 'x'.repeat(700 * 1024); // ~930 KB once base64-encoded
      const create = (i: number) => connection.core.createNamespacedSecret({ namespace: ns, body: secret(`big-${i}`, { blob }) });
      for (let i = 0; i < 6; i++) await create(i);
      const list = await connection.core.listNamespacedSecret({ namespace: ns });
      assert.equal(list.items.length, 6);
      assert.equal(Buffer.from(list.items[5]!.data!.blob!, 'base64').length, blob.length);
      for (let i = 6; i < 19; i++) await create(i);
      await assert.rejects(connection.core.listNamespacedSecret({ namespace: ns }), { code: 'CERTSHARE_KUBE_RESPONSE_TOO_LARGE' });
      // The stream was reset, not the connection: the next request goes over the same one.
      await connection.core.readNamespacedSecret({ name: 'big-0', namespace: ns });
      assert.equal(relay.accepted, 1);
    } finally {
      connection.close();
      await relay.close();
    }
  });

  it('a dropped connection is replaced and the watches resume on the new one', { timeout: 120_000 }, async () => {
    const { relay, connection, ns } = await relayedAdmin(cp(), dir());
    const names = Array.from({ length: 10 }, (_, i) => `d-${i}`);
    await Promise.all(names.map((name) => connection.core.createNamespacedSecret({ namespace: ns, body: secret(name) })));
    const watched = watchAll(connection, names);
    try {
      await everyWatchSeesAnUpdate(connection.core, ns, names, watched, 30_000, 'before');
      relay.cut();
      relay.restore();
      await everyWatchSeesAnUpdate(connection.core, ns, names, watched, 30_000, 'after');
      assert.equal(relay.accepted, 2, 'one connection replaced by one');
    } finally {
      await watched.stop();
      connection.close();
      await relay.close();
    }
  });

  it('a black-holed connection is found dead by its PINGs, once for all its watches, which resume', { timeout: 120_000 }, async () => {
    const { relay, connection, ns } = await relayedAdmin(cp(), dir());
    setKubeSessionLiveness(connection.config, { readIdleMs: 1000, pingTimeoutMs: 3000 });
    const names = Array.from({ length: 10 }, (_, i) => `b-${i}`);
    await Promise.all(names.map((name) => connection.core.createNamespacedSecret({ namespace: ns, body: secret(name) })));
    const watched = watchAll(connection, names);
    try {
      await everyWatchSeesAnUpdate(connection.core, ns, names, watched, 30_000, 'before');
      relay.blackHole();
      relay.restore(); // new connections get through; the black-holed one stays dead
      const started = performance.now();
      // The watches' own inactivity bound is 15 minutes: only the session's PING can notice.
      await everyWatchSeesAnUpdate(connection.core, ns, names, watched, 30_000, 'after');
      assert.ok(performance.now() - started < 20_000);
      assert.equal(relay.accepted, 2, 'one new connection for all the watches');
    } finally {
      await watched.stop();
      connection.close();
      await relay.close();
    }
  });

  it('a server without h2 is spoken to over HTTP/1.1, remembered', { timeout: 60_000 }, async () => {
    const pair = await makePair('localhost', Date.now() - 60_000, DAY);
    let requests = 0;
    const server = createHttpsServer({ cert: pair.certPem, key: pair.keyPem }, (req, res) => {
      requests++;
      if (req.url?.includes('watch=true')) {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(`${JSON.stringify({ type: 'ADDED', object: { metadata: { name: 'w', resourceVersion: '7' } } })}\n`);
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ apiVersion: 'v1', kind: 'Secret', metadata: { name: 's', namespace: 'n' } }));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const { port } = server.address() as { port: number };
      const kubeconfig = await scriptedKubeconfig(dir(), 'h1', port);
      const connection = await connectKube({ KUBECONFIG: kubeconfig, POD_NAMESPACE: 'n' });
      const api = makeApi(connection.config, CoreV1Api);
      for (let i = 0; i < 3; i++) assert.equal((await api.readNamespacedSecret({ name: 's', namespace: 'n' })).metadata?.name, 's');
      const events: WatchEvent[] = [];
      await watchOnce(connection.config, '/api/v1/namespaces/n/secrets', {}, (e) => events.push(e), {
        signal: new AbortController().signal,
        inactivityMs: 5000,
      });
      assert.equal(events[0]?.object.metadata?.resourceVersion, '7');
      assert.equal(requests, 4);
      assert.deepEqual(kubeSessionStats(connection.config), { connects: 1, sessions: 0, http1Only: 1 }, 'ALPN asked once');
      connection.close();
    } finally {
      server.closeAllConnections();
      server.close();
    }
  });
});

describe('HTTP/2 with the apiserver sending GOAWAY (--goaway-chance=0.02)', () => {
  const cp = useControlPlane({ goawayChance: 0.02 });
  const dir = useTempDir();
  let relay: TcpProxy;
  let connection: KubeConnection;
  let ns: string;
  before(async () => {
    ({ relay, connection, ns } = await relayedAdmin(cp(), dir()));
  });
  after(async () => {
    connection.close();
    await relay.close();
  });

  it('a burst of 3000 requests all succeed and the watches keep delivering', { timeout: 180_000 }, async () => {
    const names = Array.from({ length: 20 }, (_, i) => `g-${i}`);
    await Promise.all(names.map((name) => connection.core.createNamespacedSecret({ namespace: ns, body: secret(name) })));
    const watched = watchAll(connection, names);
    try {
      await everyWatchSeesAnUpdate(connection.core, ns, names, watched, 30_000, 'before');
      let done = 0;
      const worker = async () => {
        while (done < 3000) {
          done++;
          await connection.core.readNamespacedSecret({ name: names[done % names.length]!, namespace: ns });
        }
      };
      await Promise.all(Array.from({ length: 50 }, worker));
      const stats = kubeSessionStats(connection.config);
      assert.ok(stats.connects > 5, `the apiserver's GOAWAYs moved us to new connections (${stats.connects} connections)`);
      await everyWatchSeesAnUpdate(connection.core, ns, names, watched, 30_000, 'after');
      assert.ok(relay.open <= 3, `connections left open: ${relay.open}`);
    } finally {
      await watched.stop();
    }
  });
});
