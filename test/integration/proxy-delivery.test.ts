import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { once } from 'node:events';
import { mkdir, writeFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { daemonConfigFrom, RUN_FLAGS } from '../../src/config/run-options.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import { inspectCertPair } from '../../src/core/certificates/certificate.ts';
import type { StoredCert } from '../../src/core/ports/store.ts';
import { checkHaproxyPath, combinedPem, HaproxyDelivery, HaproxyRuntimeApi } from '../../src/delivery/haproxy.ts';
import type { ReloadOutcome } from '../../src/delivery/reload-command.ts';
import { parseReloadSignal, readPidFile, SignalReload } from '../../src/delivery/reload-signal.ts';
import { parseFlags } from '../../src/flags/flags.ts';
import { DAY, makePair } from '../support/certs.ts';
import { FakeClock } from '../support/fake-clock.ts';
import { useTempDir } from '../support/standalone.ts';

const DOMAIN = 'web.tailnet-1234.ts.net';

function config(args: string[]) {
  return daemonConfigFrom(parseFlags(RUN_FLAGS, ['--domain', DOMAIN, ...args], {}), {});
}

describe('proxy delivery: flags, pid files, the HAProxy PEM', () => {
  const dir = useTempDir();

  it('takes only signals that reload, never one that stops a process', () => {
    assert.equal(parseReloadSignal('HUP'), 'SIGHUP');
    assert.equal(parseReloadSignal('sigusr1'), 'SIGUSR1');
    for (const bad of ['TERM', 'KILL', 'INT', 'QUIT', 'SIGSTOP', '9', '', 'HUP;TERM']) {
      assert.throws(() => parseReloadSignal(bad), { code: 'CERTSHARE_BAD_FLAG' }, bad);
    }
  });

  it('refuses flag combinations that cannot work', () => {
    const refused: Array<[string[], RegExp]> = [
      [['--reload-signal', 'HUP'], /--reload-signal: needs --reload-pidfile/],
      [['--reload-pidfile', '/run/nginx/nginx.pid'], /--reload-pidfile: needs --reload-signal/],
      [['--reload-signal', 'HUP', '--reload-pidfile', '/p', '--reload-command', 'true'], /--reload-command: give it or --reload-signal, not both/],
      [['--reload-signal', 'TERM', '--reload-pidfile', '/p'], /--reload-signal: must be one of HUP, USR1, USR2/],
      [['--haproxy-socket', '/run/haproxy/admin.sock'], /--haproxy-socket: needs --haproxy-crt-dir/],
      [['--haproxy-crt-dir', 'certs'], /--haproxy-crt-dir: must be an absolute path/],
      [['--haproxy-crt-dir', '/certs;shutdown sessions'], /--haproxy-crt-dir: must not contain white space/],
      [['--haproxy-crt-dir', '/certs\nx'], /--haproxy-crt-dir: must not contain white space/],
    ];
    for (const [args, message] of refused) assert.throws(() => config(args), { code: 'CERTSHARE_BAD_FLAG', message }, args.join(' '));
    const ok = config([
      '--reload-signal',
      'HUP',
      '--reload-pidfile',
      '/run/nginx/nginx.pid',
      '--haproxy-crt-dir',
      '/run/haproxy/certs',
      '--haproxy-socket',
      '/run/haproxy/admin.sock',
    ]);
    assert.equal(ok.reloadSignal, 'SIGHUP');
    assert.equal(ok.haproxyCrtDir, '/run/haproxy/certs');
    assert.equal(checkHaproxyPath('/run/haproxy/certs'), undefined);
  });

  it('writes the chain then the key with no blank line (a blank line would end the runtime API payload)', () => {
    const pem = combinedPem({ certPem: 'LEAF\r\n\r\nCHAIN\n\n', keyPem: '\nKEY\n' });
    assert.equal(pem, 'LEAF\nCHAIN\nKEY\n');
  });

  it('reads a pid file that holds one pid, and nothing else', async () => {
    const file = join(dir(), 'ok.pid');
    await writeFile(file, ' 4242\n');
    assert.equal(await readPidFile(file, 7), 4242);
    await writeFile(file, `${'1'.repeat(70)}\n`);
    await assert.rejects(readPidFile(file, 7), { code: 'CERTSHARE_RELOAD_FAILED', message: /more than a pid/ });
    await writeFile(file, '99999999\n');
    await assert.rejects(readPidFile(file, 7), { code: 'CERTSHARE_RELOAD_FAILED', message: /one positive integer/ });
    await assert.rejects(readPidFile(join(dir(), 'none.pid'), 7), { code: 'CERTSHARE_RELOAD_FAILED', message: /pid file .*none\.pid: cannot read it/ });
  });

  it('does not hang on a FIFO planted at the pid file path', async () => {
    const fifo = join(dir(), 'fifo.pid');
    execFileSync('mkfifo', [fifo]);
    await assert.rejects(readPidFile(fifo, 7), { code: 'CERTSHARE_RELOAD_FAILED', message: /not a regular file/ });
  });

  it('says what to change when the kernel refuses the signal (another uid, no CAP_KILL)', async () => {
    const file = join(dir(), 'eperm.pid');
    await writeFile(file, '4242\n');
    const eperm = Object.assign(new Error('kill EPERM'), { code: 'EPERM' });
    const outcome = await new Promise<ReloadOutcome>((resolve) => {
      const logged: string[] = [];
      const logger = { ...silentLogger, error: (o: object) => logged.push(JSON.stringify(o)) };
      const reload = new SignalReload('SIGHUP', file, {
        logger,
        onOutcome: (o) => {
          assert.match(logged.join(), /CERTSHARE_RELOAD_FAILED.*not permitted to send SIGHUP to pid 4242.*own uid/);
          resolve(o);
        },
        kill: () => {
          throw eperm;
        },
      });
      void reload.request(DOMAIN);
    });
    assert.deepEqual({ ok: outcome.ok, method: outcome.method, domains: outcome.domains }, { ok: false, method: 'signal', domains: [DOMAIN] });
  });

  /** A SignalReload of a master whose accepting workers are `workers()`, on `clock`; its outcome once reported. */
  async function watchedReload(clock: FakeClock, workers: () => number[] | undefined, settleTimeoutMs = 30_000) {
    const file = join(dir(), 'master.pid');
    await writeFile(file, '4242\n');
    const signals: string[] = [];
    const logged: string[] = [];
    let outcome: ReloadOutcome | undefined;
    const { promise: signalled, resolve } = Promise.withResolvers<void>();
    const reload = new SignalReload('SIGHUP', file, {
      logger: { ...silentLogger, error: (o: object) => logged.push(JSON.stringify(o)) },
      onOutcome: (o) => (outcome = o),
      kill: (pid, signal) => {
        signals.push(`${signal} ${pid}`);
        resolve();
      },
      workers: async () => workers(),
      clock,
      settleTimeoutMs,
    });
    void reload.request(DOMAIN);
    await signalled;
    await clock.advance(0);
    return { signals, logged, outcome: () => outcome };
  }

  it("reports a signal reload only once the master's workers from before it no longer accept (nginx's old ones serve the replaced pair)", async () => {
    const clock = new FakeClock();
    let workers = [10, 11];
    const run = await watchedReload(clock, () => workers);
    assert.deepEqual(run.signals, ['SIGHUP 4242']);
    workers = [10, 11, 20, 21]; // the new workers start; the old ones still accept
    await clock.advance(50);
    assert.equal(run.outcome(), undefined, 'not delivered while an old worker accepts');
    workers = [11, 20, 21]; // 10 is shutting down (or gone)
    await clock.advance(50);
    assert.equal(run.outcome(), undefined);
    workers = [20, 21];
    await clock.advance(10);
    assert.equal(run.outcome()?.ok, true);
  });

  it('reports a reload the proxy did not take (its old workers still accept past the timeout) as failed, saying so', async () => {
    const clock = new FakeClock();
    const run = await watchedReload(clock, () => [10], 1000);
    await clock.advance(990);
    assert.equal(run.outcome(), undefined);
    await clock.advance(20);
    assert.equal(run.outcome()?.ok, false);
    assert.match(
      run.logged.join(),
      /CERTSHARE_RELOAD_FAILED.*workers from before SIGHUP \(10\) still accept connections 1000 ms after it: the proxy did not take the reload/,
    );
  });

  it('tries a failed signal reload again, from 1 s doubling, until one lands; a newer reload takes its place; none after stop', async () => {
    const clock = new FakeClock();
    const file = join(dir(), 'retried.pid');
    await writeFile(file, '4242\n');
    const outcomes: ReloadOutcome[] = [];
    let running = false;
    const reload = new SignalReload('SIGHUP', file, {
      logger: silentLogger,
      onOutcome: (o) => outcomes.push(o),
      kill: () => {
        if (!running) throw Object.assign(new Error('kill ESRCH'), { code: 'ESRCH' });
      },
      workers: async () => [],
      clock,
    });
    const results = (): Array<[boolean, string[]]> => outcomes.map((o) => [o.ok, o.domains]);
    try {
      await reload.request(DOMAIN);
      assert.deepEqual(clock.pendingDurations(), [1000]);
      await clock.advance(1000);
      await reload.idle();
      assert.deepEqual(clock.pendingDurations(), [2000], 'failed again: next after 2 s');
      running = true;
      await clock.advance(2000);
      await reload.idle();
      assert.deepEqual(results(), [
        [false, [DOMAIN]],
        [false, [DOMAIN]],
        [true, [DOMAIN]],
      ]);
      assert.equal(clock.pendingSleeps(), 0, 'landed: no more tries');
      running = false;
      await reload.request('a.example.com');
      await reload.request('b.example.com');
      assert.deepEqual(clock.pendingDurations(), [1000, 2000]);
      await clock.advance(1000);
      await reload.idle();
      assert.equal(outcomes.length, 5, 'a reload begun after the failed one takes the place of its retry');
      await clock.advance(1000);
      await reload.idle();
      assert.deepEqual(results().slice(5), [[false, ['a.example.com', 'b.example.com']]], 'the retry delivers the domains of both');
      assert.deepEqual(clock.pendingDurations(), [4000]);
    } finally {
      await reload.stop();
    }
    assert.equal(clock.pendingSleeps(), 0, 'stopped: no retry');
  });

  it("waits the reload's usual pause when the master's workers cannot be seen", async () => {
    const clock = new FakeClock();
    const run = await watchedReload(clock, () => undefined);
    await clock.advance(290);
    assert.equal(run.outcome(), undefined);
    await clock.advance(10);
    assert.equal(run.outcome()?.ok, true);
  });
});

/**
 * A unix socket server answering as HAProxy 2.6's runtime API does, one command a connection; `openOn` is the
 * certificate of a transaction someone left open (HAProxy then takes another certificate's `set` into it).
 */
async function fakeRuntimeApi(path: string, openOn?: string): Promise<{ commands: string[]; close(): Promise<void> }> {
  const commands: string[] = [];
  let open = openOn;
  const server = createServer((socket) => {
    socket.once('data', (chunk) => {
      const [verb, , , name] = String(chunk).split('\n')[0]!.split(' ');
      commands.push(`${verb} ${name}`);
      if (verb === 'set') {
        const action = open ? 'updated' : 'created';
        open ??= name;
        socket.end(`Transaction ${action} for certificate ${open}!\n\n`);
      } else if (verb === 'commit') {
        socket.end(open === name ? `Committing ${name}.\nSuccess!\n\n` : `The ongoing transaction is about '${open}' but you are trying to set '${name}'\n`);
        if (open === name) open = undefined;
      } else {
        socket.end(open === name ? `Transaction aborted for certificate '${name}'!\n\n` : `The ongoing transaction is about '${open}'\n\n`);
        if (open === name) open = undefined;
      }
    });
  });
  server.listen(path);
  await once(server, 'listening');
  return { commands, close: () => new Promise((resolve) => server.close(() => resolve())) };
}

describe('HAProxy runtime API delivery', () => {
  const dir = useTempDir();

  async function delivery(name: string) {
    const [crtDir, socket, clock] = [join(dir(), name), join(dir(), `${name}.sock`), new FakeClock()];
    const outcomes: ReloadOutcome[] = [];
    const haproxy = new HaproxyDelivery({
      crtDir,
      api: new HaproxyRuntimeApi(socket, 5000),
      logger: silentLogger,
      clock,
      onOutcome: (o) => outcomes.push(o),
      onWritten: () => {},
    });
    // A file HAProxy loaded at start: certshare pushes the certificates that replace it.
    await mkdir(crtDir);
    await writeFile(haproxy.pathOf(DOMAIN), combinedPem(await makePair(DOMAIN, Date.now() - DAY, DAY)));
    const cert = async (): Promise<StoredCert> => {
      const pair = await makePair(DOMAIN, Date.now(), DAY);
      return { pair, info: inspectCertPair(pair, DOMAIN) };
    };
    return { haproxy, socket, clock, outcomes, cert, pem: haproxy.pathOf(DOMAIN) };
  }

  it('tries a failed push again, from 1 s doubling, until it lands; a newer certificate ends the retries of the one before', async () => {
    const { haproxy, socket, clock, outcomes, cert, pem } = await delivery('retry');
    try {
      haproxy.certificate(DOMAIN, await cert());
      await haproxy.idle();
      assert.deepEqual(
        outcomes.map((o) => o.ok),
        [false],
        'no socket: ENOENT',
      );
      await clock.advance(1000);
      await haproxy.idle();
      assert.equal(outcomes.length, 2, 'tried again after 1 s');
      assert.deepEqual(clock.pendingDurations(), [2000], 'then after 2 s');
      const api = await fakeRuntimeApi(socket);
      try {
        await clock.advance(2000);
        await haproxy.idle();
        assert.deepEqual(
          outcomes.map((o) => o.ok),
          [false, false, true],
        );
        assert.deepEqual(api.commands, [`set ${pem}`, `commit ${pem}`]);
        assert.equal(clock.pendingSleeps(), 0, 'landed: no more tries');
      } finally {
        await api.close();
      }
      haproxy.certificate(DOMAIN, await cert());
      await haproxy.idle();
      haproxy.certificate(DOMAIN, await cert());
      await haproxy.idle();
      assert.equal(outcomes.length, 5);
      assert.deepEqual(clock.pendingDurations(), [1000, 2000]);
      await clock.advance(1000);
      await haproxy.idle();
      assert.equal(outcomes.length, 5, 'the certificate before the latest is not tried again');
      await clock.advance(1000);
      await haproxy.idle();
      assert.equal(outcomes.length, 6, 'the latest is');
    } finally {
      await haproxy.stop();
    }
  });

  it('aborts the transaction left open on another certificate that HAProxy took this one into, and does not commit', async () => {
    const { haproxy, socket, clock, outcomes, cert, pem } = await delivery('open');
    const other = join(dir(), 'open', 'other.pem');
    const api = await fakeRuntimeApi(socket, other);
    try {
      haproxy.certificate(DOMAIN, await cert());
      await haproxy.idle();
      assert.deepEqual(api.commands, [`set ${pem}`, `abort ${other}`]);
      assert.equal(outcomes[0]?.ok, false);
      await clock.advance(1000);
      await haproxy.idle();
      assert.deepEqual(api.commands.slice(2), [`set ${pem}`, `commit ${pem}`], 'the retry finds no transaction open');
      assert.equal(outcomes[1]?.ok, true);
    } finally {
      await haproxy.stop();
      await api.close();
    }
  });
});
