// nginx from Debian's package with manifests/example's configuration: the certificate path holds a variable,
// so nginx reads the files at every TLS handshake; certshare only writes them. A handshake opens the
// certificate, then the key: the configuration must never pair the files of two renewals.
import assert from 'node:assert/strict';
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { X509Certificate } from 'node:crypto';
import { once } from 'node:events';
import { constants } from 'node:fs';
import { type FileHandle, chmod, mkdir, open, readFile, readdir, realpath, rename, rm, symlink, writeFile } from 'node:fs/promises';
import { connect as connectHttp2 } from 'node:http2';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { connect } from 'node:tls';
import { RUN_FLAGS } from '../../src/config/run-options.ts';
import { parseDuration } from '../../src/core/values/duration.ts';
import { CertDirectory } from '../../src/store/cert-directory.ts';
import { makePair } from '../support/certs.ts';
import { DOMAIN, emulatorIn, standaloneDaemon, useTempDir } from '../support/standalone.ts';
import { nextEvent, onEvent, until } from '../support/wait.ts';
import { handshake, proveRenewalsServed, startNginx, tlsSession, waitServing } from './proxies.ts';

const RENEWALS = 3;

describe("nginx (Debian 12 package) with manifests/example's per-handshake configuration", { concurrency: true }, () => {
  const dir = useTempDir();

  for (const renewals of [1, 2]) {
    it(`serves a handshake from one renewal only when ${renewals} renewal(s) land between its opening of the certificate and of the key`, async () => {
      const base = join(dir(), `between-opens-${renewals}`);
      const certs = new CertDirectory(join(base, 'certs'));
      await certs.prepare();
      const now = Date.now();
      const before = await makePair(DOMAIN, now, 3_600_000);
      const later = await Promise.all(Array.from({ length: renewals }, () => makePair(DOMAIN, now, 3_600_000)));
      await certs.write(DOMAIN, before);
      const nginx = await startNginx(base, { certRoot: certs.root, domain: DOMAIN });
      try {
        await waitServing(nginx, DOMAIN);
        // nginx's open of the certificate made to wait, as a worker descheduled between its two opens would be:
        // the certificate file becomes a FIFO, whose open for reading returns only once this test opens it to
        // write, and whose read ends only when the test closes it.
        const certFile = await realCertificateFile(certs, DOMAIN);
        await rm(certFile);
        execFileSync('mkfifo', ['-m', '0644', certFile]);
        const served = handshake(nginx.port, DOMAIN);
        const opening = open(certFile, 'w');
        const writer = await Promise.race([opening, served.then((h) => unblock(certFile, opening, `nginx never opened the certificate: ${h.error}`))]);
        try {
          // nginx holds the certificate file of `before` open: certshare renews now (twice: renewals close
          // together, e.g. a revocation right after an issuance), then nginx reads on.
          for (const pair of later) assert.equal(await certs.write(DOMAIN, pair), true);
          await writer.writeFile(before.certPem);
        } finally {
          await writer.close();
        }
        const result = await served;
        assert.equal(result.error, undefined, `the handshake failed: ${nginx.output().slice(-2000)}`);
        assert.equal(result.serial, serialOf(before.certPem), 'served the certificate it had begun to read, with its own key');
        assert.equal((await handshake(nginx.port, DOMAIN)).serial, serialOf(later.at(-1)!.certPem), 'the next handshake serves the last renewal');
      } finally {
        await nginx.stop();
      }
    });
  }

  it('answers a handshake before certshare first wrote with an alert and keeps running, then serves the first write', async () => {
    const base = join(dir(), 'before-first-write');
    const certs = new CertDirectory(join(base, 'certs'));
    await certs.prepare();
    const nginx = await startNginx(base, { certRoot: certs.root, domain: DOMAIN });
    try {
      // Started before any file exists: nginx does not refuse to start (the path holds a variable), and a
      // client gets an internal-error alert, never another certificate.
      let answer = await handshake(nginx.port, DOMAIN);
      // Until nginx listens (as waitServing polls).
      for (const deadline = Date.now() + 15_000; answer.error === 'ECONNREFUSED' && !nginx.exited && Date.now() < deadline; ) {
        await new Promise((r) => setTimeout(r, 50));
        answer = await handshake(nginx.port, DOMAIN);
      }
      assert.deepEqual(answer, { error: 'ERR_SSL_TLSV1_ALERT_INTERNAL_ERROR' }, nginx.output());
      assert.equal(nginx.exited, undefined);
      const first = await makePair(DOMAIN, Date.now(), 3_600_000);
      await certs.write(DOMAIN, first);
      assert.equal((await handshake(nginx.port, DOMAIN)).serial, serialOf(first.certPem));
    } finally {
      await nginx.stop();
    }
  });

  for (const version of ['TLSv1.2', 'TLSv1.3'] as const) {
    it(`resumes no ${version} session established under a certificate certshare has since replaced (a revocation)`, async () => {
      const { certs, first: revoked, next: replacement, nginx } = await servingFirst(join(dir(), `resumption-${version}`));
      try {
        const established = await tlsSession(nginx.port, DOMAIN, version);
        assert.equal(established.serial, serialOf(revoked.certPem));
        assert.equal(await certs.write(DOMAIN, replacement), true);
        // A client offers the session (a ticket, or an id) it got under the replaced certificate.
        const next = await tlsSession(nginx.port, DOMAIN, version, established.session);
        assert.equal(next.resumed, false, 'a resumed session is one the replaced certificate authenticated, and TLS 1.3 renews it at each resumption');
        assert.equal(next.serial, serialOf(replacement.certPem));
      } finally {
        await nginx.stop();
      }
    });
  }

  // The volume as others can leave it: a hand-made file where certshare keeps its versions, a link the proxy's own
  // user (certshare's uid, where the proxy mounts /certs writable) put there, a directory it made unwritable.
  // That last one needs certshare to write as that uid, not root (who writes whatever the mode): as root, the
  // test hands the directory to uid 65532 (the image's) and certshare's writes run as it (setpriv).
  const asOwner = process.getuid?.() === 0 ? 65532 : undefined;
  for (const [name, attack, skip] of [
    ['a hand-made file at .versions/<domain>', (v: string, d: string) => rm(join(v, d), { recursive: true }).then(() => writeFile(join(v, d), 'x'))],
    ['a hand-made file at .versions', (v: string) => rm(v, { recursive: true }).then(() => writeFile(v, 'x'))],
    [
      "a link at .versions/<domain> to the proxy user's own directory",
      async (v: string, d: string) => {
        await rename(join(v, d), `${v}-elsewhere`);
        await symlink(`${v}-elsewhere`, join(v, d));
      },
    ],
    [
      '.versions/<domain> made read-only by the proxy user (its uid)',
      (v: string, d: string) => chmod(join(v, d), 0o500),
      asOwner !== undefined && spawnSync('setpriv', ['--version']).status !== 0 && 'root writes whatever the mode, and setpriv is missing',
    ],
  ] as const) {
    it(`serves the next renewal after ${name}, and keeps what it moves aside`, { skip: skip || false }, async () => {
      const base = join(dir(), name.replace(/\W+/g, '-'));
      const { certs, next: renewal, nginx } = await servingFirst(base);
      const owner = name.includes('read-only') ? asOwner : undefined;
      try {
        if (owner !== undefined) {
          for (const d of [dir(), base]) await chmod(d, 0o755);
          execFileSync('chown', ['-R', `${owner}:${owner}`, certs.root]);
        }
        await attack(join(certs.root, '.versions'), DOMAIN);
        // On 109210d every later write failed (EEXIST, ENOTDIR, EACCES), a restarted certshare's too.
        const [written, again] =
          owner === undefined
            ? [await certs.write(DOMAIN, renewal), await new CertDirectory(certs.root).write(DOMAIN, renewal)]
            : await writesAs(owner, certs.root, renewal);
        assert.equal(written, true);
        assert.equal((await handshake(nginx.port, DOMAIN)).serial, serialOf(renewal.certPem));
        assert.equal(again, false, 'a restarted certshare finds it written');
        const aside = [...(await readdir(certs.root)), ...(await readdir(join(certs.root, '.versions')))].filter((e) => e.startsWith('.replaced-'));
        assert.equal(aside.length, name.includes('read-only') ? 0 : 1, `moved aside, not deleted: ${aside.join(', ')}`);
      } finally {
        await nginx.stop();
      }
    });
  }

  it('leaves no version behind when the volume fills between the files and the swap, and serves the next renewal once it has room', {
    skip: process.getuid?.() !== 0 && 'needs root (mounts a tmpfs)',
  }, async () => {
    const base = join(dir(), 'full');
    const root = join(base, 'certs');
    await mkdir(root, { recursive: true });
    // The root and what the first write makes: .versions, .versions/<domain>, a version, its two files, the link.
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=1m,nr_inodes=7', 'tmpfs', root]);
    const certs = new CertDirectory(root);
    let nginx: Awaited<ReturnType<typeof startNginx>> | undefined;
    try {
      const [first, renewal] = [await makePair(DOMAIN, Date.now(), 3_600_000), await makePair(DOMAIN, Date.now(), 3_600_000)];
      execFileSync('mount', ['-o', 'remount,nr_inodes=10', root]);
      await certs.write(DOMAIN, first);
      nginx = await startNginx(base, { certRoot: root, domain: DOMAIN });
      await waitServing(nginx, DOMAIN);
      // Room for a new version and its two files, none for the link to it: ENOSPC in the middle of the swap.
      await assert.rejects(certs.write(DOMAIN, renewal), /ENOSPC/);
      const versions = await readdir(join(root, '.versions', DOMAIN));
      // On 109210d the new version, key included, stayed: one more at each retry (from 1 s, doubling to a minute).
      assert.deepEqual(versions, [(await realpath(certs.pathOf(DOMAIN))).split('/').pop()], 'only the version the link names');
      assert.equal((await handshake(nginx.port, DOMAIN)).serial, serialOf(first.certPem), 'nginx serves the pair before');
      execFileSync('mount', ['-o', 'remount,nr_inodes=64', root]);
      assert.equal(await certs.write(DOMAIN, renewal), true);
      assert.equal((await handshake(nginx.port, DOMAIN)).serial, serialOf(renewal.certPem));
    } finally {
      await nginx?.stop();
      execFileSync('umount', [root]);
    }
  });

  it('ends a keep-alive HTTP/1.1 and an HTTP/2 connection held across a renewal before the readiness lead has passed', async (t) => {
    // A held connection goes on under the certificate of its handshake: past a revocation (the swap) and, when
    // certshare cannot renew, past the expiry, since the readiness gate (--readiness-lead before notAfter)
    // takes the Pod out of new connections only. nginx ends it only by keepalive_time (by default 1 h).
    const lead = parseDuration(RUN_FLAGS.find((f) => f.name === 'readiness-lead')!.default!);
    const { certs, first: revoked, next: replacement, nginx } = await servingFirst(join(dir(), 'held'));
    try {
      const opened = Date.now();
      const http1 = connect({ host: '127.0.0.1', port: nginx.port, servername: DOMAIN, rejectUnauthorized: false, ALPNProtocols: ['http/1.1'] });
      await once(http1, 'secureConnect');
      http1.resume();
      http1.on('error', () => {});
      const http2 = connectHttp2(`https://127.0.0.1:${nginx.port}`, { servername: DOMAIN, rejectUnauthorized: false });
      http2.on('error', () => {});
      await once(http2, 'connect');
      const closedAt: { http1?: number; http2?: number } = {};
      http1.once('close', () => (closedAt.http1 = Date.now()));
      http2.once('close', () => (closedAt.http2 = Date.now()));
      assert.equal(http1.getPeerCertificate().serialNumber, serialOf(revoked.certPem));
      assert.equal(http1.alpnProtocol, 'http/1.1');
      assert.equal(http2.alpnProtocol, 'h2');
      assert.equal(await certs.write(DOMAIN, replacement), true);
      assert.equal((await handshake(nginx.port, DOMAIN)).serial, serialOf(replacement.certPem), 'a new connection gets the replacement');
      // A busy client: a request on each connection every second, so no idle timeout ends them.
      const busy = setInterval(() => {
        if (!closedAt.http1) http1.write('GET / HTTP/1.1\r\nHost: x\r\n\r\n');
        if (closedAt.http2 || http2.closed) return;
        try {
          http2
            .request({ ':path': '/' })
            .on('error', () => {})
            .resume()
            .end();
        } catch {
          // A GOAWAY from nginx: the session takes no new stream and closes.
        }
      }, 1000);
      try {
        await until(
          'both held connections closed by nginx',
          () => closedAt.http1 !== undefined && closedAt.http2 !== undefined,
          [onEvent(http1, 'close'), onEvent(http2, 'close')],
          lead + 10_000,
        ).catch(() => {});
      } finally {
        clearInterval(busy);
        http1.destroy();
        http2.destroy();
      }
      const lasted = [closedAt.http1, closedAt.http2].map((at) => (at === undefined ? undefined : at - opened));
      t.diagnostic(`held connections closed by nginx after ${lasted.map((ms) => ms ?? 'never').join(', ')} ms (HTTP/1.1, HTTP/2); readiness lead ${lead} ms`);
      for (const [i, ms] of lasted.entries()) {
        assert.ok(
          ms !== undefined && ms < lead,
          `${['HTTP/1.1', 'HTTP/2'][i]} connection under the replaced certificate still open ${ms ?? `past ${lead + 10_000}`} ms`,
        );
      }
    } finally {
      await nginx.stop();
    }
  });

  it('takes the Pod out of rotation while nginx fails every handshake (a key its worker cannot use), and back after', async (t) => {
    // A worker that cannot use the key (another uid's workers and the 0600 key, a key edited by hand) answers each
    // handshake with an alert: clients get nothing, and the example's tcpSocket probe still passes.
    const base = join(dir(), 'alert');
    const certDir = join(base, 'store');
    const emulator = await emulatorIn(dir(), { listen: join(dir(), 'alert.sock') });
    const nginx = await startNginx(base, { certRoot: certDir, domain: DOMAIN });
    const daemon = await standaloneDaemon(emulator, certDir, ['--served-check', `127.0.0.1:${nginx.port}`, '--served-check-interval', '1s']);
    const healthy = (): boolean => daemon.health.evaluate(Date.now()).healthy;
    const onHealth = (l: () => void): (() => void) => daemon.health.onChange(l);
    try {
      await until('the certificate written and served', healthy, [onHealth], 30_000);
      const keyFile = join(await realpath(join(certDir, DOMAIN)), 'tls.key');
      const key = await readFile(keyFile, 'utf8');
      await writeFile(keyFile, (await makePair(DOMAIN, Date.now(), 3_600_000)).keyPem);
      assert.equal((await handshake(nginx.port, DOMAIN)).error, 'ERR_SSL_TLSV1_ALERT_INTERNAL_ERROR');
      const failing = Date.now();
      // On 109210d the check counted the alert as no answer ("unknown"): still healthy 30 s later.
      await until('the Pod out of rotation', () => !healthy(), [onHealth], 30_000);
      const reason = daemon.health.evaluate(Date.now()).reason;
      t.diagnostic(`out of rotation ${Date.now() - failing} ms after nginx began failing handshakes: ${reason}`);
      assert.match(reason, /fails the TLS handshake/);
      await writeFile(keyFile, key);
      await until('back in rotation', healthy, [onHealth], 30_000);
    } finally {
      await daemon.stop();
      await nginx.stop();
      await emulator.close();
    }
  });

  it(`serves each of ${RENEWALS} renewals within 2 s of certshare holding it, with no failed handshake, no reload and the same master`, async (t) => {
    const base = join(dir(), 'renewals');
    const certDir = join(base, 'store');
    // 6 s certificates: renewed at half their lifetime, every 3 s.
    const emulator = await emulatorIn(dir(), { listen: join(dir(), 'renewals.sock'), certLifetimeMs: 6000 });
    const daemon = await standaloneDaemon(emulator, certDir);
    const firstFiles = nextEvent(daemon.events, 'filesWritten');
    let nginx: Awaited<ReturnType<typeof startNginx>> | undefined;
    try {
      await firstFiles;
      nginx = await startNginx(base, { certRoot: certDir, domain: DOMAIN });
      await waitServing(nginx, DOMAIN);
      await proveRenewalsServed(t, { daemon, certDir, domain: DOMAIN, proxy: nginx, pidFile: nginx.pidFile, method: undefined, count: RENEWALS });
    } finally {
      await daemon.stop();
      await nginx?.stop();
      await emulator.close();
    }
  });
});

const serialOf = (pem: string): string => new X509Certificate(pem).serialNumber;

/** nginx with the example's configuration under `base`, serving `first` from certshare's files; `next`, a pair for the test. */
async function servingFirst(base: string) {
  const certs = new CertDirectory(join(base, 'certs'));
  await certs.prepare();
  const [first, next] = [await makePair(DOMAIN, Date.now(), 3_600_000), await makePair(DOMAIN, Date.now(), 3_600_000)];
  await certs.write(DOMAIN, first);
  const nginx = await startNginx(base, { certRoot: certs.root, domain: DOMAIN });
  try {
    await waitServing(nginx, DOMAIN);
  } catch (err) {
    await nginx.stop();
    throw err;
  }
  return { certs, first, next, nginx };
}

/**
 * Two writes of `pair` to the directory at `root`, each by a certshare started anew, in a process of uid `uid`
 * (and its gid, no other group): whether each changed anything.
 */
async function writesAs(uid: number, root: string, pair: { certPem: string; keyPem: string }): Promise<[boolean, boolean]> {
  const script = `import { CertDirectory } from ${JSON.stringify(join(import.meta.dirname, '../../src/store/cert-directory.ts'))};
    let input = '';
    for await (const chunk of process.stdin) input += chunk;
    const pair = JSON.parse(input);
    const written = [];
    for (let i = 0; i < 2; i++) written.push(await new CertDirectory(process.argv[1]).write(${JSON.stringify(DOMAIN)}, pair));
    console.log(JSON.stringify(written));`;
  const child = spawn('setpriv', [`--reuid=${uid}`, `--regid=${uid}`, '--clear-groups', '--', process.execPath, '--input-type=module', '-e', script, root], {
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d));
  child.stderr.on('data', (d: Buffer) => (stderr += d));
  child.stdin.end(JSON.stringify(pair));
  const [code] = (await once(child, 'close')) as [number | null];
  assert.equal(code, 0, stderr);
  return JSON.parse(stdout) as [boolean, boolean];
}

/** The certificate file the domain's link names now, in its version directory. */
const realCertificateFile = (certs: CertDirectory, domain: string): Promise<string> => realpath(join(certs.pathOf(domain), 'tls.crt'));

/** Lets the test's own pending open of the FIFO finish (a reader of its own), then fails with `message`. */
async function unblock(fifo: string, opening: Promise<FileHandle>, message: string): Promise<never> {
  const reader = await open(fifo, constants.O_RDONLY | constants.O_NONBLOCK);
  await (await opening).close();
  await reader.close();
  throw new Error(message);
}
