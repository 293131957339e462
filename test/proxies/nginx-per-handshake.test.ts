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
import { handshake, proveRenewalsServed, startNginx, waitServing } from './proxies.ts';

const RENEWALS = 3;

describe("nginx (Debian 12 package) with manifests/example's per-handshake configuration", { concurrency: true }, () => {
  const dir = useTempDir();

  it('serves a handshake from one renewal only when the next renewal lands between its opening of the certificate and of the key', async () => {
    const base = join(dir(), 'between-opens');
    const certs = new CertDirectory(join(base, 'certs'));
    await certs.prepare();
    const now = Date.now();
    const [before, renewal] = [await makePair(DOMAIN, now, 3_600_000), await makePair(DOMAIN, now, 3_600_000)];
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
        // nginx holds the certificate file of `before` open: certshare renews now, then nginx reads on.
        assert.equal(await certs.write(DOMAIN, renewal), true);
        await writer.writeFile(before.certPem);
      } finally {
        await writer.close();
      }
      const result = await served;
      assert.equal(result.error, undefined, `the handshake failed: ${nginx.output().slice(-2000)}`);
      assert.equal(result.serial, serialOf(before.certPem), 'served the certificate it had begun to read, with its own key');
      assert.equal((await handshake(nginx.port, DOMAIN)).serial, serialOf(renewal.certPem), 'the next handshake serves the renewal');
    } finally {
      await nginx.stop();
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

/** The certificate file the domain's link names now, in its version directory. */
const realCertificateFile = (certs: CertDirectory, domain: string): Promise<string> => realpath(join(certs.pathOf(domain), 'tls.crt'));

/** Lets the test's own pending open of the FIFO finish (a reader of its own), then fails with `message`. */
async function unblock(fifo: string, opening: Promise<FileHandle>, message: string): Promise<never> {
  const reader = await open(fifo, constants.O_RDONLY | constants.O_NONBLOCK);
  await (await opening).close();
  await reader.close();
  throw new Error(message);
}
