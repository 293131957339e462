// nginx from Debian's package with manifests/example's configuration: the certificate path holds a variable,
// so nginx reads the files at every TLS handshake; certshare only writes them. A handshake opens the
// certificate, then the key: the configuration must never pair the files of two renewals.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { X509Certificate } from 'node:crypto';
import { constants } from 'node:fs';
import { type FileHandle, open, realpath, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { CertDirectory } from '../../src/store/cert-directory.ts';
import { makePair } from '../support/certs.ts';
import { DOMAIN, emulatorIn, standaloneDaemon, useTempDir } from '../support/standalone.ts';
import { nextEvent } from '../support/wait.ts';
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
      const base = join(dir(), `resumption-${version}`);
      const certs = new CertDirectory(join(base, 'certs'));
      await certs.prepare();
      const [revoked, replacement] = [await makePair(DOMAIN, Date.now(), 3_600_000), await makePair(DOMAIN, Date.now(), 3_600_000)];
      await certs.write(DOMAIN, revoked);
      const nginx = await startNginx(base, { certRoot: certs.root, domain: DOMAIN });
      try {
        await waitServing(nginx, DOMAIN);
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

/** The certificate file the domain's link names now, in its version directory. */
const realCertificateFile = (certs: CertDirectory, domain: string): Promise<string> => realpath(join(certs.pathOf(domain), 'tls.crt'));

/** Lets the test's own pending open of the FIFO finish (a reader of its own), then fails with `message`. */
async function unblock(fifo: string, opening: Promise<FileHandle>, message: string): Promise<never> {
  const reader = await open(fifo, constants.O_RDONLY | constants.O_NONBLOCK);
  await (await opening).close();
  await reader.close();
  throw new Error(message);
}
