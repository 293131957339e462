// A flood of the webhook port, as any Pod of the cluster can send (the port is reachable from every Pod
// unless a NetworkPolicy fences it): idle connections, slow bodies, bodies over the bound and bodies at the
// bound that are expensive to parse, from two addresses, while the real apiserver creates Pods through the
// webhook (`failurePolicy: Fail`: a refused call is a Pod creation refused). The injector runs as its own
// process under the manifests' account, so its memory is its own.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect as netConnect } from 'node:net';
import { type TLSSocket, connect } from 'node:tls';
import { setTimeout as delay } from 'node:timers/promises';
import { after, before, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { buildDist } from '../../../scripts/build.ts';
import { MAX_BODY_BYTES } from '../../../src/injector/tls-server.ts';
import { useControlPlane } from '../../harness/use-control-plane.ts';
import { imageNodeFlags } from '../../support/dockerfile.ts';
import { injectorContainer, injectorRuntimeEnv } from '../../support/injector-deployment.ts';
import { ASKED, installInjector, proxyPod } from '../../support/injector-webhook.ts';
import { deathSignalPrefix, freePort } from '../../support/processes.ts';
import { injectorLoopbackFlags } from '../../support/replica-flags.ts';
import { memoryOf } from '../../support/proc-memory.ts';

const cp = useControlPlane();
const INJECTOR_NS = 'certshare';
const FLOOD_MS = 20_000;

/** A JSON body of `bytes` bytes made of as many small keys as fit: the most objects per byte to parse. */
function expensiveJson(bytes: number): Buffer {
  const parts: string[] = [];
  let size = 2;
  for (let i = 0; size + 16 < bytes; i++) {
    const part = `"k${i}":${i % 10}`;
    parts.push(part);
    size += part.length + 1;
  }
  return Buffer.from(`{${parts.join(',')}}`);
}

describe('the webhook under a flood from other Pods, while the apiserver creates Pods through it', () => {
  const ns = `flood-${process.pid}`;
  let injector: ReturnType<typeof spawn>;
  let port: number;
  let stderr = '';
  let dist: string | undefined;

  before(async () => {
    // What the image runs: the production bundle (module loading from sources costs tens of MB more).
    dist = await mkdtemp(join(tmpdir(), 'certshare-flood-'));
    await buildDist(join(dist, 'dist'));
    const MAIN = join(dist, 'dist/cli/main.js');
    // As the image runs it: the Dockerfile's Node flags, the Deployment's NODE_OPTIONS and allocator settings.
    const NODE_FLAGS = imageNodeFlags(await readFile(fileURLToPath(new URL('../../../Dockerfile', import.meta.url)), 'utf8'));
    const kubeconfig = await installInjector(cp(), 'https://127.0.0.1:1/mutate', ns);
    const env = { ...process.env, ...(await injectorRuntimeEnv()), KUBECONFIG: kubeconfig, POD_NAMESPACE: INJECTOR_NS, POD_NAME: 'injector-flood' };
    /** The injector on a port found free, and the webhook's URL on that port. */
    const start = async (): Promise<void> => {
      port = await freePort();
      const url = [{ op: 'replace', path: '/webhooks/0/clientConfig/url', value: `https://127.0.0.1:${port}/mutate` }];
      const patched = await cp().kubectl(['patch', 'mutatingwebhookconfiguration', 'certshare-injector', '--type=json', '-p', JSON.stringify(url)]);
      assert.equal(patched.code, 0, patched.stderr);
      const [command, ...prefix] = [...deathSignalPrefix(), process.execPath];
      stderr = '';
      injector = spawn(command!, [...prefix, ...NODE_FLAGS, MAIN, 'injector', ...injectorLoopbackFlags(port), '--log-level', 'warn'], {
        env,
        stdio: ['ignore', 'ignore', 'pipe'],
      });
      injector.stderr!.setEncoding('utf8').on('data', (chunk: string) => (stderr = (stderr + chunk).slice(-4000)));
    };
    await start();
    // The first replica creates its CA and writes the caBundle; the apiserver trusts it a moment later.
    const deadline = performance.now() + 60_000;
    let warm = await createPod('warmup-0');
    for (let i = 1, restarts = 0; !warm.ok && performance.now() < deadline; i++) {
      if (injector.exitCode !== null && /EADDRINUSE/.test(stderr) && restarts++ < 3) {
        // Another test's process took the port between its check and the injector's bind: another port.
        await start();
      }
      assert.equal(injector.exitCode, null, `the injector exited: ${stderr}`);
      await delay(250);
      warm = await createPod(`warmup-${i}`);
    }
    assert.ok(warm.ok, `the webhook never admitted a Pod: ${warm.why}; ${stderr}`);
  });

  after(async () => {
    injector?.kill('SIGKILL');
    if (injector?.exitCode === null) await once(injector, 'exit');
    if (dist) await rm(dist, { recursive: true, force: true });
  });

  async function createPod(name: string): Promise<{ ok: boolean; why: string }> {
    const res = await cp().adminRequest('POST', `/api/v1/namespaces/${ns}/pods`, { body: proxyPod(name, ASKED), timeoutMs: 30_000 });
    if (res.status !== 201) return { ok: false, why: `${res.status} ${res.body.slice(0, 300)}` };
    const injected = (JSON.parse(res.body) as { spec: { initContainers?: Array<{ name: string }> } }).spec.initContainers?.some((c) => c.name === 'certshare');
    return injected ? { ok: true, why: '' } : { ok: false, why: `${name} stored without the sidecar` };
  }

  it("refuses what it must, keeps its memory under the Deployment's limit, and fails no Pod creation", { timeout: 180_000 }, async (t) => {
    const stop = AbortSignal.timeout(FLOOD_MS);
    const sockets = new Set<TLSSocket>();
    // The flood ends at once: connections still waiting on a handshake or an answer too.
    stop.addEventListener('abort', () => {
      for (const s of sockets) s.destroy();
    });
    const answers: Record<string, number> = {};
    const open = (source: string): Promise<TLSSocket> =>
      new Promise((resolve) => {
        const tcp = netConnect({ host: '127.0.0.1', port, localAddress: source });
        tcp.on('error', () => {});
        const socket = connect({ socket: tcp, rejectUnauthorized: false });
        sockets.add(socket);
        socket.on('error', () => {});
        socket.on('close', () => sockets.delete(socket));
        socket.on('data', (chunk: Buffer) => {
          const code = /^HTTP\/1\.1 (\d{3})/.exec(chunk.toString('latin1'))?.[1];
          if (code) answers[code] = (answers[code] ?? 0) + 1;
        });
        socket.once('secureConnect', () => resolve(socket));
        socket.once('close', () => resolve(socket));
      });
    const head = (length: number) => `POST /mutate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${length}\r\n\r\n`;
    const expensive = expensiveJson(MAX_BODY_BYTES - 1024);
    /** Runs `attack` again and again from `source` until the flood ends. */
    const loop = async (source: string, attack: (socket: TLSSocket) => Promise<void>) => {
      while (!stop.aborted) {
        const socket = await open(source);
        if (socket.destroyed) {
          await delay(20);
          continue;
        }
        await attack(socket).catch(() => {});
        socket.destroy();
      }
    };
    const closed = (socket: TLSSocket) => (socket.destroyed ? Promise.resolve() : once(socket, 'close').then(() => {}));
    const attackers: Promise<void>[] = [];
    const repeat = (count: number, source: string, attack: (socket: TLSSocket) => Promise<void>) => {
      for (let i = 0; i < count; i++) attackers.push(loop(source, attack));
    };
    // Idle connections, held until the server drops them: four Pods, more than the connection bound in all.
    for (const source of ['127.0.0.2', '127.0.0.3', '127.0.0.4', '127.0.0.5'])
      repeat(80, source, (s) => Promise.race([closed(s), once(stop, 'abort').then(() => {})]));
    // Slow bodies: a bound-sized body, 1 KiB every 200 ms.
    repeat(20, '127.0.0.6', async (s) => {
      s.write(head(MAX_BODY_BYTES - 1024));
      while (!s.destroyed && !stop.aborted) {
        s.write(Buffer.alloc(1024, 0x20));
        await delay(200);
      }
    });
    // Over the bound. Headers only: the refusal comes before the body (a body written into a socket the
    // server closes would turn the answer into a reset).
    repeat(10, '127.0.0.7', async (s) => {
      s.write(head(20 * MAX_BODY_BYTES));
      await Promise.race([closed(s), delay(1000)]);
    });
    // At the bound, the most expensive JSON to parse, as fast as answered, from two Pods.
    for (const source of ['127.0.0.8', '127.0.0.9'])
      repeat(10, source, async (s) => {
        s.write(head(expensive.length));
        s.write(expensive);
        await Promise.race([closed(s), delay(5000)]);
      });
    const failures: string[] = [];
    let created = 0;
    let peakSeen = 0;
    const sampler = (async () => {
      while (!stop.aborted) {
        peakSeen = Math.max(peakSeen, (await memoryOf(injector.pid!)).rss);
        await delay(100);
      }
    })();
    for (let i = 0; !stop.aborted; i++) {
      const r = await createPod(`pod-${i}`);
      if (r.ok) created++;
      else failures.push(r.why);
    }
    await Promise.all([...attackers, sampler]);
    for (const s of sockets) s.destroy();
    const { peak } = await memoryOf(injector.pid!);
    const limit = (await injectorContainer()).resources.limits.memory;
    assert.match(limit, /^\d+Mi$/);
    const MEMORY_LIMIT_BYTES = Number.parseInt(limit, 10) * 2 ** 20;
    t.diagnostic(
      `flood ${FLOOD_MS / 1000}s: ${created} Pods created, ${failures.length} failed; injector RSS peak ${(peak / 2 ** 20).toFixed(1)} MiB ` +
        `(sampled ${(peakSeen / 2 ** 20).toFixed(1)}); attacker answers ${JSON.stringify(answers)}`,
    );
    assert.equal(injector.exitCode, null, `the injector died: ${stderr}`);
    assert.deepEqual(failures, [], `${failures.length} Pod creations failed of ${created + failures.length}`);
    // Creation goes on, every one admitted: how many is a speed, the bench's to measure (a loaded machine makes few).
    assert.ok(created >= 3, `only ${created} Pods created in ${FLOOD_MS / 1000} s`);
    assert.ok(peak < MEMORY_LIMIT_BYTES, `injector RSS peaked at ${(peak / 2 ** 20).toFixed(1)} MiB, over the Deployment's ${limit} limit`);
    assert.ok((answers['413'] ?? 0) > 0, 'bodies over the bound refused with 413');
  });
});
