// `npm run cluster` / `make cluster`: the test control plane (etcd + kube-apiserver on loopback) in the
// foreground, for trying certshare by hand. Writes .cluster/kubeconfig (admin) and .cluster/bin/kubectl;
// Ctrl-C stops everything and removes the data. `npm run cluster -- --kubelet`: the real single-node
// cluster of the end-to-end tier instead (test/cluster/), with the project's images imported.
import { chmod, copyFile, mkdir, rm, symlink, writeFile, readFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { parseScriptArgs } from '../../bench/lib/command-line.ts';
import { startControlPlane, type ControlPlane } from './control-plane.ts';

const root = resolve(import.meta.dirname, '../..');
const clusterDir = join(root, '.cluster');
const kubeconfigPath = join(clusterDir, 'kubeconfig');
const kubectlPath = join(clusterDir, 'bin', 'kubectl');

async function linkKubectl(binDir: string): Promise<void> {
  await mkdir(join(clusterDir, 'bin'), { recursive: true });
  await rm(kubectlPath, { force: true });
  try {
    await symlink(join(binDir, 'kubectl'), kubectlPath);
  } catch {
    await copyFile(join(binDir, 'kubectl'), kubectlPath);
    await chmod(kubectlPath, 0o755);
  }
}

async function main(): Promise<void> {
  const values = parseScriptArgs({
    name: 'cluster',
    invocation: 'npm run cluster --',
    summary:
      'Starts etcd + kube-apiserver on 127.0.0.1 until Ctrl-C (or make cluster). Env: CERTSHARE_CP_VERBOSE=1 ' +
      '(CERTSHARE_CLUSTER_VERBOSE=1 with --kubelet) streams their logs; KUBEBUILDER_ASSETS=<dir> uses prebuilt binaries.',
    flags: [
      {
        name: 'kubelet',
        boolean: true,
        help:
          'A real single-node cluster (kubelet, containerd, controllers, kube-proxy, DNS) in a network namespace of its own, ' +
          'with the certshare, tailscale, nginx and pause images built and imported (root).',
      },
    ],
  });
  if (values.kubelet) {
    await runNodeCluster();
    return;
  }
  const started = performance.now();
  console.error('cluster: starting etcd + kube-apiserver (the first run builds them from source; slow)');
  let cp: ControlPlane | undefined;
  let stopping = false;
  const stop = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    console.error(`\ncluster: ${signal}, stopping`);
    await cp?.stop();
    await rm(kubeconfigPath, { force: true }); // its server and CA are gone
    process.exit(0);
  };
  process.on('SIGINT', () => void stop('SIGINT'));
  process.on('SIGTERM', () => void stop('SIGTERM'));
  process.on('SIGHUP', () => void stop('SIGHUP'));

  cp = await startControlPlane({ verbose: process.env.CERTSHARE_CP_VERBOSE === '1' });
  if (stopping) return;
  await mkdir(clusterDir, { recursive: true });
  await writeFile(kubeconfigPath, await readFile(cp.adminKubeconfigPath, 'utf8'), { mode: 0o600 });
  await writeFile(join(clusterDir, 'ca.crt'), cp.caPem);
  await linkKubectl(cp.binDir);
  const rss = await cp.rss();
  const mib = (n?: number) => (n === undefined ? '?' : `${Math.round(n / 1048576)} MiB`);

  console.log(`cluster: ready in ${Math.round(performance.now() - started)} ms
  server      ${cp.server}   (etcd ${cp.etcdUrl})
  kubeconfig  .cluster/kubeconfig   (admin: CN=admin, O=system:masters)
  kubectl     .cluster/bin/kubectl
  memory      kube-apiserver ${mib(rss.apiserver)}, etcd ${mib(rss.etcd)}

In another shell:
  export KUBECONFIG="$PWD/.cluster/kubeconfig" PATH="$PWD/.cluster/bin:$PATH"
  kubectl get ns

No kubelet, scheduler or controller-manager runs: Pods stay Pending, namespaces get no "default"
ServiceAccount (create ServiceAccounts yourself) and deleted namespaces stay Terminating.
Ctrl-C stops everything and deletes the data.`);
  // Stay up until a signal arrives.
  setInterval(() => {}, 1 << 30);
}

main().catch((err: unknown) => {
  console.error(`cluster: ${err instanceof Error ? err.message : String(err)}`);
  process.exit(1);
});

async function runNodeCluster(): Promise<void> {
  const { startE2eCluster } = await import('../cluster/e2e-cluster.ts');
  const started = performance.now();
  console.error('cluster: starting a single-node cluster (the first run builds binaries and images; slow)');
  const env = await startE2eCluster({ log: (line) => console.error(`cluster: ${line}`) });
  let stopping = false;
  const stop = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    console.error(`\ncluster: ${signal}, stopping (and restoring the host)`);
    await env.stop();
    await rm(kubeconfigPath, { force: true });
    process.exit(0);
  };
  process.on('SIGINT', () => void stop('SIGINT'));
  process.on('SIGTERM', () => void stop('SIGTERM'));
  process.on('SIGHUP', () => void stop('SIGHUP'));
  await mkdir(clusterDir, { recursive: true });
  await writeFile(kubeconfigPath, await readFile(env.cluster.adminKubeconfigPath, 'utf8'), { mode: 0o600 });
  await linkKubectl(env.cluster.binDir);
  const t = env.cluster.timings;
  console.log(`cluster: ready in ${Math.round(performance.now() - started)} ms (apiserver ${t.apiServerReadyMs} ms, node Ready ${t.nodeReadyMs} ms)
  server      ${env.cluster.server}   (inside the network namespace ${env.netns} only)
  kubeconfig  .cluster/kubeconfig
  images      ${Object.values(env.images)
    .map((i) => i.ref)
    .join(', ')}
  tailscale   control ${env.tsenv.control}, ACME ${env.tsenv.acme}

In another shell (kubectl runs inside the namespace):
  nsenter --net=/run/netns/${env.netns} .cluster/bin/kubectl --kubeconfig=.cluster/kubeconfig get nodes

Ctrl-C stops everything, deletes the data and puts back the kernel settings the kubelet changed.`);
  setInterval(() => {}, 1 << 30);
}
