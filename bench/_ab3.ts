import { spawn } from 'node:child_process';
import { DIST_MAIN } from './lib/certshare.ts';
import { freePort, pollHealthy } from './lib/http.ts';
import { pinProcess, runLoad } from './lib/load.ts';
import { Proc, cleanEnv, stopAll } from './lib/proc.ts';
const args = (port: number) => [DIST_MAIN, 'run', '--localapi', '/tmp/bx/ts.sock', '--domain', 'a.tailnet-0000.ts.net', '--store', 'dir:/tmp/bx/certs', '--listen', `127.0.0.1:${port}`];
try {
  for (let round = 0; round < 3; round++) {
    for (const v of ['proc', 'fresh']) {
      if (v === 'fresh') (await import('node:fs')).rmSync('/tmp/bx/certs', { recursive: true, force: true });
      const port = await freePort();
      let pid: number; let kill: () => Promise<void>;
      if (v === 'ignore') {
        const c = spawn(process.execPath, args(port), { stdio: 'ignore', env: cleanEnv() });
        pid = c.pid!; kill = async () => { c.kill(); await new Promise((r) => c.once('exit', r)); };
      } else if (v === 'proc-launchpin') {
        const p = new Proc('d', ['-c', '0', process.execPath, ...args(port)], { file: 'taskset' });
        pid = p.pid; kill = () => p.stop();
      } else {
        const p = new Proc('d', args(port));
        if (v === 'fresh') p.onLine((l) => { if (/issued|written/.test(l)) console.log('   ', l.slice(0, 160)); });
        pid = p.pid; kill = () => p.stop();
      }
      await pollHealthy(port, 10000, () => true);
      if (v !== 'proc-launchpin') pinProcess(pid, 0);
      await runLoad(`http://127.0.0.1:${port}/healthz`, 2);
      const r = await runLoad(`http://127.0.0.1:${port}/healthz`, 4);
      console.log(round, v, Math.round(r.rps));
      await kill();
    }
  }
} finally { await stopAll(); }
