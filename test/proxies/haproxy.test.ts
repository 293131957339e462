// HAProxy 2.6 from Debian's package, started from the combined PEM certshare writes, given each renewal
// through its runtime API on a unix socket: no reload, no failed handshake.
import assert from 'node:assert/strict';
import { X509Certificate } from 'node:crypto';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { mkdir, stat, writeFile } from 'node:fs/promises';
import { createServer, type Server, type Socket } from 'node:net';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { combinedPem, HaproxyRuntimeApi } from '../../src/delivery/haproxy.ts';
import type { ReloadOutcome } from '../../src/delivery/reload-command.ts';
import { makePair } from '../support/certs.ts';
import { recordingLogger } from '../support/recording-logger.ts';
import { DOMAIN, emulatorIn, standaloneDaemon, useTempDir } from '../support/standalone.ts';
import { nextEvent, onEvent, until } from '../support/wait.ts';
import { proveRenewalsServed, servedSerial, startHaproxy, tlsSession, waitServing } from './proxies.ts';

const RENEWALS = 3;

/** A unix socket server that is not HAProxy's runtime API: it answers each connection with `answer`, or never. */
async function impostor(path: string, answer: ((socket: Socket) => void) | undefined): Promise<Server> {
  const server = createServer((socket) => {
    socket.on('error', () => {});
    if (answer) socket.once('data', () => answer(socket));
  });
  server.listen(path);
  await once(server, 'listening');
  return server;
}

describe('HAProxy (Debian 12 package), runtime API delivery', { concurrency: true }, () => {
  const dir = useTempDir();

  it(`serves each of ${RENEWALS} renewals within 2 s of certshare holding it, with no failed handshake and no restart`, async (t) => {
    const base = join(dir(), 'renewals');
    const certDir = join(base, 'store');
    const crtDir = join(base, 'haproxy-certs');
    const socket = join(base, 'admin.sock');
    // 6 s certificates: renewed at half their lifetime, every 3 s.
    const emulator = await emulatorIn(dir(), { listen: join(dir(), 'renewals.sock'), certLifetimeMs: 6000 });
    const daemon = await standaloneDaemon(emulator, certDir, ['--haproxy-crt-dir', crtDir, '--haproxy-socket', socket]);
    const pem = join(crtDir, `${DOMAIN}.pem`);
    const firstFile = nextEvent(daemon.events, 'filesWritten', ({ path }: { path: string }) => path === pem);
    let haproxy: Awaited<ReturnType<typeof startHaproxy>> | undefined;
    try {
      await firstFile;
      assert.equal((await stat(pem)).mode & 0o777, 0o600, 'the combined PEM holds the key: 0600');
      haproxy = await startHaproxy(base, { crtDir, socket });
      await waitServing(haproxy, DOMAIN);
      const pidFile = join(base, 'haproxy.pid');
      await proveRenewalsServed(t, { daemon, certDir, domain: DOMAIN, proxy: haproxy, pidFile, method: 'haproxy', count: RENEWALS });
      assert.doesNotMatch(haproxy.output(), /Reexecuting Master process/, 'HAProxy was never reloaded');
    } finally {
      await daemon.stop();
      await haproxy?.stop();
      await emulator.close();
    }
  });

  for (const version of ['TLSv1.2', 'TLSv1.3'] as const) {
    it(`resumes no ${version} session established under a certificate the runtime API has since replaced (a revocation)`, async () => {
      const base = join(dir(), `resumption-${version}`);
      const crtDir = join(base, 'haproxy-certs');
      const socket = join(base, 'admin.sock');
      await mkdir(crtDir, { recursive: true });
      const [revoked, replacement] = [await makePair(DOMAIN, Date.now(), 3_600_000), await makePair(DOMAIN, Date.now(), 3_600_000)];
      const pem = join(crtDir, `${DOMAIN}.pem`);
      await writeFile(pem, combinedPem(revoked), { mode: 0o600 });
      const haproxy = await startHaproxy(base, { crtDir, socket });
      try {
        await waitServing(haproxy, DOMAIN);
        const established = await tlsSession(haproxy.port, DOMAIN, version);
        assert.equal(established.resumed, false);
        await new HaproxyRuntimeApi(socket, 5000).replaceCertificate(pem, combinedPem(replacement));
        // A client offers the session (a ticket, or an id) it got under the replaced certificate.
        const next = await tlsSession(haproxy.port, DOMAIN, version, established.session);
        assert.equal(next.resumed, false, 'a resumed session is one the replaced certificate authenticated');
      } finally {
        await haproxy.stop();
      }
    });
  }

  it('pushes the renewals of two domains renewed at once, one transaction after the other (HAProxy holds one at a time)', async () => {
    const base = join(dir(), 'two');
    const certDir = join(base, 'store');
    const crtDir = join(base, 'haproxy-certs');
    const socket = join(base, 'admin.sock');
    const other = 'db.tailnet-test.ts.net';
    // Both issued together and renewed together, every 3 s; the renewals stop before served and held are compared.
    const emulator = await emulatorIn(dir(), { listen: join(dir(), 'two.sock'), certLifetimeMs: 6000, domains: [DOMAIN, other] });
    const daemon = await standaloneDaemon(emulator, certDir, ['--domain', DOMAIN, '--domain', other, '--haproxy-crt-dir', crtDir, '--haproxy-socket', socket]);
    const written = new Set<string>();
    const bothFiles = until('both PEMs written', () => written.size === 2, [onEvent(daemon.events, 'filesWritten')]);
    // Per domain: the serial of the PEM last written for HAProxy, and whether a push ended after that write.
    const lastWritten = new Map<string, { serial: string; pushed: boolean }>();
    daemon.events.on('filesWritten', ({ domain, path }: { domain: string; path: string }) => {
      if (!path.endsWith('.pem')) return;
      written.add(path);
      lastWritten.set(domain, { serial: new X509Certificate(readFileSync(path, 'utf8')).serialNumber, pushed: false });
    });
    daemon.events.on('reloaded', (o: ReloadOutcome) => {
      for (const domain of o.domains) if (o.ok && lastWritten.has(domain)) lastWritten.get(domain)!.pushed = true;
    });
    let emulatorOpen = true;
    let haproxy: Awaited<ReturnType<typeof startHaproxy>> | undefined;
    try {
      await bothFiles;
      haproxy = await startHaproxy(base, { crtDir, socket });
      await waitServing(haproxy, DOMAIN);
      const outcomes: ReloadOutcome[] = [];
      daemon.events.on('reloaded', (o: ReloadOutcome) => outcomes.push(o));
      const pushed = (domain: string) => outcomes.some((o) => o.ok && o.domains.includes(domain));
      await until('a renewal of each pushed', () => pushed(DOMAIN) && pushed(other), [onEvent(daemon.events, 'reloaded')], 30_000);
      assert.deepEqual(
        outcomes.filter((o) => !o.ok),
        [],
        'no push failed',
      );
      const held = (domain: string) => daemon.manager.loop(domain)!.current!.info.serial.toUpperCase();
      // No renewal from now on (tailscaled gone): once the PEM last written holds what certshare holds and its push
      // ended, both stay as they are while HAProxy is asked what it serves.
      await emulator.close();
      emulatorOpen = false;
      const settled = (domain: string) => lastWritten.get(domain)?.pushed === true && lastWritten.get(domain)?.serial.toUpperCase() === held(domain);
      await until('the last renewal of each pushed', () => settled(DOMAIN) && settled(other), [
        onEvent(daemon.events, 'filesWritten'),
        onEvent(daemon.events, 'reloaded'),
      ]);
      for (const domain of [DOMAIN, other]) assert.equal(await servedSerial(haproxy.port, domain), held(domain), `${domain} serves what certshare holds`);
    } finally {
      await daemon.stop();
      await haproxy?.stop();
      if (emulatorOpen) await emulator.close();
    }
  });

  for (const [name, answer] of [
    ['answers garbage', (s: Socket) => s.end('HTTP/1.1 400 Bad Request\r\n\r\n')],
    ['never answers', undefined],
    ['answers without end', (s: Socket) => s.write('x'.repeat(70_000))],
  ] as const) {
    it(`counts a push to a socket that ${name} as a failure (CERTSHARE_HAPROXY_API), keeps the file and goes on`, async () => {
      const base = join(dir(), name.replaceAll(' ', '-'));
      const certDir = join(base, 'store');
      const crtDir = join(base, 'haproxy-certs');
      const socket = join(base.replace(/[^/]+$/, ''), `${name.replaceAll(' ', '-')}.sock`);
      const server = await impostor(socket, answer);
      const { logger, entries } = recordingLogger();
      // 3 s certificates: the first is written (a new file is not pushed), the renewal 1.5 s later is.
      const emulator = await emulatorIn(dir(), { listen: join(dir(), `${name.replaceAll(' ', '-')}-ts.sock`), certLifetimeMs: 3000 });
      const daemon = await standaloneDaemon(emulator, certDir, ['--haproxy-crt-dir', crtDir, '--haproxy-socket', socket, '--reload-timeout', '500ms'], logger);
      try {
        const outcome: ReloadOutcome = await nextEvent(daemon.events, 'reloaded', () => true, 20_000);
        assert.equal(outcome.ok, false);
        assert.equal(outcome.method, 'haproxy');
        const logged = entries.find((e) => e.code === 'CERTSHARE_HAPROXY_API');
        assert.ok(logged, 'an error with CERTSHARE_HAPROXY_API is logged');
        assert.match(String(logged.err), answer ? /set ssl cert|answer over/ : /no whole answer within 500 ms/);
        const metrics = await (await fetch(`${daemon.address}/metrics`)).text();
        assert.match(metrics, /certshare_reload_command_runs_total\{method="haproxy",result="failure"\} [1-9]/);
        assert.equal(daemon.health.evaluate(Date.now()).healthy, true, 'a failed push takes nothing else down');
        // The next change tries again.
        const again: ReloadOutcome = await nextEvent(daemon.events, 'reloaded', () => true, 20_000);
        assert.equal(again.ok, false);
      } finally {
        await daemon.stop();
        await emulator.close();
        server.close();
      }
    });
  }
});
