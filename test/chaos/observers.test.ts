// The checker's watch of a replica's projected files (DirWatch), on a directory certshare's own CertDirectory
// writes: what readNow reports, at once, for a checker about to record a violation.
import assert from 'node:assert/strict';
import { X509Certificate } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { CertDirectory } from '../../src/store/cert-directory.ts';
import { makePair } from '../support/certs.ts';
import { DirWatch, type FilesState } from './observers.ts';

const D = 'proxy.tailnet-0000.ts.net';

describe('DirWatch.readNow', () => {
  it('reports the files as they are before it returns, a swap included, and nothing when they did not change', async () => {
    const root = await mkdtemp(join(tmpdir(), 'certshare-dirwatch-'));
    try {
      const dir = new CertDirectory(root);
      const [first, second] = await Promise.all([makePair(D, Date.now() - 2000, 60_000), makePair(D, Date.now() - 1000, 60_000)]);
      const serial = (certPem: string): string => new X509Certificate(certPem).serialNumber;
      const seen: Array<string | undefined> = [];
      const watch = new DirWatch(root, [D], (_domain, state: FilesState) => seen.push(state.cert?.serial));

      watch.readNow(D);
      assert.deepEqual(seen, [undefined], 'no files yet');
      await dir.write(D, first);
      watch.readNow(D);
      assert.deepEqual(seen, [undefined, serial(first.certPem)]);
      // The swap the projector makes (a new version directory, the link renamed over): reported by the next read.
      await dir.write(D, second);
      watch.readNow(D);
      assert.deepEqual(seen, [undefined, serial(first.certPem), serial(second.certPem)]);
      watch.readNow(D);
      await watch.check(D);
      assert.equal(seen.length, 3, 'the same files again: nothing reported');
      assert.equal(watch.serial(D), serial(second.certPem));
    } finally {
      await rm(root, { recursive: true, force: true });
    }
  });
});
