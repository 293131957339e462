// Injector replicas as separate processes against the real apiserver, under manifests/injector's RBAC:
// the holder of the Lease alone writes the CAs, the leaf and the caBundle, the other reads and serves;
// killed (SIGKILL, no release), the holder is replaced by the other once the Lease runs out, and the
// rotation goes on. Writes are counted from each replica's own log and from the Secrets' written-by.
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { EventEmitter } from 'node:events';
import { fileURLToPath } from 'node:url';
import { createInterface } from 'node:readline';
import { after, before, describe, it } from 'node:test';
import { ANNOTATION_WRITER as WRITTEN_BY } from '../../../src/kube/secret-codec.ts';
import { useControlPlane } from '../../harness/use-control-plane.ts';
import { must } from '../../support/kube.ts';
import { asAccount } from '../../support/token-request.ts';
import { deathSignalPrefix, freePort } from '../../support/processes.ts';
import { until, onEvent } from '../../support/wait.ts';
import { injectorReplicaFlags } from '../../support/replica-flags.ts';

const cp = useControlPlane();
const MAIN = fileURLToPath(new URL('../../../src/cli/main.ts', import.meta.url));
const MANIFESTS = fileURLToPath(new URL('../../../manifests/injector', import.meta.url));
const NS = 'certshare';
const LEASE = 'certshare-injector';

interface Step {
  replica: string;
  action: string;
}

interface Process {
  name: string;
  child: ChildProcess;
  served: string[];
  writer: boolean;
  exited: boolean;
  /** Its lines with a `code` (CERTSHARE_*). */
  codes: string[];
  metricsPort?: number;
}

describe('injector replicas: one writer by Lease, failover when it dies', () => {
  const bus = new EventEmitter();
  const steps: Step[] = [];
  const procs: Process[] = [];
  let kubeconfig: string;

  function startProcess(name: string, port: number): Process {
    const args = [MAIN, 'injector', ...injectorReplicaFlags(port), '--drain-delay', '0s'];
    const env = { PATH: process.env.PATH, KUBECONFIG: kubeconfig, POD_NAMESPACE: NS, POD_NAME: name };
    const [cmd, ...rest] = [...deathSignalPrefix(), process.execPath, ...args];
    const child = spawn(cmd!, rest, { stdio: ['ignore', 'pipe', 'pipe'], env });
    const proc: Process = { name, child, served: [], writer: false, exited: false, codes: [] };
    const stderr: string[] = [];
    child.stderr!.on('data', (chunk: Buffer) => stderr.push(chunk.toString()));
    createInterface({ input: child.stdout! }).on('line', (text) => {
      let line: { msg?: string; action?: string; serial?: string; code?: string; metricsPort?: number };
      try {
        line = JSON.parse(text);
      } catch {
        return;
      }
      if (line.msg === 'CA rotation step') steps.push({ replica: name, action: line.action! });
      if (line.msg === 'serving a new webhook certificate') proc.served.push(line.serial!);
      if (line.msg === 'became the writer') proc.writer = true;
      if (line.msg === 'no longer the writer') proc.writer = false;
      if (line.msg === 'injector started') proc.metricsPort = line.metricsPort;
      if (line.code) proc.codes.push(line.code);
      if (process.env.CERTSHARE_TEST_LOG) console.log(name, text);
      bus.emit('change');
    });
    child.on('exit', (code, signal) => {
      proc.exited = true;
      if (signal !== 'SIGKILL' && code !== 0) console.log(`${name} exited ${code ?? signal}: ${stderr.join('').slice(-2000)}`);
      bus.emit('change');
    });
    procs.push(proc);
    return proc;
  }

  async function secretWriters(): Promise<Record<string, string | undefined>> {
    const res = await cp().adminRequest('GET', `/api/v1/namespaces/${NS}/secrets`);
    const items = JSON.parse(res.body).items as { metadata: { name: string; annotations?: Record<string, string> } }[];
    return Object.fromEntries(items.map((s) => [s.metadata.name, s.metadata.annotations?.[WRITTEN_BY]]));
  }

  async function leaseHolder(): Promise<string | undefined> {
    const res = await cp().adminRequest('GET', `/apis/coordination.k8s.io/v1/namespaces/${NS}/leases/${LEASE}`);
    return res.status === 200 ? JSON.parse(res.body).spec?.holderIdentity : undefined;
  }

  const changed = onEvent(bus, 'change');
  const stepsBy = (replica: string, from = 0) => steps.slice(from).filter((s) => s.replica === replica);

  before(async () => {
    await must(cp().kubectl(['create', 'namespace', NS]));
    await must(cp().kubectl(['apply', '-k', MANIFESTS]));
    kubeconfig = await cp().kubeconfigFor(NS, 'certshare-injector');
  });

  after(() => {
    for (const p of procs) if (!p.exited) p.child.kill('SIGKILL');
  });

  it('only the Lease holder writes; killed, it is replaced and a CA rotation completes under the successor', { timeout: 120_000 }, async () => {
    // Started together: the election, not the order, decides.
    const [a, b] = [startProcess('injector-a', await freePort()), startProcess('injector-b', await freePort())];
    await until('one writer and both replicas serving', () => [a, b].some((p) => p.writer) && a.served.length > 0 && b.served.length > 0, [changed], 30_000);
    const holder = [a, b].find((p) => p.writer)!;
    const other = holder === a ? b : a;
    assert.equal(other.writer, false);
    assert.equal(await leaseHolder(), holder.name);

    // Two CA rotations under the holder: the other replica follows every leaf without writing anything.
    const count = (p: Process, action: string, from = 0) => stepsBy(p.name, from).filter((s) => s.action === action).length;
    await until('two CA rotations with their leaves', () => count(holder, 'create-ca') >= 3 && count(holder, 'issue-leaf') >= 4, [changed], 60_000);
    await until('the reader serves the newest leaf', () => other.served.at(-1) === holder.served.at(-1), [changed], 10_000);
    assert.deepEqual(stepsBy(other.name), [], 'the reader took no step');
    assert.deepEqual(await secretWriters(), { 'certshare-injector-ca': holder.name, 'certshare-injector-tls': holder.name });

    // Killed: no release, so the other waits for the Lease to run out (2 s on its own clock), then writes.
    const mark = steps.length;
    const killedAt = performance.now();
    holder.child.kill('SIGKILL');
    await until('the other replica becomes the writer', () => other.writer, [changed], 15_000);
    const takeoverMs = performance.now() - killedAt;
    assert.equal(await leaseHolder(), other.name);
    // A full rotation by the successor: a new CA, published, then a leaf signed by it, which it serves.
    await until(
      'a CA rotation by the successor',
      () => {
        const mine = stepsBy(other.name, mark).map((s) => s.action);
        const created = mine.indexOf('create-ca');
        return created >= 0 && mine.indexOf('publish', created) > created && mine.indexOf('issue-leaf', created) > created;
      },
      [changed],
      30_000,
    );
    const served = other.served.length;
    await until('the successor serves its own leaf', () => other.served.length > served, [changed], 10_000);
    assert.deepEqual(await secretWriters(), { 'certshare-injector-ca': other.name, 'certshare-injector-tls': other.name });
    console.log(`injector writer failover: took over ${Math.round(takeoverMs)} ms after SIGKILL (lease 2 s); steps ${JSON.stringify(steps.length)}`);
    assert.ok(takeoverMs < 10_000, `took over after ${Math.round(takeoverMs)} ms`);
  });

  it('a Lease written for 2^31 s with a stolen injector token holds no replica off: taken over, counted', { timeout: 60_000 }, async () => {
    const live = procs.filter((p) => !p.exited);
    await until('a writer', () => live.some((p) => p.writer), [changed], 15_000);
    const path = `/apis/coordination.k8s.io/v1/namespaces/${NS}/leases/${LEASE}`;
    // The injector's own token (RBAC lets it update its Lease): a holder no replica is, for 68 years, after as many
    // takeovers as the field counts (on 080ee30 every takeover then wrote one more, refused: no writer again).
    // The writer renews between the read and the write now and then (409): read again.
    let written: Awaited<ReturnType<typeof asAccount>>;
    for (let attempt = 1; ; attempt++) {
      const read = await asAccount(cp(), kubeconfig, 'GET', path);
      assert.equal(read.status, 200, read.body);
      const lease = JSON.parse(read.body) as { spec: Record<string, unknown> };
      const renewTime = new Date().toISOString().replace('Z', '000Z');
      const spec = { ...lease.spec, holderIdentity: 'intruder', leaseDurationSeconds: 2 ** 31 - 1, leaseTransitions: 2 ** 31 - 1, renewTime };
      written = await asAccount(cp(), kubeconfig, 'PUT', path, { ...lease, spec });
      if (written.status !== 409 || attempt === 5) break;
    }
    assert.equal(written.status, 200, written.body);
    await until('the writer gives the role up', () => !live.some((p) => p.writer), [changed], 15_000);
    await until('a replica writes again', () => live.some((p) => p.writer), [changed], 30_000);
    assert.notEqual(await leaseHolder(), 'intruder');
    assert.ok(
      live.some((p) => p.codes.includes('CERTSHARE_UNTRUSTED_VALUE')),
      'the duration logged as a value read back out of its bound',
    );
    const counted = (field: string): Promise<number[]> =>
      Promise.all(
        live.map(async (p) => {
          if (p.metricsPort === undefined) return 0;
          const res = await fetch(`http://127.0.0.1:${p.metricsPort}/metrics`);
          const m = new RegExp(`certshare_injector_out_of_bounds_values_total\\{field="${field}"\\} (\\d+)`).exec(await res.text());
          return Number(m?.[1] ?? 0);
        }),
      );
    for (const field of ['lease-duration', 'lease-transitions']) {
      const counts = await counted(field);
      assert.ok(
        counts.some((n) => n > 0),
        `${field} counted in certshare_injector_out_of_bounds_values_total (4a80975: logged only): ${counts.join(', ')}`,
      );
    }
  });
});
