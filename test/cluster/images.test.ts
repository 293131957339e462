// The test cluster's images (test/cluster/images.ts), read back from their OCI archives: named for
// containerd's import, certshare's configured as the Dockerfile's final stage says and free of any shell,
// each holding what its entrypoint runs. Cold, the build replays the Dockerfile (npm ci, the bundle);
// warm, it only hashes its inputs.
import assert from 'node:assert/strict';
import { type SpawnSyncReturns, spawnSync } from 'node:child_process';
import { chmod, readFile } from 'node:fs/promises';
import { join, posix, resolve } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { buildOnce } from '../harness/control-plane.ts';
import { execForm, envOf, instructions, parseDockerfile, type Stage } from '../support/dockerfile.ts';
import { tempDir } from '../support/standalone.ts';
import { buildClusterImages, type ClusterImages } from './images.ts';
import { CONTAINERD_IMAGE_NAME, OCI_REF_NAME, type OciArchiveContents, readOciArchive, type TarMember, unpackOciArchive } from './oci.ts';

const REPO = resolve(import.meta.dirname, '../..');
const TAILSCALE_BUILD = join(REPO, 'test/tailscale-binaries/build.sh');
const NONROOT = 65532;
const SHELLS = /^(sh|bash|dash|ash|zsh|busybox|toybox)$/;

type Name = keyof ClusterImages;
/** An archive's contents, the file data dropped: member name -> member. */
interface Read {
  contents: Omit<OciArchiveContents, 'layers'>;
  members: Map<string, Omit<TarMember, 'data'>>;
}

const finalStage: Stage = parseDockerfile(await readFile(join(REPO, 'Dockerfile'), 'utf8')).at(-1)!;

function lastOf(stage: Stage, keyword: string): string | undefined {
  return instructions(stage, keyword).at(-1)?.args;
}

function isRoot(): boolean {
  return process.getuid?.() === 0;
}

function hasCommand(command: string): boolean {
  return spawnSync(command, ['--version'], { stdio: 'ignore' }).status === 0;
}

describe('the cluster images', { timeout: 15 * 60_000 }, () => {
  let images: ClusterImages;
  const read = new Map<Name, Read>();

  before(
    async () => {
      const tailscaleBinDir = await buildOnce(TAILSCALE_BUILD, ['tailscaled', 'tailscale', 'containerboot']);
      const started = performance.now();
      images = await buildClusterImages({ tailscaleBinDir, log: (line) => process.stderr.write(`# ${line}\n`) });
      process.stderr.write(`# cluster images ready in ${Math.round(performance.now() - started)} ms\n`);
      for (const name of Object.keys(images) as Name[]) {
        // One at a time, data dropped: certshare's layers unpack to ~130 MB.
        const { layers, ...contents } = await readOciArchive(images[name].archive);
        const members = new Map(layers.flat().map(({ data: _, ...member }) => [member.name, member]));
        read.set(name, { contents, members });
      }
    },
    { timeout: 15 * 60_000 },
  );

  function image(name: Name): Read {
    return read.get(name)!;
  }

  it('names each archive in both annotations containerd 1.6 imports by: the full ref, one linux/amd64 image', () => {
    assert.equal(images.certshare.ref, 'certshare.test/certshare:dev');
    // Tailscale's version from test/tailscale-binaries/go.mod, nginx's major.minor from Debian.
    assert.match(images.tailscale.ref, /^certshare\.test\/tailscale:v\d+\.\d+\.\d+$/);
    assert.match(images.nginx.ref, /^certshare\.test\/nginx:\d+\.\d+$/);
    assert.equal(images.pause.ref, 'certshare.test/pause:1');
    for (const name of Object.keys(images) as Name[]) {
      const { contents } = image(name);
      // A bare tag would be imported as `import-<date>:<tag>`: ctr takes a value with `/` or `:` whole.
      assert.equal(contents.annotations[CONTAINERD_IMAGE_NAME], images[name].ref, name);
      assert.equal(contents.annotations[OCI_REF_NAME], images[name].ref, name);
      assert.deepEqual(contents.platform, { architecture: 'amd64', os: 'linux' }, name);
      assert.equal(contents.config.os, 'linux');
      assert.equal(contents.config.architecture, 'amd64');
    }
  });

  it("configures certshare as the Dockerfile's final stage: ENTRYPOINT, CMD, USER, WORKDIR, ENV, EXPOSE", () => {
    const { config } = image('certshare').contents.config;
    assert.deepEqual(config.Entrypoint, execForm(lastOf(finalStage, 'ENTRYPOINT')!));
    assert.deepEqual(config.Cmd, execForm(lastOf(finalStage, 'CMD')!));
    assert.equal(config.User, lastOf(finalStage, 'USER'));
    assert.equal(
      config.WorkingDir,
      instructions(finalStage, 'WORKDIR').reduce((dir, i) => posix.resolve(dir, i.args), '/'),
    );
    for (const [key, value] of Object.entries(envOf(finalStage))) assert.ok(config.Env?.includes(`${key}=${value}`), `ENV ${key}`);
    assert.ok(config.Env?.some((e) => e.startsWith('PATH=')));
    const ports = instructions(finalStage, 'EXPOSE').flatMap((i) => i.args.split(/\s+/));
    assert.deepEqual(Object.keys(config.ExposedPorts ?? {}).sort(), ports.map((p) => (p.includes('/') ? p : `${p}/tcp`)).sort());
  });

  it("certshare's image holds the distroless stand-in (node, its libraries, accounts) and the bundle: no shell", () => {
    const { members } = image('certshare');
    const files = [...members.values()].filter((m) => m.type !== 'dir').map((m) => m.name);
    assert.deepEqual(
      files.filter((f) => SHELLS.test(posix.basename(f))),
      [],
      'no shell',
    );
    for (const file of files)
      assert.match(file, /^(nodejs\/bin\/node|lib(64)?\/.+\.so(\.\d+)*|etc\/(passwd|group|nsswitch\.conf|ssl\/certs\/.+)|app\/dist\/.+)$/);
    assert.equal(members.get('nodejs/bin/node')?.mode, 0o755);
    assert.ok(members.get('app/dist/snapshot/certshare-run.blob'), "the ENTRYPOINT's start-up snapshot, built by the image's Node");
    assert.ok(members.get('app/dist/cli/main.js'), 'the script Kubernetes workloads run, and every command the snapshot hands on');
    assert.ok(
      files.some((f) => /^lib64\/ld-linux/.test(f)),
      'the dynamic loader, at the path node names',
    );
    assert.equal(members.get('tmp')?.mode, 0o1777);
    assert.deepEqual(pick(members.get('home/nonroot')), { mode: 0o700, uid: NONROOT, gid: NONROOT });
    for (const member of members.values()) if (member.name !== 'home/nonroot') assert.equal(member.uid, 0, `${member.name} is root's`);
  });

  it('nginx: the binary, the libraries it loads, the nonroot account, /tmp', async () => {
    const { members, contents } = image('nginx');
    const { layers } = await readOciArchive(images.nginx.archive);
    const passwd = layers
      .flat()
      .find((m) => m.name === 'etc/passwd')
      ?.data.toString();
    assert.match(passwd ?? '', /^nonroot:x:65532:65532:/m);
    assert.equal(members.get('usr/sbin/nginx')?.mode, 0o755);
    assert.ok([...members.keys()].some((f) => /^(usr\/)?lib\/x86_64-linux-gnu\/libssl\.so/.test(f)));
    assert.equal(members.get('tmp')?.mode, 0o1777);
    assert.deepEqual(contents.config.config.Entrypoint, ['/usr/sbin/nginx']);
    assert.deepEqual(contents.config.config.Cmd, ['-g', 'daemon off;']);
  });

  it('haproxy: the binary, every library it loads (lua and opentracing included), the nonroot account; soft stop', () => {
    const { members, contents } = image('haproxy');
    assert.match(images.haproxy.ref, /^certshare\.test\/haproxy:2\.\d+$/, "Debian 12's HAProxy 2.6");
    assert.equal(members.get('usr/sbin/haproxy')?.mode, 0o755);
    for (const lib of ['liblua5.3', 'libopentracing-c-wrapper', 'libopentracing', 'libssl'])
      assert.ok(
        [...members.keys()].some((f) => f.includes(`/${lib}.so`)),
        lib,
      );
    assert.deepEqual(contents.config.config.Entrypoint, ['/usr/sbin/haproxy']);
    assert.equal(contents.config.config.User, '65532:65532');
    assert.equal(contents.config.config.StopSignal, 'SIGUSR1');
  });

  it('tailscale: containerboot as entrypoint, tailscaled and tailscale on PATH; pause: busybox alone', () => {
    const tailscale = image('tailscale');
    for (const bin of ['containerboot', 'tailscaled', 'tailscale']) assert.equal(tailscale.members.get(`usr/local/bin/${bin}`)?.mode, 0o755, bin);
    assert.deepEqual(tailscale.contents.config.config.Entrypoint, ['/usr/local/bin/containerboot']);
    assert.ok(tailscale.contents.config.config.Env?.includes('PATH=/usr/local/bin:/usr/bin:/bin'));
    const pause = image('pause');
    assert.deepEqual(
      [...pause.members.values()].filter((m) => m.type !== 'dir').map((m) => m.name),
      ['bin/busybox'],
    );
    assert.equal(pause.contents.config.config.Entrypoint?.[0], '/bin/busybox');
  });

  describe('certshare and haproxy, unpacked', () => {
    const dirs: Array<{ path: string; remove(): Promise<void> }> = [];
    after(async () => {
      for (const d of dirs) await d.remove();
    });

    /** The image's ENTRYPOINT with `args`, as uid 65532 in the image's own root filesystem, from its WORKDIR, with its ENV. */
    async function runUnpacked(name: Name, args: string[]): Promise<SpawnSyncReturns<string>> {
      const dir = await tempDir(`certshare-${name}-rootfs-`);
      dirs.push(dir);
      await chmod(dir.path, 0o755);
      const rootfs = join(dir.path, 'rootfs');
      const { config } = (await unpackOciArchive(images[name].archive, rootfs)).config;
      const env = Object.fromEntries((config.Env ?? []).map((e) => [e.slice(0, e.indexOf('=')), e.slice(e.indexOf('=') + 1)]));
      const wd = config.WorkingDir ? [`--wd=${config.WorkingDir}`] : [];
      return spawnSync('unshare', [`--root=${rootfs}`, ...wd, `--setuid=${NONROOT}`, `--setgid=${NONROOT}`, ...config.Entrypoint!, ...args], {
        encoding: 'utf8',
        env,
        timeout: 30_000,
      });
    }

    it('haproxy checks its configuration as uid 65532 in its own rootfs: nothing it loads is missing', {
      skip: !isRoot() && 'needs root (unshare --root)',
    }, async () => {
      const res = await runUnpacked('haproxy', ['-c', '-f', '/etc/haproxy/haproxy.cfg']);
      assert.equal(res.status, 0, res.stderr + res.stdout);
      assert.match(res.stdout + res.stderr, /Configuration file is valid/);
    });

    it('starts as uid 65532 in its own rootfs from WORKDIR: the ENTRYPOINT with `run --help`', {
      skip: !isRoot() && 'needs root (unshare --root)',
    }, async () => {
      const res = await runUnpacked('certshare', ['run', '--help']);
      assert.equal(res.status, 0, res.stderr);
      assert.match(res.stdout, /Usage: certshare run/);
    });
  });

  it('skopeo reads every archive, the same manifest', { skip: !hasCommand('skopeo') && 'no skopeo' }, () => {
    for (const name of Object.keys(images) as Name[]) {
      const res = spawnSync('skopeo', ['inspect', `oci-archive:${images[name].archive}`], { encoding: 'utf8', timeout: 60_000 });
      assert.equal(res.status, 0, res.stderr);
      assert.equal((JSON.parse(res.stdout) as { Digest: string }).Digest, image(name).contents.manifestDigest, name);
    }
  });
});

function pick(member: Omit<TarMember, 'data'> | undefined): { mode: number; uid: number; gid: number } | undefined {
  return member && { mode: member.mode, uid: member.uid, gid: member.gid };
}
