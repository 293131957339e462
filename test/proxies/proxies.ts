// The real proxies of the test/proxies tier: Debian's nginx and HAProxy (test/proxies/install.sh), run as
// local processes on 127.0.0.1 with the configurations users write, and a TLS client that connects every
// 50 ms with SNI and records the serial of each handshake.
import assert from 'node:assert/strict';
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { X509Certificate } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { EventEmitter, once } from 'node:events';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { connect } from 'node:tls';
import type { Daemon } from '../../src/daemon/daemon.ts';
import type { ReloadMethod } from '../../src/delivery/reload-command.ts';
import { deathSignalPrefix, freePort } from '../support/processes.ts';
import { nextEvent, onEvent, until } from '../support/wait.ts';

let binDir: string | undefined;
/** The directory of nginx and haproxy (install.sh, which downloads them once into the cache). */
export function proxiesBin(): string {
  binDir ??= join(execFileSync('bash', [join(import.meta.dirname, 'install.sh')], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] }).trim(), 'bin');
  return binDir;
}

export interface ProxyProcess {
  /** The pid of the process started: HAProxy's and nginx's master. */
  readonly pid: number;
  readonly port: number;
  /** Set when the process ended (a restart of the proxy would show here). */
  exited: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  /** Everything it wrote to stdout and stderr. */
  output(): string;
  stop(): Promise<void>;
}

function startProcess(command: string, args: string[], port: number, stopSignal: NodeJS.Signals): ProxyProcess {
  const [file, ...prefix] = [...deathSignalPrefix(), command];
  const child: ChildProcess = spawn(file!, [...prefix, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stdout!.setEncoding('utf8').on('data', (c: string) => (output += c));
  child.stderr!.setEncoding('utf8').on('data', (c: string) => (output += c));
  const proxy: ProxyProcess = {
    pid: child.pid!,
    port,
    exited: undefined,
    output: () => output,
    stop: async () => {
      if (proxy.exited) return;
      const exit = once(child, 'exit');
      child.kill(stopSignal);
      await exit;
    },
  };
  child.on('exit', (code, signal) => (proxy.exited = { code, signal }));
  return proxy;
}

/** Connects until a TLS handshake with `servername` succeeds (the proxy is up), for at most `timeoutMs`. */
export async function waitServing(proxy: ProxyProcess, servername: string, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const result = await handshake(proxy.port, servername);
    if (result.serial) return;
    if (proxy.exited || Date.now() > deadline) throw new Error(`proxy on port ${proxy.port} not serving TLS (${result.error}): ${proxy.output()}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

const EXAMPLE_HAPROXY_CFG = join(import.meta.dirname, '../../manifests/example-haproxy/haproxy.cfg');

/**
 * HAProxy as its Debian package runs it in a container (master-worker, foreground), with the configuration of
 * `manifests/example-haproxy` but for what only a cluster has: `crt <crtDir>/` loads every file certshare wrote
 * there, the runtime API is on `socket`, it listens on a free port of 127.0.0.1 and writes a pid file.
 */
export async function startHaproxy(dir: string, options: { crtDir: string; socket: string }): Promise<ProxyProcess> {
  const port = await freePort();
  const config = join(dir, 'haproxy.cfg');
  let text = await readFile(EXAMPLE_HAPROXY_CFG, 'utf8');
  text = replaceAllOf(text, 'stats socket /run/haproxy/admin.sock', `pidfile ${join(dir, 'haproxy.pid')}\n  stats socket ${options.socket}`);
  text = replaceAllOf(text, 'bind :8443 ssl crt /certs/haproxy/', `bind 127.0.0.1:${port} ssl crt ${options.crtDir}/`);
  await writeFile(config, text);
  return startProcess(join(proxiesBin(), 'haproxy'), ['-W', '-db', '-f', config], port, 'SIGTERM');
}

/** nginx with a stock configuration: a plain ssl_certificate path, read at start and at reload only. */
export interface StockNginx {
  certPath: string;
  keyPath: string;
  pidFile: string;
}

/**
 * nginx with the per-handshake configuration of `manifests/example` (or `configFile`, another version of it),
 * as the example ships it but for what only a cluster has: `/certs` is `certRoot`, the domain `domain`,
 * `/tmp` a directory of the test's, and it listens on a free port of 127.0.0.1.
 */
export interface ExampleNginx {
  certRoot: string;
  domain: string;
  configFile?: string;
}

const EXAMPLE_NGINX_CONF = join(import.meta.dirname, '../../manifests/example/nginx.conf');
const EXAMPLE_DOMAIN = 'proxy.tailnet-0000.ts.net';

/** `text` with every `from` replaced; fails when there is none (the example changed under the test). */
function replaceAllOf(text: string, from: string, to: string): string {
  if (!text.includes(from)) throw new Error(`the proxy's configuration has no "${from}" to replace`);
  return text.replaceAll(from, to);
}

export async function startNginx(dir: string, options: StockNginx | ExampleNginx): Promise<ProxyProcess & { pidFile: string }> {
  const port = await freePort();
  const prefix = join(dir, 'nginx');
  await mkdir(join(prefix, 'tmp'), { recursive: true });
  const config = join(prefix, 'nginx.conf');
  let pidFile: string;
  let main = 'daemon off;';
  if ('certRoot' in options) {
    pidFile = join(prefix, 'tmp/nginx.pid');
    let text = await readFile(options.configFile ?? EXAMPLE_NGINX_CONF, 'utf8');
    text = replaceAllOf(text, 'listen 8443 ssl', `listen 127.0.0.1:${port} ssl`);
    // /tmp first: the paths put in below may be under /tmp themselves.
    text = replaceAllOf(text, '/tmp/', `${prefix}/tmp/`);
    text = replaceAllOf(text, '/certs/', `${options.certRoot}/`);
    text = replaceAllOf(text, EXAMPLE_DOMAIN, options.domain);
    // A socket here, which open(2) refuses: the container's stdout is a pipe or a file.
    text = replaceAllOf(text, 'access_log /dev/stdout;', `access_log ${prefix}/access.log;`);
    await writeFile(config, text);
    // Its workers open the key (0600, in directories of 0700): they run as certshare's uid, this process's.
    if (process.getuid?.() === 0) main += ' user root;';
  } else {
    pidFile = options.pidFile;
    await writeFile(
      config,
      `daemon off;
master_process on;
worker_processes 1;
pid ${options.pidFile};
error_log stderr warn;
events { worker_connections 64; }
http {
  access_log off;
  client_body_temp_path ${prefix}/tmp/body;
  proxy_temp_path ${prefix}/tmp/proxy;
  fastcgi_temp_path ${prefix}/tmp/fastcgi;
  uwsgi_temp_path ${prefix}/tmp/uwsgi;
  scgi_temp_path ${prefix}/tmp/scgi;
  server {
    listen 127.0.0.1:${port} ssl;
    ssl_certificate ${options.certPath};
    ssl_certificate_key ${options.keyPath};
    ssl_protocols TLSv1.2 TLSv1.3;
    location / { return 200 "ok\\n"; }
  }
}
`,
    );
    main = '';
  }
  const args = ['-p', prefix, '-e', 'stderr', '-c', config, ...(main ? ['-g', main] : [])];
  // The object startProcess keeps up to date (its `exited`), not a copy.
  return Object.assign(startProcess(join(proxiesBin(), 'nginx'), args, port, 'SIGQUIT'), { pidFile });
}

/** Once `daemon` holds a certificate of `domain` and is healthy, and the proxy on `port` serves it: its serial (upper case). */
export async function heldAndServed(daemon: Daemon, port: number, domain: string): Promise<string> {
  const held = (): string | undefined => daemon.manager.loop(domain)?.current?.info.serial.toUpperCase();
  await until(
    "the daemon's certificate held",
    () => held() !== undefined && daemon.health.evaluate(Date.now()).healthy,
    [(l) => daemon.health.onChange(l)],
    30_000,
  );
  const serial = held()!;
  const loop = new HandshakeLoop(port, domain);
  try {
    await nextEvent(loop, 'serial', (served: string) => served.toUpperCase() === serial, 30_000);
  } finally {
    await loop.stop();
  }
  return serial;
}

/** The pid a proxy wrote in its pid file. */
export async function pidInFile(path: string): Promise<number> {
  return Number((await readFile(path, 'utf8')).trim());
}

/** The serial of the certificate the proxy serves for `servername` now. */
export async function servedSerial(port: number, servername: string): Promise<string | undefined> {
  return (await handshake(port, servername)).serial;
}

export interface Handshake {
  serial?: string;
  error?: string;
}

/** One TLS handshake with SNI (any issuer: what is checked is which certificate is served). */
export function handshake(port: number, servername: string): Promise<Handshake> {
  return new Promise((resolve) => {
    const socket = connect({ host: '127.0.0.1', port, servername, rejectUnauthorized: false, timeout: 5000 }, () => {
      const serial = socket.getPeerCertificate().serialNumber;
      socket.destroy();
      resolve({ serial });
    });
    socket.on('timeout', () => {
      socket.destroy();
      resolve({ error: 'timeout' });
    });
    socket.on('error', (err: NodeJS.ErrnoException) => resolve({ error: err.code ?? err.message }));
  });
}

/**
 * A client opening a new TLS connection every `intervalMs` for as long as it runs: each serial with the time
 * it was first served, and every failed handshake. Emits `serial` on a new one.
 */
export class HandshakeLoop extends EventEmitter {
  readonly firstSeen = new Map<string, number>();
  readonly failures: Array<{ at: number; error: string }> = [];
  attempts = 0;
  #stopping = false;
  readonly #done: Promise<void>;

  constructor(port: number, servername: string, intervalMs = 50) {
    super();
    this.#done = (async () => {
      while (!this.#stopping) {
        const next = performance.now() + intervalMs;
        this.attempts++;
        const result = await handshake(port, servername);
        if (result.error) this.failures.push({ at: Date.now(), error: result.error });
        else if (!this.firstSeen.has(result.serial!)) {
          this.firstSeen.set(result.serial!, Date.now());
          this.emit('serial', result.serial);
        }
        const wait = next - performance.now();
        if (wait > 0 && !this.#stopping) await new Promise((r) => setTimeout(r, wait));
      }
    })();
  }

  async stop(): Promise<void> {
    this.#stopping = true;
    await this.#done;
  }
}

/**
 * Waits for `count` renewals that certshare holds (its store's files written under certDir) and the loop
 * was served; for each, the milliseconds from held to first served.
 */
export async function renewalsServed(daemon: Daemon, certDir: string, loop: HandshakeLoop, count: number, timeoutMs = 60_000): Promise<number[]> {
  const held: Array<{ serial: string; at: number }> = [];
  const onWritten = ({ domain, path }: { domain: string; path: string }): void => {
    if (path !== join(certDir, domain)) return;
    held.push({ serial: new X509Certificate(readFileSync(join(path, 'tls.crt'))).serialNumber, at: Date.now() });
  };
  daemon.events.on('filesWritten', onWritten);
  try {
    const served = (): boolean => held.length >= count && held.slice(0, count).every((h) => loop.firstSeen.has(h.serial));
    await until(`${count} renewals held and served`, served, [onEvent(daemon.events, 'filesWritten'), onEvent(loop, 'serial')], timeoutMs);
  } finally {
    daemon.events.off('filesWritten', onWritten);
  }
  return held.slice(0, count).map((h) => loop.firstSeen.get(h.serial)! - h.at);
}

/**
 * The tier's proof for one proxy: a client connecting every 50 ms from now on while certshare renews
 * `count` times; each renewal served within 2 s of certshare holding it, no failed handshake, the same
 * master process all along, and certshare counting a successful delivery per renewal by `method` (none
 * at all without one: the per-handshake nginx reads the files by itself).
 */
export async function proveRenewalsServed(
  t: { diagnostic(message: string): void },
  options: { daemon: Daemon; certDir: string; domain: string; proxy: ProxyProcess; pidFile: string; method: ReloadMethod | undefined; count: number },
): Promise<void> {
  const { daemon, proxy } = options;
  const loop = new HandshakeLoop(proxy.port, options.domain, 50);
  // A signal reload is reported once no worker from before it accepts, which can come after the new leaf is first served.
  let reloadsDone = 0;
  const onReloaded = (o: { ok: boolean; skipped?: boolean }): void => {
    if (o.ok && !o.skipped) reloadsDone++;
  };
  daemon.events.on('reloaded', onReloaded);
  let servedWithinMs: number[];
  try {
    servedWithinMs = await renewalsServed(daemon, options.certDir, loop, options.count);
    if (options.method !== undefined)
      await until(`${options.count} reloads reported done`, () => reloadsDone >= options.count, [onEvent(daemon.events, 'reloaded')], 30_000);
  } finally {
    daemon.events.off('reloaded', onReloaded);
    await loop.stop();
  }
  t.diagnostic(`servedWithinMs ${servedWithinMs.join(', ')}; handshakes ${loop.attempts}, failed ${loop.failures.length}`);
  assert.deepEqual(loop.failures, [], `failed handshakes out of ${loop.attempts}`);
  for (const ms of servedWithinMs) assert.ok(ms < 2000, `served ${ms} ms after certshare held it: ${servedWithinMs.join(', ')}`);
  assert.equal(proxy.exited, undefined, `the proxy exited: ${proxy.output()}`);
  assert.equal(await pidInFile(options.pidFile), proxy.pid, 'the same master process all along');
  const metrics = await (await fetch(`${daemon.address}/metrics`)).text();
  if (options.method === undefined) {
    assert.doesNotMatch(metrics, /certshare_reload_command_runs_total\{[^}]*\} [1-9]/, 'no delivery to the proxy');
    return;
  }
  const pattern = new RegExp(`certshare_reload_command_runs_total\\{method="${options.method}",result="success"\\} (\\d+)`);
  const delivered = Number(pattern.exec(metrics)?.[1] ?? 0);
  assert.ok(delivered >= options.count, `${delivered} successful deliveries (${options.method})`);
}

/**
 * One HTTPS request on a new TLS connection of `version`, offering `session` to resume: whether the server
 * resumed it, the certificate it sent (none when resumed), and the session to offer next.
 */
export function tlsSession(
  port: number,
  servername: string,
  version: 'TLSv1.2' | 'TLSv1.3',
  session?: Buffer,
): Promise<{ resumed: boolean; serial?: string; session?: Buffer }> {
  return new Promise((resolve, reject) => {
    let next: Buffer | undefined;
    const options = { host: '127.0.0.1', port, servername, rejectUnauthorized: false, minVersion: version, maxVersion: version, timeout: 5000 };
    const socket = connect({ ...options, ...(session ? { session } : {}) }, () => socket.end('GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n'));
    socket.on('session', (s: Buffer) => (next ??= s));
    socket.on('timeout', () => socket.destroy(new Error('timeout')));
    socket.on('error', reject);
    socket.resume();
    socket.on('end', () => {
      const serial = socket.getPeerCertificate().serialNumber;
      resolve({ resumed: socket.isSessionReused(), ...(serial ? { serial } : {}), ...(next ? { session: next } : {}) });
    });
  });
}
