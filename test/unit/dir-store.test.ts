import assert from 'node:assert/strict';
import { lstat, mkdir, readFile, readdir, readlink, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { inspectCertPair, validateCertPair } from '../../src/core/certificates/certificate.ts';
import { HealthState } from '../../src/core/loop/health.ts';
import type { CertPair } from '../../src/core/ports/localapi.ts';
import { systemClock } from '../../src/core/ports/clock.ts';
import { CertDirectory, SUPERSEDED_GRACE_MS, SUPERSEDED_KEPT_MAX } from '../../src/store/cert-directory.ts';
import { DirStore } from '../../src/store/dir-store.ts';
import { DAY, makePair } from '../support/certs.ts';
import { FakeClock } from '../support/fake-clock.ts';
import { useTempDir } from '../support/standalone.ts';

const domain = 'files.tailnet-1.ts.net';

describe('DirStore and CertDirectory', () => {
  const dir = useTempDir();

  it('swaps versions atomically through a symlink, key 0600, and reports only real changes', async () => {
    const root = join(dir(), 'swap');
    const written: string[] = [];
    const store = new DirStore(new CertDirectory(root), systemClock, (d) => written.push(d));
    assert.deepEqual(await store.load(domain), { state: 'absent', coordination: {} });
    const first = await makePair(domain, Date.now() - DAY, 90 * DAY);
    const info = validateCertPair(first, domain, Date.now());
    await store.save(domain, { pair: first, info });
    await store.save(domain, { pair: first, info });
    assert.deepEqual(written, [domain], 'an identical pair is not rewritten');
    assert.ok((await lstat(join(root, domain))).isSymbolicLink());
    assert.equal((await stat(join(root, domain, 'tls.key'))).mode & 0o777, 0o600);
    const second = await makePair(domain, Date.now() - DAY, 90 * DAY);
    await store.save(domain, { pair: second, info: validateCertPair(second, domain, Date.now()) });
    const third = await makePair(domain, Date.now() - DAY, 90 * DAY);
    await store.save(domain, { pair: third, info: validateCertPair(third, domain, Date.now()) });
    assert.equal(await readFile(join(root, domain, 'tls.key'), 'utf8'), third.keyPem);
    assert.equal((await readdir(join(root, '.versions', domain))).length, 3, 'the superseded versions kept for their grace');
    const read = await store.load(domain);
    assert.equal(read.state, 'valid');
  });

  describe('pruning superseded versions', () => {
    /** A directory over `root` on `clock`, with the version each write made and the versions on disk. */
    function versioned(root: string, clock: FakeClock) {
      const files = new CertDirectory(root, clock);
      return {
        async write(): Promise<string> {
          assert.equal(await files.write(domain, await makePair(domain, Date.now() - DAY, 90 * DAY)), true);
          return (await readlink(join(root, domain))).split('/').pop()!;
        },
        onDisk: async (): Promise<string[]> => (await readdir(join(root, '.versions', domain))).sort(),
      };
    }

    it('keeps a superseded version for the grace after it stopped being current, however many renewals follow, and no longer', async () => {
      const clock = new FakeClock(Date.now());
      const { write, onDisk } = versioned(join(dir(), 'grace'), clock);
      const [v0, v1, v2] = [await write(), await write(), await write()];
      assert.deepEqual(await onDisk(), [v0, v1, v2].sort(), 'two renewals in a row: the first version is still there');
      await clock.advance(SUPERSEDED_GRACE_MS - 1000);
      const v3 = await write();
      assert.deepEqual(await onDisk(), [v0, v1, v2, v3].sort(), 'superseded less than the grace ago');
      await clock.advance(2000);
      const v4 = await write();
      // v0 and v1 stopped being current more than the grace ago; v2 when v3 was written, v3 now.
      assert.deepEqual(await onDisk(), [v2, v3, v4].sort());
      await clock.advance(10 * SUPERSEDED_GRACE_MS);
      const v5 = await write();
      assert.deepEqual(await onDisk(), [v4, v5].sort(), 'the version the swap just left stays, whatever the time');
    });

    it(`keeps at most ${SUPERSEDED_KEPT_MAX} superseded versions through a flood of renewals, the latest`, async () => {
      const clock = new FakeClock(Date.now());
      const { write, onDisk } = versioned(join(dir(), 'flood'), clock);
      const written: string[] = [];
      for (let i = 0; i < SUPERSEDED_KEPT_MAX + 5; i++) {
        written.push(await write());
        await clock.advance(1); // one after another, however fast the disk
      }
      assert.deepEqual(await onDisk(), written.slice(-(SUPERSEDED_KEPT_MAX + 1)).sort());
    });

    it('gives a version a previous process left the whole grace from when this process first sees it', async () => {
      const root = join(dir(), 'restart');
      const clock = new FakeClock(Date.now());
      const before = versioned(root, clock);
      const [v0, v1] = [await before.write(), await before.write()];
      // A restart long after: the new process cannot tell when v0 stopped being current.
      await clock.advance(10 * SUPERSEDED_GRACE_MS);
      const { write, onDisk } = versioned(root, clock);
      const v2 = await write();
      assert.deepEqual(await onDisk(), [v0, v1, v2].sort());
      await clock.advance(SUPERSEDED_GRACE_MS - 1000);
      const v3 = await write();
      assert.deepEqual(await onDisk(), [v0, v1, v2, v3].sort());
      await clock.advance(2000);
      const v4 = await write();
      assert.deepEqual(await onDisk(), [v2, v3, v4].sort());
    });
  });

  it('rewrites nothing after a restart, repairs a hand edit of the pair it wrote, and writes a renewal', async () => {
    const root = join(dir(), 'compare');
    const first = await makePair(domain, Date.now() - DAY, 90 * DAY);
    assert.equal(await new CertDirectory(root).write(domain, first), true);
    const versions = async (): Promise<string[]> => (await readdir(join(root, '.versions', domain))).sort();
    const before = await versions();
    // A new process finds the pair already on disk: no new version, so the proxy has nothing to reload.
    const restarted = new CertDirectory(root);
    assert.equal(await restarted.write(domain, first), false);
    assert.deepEqual(await versions(), before);
    // Someone edits the files by hand: the same pair, reported again, is put back.
    await writeFile(join(root, domain, 'tls.crt'), 'edited by hand\n');
    assert.equal(await restarted.write(domain, first), true);
    assert.equal(await readFile(join(root, domain, 'tls.crt'), 'utf8'), first.certPem);
    assert.equal(await restarted.write(domain, first), false, 'untouched since: nothing to do');
    // A renewal is written (without reading the files first; they held the previous pair).
    const renewed = await makePair(domain, Date.now() - DAY, 90 * DAY);
    assert.equal(await restarted.write(domain, renewed), true);
    assert.equal(await readFile(join(root, domain, 'tls.key'), 'utf8'), renewed.keyPem);
    assert.equal(await readFile(join(root, domain, 'tls.crt'), 'utf8'), renewed.certPem);
  });

  it('remembers when the pair on disk was obtained, for its serial only, next to a remembered rate limit', async () => {
    const root = join(dir(), 'obtained');
    const store = new DirStore(new CertDirectory(root), systemClock, () => {});
    const pair = await makePair(domain, Date.now() - DAY, 90 * DAY);
    const info = validateCertPair(pair, domain, Date.now());
    const obtainedAt = Date.now() - 1234;
    await store.save(domain, { pair, info, obtainedAt });
    await store.recordRateLimit(domain, Date.now() + 60_000);
    // A restart: a new store over the same directory measures the renewal window as before.
    const restarted = new DirStore(new CertDirectory(root), systemClock, () => {});
    const read = await restarted.load(domain);
    assert.equal(read.state, 'valid');
    assert.equal(read.state === 'valid' && read.cert.obtainedAt, obtainedAt);
    assert.ok(read.coordination?.retryNotBefore, 'the rate limit is kept too');
    // A pair put there by other means (another serial) does not inherit the record.
    const other = await makePair(domain, Date.now() - DAY, 90 * DAY);
    await new CertDirectory(root).write(domain, other);
    const after = await restarted.load(domain);
    assert.equal(after.state === 'valid' && after.cert.obtainedAt, undefined);
  });

  it('keeps a pair valid only later where the proxy reads nothing (0600), across a restart, until a pair as new is served', async () => {
    const root = join(dir(), 'pending');
    const store = new DirStore(new CertDirectory(root), systemClock, () => {});
    const served = await makePair(domain, Date.now() - DAY, 90 * DAY);
    await store.save(domain, { pair: served, info: validateCertPair(served, domain, Date.now()) });
    const later = await makePair(domain, Date.now() + 60_000, 90 * DAY);
    const laterInfo = inspectCertPair(later, domain);
    await store.savePending(domain, { pair: later, info: laterInfo });
    assert.equal(await readFile(join(root, domain, 'tls.crt'), 'utf8'), served.certPem, 'the proxy still serves the old pair');
    assert.equal((await stat(join(root, '.state', `${domain}.pending.json`))).mode & 0o777, 0o600);
    const restarted = new DirStore(new CertDirectory(root), systemClock, () => {});
    assert.equal((await restarted.load(domain)).pending?.info.serial, laterInfo.serial, 'a restart holds it');
    await restarted.save(domain, { pair: served, info: validateCertPair(served, domain, Date.now()) });
    assert.equal((await restarted.load(domain)).pending?.info.serial, laterInfo.serial, 'a pair ending earlier keeps it');
    await restarted.save(domain, { pair: later, info: laterInfo });
    assert.equal((await restarted.load(domain)).pending, undefined, 'served now: no longer for later');
  });

  it('reports garbage as unusable and keeps a hand-made directory aside when replacing it', async () => {
    const root = join(dir(), 'garbage');
    await mkdir(join(root, domain), { recursive: true });
    await writeFile(join(root, domain, 'tls.crt'), 'garbage');
    await writeFile(join(root, domain, 'tls.key'), 'garbage');
    const store = new DirStore(new CertDirectory(root), systemClock, () => {});
    const read = await store.load(domain);
    assert.equal(read.state, 'unusable');
    const pair = await makePair(domain, Date.now() - DAY, 90 * DAY);
    await store.save(domain, { pair, info: validateCertPair(pair, domain, Date.now()) });
    assert.equal((await store.load(domain)).state, 'valid');
    const kept = (await readdir(join(root, '.versions', domain))).filter((e) => e.startsWith('replaced-'));
    assert.equal(kept.length, 1);
  });

  it('remembers a rate limit across restarts', async () => {
    const root = join(dir(), 'ratelimit');
    const until = Date.now() + 3_600_000;
    await new DirStore(new CertDirectory(root), systemClock, () => {}).recordRateLimit(domain, until);
    const read = await new DirStore(new CertDirectory(root), systemClock, () => {}).load(domain);
    assert.equal(read.coordination?.retryNotBefore, Math.floor(until));
  });

  it('writes the rate-limit memory through a temporary file and a rename: concurrent writers, no partial file, no leftovers', async () => {
    const root = join(dir(), 'durable');
    const store = new DirStore(new CertDirectory(root), systemClock, () => {});
    const stateFile = join(root, '.state', `${domain}.json`);
    const base = Date.now() + 3_600_000;
    await store.recordRateLimit(domain, base);
    // Readers racing the writers only ever see a whole file.
    let reading = true;
    const reads: Promise<number> = (async () => {
      let n = 0;
      while (reading) {
        const text = await readFile(stateFile, 'utf8');
        assert.match(text, /^\{"retryNotBefore":"[^"]+"\}\n$/, 'a whole file');
        n++;
      }
      return n;
    })();
    try {
      await Promise.all(Array.from({ length: 20 }, (_, i) => store.recordRateLimit(domain, base + i * 1000)));
    } finally {
      reading = false;
    }
    assert.ok((await reads) > 0);
    assert.deepEqual(await readdir(join(root, '.state')), [`${domain}.json`], 'no temporary file left behind');
    assert.equal((await stat(stateFile)).mode & 0o777, 0o600);
    const remembered = (await store.load(domain)).coordination?.retryNotBefore;
    assert.ok(remembered !== undefined && remembered >= base && remembered <= base + 19_000);
  });

  it('holds health at unhealthy while a pair the loop holds could not be written, until a write succeeds', async () => {
    // A disk full or read-only: the loop holds the renewal, the proxy reads the files before, which run out.
    class FullDisk extends CertDirectory {
      full = false;
      override async write(name: string, pair: CertPair): Promise<boolean> {
        if (this.full) throw Object.assign(new Error('ENOSPC: no space left on device, write'), { code: 'ENOSPC' });
        return super.write(name, pair);
      }
    }
    const files = new FullDisk(join(dir(), 'full'));
    const health = new HealthState();
    health.manage([domain]);
    const store = new DirStore(files, systemClock, () => {}, health);
    const stored = async () => {
      const pair = await makePair(domain, Date.now() - DAY, 90 * DAY);
      return { pair, info: validateCertPair(pair, domain, Date.now()) };
    };
    const [first, renewal] = [await stored(), await stored()];
    await store.save(domain, first);
    health.certificate(domain, renewal);
    assert.equal(health.evaluate(Date.now()).healthy, true);
    files.full = true;
    await assert.rejects(store.save(domain, renewal), /ENOSPC/);
    const verdict = health.evaluate(Date.now());
    assert.equal(verdict.healthy, false, 'the loop holds a valid pair, the proxy does not serve it');
    assert.match(verdict.reason, /files\.tailnet-1\.ts\.net: could not write its certificate files \(ENOSPC/);
    files.full = false;
    await store.save(domain, renewal);
    assert.equal(health.evaluate(Date.now()).healthy, true);
  });

  it('refuses names that would escape the directory', async () => {
    await assert.rejects(new CertDirectory(dir()).write('../evil', { keyPem: '', certPem: '' }), /unsafe as a file name/);
    const directory = new CertDirectory(join(dir(), 'escape', 'store'));
    await directory.prepare();
    const store = new DirStore(directory, systemClock, () => {});
    for (const name of ['../../evil.example.com', '..', 'a/b.example.com', 'UPPER.example.com']) {
      await assert.rejects(store.load(name), { code: 'CERTSHARE_BAD_DOMAIN' });
      await assert.rejects(store.recordRateLimit(name, Date.now() + 1000), { code: 'CERTSHARE_BAD_DOMAIN' });
    }
    assert.deepEqual(await readdir(join(dir(), 'escape'), { recursive: true }), ['store'], 'nothing written for a refused name');
  });
});

describe('reload command line', () => {
  it('uses the shell where there is one and runs the command directly where there is none', async () => {
    const { commandLine } = await import('../../src/delivery/reload-command.ts');
    assert.deepEqual(commandLine({ shell: 'nginx -s reload' }, true), ['/bin/sh', '-c', 'nginx -s reload']);
    assert.deepEqual(commandLine({ shell: ' /usr/sbin/nginx  -s reload ' }, false), ['/usr/sbin/nginx', '-s', 'reload']);
  });
});
