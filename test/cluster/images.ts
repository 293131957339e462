// The five images the single-node test cluster runs, built as OCI archives for `ctr -n k8s.io images
// import` with no Docker engine and no registry:
//   - certshare, from the repository's Dockerfile: its build stage replayed on the host (npm ci, the
//     bundle; test/support/dockerfile.ts), its distroless base stood in for by the pinned Node and the
//     libraries it loads, its configuration read from the final stage;
//   - tailscale: containerboot, tailscaled and tailscale from test/tailscale-binaries/build.sh;
//   - nginx: Debian's, as the example proxy, runnable as uid 65532 on a read-only root filesystem;
//   - haproxy: Debian's HAProxy 2.6, the same way (the HAProxy example);
//   - pause: the sandbox image, busybox sleeping as PID 1.
// Each archive is cached under a hash of its inputs (and of this builder's sources): a warm call only
// hashes. Concurrent callers wait on a lock file; the archive appears by rename, whole or not at all.
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { chmod, mkdir, mkdtemp, open, readdir, readFile, realpath, rename, rm, stat } from 'node:fs/promises';
import { homedir, tmpdir } from 'node:os';
import { dirname, join, posix, relative, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { envOf, execForm, instructions, isDistroless, parseDockerfile, replayDockerfile, replayRunEnv, type Stage } from '../support/dockerfile.ts';
import { type ContainerConfig, type LayerEntry, type OciImage, treeEntries, writeOciArchive } from './oci.ts';

const REPO = resolve(import.meta.dirname, '../..');
/** The pinned Node (the `node` devDependency): it runs the replayed build and is the image's /nodejs/bin/node. */
const PINNED_NODE = join(REPO, 'node_modules/node/bin/node');
const TAILSCALE_GO_MOD = join(REPO, 'test/tailscale-binaries/go.mod');
const APT_GET = join(REPO, 'test/support/apt-get.sh');
/** Sources whose change must rebuild every image: the recipes are here. */
const BUILDER_SOURCES = [join(import.meta.dirname, 'images.ts'), join(import.meta.dirname, 'oci.ts'), join(REPO, 'test/support/dockerfile.ts')];
/** What `docker build` reads for certshare's image: the Dockerfile and the context files it copies. */
const CERTSHARE_INPUTS = ['Dockerfile', '.dockerignore', 'package.json', 'package-lock.json', 'tsconfig.json', 'scripts/build.ts', 'src'];

const NONROOT = 65532;
const DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';
const HOST_CA_BUNDLE = '/etc/ssl/certs/ca-certificates.crt';
/** Archives kept per image: a few, so that worktrees at different commits do not rebuild each other's. */
const KEEP_ARCHIVES = 3;

export interface BuiltImage {
  ref: string;
  /** Path of the OCI archive (.tar). */
  archive: string;
}

export interface ClusterImages {
  certshare: BuiltImage;
  tailscale: BuiltImage;
  nginx: BuiltImage;
  haproxy: BuiltImage;
  pause: BuiltImage;
}

export interface BuildClusterImagesOptions {
  /** Directory holding tailscaled, tailscale and containerboot (what test/tailscale-binaries/build.sh prints). */
  tailscaleBinDir: string;
  /** Where the archives are kept. Default `${XDG_CACHE_HOME:-~/.cache}/certshare/images`. */
  cacheDir?: string;
  /** Progress lines (a cold build takes minutes: npm ci, the bundle, gzip). */
  log?: (line: string) => void;
}

/** Builds (or finds in the cache) the cluster's five images. */
export async function buildClusterImages(options: BuildClusterImagesOptions): Promise<ClusterImages> {
  const cacheDir = options.cacheDir ?? join(process.env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'certshare/images');
  const log = options.log ?? (() => {});
  await mkdir(cacheDir, { recursive: true });
  const [certshare, tailscale, nginx, haproxy, pause] = await Promise.all([
    certshareImage(cacheDir, log),
    tailscaleImage(cacheDir, options.tailscaleBinDir, log),
    nginxImage(cacheDir, log),
    haproxyImage(cacheDir, log),
    pauseImage(cacheDir, log),
  ]);
  return { certshare, tailscale, nginx, haproxy, pause };
}

// -------------------------------------------------------------------------------------------------
// certshare

/**
 * What the final stage's base, gcr.io/distroless/nodejs24-debian13:nonroot, gives a stage built on it
 * when the stage does not say otherwise.
 */
const DISTROLESS_NODE_DEFAULTS = { User: '65532', WorkingDir: '/home/nonroot', Entrypoint: ['/nodejs/bin/node'] };

async function certshareImage(cacheDir: string, log: (line: string) => void): Promise<BuiltImage> {
  const ref = 'certshare.test/certshare:dev';
  const node = await realpath(PINNED_NODE);
  const inputs = [await hashPaths(REPO, CERTSHARE_INPUTS), `node ${(await output(node, ['--version'])).trim()}`];
  return cachedArchive(cacheDir, 'certshare', ref, inputs, log, async (scratch) => {
    const stages = parseDockerfile(await readFile(join(REPO, 'Dockerfile'), 'utf8'));
    const final = stages.at(-1)!;
    if (!isDistroless(final) || !final.image.includes('nodejs')) {
      throw new Error(`the Dockerfile's final stage is FROM ${final.image}; this builder stands in for distroless Node only`);
    }
    for (const copy of instructions(final, 'COPY')) {
      // The replay merges the final stage's files into one tree, owned by root: an owner or mode given
      // by COPY would be lost here without a word.
      if (/--(chown|chmod)=/.test(copy.args)) throw new Error(`Dockerfile line ${copy.line}: COPY --chown/--chmod is not supported by this builder`);
    }
    const started = performance.now();
    // The final stage's RUN fills the compile cache as the image's account (65532): it must reach the tree.
    await chmod(scratch, 0o755);
    const replayed = await replayDockerfile(stages, {
      context: REPO,
      workDir: join(scratch, 'replay'),
      // The pinned Node first on PATH: the bundle is built by the Node the image runs.
      runEnv: replayRunEnv(dirname(node)),
      shellless: isDistroless,
      imageCommands: { [DISTROLESS_NODE_DEFAULTS.Entrypoint[0]!]: node },
      // The RUN lines only: npm's output reaches us in the error when a step fails.
      log: (text) => {
        if (/^\[[^\]]+\] RUN /.test(text)) log(`certshare: ${text}`);
      },
    });
    log(`certshare: Dockerfile replayed in ${seconds(started)} s`);
    const last = replayed.at(-1)!;
    return {
      ref,
      config: finalStageConfig(final, last.workdir),
      layers: [
        { entries: await distrolessNodeStandIn(node), createdBy: `stand-in for ${final.image}: node_modules/node/bin/node and the libraries it loads` },
        {
          entries: await treeEntries(last.root, '/'),
          createdBy: final.instructions
            .filter((i) => i.keyword === 'WORKDIR' || i.keyword === 'COPY')
            .map((i) => `${i.keyword} ${i.args}`)
            .join('; '),
        },
      ],
    };
  });
}

/**
 * The image configuration `docker build` gives the final stage: ENTRYPOINT, CMD (exec form only: there is
 * no shell), USER, WORKDIR, ENV after PATH, EXPOSE; the distroless base's where the stage is silent.
 */
function finalStageConfig(stage: Stage, workdir: string): ContainerConfig {
  const last = (keyword: string): string | undefined => instructions(stage, keyword).at(-1)?.args;
  const exec = (keyword: string): string[] | undefined => {
    const args = last(keyword);
    if (args === undefined) return undefined;
    const form = execForm(args);
    if (!form) throw new Error(`${keyword} ${args}: the shell form needs /bin/sh, which ${stage.image} has not`);
    return form;
  };
  const env = { PATH: DEFAULT_PATH, ...envOf(stage) };
  const ports = instructions(stage, 'EXPOSE').flatMap((i) => i.args.split(/\s+/));
  const entrypoint = exec('ENTRYPOINT');
  const cmd = exec('CMD');
  return {
    User: last('USER') ?? DISTROLESS_NODE_DEFAULTS.User,
    Env: Object.entries(env).map(([key, value]) => `${key}=${value}`),
    Entrypoint: entrypoint ?? DISTROLESS_NODE_DEFAULTS.Entrypoint,
    // An ENTRYPOINT in the stage drops the base's CMD; the stage's own CMD stays.
    ...(cmd ? { Cmd: cmd } : {}),
    WorkingDir: instructions(stage, 'WORKDIR').length > 0 ? workdir : DISTROLESS_NODE_DEFAULTS.WorkingDir,
    ...(ports.length > 0 ? { ExposedPorts: Object.fromEntries(ports.map((p) => [p.includes('/') ? p : `${p}/tcp`, {}])) } : {}),
  };
}

/** Distroless's accounts (root, nobody, nonroot = 65532) with their homes, and /tmp. */
function nonrootUsers(): LayerEntry[] {
  return [
    ...accounts([
      { name: 'root', id: 0, home: '/root' },
      { name: 'nobody', id: 65534, home: '/nonexistent' },
      { name: 'nonroot', id: NONROOT, home: '/home/nonroot' },
    ]),
    { path: '/root', type: 'dir', mode: 0o700 },
    { path: '/home/nonroot', type: 'dir', mode: 0o700, uid: NONROOT, gid: NONROOT },
    { path: '/tmp', type: 'dir', mode: 0o1777 },
  ];
}

/**
 * The distroless Node base, same shape: /nodejs/bin/node and exactly the libraries it loads (at the
 * paths the loader finds them), the users root, nobody and nonroot (65532), /home/nonroot, /tmp, the CA
 * bundle. No shell, no busybox.
 */
async function distrolessNodeStandIn(node: string): Promise<LayerEntry[]> {
  return [{ path: '/nodejs/bin/node', type: 'file', mode: 0o755, source: node }, ...(await sharedLibraries(node)), ...nonrootUsers(), ...(await caBundle())];
}

// -------------------------------------------------------------------------------------------------
// tailscale

const TAILSCALE_BINARIES = ['containerboot', 'tailscaled', 'tailscale'];

async function tailscaleImage(cacheDir: string, binDir: string, log: (line: string) => void): Promise<BuiltImage> {
  const goMod = await readFile(TAILSCALE_GO_MOD, 'utf8');
  const version = /^\s*tailscale\.com\s+(v\S+)/m.exec(goMod)?.[1];
  if (!version) throw new Error(`${TAILSCALE_GO_MOD}: no tailscale.com requirement`);
  const ref = `certshare.test/tailscale:${version}`;
  for (const bin of TAILSCALE_BINARIES) {
    await stat(join(binDir, bin)).catch(() => {
      throw new Error(`${join(binDir, bin)} is missing: tailscaleBinDir is what \`bash test/tailscale-binaries/build.sh\` prints`);
    });
  }
  const inputs = await Promise.all(TAILSCALE_BINARIES.map(async (bin) => `${bin} ${await hashFile(join(binDir, bin))}`));
  return cachedArchive(cacheDir, 'tailscale', ref, inputs, log, async () => ({
    ref,
    // As Tailscale's own image: containerboot as root starts tailscaled and runs `tailscale up`, both
    // found through PATH. In userspace mode (TS_USERSPACE, its default) it runs nothing else: no
    // iptables, no shell, hence no busybox here.
    config: { Entrypoint: ['/usr/local/bin/containerboot'], Env: ['PATH=/usr/local/bin:/usr/bin:/bin'] },
    layers: [
      {
        entries: [
          ...TAILSCALE_BINARIES.map((bin): LayerEntry => ({ path: `/usr/local/bin/${bin}`, type: 'file', mode: 0o755, source: join(binDir, bin) })),
          ...accounts([{ name: 'root', id: 0, home: '/root' }]),
          { path: '/root', type: 'dir', mode: 0o700 },
          { path: '/tmp', type: 'dir', mode: 0o1777 },
          { path: '/var/run/tailscale', type: 'dir', mode: 0o755 },
          { path: '/var/lib/tailscale', type: 'dir', mode: 0o700 },
          // tailscaled reaches a control server and DERP over HTTPS with the system's roots.
          ...(await caBundle()),
        ],
        createdBy: `containerboot, tailscaled and tailscale ${version} (test/tailscale-binaries)`,
      },
    ],
  }));
}

// -------------------------------------------------------------------------------------------------
// nginx

/**
 * The image's own nginx.conf, for a run without one mounted: any user, read-only root filesystem (pid
 * and temp files in /tmp), plain HTTP on 8080. Pods mount theirs over it.
 */
const NGINX_DEFAULT_CONF = `worker_processes 1;
pid /tmp/nginx.pid;
error_log stderr warn;

events {
  worker_connections 1024;
}

http {
  access_log /dev/stdout;
  client_body_temp_path /tmp/client_body;
  proxy_temp_path /tmp/proxy;
  fastcgi_temp_path /tmp/fastcgi;
  uwsgi_temp_path /tmp/uwsgi;
  scgi_temp_path /tmp/scgi;

  server {
    listen 8080;
    location / {
      default_type text/plain;
      return 200 "ok\\n";
    }
  }
}
`;

function nginxImage(cacheDir: string, log: (line: string) => void): Promise<BuiltImage> {
  return debianProxyImage(cacheDir, log, {
    pkg: 'nginx',
    binary: '/usr/sbin/nginx',
    Cmd: ['-g', 'daemon off;'],
    // nginx's graceful shutdown (SIGTERM is its fast one), as in nginx's own images.
    StopSignal: 'SIGQUIT',
    entries: [
      // nginx's compiled-in log and temp directories, writable by nonroot when the root filesystem is.
      { path: '/var/log/nginx', type: 'dir', mode: 0o755, uid: NONROOT, gid: NONROOT },
      { path: '/var/lib/nginx', type: 'dir', mode: 0o755, uid: NONROOT, gid: NONROOT },
      { path: '/etc/nginx/nginx.conf', type: 'file', mode: 0o644, content: NGINX_DEFAULT_CONF },
    ],
  });
}

/**
 * A proxy from its Debian package: the binary, the libraries it loads, the nonroot account (its user,
 * numeric: runAsNonRoot can check it without a runAsUser), /run, its own default configuration.
 */
async function debianProxyImage(
  cacheDir: string,
  log: (line: string) => void,
  image: { pkg: string; binary: string; Cmd: string[]; StopSignal: string; entries: LayerEntry[] },
): Promise<BuiltImage> {
  const { pkg } = image;
  const version = await debianCandidate(pkg, log);
  const ref = `certshare.test/${pkg}:${/^(?:\d+:)?(\d+\.\d+)/.exec(version)?.[1] ?? version}`;
  return cachedArchive(cacheDir, pkg, ref, [`${pkg} ${version}`], log, async (scratch) => {
    const [deb] = await aptDownload(scratch, [`${pkg}=${version}`]);
    const root = join(scratch, pkg);
    await run('dpkg-deb', ['-x', deb!, root]);
    const binary = join(root, image.binary);
    return {
      ref,
      config: {
        User: `${NONROOT}:${NONROOT}`,
        Env: [`PATH=${DEFAULT_PATH}`],
        Entrypoint: [image.binary],
        Cmd: image.Cmd,
        ExposedPorts: { '8080/tcp': {}, '8443/tcp': {} },
        StopSignal: image.StopSignal,
      },
      layers: [
        {
          entries: [
            { path: image.binary, type: 'file', mode: 0o755, source: binary },
            ...(await packageLibraries(scratch, deb!, binary, log)),
            ...nonrootUsers(),
            { path: '/run', type: 'dir', mode: 0o755 },
            ...image.entries,
          ],
          createdBy: `${pkg} ${version} (Debian) and the libraries it loads`,
        },
      ],
    };
  });
}

/**
 * The shared libraries a packaged binary loads: this host's where it has them; the rest from Debian's
 * library packages it depends on that this host lacks (and theirs, round after round), downloaded the same way.
 */
async function packageLibraries(scratch: string, deb: string, binary: string, log: (line: string) => void): Promise<LayerEntry[]> {
  const deps = join(scratch, 'deps');
  const fetched = new Set<string>();
  let round = [deb];
  for (;;) {
    try {
      return await sharedLibraries(binary, fetched.size > 0 ? deps : undefined);
    } catch (err) {
      if (!(err instanceof MissingLibrariesError)) throw err;
      const depends = (await Promise.all(round.map((d) => output('dpkg-deb', ['-f', d, 'Depends']))))
        .join(',')
        .split(',')
        .map((d) => d.trim().split(/[\s|(:]/)[0]!)
        .filter((name) => /^(lib|zlib)/.test(name) && !fetched.has(name));
      const wanted: string[] = [];
      for (const name of new Set(depends)) if (!(await installedHere(name))) wanted.push(name);
      if (wanted.length === 0) throw err;
      log(`${posix.basename(binary)}: ${err.missing.join(', ')} not on this host; taking ${wanted.join(', ')} from Debian`);
      for (const name of wanted) fetched.add(name);
      round = await aptDownload(scratch, wanted);
      for (const dep of round) await run('dpkg-deb', ['-x', dep, deps]);
    }
  }
}

async function installedHere(pkg: string): Promise<boolean> {
  // dpkg-query's own field syntax, not a template.
  const result = await runCapturing('dpkg-query', ['-W', `-f=${'$'}{Status}`, pkg]);
  return result.code === 0 && result.stdout.trim() === 'install ok installed';
}

// -------------------------------------------------------------------------------------------------
// haproxy

/** The image's own haproxy.cfg, for a run without one mounted: plain HTTP on 8080. Pods mount theirs over it. */
const HAPROXY_DEFAULT_CFG = `global
  log stderr format raw local0 warning
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
frontend http
  bind :8080
  http-request return status 200 content-type text/plain string ok
`;

function haproxyImage(cacheDir: string, log: (line: string) => void): Promise<BuiltImage> {
  return debianProxyImage(cacheDir, log, {
    pkg: 'haproxy',
    binary: '/usr/sbin/haproxy',
    // Master-worker in the foreground, as HAProxy's own images run it.
    Cmd: ['-W', '-db', '-f', '/etc/haproxy/haproxy.cfg'],
    // HAProxy's soft stop (connections finish), as in its own images.
    StopSignal: 'SIGUSR1',
    entries: [{ path: '/etc/haproxy/haproxy.cfg', type: 'file', mode: 0o644, content: HAPROXY_DEFAULT_CFG }],
  });
}

// -------------------------------------------------------------------------------------------------
// pause

/**
 * The sandbox's process: busybox's shell as PID 1, which the kernel spares every signal it has no
 * handler for, so it traps TERM and INT to exit at once; `wait` returns on a trapped signal.
 */
const PAUSE_SCRIPT = "trap 'exit 0' TERM INT; /bin/busybox sleep 2147483647 & wait";

async function pauseImage(cacheDir: string, log: (line: string) => void): Promise<BuiltImage> {
  const ref = 'certshare.test/pause:1';
  const hostBusybox = '/bin/busybox';
  const hostIsStatic = await stat(hostBusybox).then(
    async () => (await sharedLibraries(hostBusybox)).length === 0,
    () => false,
  );
  const inputs = hostIsStatic ? [`busybox ${await hashFile(hostBusybox)}`] : [`busybox-static ${await debianCandidate('busybox-static', log)}`];
  return cachedArchive(cacheDir, 'pause', ref, inputs, log, async (scratch) => {
    let busybox = hostBusybox;
    if (!hostIsStatic) {
      // Debian's `busybox` package is linked dynamically; busybox-static is what a library-less image needs.
      const [deb] = await aptDownload(scratch, ['busybox-static']);
      await run('dpkg-deb', ['-x', deb!, join(scratch, 'busybox')]);
      busybox = join(scratch, 'busybox/bin/busybox');
    }
    return {
      ref,
      config: { Entrypoint: ['/bin/busybox', 'sh', '-c', PAUSE_SCRIPT], Env: ['PATH=/bin'] },
      layers: [{ entries: [{ path: '/bin/busybox', type: 'file', mode: 0o755, source: busybox }], createdBy: 'busybox (static), sleeping' }],
    };
  });
}

// -------------------------------------------------------------------------------------------------
// Pieces shared by the images

interface Account {
  name: string;
  id: number;
  home: string;
}

/** /etc/passwd and /etc/group (one group per user, same id) and an nsswitch.conf reading them. */
function accounts(users: Account[]): LayerEntry[] {
  const passwd = users.map((u) => `${u.name}:x:${u.id}:${u.id}:${u.name}:${u.home}:/sbin/nologin\n`).join('');
  const group = users.map((u) => `${u.name}:x:${u.id}:\n`).join('');
  return [
    { path: '/etc/passwd', type: 'file', mode: 0o644, content: passwd },
    { path: '/etc/group', type: 'file', mode: 0o644, content: group },
    { path: '/etc/nsswitch.conf', type: 'file', mode: 0o644, content: 'passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n' },
  ];
}

async function caBundle(): Promise<LayerEntry[]> {
  const present = await stat(HOST_CA_BUNDLE).then(
    () => true,
    () => false,
  );
  return present ? [{ path: HOST_CA_BUNDLE, type: 'file', mode: 0o644, source: await realpath(HOST_CA_BUNDLE) }] : [];
}

class MissingLibrariesError extends Error {
  readonly missing: string[];
  constructor(binary: string, missing: string[]) {
    super(`${binary} needs ${missing.join(', ')}, not found`);
    this.missing = missing;
  }
}

/**
 * The shared libraries a binary loads (ldd), the dynamic loader included, each at the path the loader
 * finds it, with the content of the file behind any symlink. Empty for a static binary. With extraRoot
 * (an extracted package tree), libraries are also looked for there and placed at their path inside it.
 */
async function sharedLibraries(binary: string, extraRoot?: string): Promise<LayerEntry[]> {
  const env: NodeJS.ProcessEnv = { ...process.env };
  if (extraRoot) env.LD_LIBRARY_PATH = ['lib/x86_64-linux-gnu', 'usr/lib/x86_64-linux-gnu'].map((d) => join(extraRoot, d)).join(':');
  else delete env.LD_LIBRARY_PATH;
  const result = await runCapturing('ldd', [binary], env);
  if (/not a dynamic executable|statically linked/.test(result.stdout + result.stderr)) return [];
  if (result.code !== 0) throw new Error(`ldd ${binary} exited ${result.code}: ${result.stderr}`);
  const missing = [...result.stdout.matchAll(/^\s*(\S+) => not found/gm)].map((m) => m[1]!);
  if (missing.length > 0) throw new MissingLibrariesError(binary, missing);
  const entries: LayerEntry[] = [];
  for (const line of result.stdout.split('\n')) {
    const path = /^\s*(?:\S+ => )?(\/\S+) \(0x[0-9a-f]+\)$/.exec(line)?.[1];
    if (!path) continue; // linux-vdso.so.1: the kernel's, no file
    const real = await realpath(path);
    const imagePath = extraRoot && path.startsWith(`${extraRoot}/`) ? `/${relative(extraRoot, path)}` : path;
    entries.push({ path: imagePath, type: 'file', mode: (await stat(real)).mode & 0o755, source: real });
  }
  return entries;
}

/** The version apt would download for a package; refreshes the package lists once when it knows none. */
async function debianCandidate(pkg: string, log: (line: string) => void): Promise<string> {
  const candidate = async (): Promise<string | undefined> => {
    const policy = await output('apt-cache', ['policy', pkg]);
    const version = /^\s*Candidate:\s*(\S+)/m.exec(policy)?.[1];
    return version && version !== '(none)' ? version : undefined;
  };
  let version = await candidate();
  if (!version) {
    log(`${pkg}: no candidate version in apt's lists; apt-get update`);
    await run('bash', [APT_GET, 'update', '-qq']);
    version = await candidate();
  }
  if (!version) throw new Error(`apt offers no ${pkg} package (a Debian host with apt's lists is needed)`);
  return version;
}

/** Downloads the packages' .debs into a new directory under dir (no install, no root needed); their paths. */
async function aptDownload(dir: string, packages: string[]): Promise<string[]> {
  const into = await mkdtemp(join(dir, 'debs-'));
  // apt-get download writes as _apt where it can; the directory is ours, so let it write as us.
  await run('apt-get', ['download', '-q', '-o', 'APT::Sandbox::User=root', ...packages], into);
  const debs = (await readdir(into)).filter((f) => f.endsWith('.deb')).sort();
  if (debs.length !== packages.length) throw new Error(`apt-get download ${packages.join(' ')} left ${debs.join(', ') || 'nothing'}`);
  return packages.map((p) => {
    const name = p.split('=')[0]!;
    const deb = debs.find((d) => d.startsWith(`${name}_`));
    if (!deb) throw new Error(`apt-get download ${p}: no ${name}_*.deb`);
    return join(into, deb);
  });
}

// -------------------------------------------------------------------------------------------------
// The cache

/** Hex sha256 of this builder's own sources, memoised: every key includes it. */
let builderHash: Promise<string> | undefined;

async function cachedArchive(
  cacheDir: string,
  name: string,
  ref: string,
  inputs: string[],
  log: (line: string) => void,
  build: (scratch: string) => Promise<OciImage>,
): Promise<BuiltImage> {
  builderHash ??= hashPaths('/', BUILDER_SOURCES);
  const key = createHash('sha256')
    .update(JSON.stringify([await builderHash, ref, ...inputs]))
    .digest('hex')
    .slice(0, 16);
  const archive = join(cacheDir, `${name}-${key}.tar`);
  if (await exists(archive)) return { ref, archive };
  const release = await lock(`${archive}.lock`, () => exists(archive));
  if (!release) return { ref, archive }; // built by the holder of the lock meanwhile
  try {
    if (await exists(archive)) return { ref, archive };
    log(`${ref}: building`);
    const started = performance.now();
    const scratch = await mkdtemp(join(tmpdir(), `certshare-image-${name}-`));
    try {
      const image = await build(scratch);
      const partial = `${archive}.${process.pid}.partial`;
      const written = await writeOciArchive(partial, image, join(scratch, 'layers')).catch(async (err: unknown) => {
        await rm(partial, { force: true });
        throw err;
      });
      await rename(partial, archive);
      const size = written.layers.reduce((sum, l) => sum + l.size, 0);
      const unpacked = written.layers.reduce((sum, l) => sum + l.uncompressedSize, 0);
      log(`${ref}: built in ${seconds(started)} s, ${mebibytes(size)} MiB compressed, ${mebibytes(unpacked)} MiB unpacked`);
    } finally {
      await rm(scratch, { recursive: true, force: true });
    }
    await prune(cacheDir, name);
    return { ref, archive };
  } finally {
    await release();
  }
}

/**
 * Takes the lock file (holding our pid), waiting while a live process holds it; undefined instead when
 * `done()` says its holder produced what we wanted. A dead holder's lock is taken over.
 */
async function lock(path: string, done: () => Promise<boolean>): Promise<(() => Promise<void>) | undefined> {
  for (;;) {
    try {
      const handle = await open(path, 'wx');
      await handle.writeFile(String(process.pid));
      await handle.close();
      return () => rm(path, { force: true });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
    if (await done()) return undefined;
    const holder = Number.parseInt(await readFile(path, 'utf8').catch(() => ''), 10);
    const age = await stat(path).then(
      (s) => Date.now() - s.mtimeMs,
      () => 0,
    );
    // No pid yet: written right after the file is created, unless its creator died in between.
    const stale = Number.isNaN(holder) ? age > 10_000 : !alive(holder);
    if (stale) await rm(path, { force: true });
    else await sleep(500);
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** Removes all but the newest KEEP_ARCHIVES archives of the image, and partial files of dead builders. */
async function prune(cacheDir: string, name: string): Promise<void> {
  const files = (await readdir(cacheDir)).filter((f) => f.startsWith(`${name}-`));
  for (const file of files) {
    const pid = /\.(\d+)\.partial$/.exec(file)?.[1];
    if (pid && !alive(Number(pid))) await rm(join(cacheDir, file), { force: true });
  }
  const archives = await Promise.all(
    files.filter((f) => /^[\w-]+-[0-9a-f]{16}\.tar$/.test(f)).map(async (f) => ({ path: join(cacheDir, f), mtime: (await stat(join(cacheDir, f))).mtimeMs })),
  );
  archives.sort((a, b) => b.mtime - a.mtime);
  for (const old of archives.slice(KEEP_ARCHIVES)) await rm(old.path, { force: true });
}

// -------------------------------------------------------------------------------------------------
// Small helpers

async function exists(path: string): Promise<boolean> {
  return stat(path).then(
    () => true,
    () => false,
  );
}

async function hashFile(path: string): Promise<string> {
  const hash = createHash('sha256');
  for await (const chunk of createReadStream(path) as AsyncIterable<Buffer>) hash.update(chunk);
  return hash.digest('hex');
}

/** Hex sha256 over the names and contents of the files at (or under) the paths, relative to base. */
async function hashPaths(base: string, paths: string[]): Promise<string> {
  const files: string[] = [];
  for (const path of paths) {
    const full = resolve(base, path);
    if ((await stat(full)).isDirectory()) {
      for (const entry of await readdir(full, { recursive: true, withFileTypes: true })) {
        if (entry.isFile()) files.push(join(entry.parentPath, entry.name));
      }
    } else files.push(full);
  }
  files.sort();
  const hash = createHash('sha256');
  for (const file of files) hash.update(`${posix.normalize(relative(base, file))}\0${await hashFile(file)}\n`);
  return hash.digest('hex');
}

interface Captured {
  code: number | null;
  stdout: string;
  stderr: string;
}

function runCapturing(command: string, args: string[], env: NodeJS.ProcessEnv = process.env, cwd?: string): Promise<Captured> {
  return new Promise((resolvePromise, reject) => {
    const child = spawn(command, args, { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (c: string) => (stdout += c));
    child.stderr.setEncoding('utf8').on('data', (c: string) => (stderr += c));
    child.on('error', reject);
    child.on('close', (code) => resolvePromise({ code, stdout, stderr }));
  });
}

async function output(command: string, args: string[]): Promise<string> {
  const result = await runCapturing(command, args);
  if (result.code !== 0) throw new Error(`${command} ${args.join(' ')} exited ${result.code}: ${result.stderr.slice(-2000)}`);
  return result.stdout;
}

async function run(command: string, args: string[], cwd?: string): Promise<void> {
  const result = await runCapturing(command, args, process.env, cwd);
  if (result.code !== 0) throw new Error(`${command} ${args.join(' ')} exited ${result.code}: ${(result.stdout + result.stderr).slice(-2000)}`);
}

function seconds(since: number): string {
  return ((performance.now() - since) / 1000).toFixed(1);
}

function mebibytes(bytes: number): string {
  return (bytes / 2 ** 20).toFixed(1);
}
