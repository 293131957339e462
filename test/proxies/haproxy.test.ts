// HAProxy 2.6 from Debian's package, started from the combined PEM certshare writes, given each renewal
// through its runtime API on a unix socket: no reload, no failed handshake.
import assert from 'node:assert/strict';
import { X509Certificate } from 'node:crypto';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { mkdir, rename, stat, writeFile } from 'node:fs/promises';
import { createServer, type Server, type Socket } from 'node:net';
import { connect } from 'node:tls';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { RUN_FLAGS } from '../../src/config/run-options.ts';
import { parseDuration } from '../../src/core/values/duration.ts';
import { combinedPem, HaproxyRuntimeApi } from '../../src/delivery/haproxy.ts';
import type { ReloadOutcome } from '../../src/delivery/reload-command.ts';
import type { CertPair } from '../../src/core/ports/localapi.ts';
import { makePair } from '../support/certs.ts';
import { control } from '../support/emulator.ts';
import { recordingLogger } from '../support/recording-logger.ts';
import { DOMAIN, emulatorIn, standaloneDaemon, useTempDir } from '../support/standalone.ts';
import { nextEvent, onEvent, until } from '../support/wait.ts';
import { heldAndServed, proveRenewalsServed, servedSerial, startHaproxy, tlsSession, waitServing } from './proxies.ts';

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

/**
 * HAProxy serving the PEMs of `pairs` (by domain), written into `<base>/haproxy-certs` as certshare or an earlier
 * run left them, its runtime API on `<base>/admin.sock`.
 */
async function haproxyServing(base: string, pairs: Record<string, CertPair>) {
  const crtDir = join(base, 'haproxy-certs');
  const socket = join(base, 'admin.sock');
  await mkdir(crtDir, { recursive: true });
  for (const [domain, pair] of Object.entries(pairs)) await writeFile(join(crtDir, `${domain}.pem`), combinedPem(pair), { mode: 0o600 });
  const haproxy = await startHaproxy(base, { crtDir, socket });
  try {
    await waitServing(haproxy, Object.keys(pairs)[0]!);
  } catch (err) {
    await haproxy.stop();
    throw err;
  }
  return { haproxy, crtDir, socket, pem: join(crtDir, `${DOMAIN}.pem`) };
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
      const [revoked, replacement] = [await makePair(DOMAIN, Date.now(), 3_600_000), await makePair(DOMAIN, Date.now(), 3_600_000)];
      const { haproxy, socket, pem } = await haproxyServing(join(dir(), `resumption-${version}`), { [DOMAIN]: revoked });
      try {
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

  it('ends a kept-alive HTTP/1.1 connection held across a renewal before the readiness lead has passed', async (t) => {
    // A held connection goes on under the certificate of its handshake: past a revocation (the push) and, when
    // certshare cannot renew, past the expiry, since the readiness gate takes the Pod out of new connections only.
    // No timeout of HAProxy 2.6 ends a busy one: the example closes it at the first response after 30 s.
    const lead = parseDuration(RUN_FLAGS.find((f) => f.name === 'readiness-lead')!.default!);
    const [revoked, replacement] = [await makePair(DOMAIN, Date.now(), 3_600_000), await makePair(DOMAIN, Date.now(), 3_600_000)];
    const { haproxy, socket, pem } = await haproxyServing(join(dir(), 'held'), { [DOMAIN]: revoked });
    try {
      const opened = Date.now();
      const http1 = connect({ host: '127.0.0.1', port: haproxy.port, servername: DOMAIN, rejectUnauthorized: false, ALPNProtocols: ['http/1.1'] });
      http1.on('error', () => {});
      await once(http1, 'secureConnect');
      http1.resume();
      let closedAt: number | undefined;
      http1.once('close', () => (closedAt = Date.now()));
      assert.equal(http1.alpnProtocol, 'http/1.1');
      assert.equal(http1.getPeerCertificate().serialNumber, new X509Certificate(revoked.certPem).serialNumber);
      await new HaproxyRuntimeApi(socket, 5000).replaceCertificate(pem, combinedPem(replacement));
      assert.equal(await servedSerial(haproxy.port, DOMAIN), new X509Certificate(replacement.certPem).serialNumber, 'a new connection gets the replacement');
      // A busy client: a request every second, so no idle timeout ends the connection.
      const busy = setInterval(() => closedAt === undefined && http1.write('GET / HTTP/1.1\r\nHost: x\r\n\r\n'), 1000);
      try {
        await until('the held connection closed by HAProxy', () => closedAt !== undefined, [onEvent(http1, 'close')], lead + 10_000).catch(() => {});
      } finally {
        clearInterval(busy);
        http1.destroy();
      }
      const lasted = closedAt === undefined ? undefined : closedAt - opened;
      t.diagnostic(`held HTTP/1.1 connection closed by HAProxy after ${lasted ?? 'never'} ms; readiness lead ${lead} ms`);
      assert.ok(lasted !== undefined && lasted < lead, `the connection under the replaced certificate still open ${lasted ?? `past ${lead + 10_000}`} ms`);
    } finally {
      await haproxy.stop();
    }
  });

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

  it('takes the Pod out past the reload window while HAProxy (its push failed: socket gone) serves a revoked leaf; back once a push lands', async (t) => {
    const certDir = join(dir(), 'revoked', 'store');
    // HAProxy first, on an expired pair of the test's (certshare replaces it): --served-check needs its port.
    const { haproxy, crtDir, socket } = await haproxyServing(join(dir(), 'revoked'), { [DOMAIN]: await makePair(DOMAIN, Date.now() - 7_200_000, 3_600_000) });
    const emulator = await emulatorIn(dir(), { listen: join(dir(), 'revoked.sock'), acmeListen: '127.0.0.1:0', certLifetimeMs: 3_600_000 });
    assert.ok(emulator.acmeDirectoryUrl);
    const daemon = await standaloneDaemon(emulator, certDir, [
      ...['--haproxy-crt-dir', crtDir, '--haproxy-socket', socket, '--reload-timeout', '3s'],
      ...['--acme-directory', emulator.acmeDirectoryUrl, '--ari-interval', '1s'],
      ...['--served-check', `127.0.0.1:${haproxy.port}`, '--served-check-interval', '1s', '--served-stale-after', '3s'],
    ]);
    const healthy = (): boolean => daemon.health.evaluate(Date.now()).healthy;
    const onHealth = (l: () => void): (() => void) => daemon.health.onChange(l);
    const held = (): string | undefined => daemon.manager.loop(DOMAIN)?.current?.info.serial.toUpperCase();
    const gone = `${socket}.gone`;
    try {
      const revoked = await heldAndServed(daemon, haproxy.port, DOMAIN);
      // The socket's file moved away (a volume remounted, a path changed): connecting fails with ENOENT, HAProxy
      // itself goes on, serving what it was given last.
      await rename(socket, gone);
      const failedPush = nextEvent(daemon.events, 'reloaded', (o: ReloadOutcome) => !o.ok, 30_000);
      const res = await control(emulator.address, 'ari/revoke', { serial: revoked });
      assert.equal(res.status, 200, res.body);
      await failedPush;
      const failedAt = Date.now();
      const renewal = held();
      assert.notEqual(renewal, revoked, 'certshare replaced the revoked certificate');
      assert.equal((await servedSerial(haproxy.port, DOMAIN))?.toUpperCase(), revoked, 'HAProxy still serves the revoked leaf');
      await until('the Pod out of rotation', () => !healthy(), [onHealth], 30_000);
      const reason = daemon.health.evaluate(Date.now()).reason;
      t.diagnostic(`out of rotation ${Date.now() - failedAt} ms after the failed push (--served-stale-after 3s): ${reason}`);
      assert.match(reason, /CA asked to replace now/);
      const metrics = await (await fetch(`${daemon.address}/metrics`)).text();
      assert.match(metrics, /certshare_served_certificate_status\{domain="web\.tailnet-test\.ts\.net",outcome="previous_replaced_now"\} 1/);

      // The socket back: a retried push gives HAProxy the renewal, and the Pod comes back (before: only the next
      // renewal pushed again, days later, and the Pod stayed out until then).
      await rename(gone, socket);
      const backFrom = Date.now();
      await until('the Pod back in rotation', healthy, [onHealth], 30_000);
      t.diagnostic(`back in rotation ${Date.now() - backFrom} ms after the socket came back`);
      assert.equal((await servedSerial(haproxy.port, DOMAIN))?.toUpperCase(), renewal, 'HAProxy serves the renewal');
      assert.doesNotMatch(haproxy.output(), /Reexecuting Master process/, 'HAProxy was never reloaded');
    } finally {
      await daemon.stop();
      await haproxy.stop();
      await emulator.close();
    }
  });

  it("pushes past a transaction someone left open on another certificate, which HAProxy 2.6 would fill with certshare's key", async (t) => {
    const certDir = join(dir(), 'open-transaction', 'store');
    const other = 'other.tailnet-test.ts.net';
    const otherPair = await makePair(other, Date.now(), 3_600_000);
    const expired = await makePair(DOMAIN, Date.now() - 7_200_000, 3_600_000);
    const { haproxy, crtDir, socket } = await haproxyServing(join(dir(), 'open-transaction'), { [DOMAIN]: expired, [other]: otherPair });
    const otherPem = join(crtDir, `${other}.pem`);
    const api = new HaproxyRuntimeApi(socket, 5000);
    // Someone's `set ssl cert` on the other certificate, never committed: HAProxy holds one transaction at a time.
    assert.match(await api.exchange(`set ssl cert ${otherPem} <<\n${combinedPem(await makePair(other, Date.now(), 3_600_000))}\n`), /Transaction created/);
    const emulator = await emulatorIn(dir(), { listen: join(dir(), 'open-transaction.sock'), certLifetimeMs: 3_600_000 });
    const { logger, entries } = recordingLogger();
    const daemon = await standaloneDaemon(emulator, certDir, ['--haproxy-crt-dir', crtDir, '--haproxy-socket', socket], logger);
    const held = (): string | undefined => daemon.manager.loop(DOMAIN)?.current?.info.serial.toUpperCase();
    try {
      const pushed = nextEvent(daemon.events, 'reloaded', (o: ReloadOutcome) => o.ok, 15_000);
      await nextEvent(daemon.events, 'reloaded', (o: ReloadOutcome) => !o.ok, 15_000);
      // HAProxy answered certshare's `set ssl cert` with "Transaction updated for certificate <the other>": certshare's
      // key went into that transaction, which whoever commits it would serve under the other's name. Before, certshare
      // took that answer as its own and left it there; its commit failed, and so did every push after.
      const transaction = await api.exchange(`show ssl cert *${otherPem}\n`);
      assert.doesNotMatch(transaction, /DNS:web\.tailnet-test\.ts\.net/, `certshare's certificate left in the other's transaction: ${transaction}`);
      assert.doesNotMatch(await api.exchange('show ssl cert\n'), /# transaction/, 'no transaction left open');
      const logged = entries.find((e) => e.code === 'CERTSHARE_HAPROXY_API');
      t.diagnostic(`first push: ${String(logged?.err)}`);
      assert.match(String(logged?.err), /a transaction left open on .*other\.tailnet-test\.ts\.net\.pem.* took this certificate; aborted/);
      await pushed;
      assert.equal((await servedSerial(haproxy.port, DOMAIN))?.toUpperCase(), held(), 'HAProxy serves what certshare holds');
      const otherServed = (await servedSerial(haproxy.port, other))?.toUpperCase();
      assert.equal(otherServed, new X509Certificate(otherPair.certPem).serialNumber.toUpperCase(), 'the other name serves what it loaded');
    } finally {
      await daemon.stop();
      await haproxy.stop();
      await emulator.close();
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
        // Tried again (a retry, or the next change).
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
