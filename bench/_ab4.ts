import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { CertFileWatch, spawnDaemon, startEmulator } from './lib/certshare.ts';
import { freePort } from './lib/http.ts';
import { pinProcess, runLoad } from './lib/load.ts';
import { idleRss, Proc, stopAll } from './lib/proc.ts';
const variant = process.argv[2] ?? 'bench';
try {
  const dir = await mkdtemp(join(tmpdir(), 'certshare-bench-ab-'));
  const emulator = await startEmulator(join(dir, 'emulator'), 'standalone', ['--domain', 'web.tailnet-0000.ts.net']);
  const certDir = join(dir, 'certs');
  const files = await CertFileWatch.start(certDir, 'web.tailnet-0000.ts.net');
  const port = await freePort();
  const daemon = spawnDaemon('d', ['--localapi', emulator.socket, '--store', `dir:${certDir}`, '--domain', 'web.tailnet-0000.ts.net', '--listen', `127.0.0.1:${port}`]);
  await files.next(30_000);
  if (variant !== 'noidle') await idleRss([daemon.pid]);
  let hello: Proc | undefined; let hport = 0;
  if (variant !== 'nohello') {
    hello = new Proc('h', [resolve(import.meta.dirname, 'fastify-hello.ts')]);
    const line = await hello.waitForLog((e) => typeof e.listening === 'string', 20_000, 'l');
    hport = Number(new URL(line.listening as string).port);
    pinProcess(hello.pid, 0);
  }
  pinProcess(daemon.pid, 0);
  const d = `http://127.0.0.1:${port}/healthz`, h = `http://127.0.0.1:${hport}/healthz`;
  await runLoad(d, 2); if (hello) await runLoad(h, 2);
  const out: string[] = [];
  for (let i = 0; i < 5; i++) {
    out.push(`d ${Math.round((await runLoad(d, 2)).rps)}`);
    if (hello) out.push(`h ${Math.round((await runLoad(h, 2)).rps)}`);
  }
  console.log(variant, out.join(' '));
} finally { await stopAll(); }
