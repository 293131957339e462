// certshare advertising a Tailscale Service on the real tailscaled (test/harness/tailscale.ts): the prefs as the
// tests read them, and the common start: a daemon whose proxy (a loopback TLS listener) first serves a foreign
// certificate, under which nothing may be advertised, then the certificate certshare holds.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { Daemon } from '../../src/daemon/daemon.ts';
import { NotifyMask } from '../../src/core/ports/localapi.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import { createLocalApiClient } from '../../src/localapi/client.ts';
import { createCertificateAuthority } from '../../src/pki/ca.ts';
import { buildAdvertiseAgent } from '../../scripts/build.ts';
import { ADVERTISE_AGENT_UID } from '../../src/injector/sidecar.ts';
import { ManagedProcess } from '../harness/control-plane.ts';
import type { RealTailscaled } from '../harness/tailscale.ts';
import { DAY, makePair } from './certs.ts';
import { injectedAgent } from './injected-agent.ts';
import { standaloneDaemon } from './standalone.ts';
import { startTlsProxy, type TestProxy } from './tls-proxy.ts';
import { every, until } from './wait.ts';

export async function prefsOf(ts: RealTailscaled): Promise<Record<string, unknown>> {
  const res = await ts.localApi('/localapi/v0/prefs');
  assert.equal(res.status, 200, res.body);
  return JSON.parse(res.body) as Record<string, unknown>;
}

export const advertisedIn = (p: Record<string, unknown>): string[] => (p.AdvertiseServices as string[] | null) ?? [];

/** The prefs but AdvertiseServices: what advertising must never change. */
export function otherPrefs(p: Record<string, unknown>): Record<string, unknown> {
  const { AdvertiseServices: _, ...rest } = p;
  return rest;
}

/**
 * certshare (in this process) with `--advertise-services service` and `flags`: not advertised while the proxy
 * serves a foreign certificate, then advertised once it serves the one held. Resolves with the prefs then;
 * the caller stops the daemon and the proxy (also when this rejects: they are handed over first).
 */
export async function advertisedOnceServed(
  ts: RealTailscaled,
  certDir: string,
  service: string,
  flags: string[],
  started: (parts: { daemon: Daemon; proxy: TestProxy }) => void,
  explain: () => string = () => '',
): Promise<Record<string, unknown>> {
  const foreignCa = await createCertificateAuthority({ name: 'not pebble', now: Date.now() });
  const proxy = await startTlsProxy(await makePair(ts.domain, Date.now() - DAY, 30 * DAY, foreignCa));
  const daemon = await standaloneDaemon(ts, certDir, [
    '--domain',
    ts.domain,
    '--served-check',
    `127.0.0.1:${proxy.port}`,
    '--served-check-interval',
    '1s',
    '--advertise-services',
    service,
    ...flags,
  ]);
  started({ daemon, proxy });
  const before = advertisedIn(await prefsOf(ts));
  await until('the certificate held and the proxy checked', () => daemon.health.details().some((l) => l.includes('never held')), [every(100)], 120_000);
  assert.deepEqual(advertisedIn(await prefsOf(ts)), before, 'not advertised while the proxy serves another certificate');
  proxy.serve({
    certPem: await readFile(join(certDir, ts.domain, 'tls.crt'), 'utf8'),
    keyPem: await readFile(join(certDir, ts.domain, 'tls.key'), 'utf8'),
  });
  const deadline = Date.now() + 30_000;
  let now = await prefsOf(ts);
  while (!advertisedIn(now).includes(service)) {
    assert.ok(Date.now() < deadline, `${service} never advertised${explain()}`);
    await new Promise((r) => setTimeout(r, 100));
    now = await prefsOf(ts);
  }
  return now;
}

/**
 * The prefs' list at each change, from tailscaled's IPN bus (a Notify.Prefs at every edit and every reload of the
 * file): each distinct value in order, with the time it was sent; the first, the list at the start.
 */
export async function watchPrefs(ts: RealTailscaled): Promise<{ seen: Array<{ list: string; at: number }>; stop(): Promise<void> }> {
  const seen: Array<{ list: string; at: number }> = [{ list: JSON.stringify(advertisedIn(await prefsOf(ts))), at: Date.now() }];
  const stop = new AbortController();
  const bus = createLocalApiClient({ address: ts.socket, logger: silentLogger }).watchIpnBus(NotifyMask.NoNetMap, stop.signal);
  const watching = (async () => {
    for await (const notify of bus) {
      const prefs = notify.Prefs as { AdvertiseServices?: string[] | null } | null | undefined;
      const now = prefs ? JSON.stringify(prefs.AdvertiseServices ?? []) : undefined;
      if (now !== undefined && seen.at(-1)!.list !== now) seen.push({ list: now, at: Date.now() });
    }
  })().catch(() => {});
  return {
    seen,
    stop: async () => {
      stop.abort();
      await watching;
    },
  };
}

/** One LocalAPI request made by a process running as `uid` (no capability, no group): what tailscaled's peer credentials see. */
export async function asUid(uid: number, socket: string, method: string, path: string, body?: unknown): Promise<{ status: number; body: string }> {
  const script = `
    const http = require('node:http');
    const [socketPath, method, path, body] = process.argv.slice(1);
    const req = http.request({ socketPath, method, path, headers: { host: 'local-tailscaled.sock' } }, (res) => {
      let text = '';
      const done = () => {
        console.log(JSON.stringify({ status: res.statusCode, body: text.slice(0, 300) }));
        process.exit(0);
      };
      res.on('data', (c) => (text += c));
      res.on('end', done);
    });
    req.on('error', (err) => console.log(JSON.stringify({ status: 0, body: String(err) })));
    req.end(body || undefined);`;
  const args = [
    `--reuid=${uid}`,
    `--regid=${uid}`,
    '--clear-groups',
    '--',
    process.execPath,
    '-e',
    script,
    socket,
    method,
    path,
    body ? JSON.stringify(body) : '',
  ];
  const { stdout } = await promisify(execFile)('setpriv', args, { timeout: 60_000 });
  return JSON.parse(stdout) as { status: number; body: string };
}

/**
 * The advertise agent as the injector injects it (injected-agent.ts: its script built from these sources into
 * `dir`, its Node flags, its variables), as its own uid, for `service` through tailscaled's socket and `exchange`.
 * Resolves once it said it started.
 */
export async function startInjectedAgent(ts: RealTailscaled, dir: string, service: string, exchange: string): Promise<ManagedProcess> {
  const dist = join(dir, 'dist');
  await buildAdvertiseAgent(dist);
  const launch = injectedAgent(dist, { services: service, socket: ts.socket, exchange });
  const agent = new ManagedProcess(
    'advertise-agent',
    'setpriv',
    [`--reuid=${ADVERTISE_AGENT_UID}`, `--regid=${ADVERTISE_AGENT_UID}`, '--clear-groups', '--', process.execPath, ...launch.args],
    process.env.CERTSHARE_TS_VERBOSE === '1',
    { PATH: process.env.PATH ?? '/usr/bin:/bin', ...launch.env },
  );
  // Its JSON line: a crash's stack trace may quote the minified script, this message among it.
  const started = (line: string): boolean => {
    try {
      return (JSON.parse(line) as { msg?: unknown }).msg === 'advertise agent started';
    } catch {
      return false;
    }
  };
  await until('the agent started', () => agent.lines.some(started) || agent.exitInfo !== undefined, [every(100)], 60_000);
  if (agent.exitInfo) throw new Error(`the advertise agent exited (${JSON.stringify(agent.exitInfo)}):\n${agent.lines.join('\n')}`);
  return agent;
}
