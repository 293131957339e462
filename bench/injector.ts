// The injector's figures on the real control plane: admission latency as the apiserver measures it
// (apiserver_admission_webhook_admission_duration_seconds) while Pods are created, and idle RSS of the
// production bundle, under manifests/injector's ServiceAccount and RBAC, next to its baseline's: the
// packages it needs, alone (bench/injector-packages.ts). Both run with the Deployment's runtime variables
// (NODE_OPTIONS, GLIBC_TUNABLES: test/support/injector-deployment.ts), as the cluster runs the injector.
import { fileURLToPath } from 'node:url';
import type { ControlPlane } from '../test/harness/control-plane.ts';
import { bucketIncrease, histogramQuantile } from '../test/support/histogram.ts';
import { must } from '../test/support/kube.ts';
import { freePort } from '../test/support/processes.ts';
import { labelsOf, metricSeries } from './lib/apiserver.ts';
import { injectorLoopbackFlags } from '../test/support/replica-flags.ts';
import { injectorRuntimeEnv } from '../test/support/injector-deployment.ts';
import { type BaselineBuild, startBaseline, waitListening } from './lib/baseline.ts';
import { bundleMain, IMAGE_NODE_FLAGS } from './lib/certshare.ts';
import { Proc, cleanEnv, cpuMs, idleRss, type MemStatus } from './lib/proc.ts';
import type { BenchSize } from './lib/size.ts';
import { progress } from './lib/stats.ts';

const MANIFESTS = fileURLToPath(new URL('../manifests/injector', import.meta.url));
const WEBHOOK = 'inject.certshare.io';

export interface InjectorResults {
  rss: MemStatus;
  /** The injector's packages alone (bench/injector-packages.ts), idle. */
  packagesRss: MemStatus;
  /** The injector idle after its first served certificate, before any admission. */
  freshRss: MemStatus;
  pods: number;
  failures: number;
  p50Ms: number;
  p99Ms: number;
  /** The injector's CPU time (user + system, 10 ms ticks) while the Pods were created, per Pod created. */
  cpuPerAdmissionMs: number;
  /** Start of the process to its first served certificate (CA created, bundle stored and seen). */
  firstCertMs: number;
}

async function admissionBuckets(cp: ControlPlane): Promise<Map<number, number>> {
  const buckets = new Map<number, number>();
  for (const [labels, value] of metricSeries(await cp.metrics(), 'apiserver_admission_webhook_admission_duration_seconds_bucket')) {
    const l = labelsOf(labels);
    if (l.name !== WEBHOOK || l.rejected !== 'false') continue;
    const le = Number(l.le);
    buckets.set(le, (buckets.get(le) ?? 0) + value);
  }
  return buckets;
}

export async function injectorPhase(cp: ControlPlane, pods: number, size: BenchSize, packages: BaselineBuild): Promise<InjectorResults> {
  const runtime = await injectorRuntimeEnv();
  progress("injector's packages alone: idle RSS");
  const baseline = startBaseline(packages, 0, runtime);
  await waitListening(baseline);
  const [packagesRss] = await idleRss([baseline.pid], size.idle);
  await baseline.stop();
  progress(`injector: ${pods} Pods through the webhook, then idle RSS`);
  await must(cp.kubectl(['create', 'namespace', 'certshare']));
  await must(cp.kubectl(['apply', '-k', MANIFESTS]));
  const port = await freePort();
  const clientConfig = [{ op: 'replace', path: '/webhooks/0/clientConfig', value: { url: `https://127.0.0.1:${port}/mutate` } }];
  await must(cp.kubectl(['patch', 'mutatingwebhookconfiguration', 'certshare-injector', '--type=json', '-p', JSON.stringify(clientConfig)]));
  const ns = 'bench-inject';
  await must(cp.kubectl(['create', 'namespace', ns]));
  await must(cp.kubectl(['label', 'namespace', ns, 'certshare.io/injection=enabled']));
  const kubeconfig = await cp.kubeconfigFor('certshare', 'certshare-injector');
  const proc = new Proc(
    'certshare injector',
    [
      ...IMAGE_NODE_FLAGS,
      bundleMain(),
      'injector',
      ...injectorLoopbackFlags(port),
      // Nothing routes here through a Service: no endpoint to wait out before stopping.
      '--drain-delay',
      '0s',
    ],
    { env: cleanEnv({ ...runtime, KUBECONFIG: kubeconfig, POD_NAMESPACE: 'certshare' }), mustRun: true },
  );
  try {
    await proc.waitForLog((e) => e.msg === 'serving a new webhook certificate', 60_000, 'the first served certificate');
    const firstCertMs = performance.now() - proc.spawnedAt;
    const [freshRss] = await idleRss([proc.pid], size.idle);
    // The apiserver's informer sees a new caBundle within milliseconds; the injector served only once it was stored.
    const before = await admissionBuckets(cp);
    const cpuBefore = await cpuMs(proc.pid);
    let created = 0;
    let failures = 0;
    let next = 0;
    const worker = async () => {
      while (next < pods) {
        const i = next++;
        const body = {
          apiVersion: 'v1',
          kind: 'Pod',
          metadata: { name: `p${i}`, annotations: { 'certshare.io/inject': 'true', 'certshare.io/domains': 'proxy.tailnet-0000.ts.net' } },
          spec: { containers: [{ name: 'proxy', image: 'nginx' }], volumes: [{ name: 'tailscale-socket', emptyDir: {} }] },
        };
        const res = await cp.adminRequest('POST', `/api/v1/namespaces/${ns}/pods`, { body, timeoutMs: 20_000 });
        if (res.status === 201) created++;
        else failures++;
      }
    };
    await Promise.all([worker(), worker(), worker(), worker()]);
    const cpuPerAdmissionMs = ((await cpuMs(proc.pid)) - cpuBefore) / Math.max(1, created);
    const latency = bucketIncrease(before, await admissionBuckets(cp));
    const [rss] = await idleRss([proc.pid], size.idle);
    return {
      rss: rss!,
      packagesRss: packagesRss!,
      freshRss: freshRss!,
      pods: created,
      failures,
      p50Ms: histogramQuantile(0.5, latency) * 1000,
      p99Ms: histogramQuantile(0.99, latency) * 1000,
      cpuPerAdmissionMs,
      firstCertMs,
    };
  } finally {
    await proc.stop();
  }
}
