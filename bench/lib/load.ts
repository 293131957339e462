// The loopback load generator: autocannon (npm devDependency, pinned). It runs as its own process
// (its CLI with --json), so the bench's event loop and the generator never share a core's time slice
// in one process, and the same Node binary drives both the daemon and the bare fastify baseline.
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { availableParallelism } from 'node:os';
import { Proc } from './proc.ts';

const AUTOCANNON = createRequire(import.meta.url).resolve('autocannon/autocannon.js');

export interface LoadResult {
  /** 2xx responses per second. */
  rps: number;
  p50Ms: number;
  p99Ms: number;
  ok: number;
  errors: number;
  non2xx: number;
  durationS: number;
}

interface AutocannonJson {
  duration: number;
  errors: number;
  timeouts: number;
  non2xx: number;
  '2xx': number;
  latency: { p50: number; p99: number };
}

let canPin: boolean | undefined;
/**
 * With 2+ CPUs and taskset(1): the server under test runs on CPU 0 and the load generator on CPU 1, so
 * the two servers compared are measured under the same conditions (one core each, like a sidecar with a
 * CPU limit of 1) instead of whatever the scheduler does on a small machine.
 */
export function pinningAvailable(): boolean {
  canPin ??= process.platform === 'linux' && availableParallelism() >= 2 && spawnSync('taskset', ['-c', '0', 'true'], { stdio: 'ignore' }).status === 0;
  return canPin;
}

/** Pins every thread of `pid` to CPU `cpu` (no-op without pinning). */
export function pinProcess(pid: number, cpu: number): void {
  if (!pinningAvailable()) return;
  const r = spawnSync('taskset', ['-a', '-p', '-c', String(cpu), String(pid)], { stdio: 'ignore' });
  if (r.status !== 0) throw new Error(`taskset -a -p -c ${cpu} ${pid} failed`);
}

/** GET `url` with `connections` keep-alive connections for `seconds` (from CPU 1 when pinning is available). */
export async function runLoad(url: string, seconds: number, connections = 10): Promise<LoadResult> {
  const args = [AUTOCANNON, '--json', '--no-progress', '-c', String(connections), '-d', String(seconds), url];
  const proc = pinningAvailable() ? new Proc('autocannon', ['-c', '1', process.execPath, ...args], { file: 'taskset' }) : new Proc('autocannon', args);
  let out = '';
  proc.onLine((line) => {
    if (line.startsWith('{')) out = line;
  });
  const timer = setTimeout(() => proc.child.kill('SIGKILL'), (seconds + 30) * 1000);
  const exit = await proc.exited;
  clearTimeout(timer);
  if (exit.code !== 0 || !out) throw new Error(`autocannon failed (code ${exit.code}, signal ${exit.signal}):\n${proc.tail()}`);
  const r = JSON.parse(out) as AutocannonJson;
  return {
    rps: r['2xx'] / r.duration,
    p50Ms: r.latency.p50,
    p99Ms: r.latency.p99,
    ok: r['2xx'],
    errors: r.errors + r.timeouts,
    non2xx: r.non2xx,
    durationS: r.duration,
  };
}
