// The world of the end-to-end tier: the single-node cluster (./cluster.ts) with the project's images
// imported, and Tailscale's test control server and pebble (tsenv) on the node's address, so that a
// tailscaled in a Pod logs in and gets certificates there. Nothing of it is reachable from outside the
// cluster's network namespace but tsenv's admin socket (a unix socket, for the ACME order counts).
import { mkdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { get } from '../support/emulator.ts';
import type { Socket } from 'node:net';
import type { AcmeStats, ControlVipServices, ServiceVip } from '../harness/tailscale.ts';
import { dialThrough, tailscaleBinDir } from '../harness/tailscale.ts';
import { CLUSTER_ROOT, type Cluster, NETNS, NODE_IP, startCluster } from './cluster.ts';
import { type BuiltImage, buildClusterImages } from './images.ts';

/** The example's tailnet: its domain is `proxy.<this>` (manifests/example). */
export const E2E_MAGICDNS = 'tailnet-0000.ts.net';

export interface TsenvEndpoints {
  /** Login server URL for tailscaled (`--login-server`). */
  control: string;
  /** ACME directory URL (TS_DEBUG_ACME_DIRECTORY_URL). */
  acme: string;
  /** PEM: the ACME front's TLS CA and pebble's root (tailscaled's SSL_CERT_FILE; a TLS client's trust). */
  bundlePem: string;
}

export interface E2eClusterOptions {
  /** Lifetime of pebble's certificates, a Go duration. Default 90 days. */
  certValidity?: string;
  /** Control routes each Tailscale Service's VIP to one of its hosts (tsenv --service-vips). */
  serviceVips?: boolean;
  log?: (line: string) => void;
}

/** A tailscaled outside the cluster (a process in its network namespace, not a Pod), logged in to the same control. */
export interface TailnetClient {
  readonly socket: string;
  /** A TCP connection through the tailnet from this node (LocalAPI dial): rejects when it has no route or cannot dial. */
  dial(host: string, port: number): Promise<Socket>;
}

export interface E2eCluster {
  readonly cluster: Cluster;
  readonly netns: string;
  readonly images: { certshare: BuiltImage; tailscale: BuiltImage; nginx: BuiltImage; haproxy: BuiltImage; pause: BuiltImage };
  readonly tsenv: TsenvEndpoints;
  /** Orders that reached pebble, by identifiers. */
  acmeStats(): Promise<AcmeStats>;
  /** What control knows of every node's Tailscale Services; a node silent for `timeout` (a Go duration) is offline. */
  vipServices(timeout: string): Promise<ControlVipServices[]>;
  /** Each Service's VIP, hosts and primary as control routes them (serviceVips). */
  serviceVips(): Promise<ServiceVip[]>;
  /** Starts a tailnet client named `hostname` and logs it in; it stops with the cluster. */
  startTailnetClient(hostname: string): Promise<TailnetClient>;
  /** Seconds: images built, cluster started (until schedulable). */
  readonly startSeconds: { images: number; cluster: number };
  stop(): Promise<void>;
}

export async function startE2eCluster(options: E2eClusterOptions = {}): Promise<E2eCluster> {
  const log = options.log ?? (() => {});
  const tsBin = await tailscaleBinDir();
  let t = performance.now();
  const images = await buildClusterImages({ tailscaleBinDir: tsBin, log });
  const imagesSeconds = (performance.now() - t) / 1000;
  log(`images ready in ${imagesSeconds.toFixed(1)} s`);
  t = performance.now();
  const cluster = await startCluster({
    sandboxImage: images.pause.ref,
    images: [
      { ...images.pause, pinned: true },
      { ...images.certshare, pinned: false },
      { ...images.tailscale, pinned: false },
      { ...images.nginx, pinned: false },
      { ...images.haproxy, pinned: false },
    ],
    log,
  });
  const clusterSeconds = (performance.now() - t) / 1000;
  try {
    const dir = join(CLUSTER_ROOT, 'tsenv');
    await mkdir(dir, { recursive: true });
    const args = [join(tsBin, 'tsenv'), '--dir', dir, '--listen', NODE_IP, '--magicdns-domain', E2E_MAGICDNS, '--cert-domains'];
    if (options.certValidity) args.push('--validity', options.certValidity);
    if (options.serviceVips) args.push('--service-vips');
    const tsenv = cluster.spawnInside('tsenv', args);
    const readyLine = () => tsenv.lines.find((l) => l.startsWith('{"control"'));
    await tsenv.waitReady('tsenv', performance.now(), 60_000, async () => readyLine() !== undefined);
    const line = readyLine()!;
    const ready = JSON.parse(line) as { control: string; acme: string; bundle: string; admin: string };
    const endpoints: TsenvEndpoints = { control: ready.control, acme: ready.acme, bundlePem: await readFile(ready.bundle, 'utf8') };
    return {
      cluster,
      netns: NETNS,
      images,
      tsenv: endpoints,
      startSeconds: { images: imagesSeconds, cluster: clusterSeconds },
      async acmeStats() {
        const res = await get(ready.admin, '/stats');
        if (res.status !== 200) throw new Error(`tsenv /stats: HTTP ${res.status}: ${res.body}`);
        return JSON.parse(res.body) as AcmeStats;
      },
      async vipServices(timeout) {
        const res = await get(ready.admin, `/vip-services?timeout=${encodeURIComponent(timeout)}`);
        if (res.status !== 200) throw new Error(`tsenv /vip-services: HTTP ${res.status}: ${res.body}`);
        return JSON.parse(res.body) as ControlVipServices[];
      },
      async serviceVips() {
        const res = await get(ready.admin, '/service-vips');
        if (res.status !== 200) throw new Error(`tsenv /service-vips: HTTP ${res.status}: ${res.body}`);
        return JSON.parse(res.body) as ServiceVip[];
      },
      async startTailnetClient(hostname) {
        const own = join(CLUSTER_ROOT, hostname);
        await mkdir(own, { recursive: true });
        const socket = join(own, 'tailscaled.sock');
        const flags = ['--tun=userspace-networking', `--socket=${socket}`, `--statedir=${join(own, 'state')}`, '--port=0', '--no-logs-no-support'];
        const tailscaled = cluster.spawnInside(`tailscaled ${hostname}`, [join(tsBin, 'tailscaled'), ...flags]);
        await tailscaled.waitReady(`tailscaled ${hostname}`, performance.now(), 60_000, async () => (await get(socket, '/localapi/v0/status')).status === 200);
        const up = await cluster.exec(
          [join(tsBin, 'tailscale'), `--socket=${socket}`, 'up', `--login-server=${ready.control}`, `--hostname=${hostname}`, '--timeout=60s'],
          { timeoutMs: 90_000 },
        );
        if (up.code !== 0) throw new Error(`tailscale up (${hostname}): ${up.stderr}\n${tailscaled.tail()}`);
        return { socket, dial: (host, port) => dialThrough(socket, host, port) };
      },
      stop: () => cluster.stop(),
    };
  } catch (err) {
    await cluster.stop();
    throw err;
  }
}
