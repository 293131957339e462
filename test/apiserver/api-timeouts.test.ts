// Every Kubernetes API call is bounded: with the API server black-holed (a relay that accepts and then
// says nothing, as behind a firewall dropping packets), calls fail with a timeout instead of hanging, the
// Lease loop keeps its pace, and SIGTERM still ends the process within --shutdown-timeout.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { EventEmitter, once } from 'node:events';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { systemClock } from '../../src/core/ports/clock.ts';
import { CertshareError } from '../../src/core/errors.ts';
import type { Logger } from '../../src/core/ports/logger.ts';
import { silentLogger } from '../../src/core/ports/logger.ts';
import { startEmulator } from '../../src/emulator/server.ts';
import { connectKube } from '../../src/kube/connection.ts';
import { LeaseElector } from '../../src/kube/lease-elector.ts';
import { KubeSecretStore } from '../../src/kube/secret-store.ts';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { GATE, GROUP, KUBE_DOMAIN, createGatedPod, exampleNamespace, filesWritten, heldSerial, kubeconfigVia, startReplica } from '../support/kube.ts';
import { useTempDir } from '../support/standalone.ts';
import { startTcpProxy, type TcpProxy } from '../support/tcp-proxy.ts';
import { nextEvent, onEvent, until } from '../support/wait.ts';

const cp = useControlPlane();
const BIN = fileURLToPath(new URL('../../bin/certshare.js', import.meta.url));

/** A relay in front of the API server and a ServiceAccount kubeconfig that goes through it. */
async function relayed(ns: string, dir: string, name: string, who: { pod?: string } = {}): Promise<{ relay: TcpProxy; kubeconfig: string }> {
  const relay = await startTcpProxy(Number(new URL(cp().server).port));
  const kubeconfig = await kubeconfigVia(cp(), ns, join(dir, `${name}.kubeconfig`), { url: `https://127.0.0.1:${relay.port}` }, who);
  return { relay, kubeconfig };
}

/** A Logger that keeps every line and emits 'line' for each (a source for `until`). */
function watchedLogger(): {
  logger: Logger;
  lines: Array<{ level: string; msg: string | undefined; obj: Record<string, unknown>; at: number }>;
  events: EventEmitter;
} {
  const lines: Array<{ level: string; msg: string | undefined; obj: Record<string, unknown>; at: number }> = [];
  const events = new EventEmitter();
  const log = (level: string) => (obj: object, msg?: string) => {
    lines.push({ level, msg, obj: obj as Record<string, unknown>, at: performance.now() });
    events.emit('line');
  };
  const logger: Logger = { debug: log('debug'), info: log('info'), warn: log('warn'), error: log('error'), child: () => logger };
  return { logger, lines, events };
}

const causeCode = (err: unknown): string | undefined =>
  (err as { cause?: unknown }).cause instanceof CertshareError ? (err as { cause: CertshareError }).cause.code : undefined;

describe('Kubernetes API calls against a black-holed API server', () => {
  const dir = useTempDir();

  it('a store call fails with CERTSHARE_KUBE_TIMEOUT within the request timeout, and its signal cuts it at once', { timeout: 60_000 }, async () => {
    const ns = await exampleNamespace(cp());
    const { relay, kubeconfig } = await relayed(ns, dir(), 'store');
    try {
      const connection = await connectKube({ KUBECONFIG: kubeconfig, POD_NAMESPACE: ns }, { requestTimeoutMs: 1500 });
      const store = new KubeSecretStore({ connection, clock: systemClock, logger: silentLogger, group: GROUP });
      const running = new AbortController().signal;
      assert.equal((await store.load(KUBE_DOMAIN, running)).state, 'absent', 'the relay forwards');
      relay.blackHole();

      let started = performance.now();
      await assert.rejects(store.load(KUBE_DOMAIN, running), (err: CertshareError) => {
        assert.equal(err.code, 'CERTSHARE_STORE_UNAVAILABLE');
        assert.equal(causeCode(err), 'CERTSHARE_KUBE_TIMEOUT');
        assert.match(err.message, /no answer from the Kubernetes API within 1500 ms/);
        return true;
      });
      const waited = performance.now() - started;
      assert.ok(waited >= 1400 && waited < 6000, `failed after ${Math.round(waited)} ms, the timeout being 1500 ms`);

      const stopping = new AbortController();
      started = performance.now();
      const cut = store.load(KUBE_DOMAIN, stopping.signal);
      stopping.abort();
      await assert.rejects(cut);
      assert.ok(performance.now() - started < 1000, 'an aborted call ends at once, without waiting for its timeout');
    } finally {
      await relay.close();
    }
  });

  it('an issuance turn whose store read is black-holed reports the timeout and goes on', { timeout: 90_000 }, async () => {
    const ns = await exampleNamespace(cp());
    const { relay, kubeconfig } = await relayed(ns, dir(), 'turn');
    // 12 s certificates: the renewal turn comes 6 s after issuance, inside the black hole.
    const writer = await startReplica(cp(), ns, join(dir(), 'turn'), 'proxy-0', {
      mode: 'rw',
      env: { KUBECONFIG: kubeconfig },
      emulator: { certLifetimeMs: 12_000 },
    });
    try {
      await until('the first certificate', () => heldSerial(writer) !== undefined, [filesWritten(writer)], 20_000);
      const reported = nextEvent<{ message: string }>(writer.daemon.events, 'problem', (p) => /unreadable/.test(p.message), 40_000);
      relay.blackHole();
      const problem = await reported;
      assert.match(problem.message, /no answer from the Kubernetes API within 10000 ms/);
      assert.equal(writer.emulator.stats().certRequests[KUBE_DOMAIN], 1, 'no CertPair call while the store cannot be read');
      // The loop is not wedged: once the API answers again, the renewal happens.
      const renewed = nextEvent(writer.emulator.events, 'issued', () => true, 40_000);
      relay.restore();
      await renewed;
    } finally {
      await relay.close();
      await writer.stop();
    }
  });

  it('the Lease loop keeps its pace: one bounded attempt per interval, and leadership back soon after', { timeout: 60_000 }, async () => {
    const ns = await exampleNamespace(cp());
    const { relay, kubeconfig } = await relayed(ns, dir(), 'lease');
    const { logger, lines, events } = watchedLogger();
    const connection = await connectKube({ KUBECONFIG: kubeconfig, POD_NAMESPACE: ns });
    // 3 s lease: an attempt every second.
    const elector = new LeaseElector({ name: `certshare-${GROUP}`, identity: 'proxy-0', leaseDurationMs: 3000 }, { connection, clock: systemClock, logger });
    const roleChanged = (listener: () => void) => elector.onChange(listener);
    elector.start();
    try {
      await until('leader', () => elector.canIssue(), [roleChanged], 10_000);
      relay.blackHole();
      const cutAt = performance.now();
      const failures = () => lines.filter((l) => l.msg === 'lease update failed');
      await until('no longer leader', () => !elector.canIssue(), [roleChanged], 6000);
      assert.ok(performance.now() - cutAt < 4500, 'leadership ends within the lease duration');
      await until('four failed attempts', () => failures().length >= 4, [onEvent(events, 'line')], 8000);
      const at = failures().map((l) => l.at);
      for (let i = 1; i < at.length; i++) assert.ok(at[i]! - at[i - 1]! < 2000, `attempts ${Math.round(at[i]! - at[i - 1]!)} ms apart; the interval is 1 s`);
      assert.ok(
        failures().every((l) => l.obj.code === 'CERTSHARE_KUBE_TIMEOUT'),
        'each attempt ended by its deadline',
      );
      relay.restore();
      const restoredAt = performance.now();
      await until('leader again', () => elector.canIssue(), [roleChanged], 6000);
      assert.ok(performance.now() - restoredAt < 4000, 'the next attempts reach the API server');
    } finally {
      await relay.close();
      await elector.stop();
    }
  });

  it('SIGTERM still ends the process within --shutdown-timeout, exit 0, taking the Pod out of rotation as far as it can', { timeout: 90_000 }, async (t) => {
    const ns = await exampleNamespace(cp());
    await createGatedPod(cp(), ns, 'proxy-0');
    // The token bound to the Pod, as its projected token is: the admission policy admits its own Pod's condition only.
    const { relay, kubeconfig } = await relayed(ns, dir(), 'sigterm', { pod: 'proxy-0' });
    const emulator = await startEmulator({ listen: join(dir(), 'sigterm.sock'), domains: [KUBE_DOMAIN] });
    const shutdownTimeoutMs = 6000;
    const child = spawn(
      process.execPath,
      [
        BIN,
        'run',
        '--acme-directory',
        'none',
        '--store',
        'kube',
        '--mode',
        'auto',
        '--lease-duration',
        '3s',
        '--domain',
        KUBE_DOMAIN,
        '--group',
        GROUP,
        '--localapi',
        emulator.address,
        '--listen',
        '127.0.0.1:0',
        '--readiness-gate',
        GATE,
        '--drain-delay',
        '1s',
        '--shutdown-timeout',
        `${shutdownTimeoutMs}ms`,
      ],
      {
        env: { PATH: process.env.PATH, KUBECONFIG: kubeconfig, POD_NAME: 'proxy-0', POD_NAMESPACE: ns, POD_IPS: '10.0.0.10' },
        stdio: ['ignore', 'pipe', 'inherit'],
      },
    );
    const logs: Array<{ msg: string; status?: string; code?: string }> = [];
    const logged = new EventEmitter();
    createInterface(child.stdout!).on('line', (line) => {
      logs.push(JSON.parse(line) as { msg: string });
      logged.emit('line');
    });
    const exited = once(child, 'exit');
    try {
      await until('ready', () => logs.some((l) => l.msg === 'readiness condition updated' && l.status === 'True'), [onEvent(logged, 'line')], 30_000);
      relay.blackHole();
      const signalledAt = performance.now();
      child.kill('SIGTERM');
      const [code] = await exited;
      const tookMs = performance.now() - signalledAt;
      t.diagnostic(`SIGTERM to exit with the API black-holed: ${Math.round(tookMs)} ms, exit code ${code}`);
      assert.equal(
        code,
        0,
        `exit code (logs: ${logs
          .slice(-6)
          .map((l) => l.msg)
          .join(' | ')})`,
      );
      assert.ok(tookMs < shutdownTimeoutMs + 1500, `exited ${Math.round(tookMs)} ms after SIGTERM; the bound is ${shutdownTimeoutMs} ms`);
      const leave = logs.find((l) => l.msg === 'could not take the Pod out of rotation');
      assert.equal(leave?.code, 'CERTSHARE_KUBE_TIMEOUT', 'leaving rotation was tried and given up on its deadline');
      assert.ok(
        logs.some((l) => l.msg === 'stopped'),
        'a complete graceful stop',
      );
    } finally {
      child.kill('SIGKILL');
      await relay.close();
      await emulator.close();
    }
  });
});
