// The production bundle (what the image runs, no node_modules, undici left out) in kube mode against
// the real apiserver: a writer issues and shares through the Secret, a reader follows renewals through
// its watch. Everything else in test/apiserver runs the TypeScript sources in-process; this is the check
// that the build did not drop anything the Kubernetes path needs.
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { X509Certificate } from 'node:crypto';
import { once } from 'node:events';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { before, describe, it } from 'node:test';
import { buildDist } from '../../scripts/build.ts';
import { startEmulator, type Emulator } from '../../src/emulator/server.ts';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { exampleNamespace, KUBE_DOMAIN, replicaArgs } from '../support/kube.ts';
import { useTempDir } from '../support/standalone.ts';
import { nextEvent } from '../support/wait.ts';

const cp = useControlPlane();

interface BundledReplica {
  child: ChildProcess;
  emulator: Emulator;
  outDir: string;
  /** Resolves with the first log entry matching, earlier ones included. */
  logged(predicate: (entry: Record<string, unknown>) => boolean): Promise<Record<string, unknown>>;
  /** Log entries so far that match. */
  count(predicate: (entry: Record<string, unknown>) => boolean): number;
  stop(): Promise<number | null>;
}

describe('the production bundle in kube mode', () => {
  const dir = useTempDir();
  let main: string;

  before(async () => {
    // Outside the checkout: nothing can be resolved from its node_modules.
    await buildDist(join(dir(), 'dist'));
    main = join(dir(), 'dist/cli/main.js');
  });

  async function startBundled(ns: string, name: string, mode: 'rw' | 'ro', certLifetimeMs: number): Promise<BundledReplica> {
    const emulator = await startEmulator({ listen: join(dir(), `${name}.sock`), domains: [KUBE_DOMAIN], id: name, certLifetimeMs });
    const outDir = join(dir(), name, 'certs');
    const args = [...replicaArgs(emulator.address, outDir, mode), '--listen', '127.0.0.1:0'];
    const env = {
      PATH: process.env.PATH ?? '/usr/bin:/bin',
      KUBECONFIG: await cp().kubeconfigFor(ns, 'certshare'),
      POD_NAME: name,
      POD_NAMESPACE: ns,
      POD_IPS: '10.0.0.10',
    };
    const child = spawn(process.execPath, [main, 'run', ...args], { cwd: dir(), env, stdio: ['ignore', 'pipe', 'inherit'] });
    const waiting = new Set<{ predicate: (e: Record<string, unknown>) => boolean; resolve: (e: Record<string, unknown>) => void }>();
    const seen: Array<Record<string, unknown>> = [];
    void (async () => {
      for await (const line of createInterface(child.stdout!)) {
        let entry: Record<string, unknown>;
        try {
          entry = JSON.parse(line) as Record<string, unknown>;
        } catch {
          continue;
        }
        seen.push(entry);
        for (const w of [...waiting]) {
          if (!w.predicate(entry)) continue;
          waiting.delete(w);
          w.resolve(entry);
        }
      }
    })();
    return {
      child,
      emulator,
      outDir,
      count: (predicate) => seen.filter(predicate).length,
      logged(predicate) {
        const already = seen.find(predicate);
        if (already) return Promise.resolve(already);
        return new Promise((resolve) => waiting.add({ predicate, resolve }));
      },
      async stop() {
        const exited = once(child, 'exit');
        if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
        const [code] = (await exited) as [number | null];
        await emulator.close();
        return code;
      },
    };
  }

  const serialOnDisk = (r: BundledReplica): Promise<string | undefined> =>
    readFile(join(r.outDir, KUBE_DOMAIN, 'tls.crt'), 'utf8').then(
      (pem) => new X509Certificate(pem).serialNumber,
      () => undefined,
    );

  it('a bundled writer shares through the Secret and a bundled reader follows a renewal; both exit 0 on SIGTERM', { timeout: 60_000 }, async () => {
    const ns = await exampleNamespace(cp());
    // 6 s certificates renew at half: a renewal 3 s after the first issuance.
    const writer = await startBundled(ns, 'proxy-0', 'rw', 6000);
    const reader = await startBundled(ns, 'proxy-1', 'ro', 6000);
    try {
      const first = await nextEvent<{ serial: string }>(writer.emulator.events, 'issued', () => true, 20_000);
      await reader.logged((e) => e.msg === 'healthy');
      const renewal = await nextEvent<{ serial: string }>(writer.emulator.events, 'issued', (e) => e.serial !== first.serial, 20_000);
      // The reader's files follow the renewal through its watch (no restart, no CertPair of its own).
      const written = (e: Record<string, unknown>) => e.msg === 'certificate files written';
      for (;;) {
        const before = reader.count(written);
        if ((await serialOnDisk(reader)) === renewal.serial) break;
        await reader.logged((e) => written(e) && reader.count(written) > before);
      }
      assert.deepEqual(reader.emulator.stats().certRequests, {}, 'the reader never calls CertPair');
    } finally {
      const codes = [await reader.stop(), await writer.stop()];
      assert.deepEqual(codes, [0, 0], 'both exit 0 on SIGTERM');
    }
  });
});
