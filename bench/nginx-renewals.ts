// `node bench/nginx-renewals.ts [--config example|264753e|stock] [--renewals N] [--json]`: Debian's nginx 1.22
// (test/proxies/install.sh) next to certshare renewing against the emulator, with clients opening a new
// TLS connection every --interval-ms: failed handshakes, how soon each renewal was served, and the CPU
// nginx spent per handshake. `example` is manifests/example's per-handshake configuration as it is now,
// `264753e` the same file at that commit (both files opened through the link), `stock` a plain
// ssl_certificate path reloaded by certshare with SIGHUP.
import { execFileSync, spawnSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import { join } from 'node:path';
import { type CommandLine, exitWithUsageError, numberFlag, parseScriptArgs } from './lib/command-line.ts';
import { CertDirectory } from '../src/store/cert-directory.ts';
import { makePair } from '../test/support/certs.ts';
import { DOMAIN, emulatorIn, standaloneDaemon, tempDir } from '../test/support/standalone.ts';
import { nextEvent } from '../test/support/wait.ts';
import { HandshakeLoop, proxiesBin, renewalsServed, startNginx, waitServing } from '../test/proxies/proxies.ts';

const SCRIPT: CommandLine = {
  name: 'bench/nginx-renewals.ts',
  invocation: 'node bench/nginx-renewals.ts',
  summary: 'Failed handshakes and CPU per handshake of the real nginx 1.22 through certshare renewals, one configuration per run.',
  flags: [
    { name: 'config', placeholder: 'NAME', help: 'example (manifests/example now), 264753e (that file at 264753e) or stock (SIGHUP) [default example].' },
    { name: 'renewals', placeholder: 'N', help: 'Renewals to go through [default 20].' },
    { name: 'lifetime', placeholder: 'S', help: 'Certificate lifetime in seconds; certshare renews at half of it [default 2].' },
    { name: 'interval-ms', placeholder: 'MS', help: 'Each client opens a new TLS connection this often [default 50].' },
    { name: 'clients', placeholder: 'N', help: 'Clients at once [default 1].' },
    {
      name: 'swap-every-ms',
      placeholder: 'MS',
      help:
        "Instead of certshare and the emulator: certshare's file writer (CertDirectory) alone swaps two pairs this often, --renewals times " +
        '(example and 264753e only): many swaps, many handshakes, to see a rare race.',
    },
    { name: 'json', boolean: true, help: 'The last stdout line is one JSON object with the figures.' },
  ],
};

const REPO = join(import.meta.dirname, '..');
const opts = parseScriptArgs(SCRIPT);
const config = String(opts.config ?? 'example');
if (!['example', '264753e', 'stock'].includes(config)) exitWithUsageError(SCRIPT, '--config wants example, 264753e or stock');
const renewals = numberFlag(SCRIPT, opts, 'renewals', 20, 'a whole number, at least 1', (n) => Number.isInteger(n) && n >= 1);
const lifetimeS = numberFlag(SCRIPT, opts, 'lifetime', 2, 'seconds, at least 1', (n) => n >= 1);
const intervalMs = numberFlag(SCRIPT, opts, 'interval-ms', 50, 'milliseconds, at least 1', (n) => n >= 1);
const swapEveryMs = opts['swap-every-ms'] === undefined ? undefined : numberFlag(SCRIPT, opts, 'swap-every-ms', 0, 'milliseconds, at least 1', (n) => n >= 1);
if (swapEveryMs !== undefined && config === 'stock') exitWithUsageError(SCRIPT, '--swap-every-ms is for the per-handshake configurations');
const clients = numberFlag(SCRIPT, opts, 'clients', 1, 'a whole number from 1 to 50', (n) => Number.isInteger(n) && n >= 1 && n <= 50);

/** CPU time (clock ticks) of a process and of its children, those running and those it has reaped. */
function cpuTicks(pid: number): number {
  const fields = (stat: string): string[] => stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  const own = fields(readFileSync(`/proc/${pid}/stat`, 'utf8'));
  // After the command and state: utime, stime, cutime, cstime are fields 14 to 17 of stat(5).
  let ticks = Number(own[11]) + Number(own[12]) + Number(own[13]) + Number(own[14]);
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    let f: string[];
    try {
      f = fields(readFileSync(`/proc/${entry}/stat`, 'utf8'));
    } catch {
      continue; // gone meanwhile
    }
    if (Number(f[1]) === pid) ticks += Number(f[11]) + Number(f[12]);
  }
  return ticks;
}

const dir = await tempDir('certshare-measure-');
const certDir = join(dir.path, 'store');
const pidFile = join(dir.path, 'nginx.pid');
const emulator = swapEveryMs === undefined ? await emulatorIn(dir.path, { certLifetimeMs: lifetimeS * 1000 }) : undefined;
const reload = config === 'stock' ? ['--reload-signal', 'HUP', '--reload-pidfile', pidFile] : [];
const daemon = emulator ? await standaloneDaemon(emulator, certDir, reload) : undefined;
const files = new CertDirectory(certDir);
const pairs = swapEveryMs === undefined ? [] : await Promise.all([0, 1].map(() => makePair(DOMAIN, Date.now() - 60_000, 86_400_000)));
let nginx: Awaited<ReturnType<typeof startNginx>> | undefined;
try {
  if (daemon) await nextEvent(daemon.events, 'filesWritten', () => true, 30_000);
  else await files.write(DOMAIN, pairs[0]!);
  if (config === 'stock') {
    nginx = await startNginx(dir.path, { certPath: join(certDir, DOMAIN, 'tls.crt'), keyPath: join(certDir, DOMAIN, 'tls.key'), pidFile });
  } else {
    const configFile = join(dir.path, 'example-nginx.conf');
    if (config === '264753e') await writeFile(configFile, execFileSync('git', ['-C', REPO, 'show', '264753e:manifests/example/nginx.conf']));
    nginx = await startNginx(dir.path, { certRoot: certDir, domain: DOMAIN, ...(config === '264753e' ? { configFile } : {}) });
  }
  await waitServing(nginx, DOMAIN);
  const ticksBefore = cpuTicks(nginx.pid);
  const loops = Array.from({ length: clients }, () => new HandshakeLoop(nginx!.port, DOMAIN, intervalMs));
  const startedAt = Date.now();
  let servedWithinMs: number[] = [];
  try {
    if (daemon) servedWithinMs = await renewalsServed(daemon, certDir, loops[0]!, renewals, renewals * lifetimeS * 1000 + 60_000);
    else for (let i = 1; i <= renewals; i++) await Promise.all([files.write(DOMAIN, pairs[i % 2]!), sleep(swapEveryMs!)]);
  } finally {
    await Promise.all(loops.map((l) => l.stop()));
  }
  const ticks = cpuTicks(nginx.pid) - ticksBefore;
  const handshakes = loops.reduce((n, l) => n + l.attempts, 0);
  const failures = loops.flatMap((l) => l.failures);
  const hz = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim());
  const figures = {
    config,
    nginx: spawnSync(join(proxiesBin(), 'nginx'), ['-v'], { encoding: 'utf8' }).stderr.trim(),
    renewals,
    swapEveryMs,
    clients,
    intervalMs,
    seconds: Math.round((Date.now() - startedAt) / 1000),
    handshakes,
    failedHandshakes: failures.length,
    failureErrors: [...new Set(failures.map((f) => f.error))],
    servedWithinMsMax: servedWithinMs.length > 0 ? Math.max(...servedWithinMs) : undefined,
    nginxCpuUsPerHandshake: Math.round(((ticks / hz) * 1e6) / handshakes),
    restarted: nginx.exited !== undefined,
  };
  console.log(
    `${config}: ${renewals} ${daemon ? 'renewals' : 'swaps'} in ${figures.seconds} s, ${failures.length} failed of ${handshakes} handshakes ` +
      `(${figures.failureErrors.join(', ') || 'none'}), ` +
      (daemon ? `each served within ${figures.servedWithinMsMax} ms of certshare holding it, ` : '') +
      `nginx CPU ${figures.nginxCpuUsPerHandshake} us per handshake`,
  );
  // What nginx said about the failed handshakes: the first few of its error lines.
  for (const line of nginx
    .output()
    .split('\n')
    .filter((l) => /\[(error|crit|alert)\]/.test(l))
    .slice(0, 3))
    console.log(`nginx: ${line}`);
  if (opts.json) console.log(JSON.stringify(figures));
} finally {
  await daemon?.stop();
  await nginx?.stop();
  await emulator?.close();
  await dir.remove();
}
