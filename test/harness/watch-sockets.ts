// How many TCP connections to the API server, and how much memory, N Secret watches cost one process
// (a replica watches one Secret per domain). Starts its own control plane; prints one JSON line per N.
//
//   node test/harness/watch-sockets.ts 1 200
import { readdir, readFile, readlink } from 'node:fs/promises';
import { systemClock } from '../../src/core/ports/clock.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import { connectKube } from '../../src/kube/connection.ts';
import { SecretWatch } from '../../src/kube/secret-watch.ts';
import { startControlPlane } from './control-plane.ts';

/** This process's ESTABLISHED TCP connections to `port` (its own socket inodes matched in /proc/net/tcp*). */
async function socketsTo(port: number): Promise<number> {
  const inodes = new Set<string>();
  for (const fd of await readdir('/proc/self/fd')) {
    const target = await readlink(`/proc/self/fd/${fd}`).catch(() => '');
    const inode = /^socket:\[(\d+)\]$/.exec(target)?.[1];
    if (inode) inodes.add(inode);
  }
  let count = 0;
  for (const table of ['/proc/self/net/tcp', '/proc/self/net/tcp6']) {
    const lines = (await readFile(table, 'utf8').catch(() => '')).split('\n').slice(1);
    for (const line of lines) {
      const f = line.trim().split(/\s+/);
      if (f.length < 10) continue;
      const remotePort = Number.parseInt(f[2]!.split(':')[1]!, 16);
      if (remotePort === port && f[3] === '01' && inodes.has(f[9]!)) count++;
    }
  }
  return count;
}

const counts = process.argv.slice(2).map(Number);
const cp = await startControlPlane();
try {
  for (const n of counts) {
    const ns = `sockets-${n}`;
    await cp.kubectl(['create', 'namespace', ns]);
    const connection = await connectKube({ KUBECONFIG: cp.adminKubeconfigPath, POD_NAMESPACE: ns });
    const names = Array.from({ length: n }, (_, i) => `domain-${i}.tailnet-0000.ts.net`);
    for (let i = 0; i < n; i += 50) {
      await Promise.all(names.slice(i, i + 50).map((name) => connection.core.createNamespacedSecret({ namespace: ns, body: { metadata: { name } } })));
    }
    let listed = 0;
    const watches = names.map((name) => new SecretWatch({ connection, name, clock: systemClock, logger: silentLogger, onChange: () => listed++ }));
    for (const w of watches) w.start();
    // Each watch lists once, then watches; give the watch requests time to be open.
    while (listed < n) await new Promise((r) => setTimeout(r, 100));
    await new Promise((r) => setTimeout(r, 3000));
    globalThis.gc?.();
    const sockets = await socketsTo(cp.port);
    const rssMb = Math.round(process.memoryUsage().rss / 1e5) / 10;
    console.log(JSON.stringify({ watches: n, socketsToApiServer: sockets, rssMb }));
    await Promise.all(watches.map((w) => w.stop()));
    (connection as { close?: () => void }).close?.();
  }
} finally {
  await cp.stop();
}
