// Small process and port helpers shared by the test harness, the chaos run and the bench.
import { spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { createServer } from 'node:net';

let pdeathsig: string[] | undefined;
/**
 * `setpriv --pdeathsig SIGKILL --` (util-linux) as a command prefix: the kernel kills the child when this
 * process dies, which also covers SIGKILL and crashes where process.on('exit') never runs. It execs, so
 * the pid stays the child's. Linux only; empty where unavailable.
 */
export function deathSignalPrefix(): string[] {
  if (pdeathsig === undefined) {
    pdeathsig = [];
    if (process.platform === 'linux' && spawnSync('setpriv', ['--pdeathsig', 'SIGKILL', '--', 'true'], { stdio: 'ignore' }).status === 0) {
      pdeathsig = ['setpriv', '--pdeathsig', 'SIGKILL', '--'];
    }
  }
  return pdeathsig;
}

/** A loopback TCP port free right now. */
export async function freePort(): Promise<number> {
  const server = createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const address = server.address();
  server.close();
  await once(server, 'close');
  if (address === null || typeof address === 'string') throw new Error('no free loopback port');
  return address.port;
}
