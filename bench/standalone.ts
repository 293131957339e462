// Standalone figures: bare Node RSS, the daemon's idle RSS (dir store), /healthz throughput against a
// bare fastify server, start-up to healthy (beside the bare fastify's start-up to its first answer: wall
// time, and the CPU time each used until then), and domain-to-certificate latency; the daemon started as
// the image's default entry does (its start-up snapshot).
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { type BaselineBuild, startBaseline, waitListening } from './lib/baseline.ts';
import { CertFileWatch, spawnImageEntry, startEmulator } from './lib/certshare.ts';
import { freePort, pollHealthy } from './lib/http.ts';
import { pinningAvailable, pinProcess, runLoad, type LoadResult } from './lib/load.ts';
import { cpuMs, idleRss, Proc, threadsCpuMs, type MemStatus } from './lib/proc.ts';
import type { BenchSize } from './lib/size.ts';
import { progress } from './lib/stats.ts';

export const STANDALONE_DOMAIN = 'web.tailnet-0000.ts.net';

export interface StandaloneOptions {
  /** Seconds of measured load per server (split into interleaved rounds of about 2 s). */
  loadSeconds: number;
  connections: number;
  size: BenchSize;
  /** The bare fastify baseline (bench/lib/baseline.ts). */
  hello: BaselineBuild;
}

export interface StandaloneResults {
  bareNode: MemStatus;
  standalone: MemStatus;
  /** The bare fastify hello, bundled as dist/ is: what fastify alone costs a process. */
  fastifyHello: MemStatus;
  healthz: LoadResult[];
  fastify: LoadResult[];
  /** A second bare fastify, measured as the other two: against the first, the resolution of the comparison. */
  twin: LoadResult[];
  /** CPU time of each server per 2xx response in each round (microseconds), same order as healthz / fastify. */
  healthzCpuUs: number[];
  fastifyCpuUs: number[];
  startupMs: number[];
  /**
   * CPU time the daemon used from its start until /healthz answered 200: every thread's time on a CPU
   * (threadsCpuMs, ns resolution), read at once after that answer.
   */
  startupCpuMs: number[];
  /** The bare fastify hello's start-up to its first /healthz 200, measured in turn with the daemon's. */
  fastifyStartupMs: number[];
  /** The bare fastify hello's CPU time until its first /healthz 200, measured as the daemon's. */
  fastifyStartupCpuMs: number[];
  domainToCertMs: number[];
  pinned: boolean;
}

export async function bareNodeRss(size: BenchSize): Promise<MemStatus> {
  const proc = new Proc('bare node', ['-e', 'setInterval(() => {}, 1 << 30)'], { mustRun: true });
  try {
    const [rss] = await idleRss([proc.pid], size.idle);
    return rss!;
  } finally {
    await proc.stop();
  }
}

async function startFastifyHello(hello: BaselineBuild): Promise<{ proc: Proc; port: number }> {
  const proc = startBaseline(hello, 0);
  return { proc, port: await waitListening(proc) };
}

type LoadServer = 'daemon' | 'fastify' | 'twin';
interface LoadRounds {
  results: LoadResult[];
  /** CPU time per 2xx response in each round (microseconds). */
  cpuUs: number[];
}
const newRounds = (): LoadRounds => ({ results: [], cpuUs: [] });

/** The image's entry with its certificate stored, once /healthz answers 200. */
async function startHealthyDaemon(baseArgs: string[]): Promise<{ proc: Proc; port: number }> {
  const port = await freePort();
  const proc = spawnImageEntry('certshare under load', [...baseArgs, '--domain', STANDALONE_DOMAIN, '--listen', `127.0.0.1:${port}`]);
  await pollHealthy(port, 20_000, () => proc.exitInfo === undefined);
  return { proc, port };
}

export async function standalonePhase(dir: string, o: StandaloneOptions, bareNode: MemStatus): Promise<StandaloneResults> {
  const emulator = await startEmulator(join(dir, 'emulator'), 'standalone', ['--domain', STANDALONE_DOMAIN]);
  const certDir = join(dir, 'certs');
  const baseArgs = ['--localapi', emulator.socket, '--store', `dir:${certDir}`];
  const files = await CertFileWatch.start(certDir, STANDALONE_DOMAIN);

  // 1. Idle RSS after start-up and a first certificate.
  progress('standalone: first start, first certificate, idle RSS');
  const port = await freePort();
  let daemon = spawnImageEntry('certshare standalone', [...baseArgs, '--domain', STANDALONE_DOMAIN, '--listen', `127.0.0.1:${port}`]);
  await files.next(30_000);
  const [standalone] = await idleRss([daemon.pid], o.size.idle);

  // 2. /healthz under load, against a bare fastify hello measured the same way, and a second bare fastify
  // (its twin): fresh processes each round. Two starts of one program on this machine differ for as long as
  // they run (docs/performance.md), so one process per server for every round would compare the luck of two
  // starts; the twin against the bare fastify shows what is left of it in the medians.
  const hello = await startFastifyHello(o.hello);
  const [fastifyHello] = await idleRss([hello.proc.pid], {
    ...o.size.idle,
    idleMs: Math.min(1000, o.size.idle.idleMs),
    spanMs: Math.min(1000, o.size.idle.spanMs),
  });
  await hello.proc.stop();
  await daemon.stop();
  progress(
    `load: ${o.loadSeconds} s each on /healthz of the daemon, a bare fastify and its twin, fresh processes each round ` +
      `(${o.connections} connections${pinningAvailable() ? '; servers on CPU 0, autocannon on CPU 1' : ''})`,
  );
  const load: Record<LoadServer, LoadRounds> = { daemon: newRounds(), fastify: newRounds(), twin: newRounds() };
  // Short rounds, medians: on a small shared machine a neighbour's burst then spoils one round of one server.
  const rounds = Math.max(1, Math.floor(o.loadSeconds / 2));
  for (let i = 0; i < rounds; i++) {
    const servers: Array<[LoadServer, { proc: Proc; port: number }]> = [
      ['daemon', await startHealthyDaemon(baseArgs)],
      ['fastify', await startFastifyHello(o.hello)],
      ['twin', await startFastifyHello(o.hello)],
    ];
    for (const [, server] of servers) {
      pinProcess(server.proc.pid, 0);
      await runLoad(`http://127.0.0.1:${server.port}/healthz`, o.size.warmupSeconds, o.connections);
    }
    for (const [name, server] of servers) {
      const cpuBefore = await cpuMs(server.proc.pid);
      const result = await runLoad(`http://127.0.0.1:${server.port}/healthz`, Math.max(1, Math.round(o.loadSeconds / rounds)), o.connections);
      load[name].results.push(result);
      load[name].cpuUs.push(((await cpuMs(server.proc.pid)) - cpuBefore) * (1000 / result.ok));
    }
    for (const [, server] of servers) await server.proc.stop();
  }

  // 3. Start-up to healthy with the certificate already stored (second and later starts), each paired with the
  // bare fastify hello's start-up to its first answer, which goes first every other pair: on this shared machine
  // only starts measured side by side compare, and the CPU time a start uses more than its wall time (which
  // holds the neighbours' time).
  progress(`standalone: start-up to healthy x${o.size.startupRuns}, each paired with the bare fastify hello's`);
  const startupMs: number[] = [];
  const startupCpuMs: number[] = [];
  const fastifyStartupMs: number[] = [];
  const fastifyStartupCpuMs: number[] = [];
  const startDaemon = async (): Promise<void> => {
    const p = await freePort();
    daemon = spawnImageEntry('certshare restart', [...baseArgs, '--domain', STANDALONE_DOMAIN, '--listen', `127.0.0.1:${p}`]);
    const healthyAt = await pollHealthy(p, 20_000, () => daemon.exitInfo === undefined);
    startupMs.push(healthyAt - daemon.spawnedAt);
    startupCpuMs.push(await threadsCpuMs(daemon.pid));
    await daemon.stop();
  };
  const startHello = async (): Promise<void> => {
    const helloPort = await freePort();
    const bare = startBaseline(o.hello, helloPort);
    fastifyStartupMs.push((await pollHealthy(helloPort, 20_000, () => bare.exitInfo === undefined)) - bare.spawnedAt);
    fastifyStartupCpuMs.push(await threadsCpuMs(bare.pid));
    await bare.stop();
  };
  for (let i = 0; i < o.size.startupRuns; i++) {
    for (const start of i % 2 === 0 ? [startDaemon, startHello] : [startHello, startDaemon]) await start();
  }

  // 4. A domain appears on the bus (emulator control API) -> its certificate files on disk.
  progress(`standalone: domain on the bus to certificate on disk x${o.size.domainRuns}`);
  const domains = Array.from({ length: o.size.domainRuns }, (_, i) => `new${i + 1}.tailnet-0000.ts.net`);
  const p = await freePort();
  daemon = spawnImageEntry('certshare new domains', [...baseArgs, ...domains.flatMap((d) => ['--domain', d]), '--listen', `127.0.0.1:${p}`]);
  await daemon.waitForLog((e) => e.msg === 'tailscaled cert domains', 20_000, 'first IPN bus sync');
  await sleep(500);
  const domainToCertMs: number[] = [];
  for (const domain of domains) {
    const watch = await CertFileWatch.start(certDir, domain);
    const t0 = performance.now();
    await emulator.addDomain(domain);
    const change = await watch.next(15_000);
    domainToCertMs.push(change.at - t0);
    watch.close();
    await sleep(300);
  }
  await daemon.stop();
  files.close();
  await emulator.proc.stop();
  return {
    bareNode,
    standalone: standalone!,
    fastifyHello: fastifyHello!,
    healthz: load.daemon.results,
    fastify: load.fastify.results,
    twin: load.twin.results,
    healthzCpuUs: load.daemon.cpuUs,
    fastifyCpuUs: load.fastify.cpuUs,
    startupMs,
    startupCpuMs,
    fastifyStartupMs,
    fastifyStartupCpuMs,
    domainToCertMs,
    pinned: pinningAvailable(),
  };
}
