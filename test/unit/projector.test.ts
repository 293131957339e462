// The --out-dir projection when the certificate directory refuses a write (a disk full, a read-only volume):
// the files before stay what the proxy reads, health says why until a retry succeeds, and an older pair
// never lands after a newer one.
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { validateCertPair } from '../../src/core/certificates/certificate.ts';
import { HealthState } from '../../src/core/loop/health.ts';
import type { CertPair } from '../../src/core/ports/localapi.ts';
import type { StoredCert } from '../../src/core/ports/store.ts';
import { Projector } from '../../src/delivery/projector.ts';
import { CertDirectory } from '../../src/store/cert-directory.ts';
import { DAY, makePair } from '../support/certs.ts';
import { FakeClock } from '../support/fake-clock.ts';
import { recordingLogger } from '../support/recording-logger.ts';
import { useTempDir } from '../support/standalone.ts';

const domain = 'files.tailnet-1.ts.net';

/** A certificate directory whose writes fail with ENOSPC while `full` is set. */
class FullDisk extends CertDirectory {
  full = false;
  override async write(name: string, pair: CertPair): Promise<boolean> {
    if (this.full) throw Object.assign(new Error('ENOSPC: no space left on device, write'), { code: 'ENOSPC' });
    return super.write(name, pair);
  }
}

describe('Projector', () => {
  const dir = useTempDir();

  it('holds health at unhealthy from the certificate until its first files are written: the Pod enters rotation with files to serve', async () => {
    const clock = new FakeClock(Date.now());
    const files = new FullDisk(join(dir(), 'first'), clock);
    const health = new HealthState();
    health.manage([domain]);
    const projector = new Projector(files, { logger: recordingLogger().logger, clock, health, onWritten: () => {} });
    const pair = await makePair(domain, clock.now() - DAY, 90 * DAY);
    const cert = { pair, info: validateCertPair(pair, domain, clock.now()) };
    // As the loops' observers are called: health first, then the projector, in one turn.
    health.certificate(domain, cert);
    projector.certificate(domain, cert);
    const before = health.evaluate(clock.now());
    assert.equal(before.healthy, false, 'nothing on disk yet');
    assert.match(before.reason, /files\.tailnet-1\.ts\.net: its certificate files are not written yet/);
    await projector.idle();
    assert.equal(health.evaluate(clock.now()).healthy, true);
    // A later certificate is no first write: health stays as it is while it lands.
    projector.certificate(domain, cert);
    assert.equal(health.evaluate(clock.now()).healthy, true);
    await projector.stop();
  });

  it('keeps the files before when a write fails, holds health at unhealthy saying why, and retries until the write succeeds', async () => {
    const clock = new FakeClock(Date.now());
    const root = join(dir(), 'full');
    const files = new FullDisk(root, clock);
    const health = new HealthState();
    health.manage([domain]);
    const written: string[] = [];
    const projector = new Projector(files, { logger: recordingLogger().logger, clock, health, onWritten: (d) => written.push(d) });
    const stored = async (): Promise<StoredCert> => {
      const pair = await makePair(domain, clock.now() - DAY, 90 * DAY);
      return { pair, info: validateCertPair(pair, domain, clock.now()) };
    };
    const [first, renewal, next] = [await stored(), await stored(), await stored()];
    for (const cert of [first, renewal, next]) health.certificate(domain, cert);
    projector.certificate(domain, first);
    await projector.idle();
    assert.equal(health.evaluate(clock.now()).healthy, true);

    files.full = true;
    projector.certificate(domain, renewal);
    await projector.idle();
    assert.equal(await readFile(join(root, domain, 'tls.crt'), 'utf8'), first.pair.certPem, 'the proxy keeps the pair before');
    const verdict = health.evaluate(clock.now());
    assert.equal(verdict.healthy, false);
    assert.match(verdict.reason, /files\.tailnet-1\.ts\.net: could not write its certificate files \(ENOSPC/);
    await clock.advance(1000);
    await projector.idle();
    assert.equal(health.evaluate(clock.now()).healthy, false, 'still full: still unhealthy');

    files.full = false;
    await clock.advance(2000);
    await projector.idle();
    assert.equal(await readFile(join(root, domain, 'tls.crt'), 'utf8'), renewal.pair.certPem, 'the retry wrote it');
    assert.equal(health.evaluate(clock.now()).healthy, true);
    assert.deepEqual(written, [domain, domain]);

    // A retry pending when a newer pair arrives gives way to it: the older never lands after the newer.
    files.full = true;
    projector.certificate(domain, first);
    await projector.idle();
    files.full = false;
    projector.certificate(domain, next);
    await projector.idle();
    await clock.advance(60_000);
    await projector.idle();
    assert.equal(await readFile(join(root, domain, 'tls.crt'), 'utf8'), next.pair.certPem);
    assert.equal(health.evaluate(clock.now()).healthy, true);
    await projector.stop();
  });
});
