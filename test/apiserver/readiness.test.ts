import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { createServer, type Server } from 'node:http';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { startEmulator } from '../../src/emulator/server.ts';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { GATE, KUBE_DOMAIN, GROUP, createGatedPod, exampleNamespace, replicaKubeconfig, startReplica } from '../support/kube.ts';
import { JumpClock } from '../support/jump-clock.ts';
import { useTempDir } from '../support/standalone.ts';
import { asAccount } from '../support/token-request.ts';

const cp = useControlPlane();
const BIN = fileURLToPath(new URL('../../bin/certshare.js', import.meta.url));

interface Condition {
  type: string;
  status: string;
  reason?: string;
  message?: string;
}

interface ConditionWatch {
  /** Resolves once kubectl printed the Pod as it was when the watch began: later changes are all seen. */
  opened: Promise<void>;
  /** Every state of the Pod's conditions since the watch began, in order. */
  history: Condition[][];
  /** Resolves with the first state (from the beginning of the history) that satisfies `predicate`. */
  until(predicate: (c: Condition[]) => boolean, timeoutMs?: number): Promise<Condition[]>;
  close(): void;
}

/**
 * Follows the Pod's conditions with a watch (kubectl get --watch). Tests open it before acting, so a
 * state that lasts only a moment (False before the certificate) is not missed on a slow machine.
 */
function watchConditions(ns: string, name: string): ConditionWatch {
  const child = spawn(
    join(cp().binDir, 'kubectl'),
    ['--kubeconfig', cp().adminKubeconfigPath, '-n', ns, 'get', 'pod', name, '--watch', '-o', 'json', '--output-watch-events=false'],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  const history: Condition[][] = [];
  const waiters = new Set<() => void>();
  let ended: Error | undefined;
  const notify = (): void => {
    for (const waiter of [...waiters]) waiter();
  };
  void (async () => {
    let buffer = '';
    try {
      for await (const chunk of child.stdout!) {
        buffer += String(chunk);
        // kubectl prints one pretty JSON document per change; a document ends with a "}" line.
        for (let end = buffer.indexOf('\n}\n'); end !== -1; end = buffer.indexOf('\n}\n')) {
          const doc = JSON.parse(buffer.slice(0, end + 2)) as { status?: { conditions?: Condition[] } };
          buffer = buffer.slice(end + 3);
          history.push(doc.status?.conditions ?? []);
          notify();
        }
      }
      ended = new Error(`the watch on Pod ${name} ended`);
    } catch (error) {
      ended = error as Error;
    }
    notify();
  })();
  const until = (predicate: (c: Condition[]) => boolean, timeoutMs = 60_000): Promise<Condition[]> =>
    new Promise((resolve, reject) => {
      const timer = setTimeout(() => finish(new Error(`Pod ${name} conditions never matched within ${timeoutMs} ms`)), timeoutMs);
      const finish = (error?: Error, match?: Condition[]): void => {
        clearTimeout(timer);
        waiters.delete(check);
        if (match) resolve(match);
        else reject(error);
      };
      const check = (): void => {
        const match = history.find(predicate);
        if (match) finish(undefined, match);
        else if (ended) finish(ended);
      };
      waiters.add(check);
      check();
    });
  const opened = until(() => true).then(() => undefined);
  opened.catch(() => {}); // awaited by the tests that need it; an end is reported by `until` too
  return {
    opened,
    history,
    until,
    close: () => child.kill(),
  };
}

/** Resolves with the Pod's conditions once `predicate` holds. */
async function conditionsWhen(ns: string, name: string, predicate: (c: Condition[]) => boolean, timeoutMs = 60_000): Promise<Condition[]> {
  const watch = watchConditions(ns, name);
  try {
    return await watch.until(predicate, timeoutMs);
  } finally {
    watch.close();
  }
}

const gateStatus = (conditions: Condition[]): string | undefined => conditions.find((c) => c.type === GATE)?.status;

function healthServer(podIPv4: () => string | undefined): Promise<{ url: string; server: Server; calls: number[] }> {
  const calls: number[] = [];
  const server = createServer((_req, res) => {
    calls.push(Date.now());
    const ip = podIPv4();
    if (ip) res.setHeader('Pod-IPv4', ip);
    res.end('ok');
  });
  return new Promise((resolve) =>
    server.listen(0, '127.0.0.1', () => resolve({ url: `http://127.0.0.1:${(server.address() as { port: number }).port}/healthz`, server, calls })),
  );
}

describe("the Pod's own readiness gate", () => {
  const dir = useTempDir();

  it('turns True once certificates are valid and the Service routes here, leaving other conditions alone', async () => {
    const ns = await exampleNamespace(cp());
    await createGatedPod(cp(), ns, 'proxy-0');
    // The Service first answers from another replica, then from this one.
    let answers = 0;
    const health = await healthServer(() => (++answers < 3 ? '10.0.0.99' : '10.0.0.10'));
    const watch = watchConditions(ns, 'proxy-0');
    await watch.opened;
    const replica = await startReplica(cp(), ns, join(dir(), ns), 'proxy-0', {
      mode: 'rw',
      flags: ['--readiness-gate', GATE, '--routing-check', health.url],
      // The domain appears when the test says (an hour's delay otherwise): the gate is seen False first, however slow the start.
      emulator: { domainDelayMs: 3_600_000 },
    });
    try {
      await watch.until((c) => gateStatus(c) !== undefined);
      replica.emulator.addCertDomain(KUBE_DOMAIN);
      const ready = await watch.until((c) => gateStatus(c) === 'True');
      const first = watch.history.map(gateStatus).find((status) => status !== undefined);
      assert.equal(first, 'False', 'not ready before the certificate');
      assert.deepEqual(
        ready.map((c) => c.type).sort(),
        ['PodScheduled', GATE, 'example.com/other'].sort(),
        'the kubelet-like conditions survive, and ours appears once',
      );
      assert.ok(health.calls.length >= 3, 'routing was verified with several calls');
    } finally {
      watch.close();
      await replica.stop();
      health.server.close();
    }
  });

  it('turns False ahead of the certificate expiry, then says it expired', async () => {
    const ns = await exampleNamespace(cp());
    await createGatedPod(cp(), ns, 'proxy-1');
    const writer = await startReplica(cp(), ns, join(dir(), ns), 'proxy-0', { mode: 'rw', emulator: { certLifetimeMs: 10_000 } });
    const reader = await startReplica(cp(), ns, join(dir(), ns), 'proxy-1', { mode: 'ro', flags: ['--readiness-gate', GATE] });
    try {
      await conditionsWhen(ns, 'proxy-1', (c) => gateStatus(c) === 'True');
      // Every change from here on: the watch is open before the certificate can run out.
      const watch = watchConditions(ns, 'proxy-1');
      await watch.opened;
      await writer.stop(); // no more renewals: the reader's certificate runs out
      try {
        await watch.until((c) => c.find((x) => x.type === GATE)?.reason === 'CertificateNotValid', 60_000);
      } finally {
        watch.close();
      }
      const reasons: string[] = [];
      for (const state of watch.history) {
        const gate = state.find((x) => x.type === GATE);
        if (gate?.status === 'False' && reasons.at(-1) !== gate.reason) reasons.push(gate.reason ?? '');
      }
      // 10 s certificates (a loaded machine delays a reader by seconds): the lead is 5% of the lifetime, 500 ms (--readiness-lead 1m bounds longer ones).
      assert.deepEqual(reasons, ['CertificateExpiring', 'CertificateNotValid'], 'out of rotation before the expiry, then expired');
      assert.equal((await fetch(`${reader.daemon.address}/healthz`)).status, 503);
    } finally {
      await Promise.all([writer.stop(), reader.stop()]);
    }
  });

  it("a True that the Pod's stolen token writes once over certshare's False is put back to False within a minute", async () => {
    const ns = await exampleNamespace(cp());
    await createGatedPod(cp(), ns, 'proxy-1');
    const clock = new JumpClock();
    // No writer: the reader has no certificate, and says False from its start (a certificate run out says so too:
    // the test above). The forged True is written over that False, without waiting for a certificate to expire.
    const reader = await startReplica(cp(), ns, join(dir(), ns), 'proxy-1', { mode: 'ro', flags: ['--readiness-gate', GATE], clock });
    try {
      await conditionsWhen(ns, 'proxy-1', (c) => c.find((x) => x.type === GATE)?.reason === 'CertificateNotValid', 60_000);
      // The token certshare's container holds (a proxy sharing its process namespace reads it): one patch, all it may do.
      const path = `/api/v1/namespaces/${ns}/pods/proxy-1/status`;
      const pod = JSON.parse((await cp().adminRequest('GET', path)).body) as { status: { conditions: Condition[] } };
      const conditions = pod.status.conditions.map((c) => (c.type === GATE ? { ...c, status: 'True', reason: 'CertificatesValid', message: 'forged' } : c));
      const watch = watchConditions(ns, 'proxy-1');
      try {
        await watch.opened;
        const forged = await asAccount(cp(), await replicaKubeconfig(cp(), ns, 'proxy-1'), 'PATCH', path, { status: { conditions } });
        assert.equal(forged.status, 200, `the Pod's own token may write its condition: ${forged.body.slice(0, 300)}`);
        const seen = await watch.until((c) => c.find((x) => x.type === GATE)?.message === 'forged');
        // On cd68f49 certshare patched only when what it wanted changed: the forged True stood, the Pod Ready with an
        // invalid certificate, long after the token expired (an hour at most).
        clock.jump(61_000);
        const after = await watch.until((c) => watch.history.indexOf(c) > watch.history.indexOf(seen) && gateStatus(c) === 'False');
        assert.equal(after.find((x) => x.type === GATE)?.reason, 'CertificateNotValid');
      } finally {
        watch.close();
      }
    } finally {
      await reader.stop();
    }
  });

  it("on SIGTERM sets the condition False first, then exits 0 without a drain wait (the drain is the proxy's preStop sleep)", async () => {
    const ns = await exampleNamespace(cp());
    await createGatedPod(cp(), ns, 'proxy-0');
    const emulator = await startEmulator({ listen: join(dir(), 'sigterm.sock'), domains: [KUBE_DOMAIN] });
    const kubeconfig = await replicaKubeconfig(cp(), ns, 'proxy-0');
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
        'rw',
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
        // Not waited for by certshare: a 50 s drain would hold the exit past the bound asserted below.
        '--drain-delay',
        '50s',
      ],
      {
        env: { PATH: process.env.PATH, KUBECONFIG: kubeconfig, POD_NAME: 'proxy-0', POD_NAMESPACE: ns, POD_IPS: '10.0.0.10' },
        stdio: ['ignore', 'pipe', 'inherit'],
      },
    );
    try {
      const logs: Array<{ msg: string; status?: string }> = [];
      for await (const line of createInterface(child.stdout!)) {
        const entry = JSON.parse(line) as { msg: string; status?: string };
        logs.push(entry);
        if (entry.msg === 'readiness condition updated' && entry.status === 'True') break;
      }
      const exited = once(child, 'exit');
      const signalled = performance.now();
      child.kill('SIGTERM');
      const falseSeen = conditionsWhen(ns, 'proxy-0', (c) => gateStatus(c) === 'False');
      const [code] = await exited;
      assert.equal(code, 0);
      const exitMs = performance.now() - signalled;
      assert.ok(exitMs < 20_000, `exited ${Math.round(exitMs)} ms after SIGTERM: no 50 s drain`);
      const conditions = await falseSeen;
      assert.equal(conditions.find((c) => c.type === GATE)?.reason, 'Terminating');
    } finally {
      child.kill('SIGKILL');
      await emulator.close();
    }
  });
});
