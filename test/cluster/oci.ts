// OCI image archives without a Docker engine or a registry: gzip layers written from a list of entries
// (owner, mode and mtime fixed, so equal inputs give equal digests) and the image layout (oci-layout,
// index.json, blobs/sha256/...) tarred the way `ctr images import` and `skopeo ... oci-archive:` read it.
// Also a reader for the same archives (digests checked), for tests and for unpacking a rootfs on the host.
import { createHash, type Hash } from 'node:crypto';
import { createWriteStream } from 'node:fs';
import { chmod, chown, lchown, lstat, mkdir, open, readdir, readFile, readlink, rm, symlink, writeFile } from 'node:fs/promises';
import { join, posix } from 'node:path';
import { Readable, Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { createGzip, gunzipSync } from 'node:zlib';

export const MEDIA_TYPES = {
  index: 'application/vnd.oci.image.index.v1+json',
  manifest: 'application/vnd.oci.image.manifest.v1+json',
  config: 'application/vnd.oci.image.config.v1+json',
  layerGzip: 'application/vnd.oci.image.layer.v1.tar+gzip',
} as const;

/** containerd's own name annotation: `ctr images import` (1.6 and later) names the image with it verbatim. */
export const CONTAINERD_IMAGE_NAME = 'io.containerd.image.name';
/**
 * The OCI annotation. containerd 1.6 reads it when the one above is absent: a value holding `/`, `:` or
 * `@` is taken as the full name, a bare tag becomes `import-<date>:<tag>` (without --base-name).
 */
export const OCI_REF_NAME = 'org.opencontainers.image.ref.name';

/** Every entry's mtime, and the image's `created`: the Unix epoch, so rebuilding changes no digest. */
const EPOCH_SECONDS = 0;
const BLOCK = 512;

export interface LayerEntry {
  /** Absolute path in the image, e.g. `/etc/passwd`. */
  path: string;
  type: 'file' | 'dir' | 'symlink';
  /** Permission bits, setuid/setgid/sticky included (e.g. 0o1777 for /tmp). */
  mode: number;
  /** Owner in the image; root unless given. */
  uid?: number;
  gid?: number;
  /** A file's content: a host file to copy... */
  source?: string;
  /** ...or the bytes themselves. */
  content?: string | Buffer;
  /** A symlink's target. */
  target?: string;
}

export interface Layer {
  entries: LayerEntry[];
  /** The history line for it (`created_by`), as `docker history` would show the instruction. */
  createdBy: string;
}

/** The `config` object of an OCI image configuration (the fields a runtime reads). */
export interface ContainerConfig {
  User?: string;
  Env?: string[];
  Entrypoint?: string[];
  Cmd?: string[];
  WorkingDir?: string;
  ExposedPorts?: Record<string, Record<string, never>>;
  StopSignal?: string;
  Labels?: Record<string, string>;
}

export interface OciImage {
  /** Full reference, e.g. `certshare.test/certshare:dev`. */
  ref: string;
  config: ContainerConfig;
  layers: Layer[];
}

export interface WrittenLayer {
  digest: string;
  size: number;
  diffId: string;
  uncompressedSize: number;
}

export interface WrittenArchive {
  manifestDigest: string;
  configDigest: string;
  layers: WrittenLayer[];
}

function sha256(data: string | Buffer): string {
  return `sha256:${createHash('sha256').update(data).digest('hex')}`;
}

/** A layer entry for every file, directory and symlink under hostDir, placed at imageDir; owned by root. */
export async function treeEntries(hostDir: string, imageDir: string): Promise<LayerEntry[]> {
  const entries: LayerEntry[] = [];
  const walk = async (host: string, image: string): Promise<void> => {
    for (const dirent of await readdir(host, { withFileTypes: true })) {
      const from = join(host, dirent.name);
      const to = posix.join(image, dirent.name);
      const st = await lstat(from);
      // Group/other write bits dropped: what the host's umask left must not make image files writable.
      const mode = st.mode & 0o7755;
      if (st.isDirectory()) {
        entries.push({ path: to, type: 'dir', mode });
        await walk(from, to);
      } else if (st.isSymbolicLink()) entries.push({ path: to, type: 'symlink', mode: 0o777, target: await readlink(from) });
      else if (st.isFile()) entries.push({ path: to, type: 'file', mode, source: from });
      else throw new Error(`${from}: neither a file, a directory nor a symlink`);
    }
  };
  await walk(hostDir, imageDir);
  return entries;
}

/** The entries with every missing parent directory added (0755, root), the last of equal paths kept, parents first. */
export function normalizeEntries(entries: LayerEntry[]): LayerEntry[] {
  const byPath = new Map<string, LayerEntry>();
  for (const entry of entries) {
    if (!entry.path.startsWith('/')) throw new Error(`layer path ${entry.path} is not absolute`);
    const path = posix.normalize(entry.path).replace(/\/+$/, '');
    if (path === '') throw new Error('the root directory is not a layer entry');
    byPath.delete(path);
    byPath.set(path, { ...entry, path });
  }
  for (const path of [...byPath.keys()]) {
    for (let parent = posix.dirname(path); parent !== '/'; parent = posix.dirname(parent)) {
      const existing = byPath.get(parent);
      if (existing && existing.type !== 'dir') throw new Error(`${path}: its parent ${parent} is a ${existing.type}`);
      if (!existing) byPath.set(parent, { path: parent, type: 'dir', mode: 0o755 });
    }
  }
  const parts = (p: string): string[] => p.split('/');
  return [...byPath.values()].sort((a, b) => {
    const [x, y] = [parts(a.path), parts(b.path)];
    for (let i = 0; i < Math.min(x.length, y.length); i++) if (x[i] !== y[i]) return x[i]! < y[i]! ? -1 : 1;
    return x.length - y.length;
  });
}

// -------------------------------------------------------------------------------------------------
// tar (POSIX ustar, with PAX records for names that do not fit)

function octal(value: number, width: number): string {
  return `${value.toString(8).padStart(width - 1, '0')}\0`;
}

interface HeaderFields {
  name: string;
  mode: number;
  uid: number;
  gid: number;
  size: number;
  typeflag: string;
  linkname?: string;
}

function rawHeader(h: HeaderFields & { prefix?: string }): Buffer {
  const block = Buffer.alloc(BLOCK);
  block.write(h.name, 0, 100, 'utf8');
  block.write(octal(h.mode, 8), 100, 'ascii');
  block.write(octal(h.uid, 8), 108, 'ascii');
  block.write(octal(h.gid, 8), 116, 'ascii');
  block.write(octal(h.size, 12), 124, 'ascii');
  block.write(octal(EPOCH_SECONDS, 12), 136, 'ascii');
  block.write(' '.repeat(8), 148, 'ascii');
  block.write(h.typeflag, 156, 'ascii');
  block.write(h.linkname ?? '', 157, 100, 'utf8');
  block.write('ustar\u000000', 257, 'ascii');
  block.write(h.prefix ?? '', 345, 155, 'utf8');
  let sum = 0;
  for (const byte of block) sum += byte;
  block.write(`${sum.toString(8).padStart(6, '0')}\0 `, 148, 'ascii');
  return block;
}

function padding(size: number): Buffer {
  return Buffer.alloc((BLOCK - (size % BLOCK)) % BLOCK);
}

/** One PAX record: its length counts itself. */
function paxRecord(key: string, value: string): string {
  const body = ` ${key}=${value}\n`;
  let length = Buffer.byteLength(body) + 1;
  while (String(length).length + Buffer.byteLength(body) !== length) length++;
  return `${length}${body}`;
}

/** The header block(s) of one member: ustar's prefix/name split when the name fits, a PAX header before it otherwise. */
function headerBlocks(h: HeaderFields): Buffer[] {
  const nameBytes = Buffer.byteLength(h.name);
  const linkFits = Buffer.byteLength(h.linkname ?? '') <= 100;
  if (nameBytes <= 100 && linkFits) return [rawHeader(h)];
  if (linkFits) {
    for (let i = h.name.indexOf('/'); i > 0; i = h.name.indexOf('/', i + 1)) {
      const prefix = h.name.slice(0, i);
      const rest = h.name.slice(i + 1);
      if (Buffer.byteLength(prefix) <= 155 && Buffer.byteLength(rest) <= 100 && rest !== '') return [rawHeader({ ...h, name: rest, prefix })];
    }
  }
  let records = paxRecord('path', h.name);
  if (!linkFits) records += paxRecord('linkpath', h.linkname!);
  const pax = Buffer.from(records, 'utf8');
  const paxName = `PaxHeaders/${posix.basename(h.name.replace(/\/$/, '')).slice(0, 80)}`;
  return [
    rawHeader({ name: paxName, mode: 0o644, uid: 0, gid: 0, size: pax.length, typeflag: 'x' }),
    pax,
    padding(pax.length),
    rawHeader({ ...h, name: h.name.slice(0, 100), linkname: (h.linkname ?? '').slice(0, 100) }),
  ];
}

/** The tar stream of the entries, as given (normalize them first for a layer). Paths lose their leading `/`. */
async function* tarStream(entries: LayerEntry[]): AsyncGenerator<Buffer> {
  for (const entry of entries) {
    const name = entry.path.replace(/^\/+/, '');
    const owner = { uid: entry.uid ?? 0, gid: entry.gid ?? 0 };
    if (entry.type === 'dir') {
      yield* headerBlocks({ name: `${name}/`, mode: entry.mode, ...owner, size: 0, typeflag: '5' });
    } else if (entry.type === 'symlink') {
      if (!entry.target) throw new Error(`symlink ${entry.path} has no target`);
      yield* headerBlocks({ name, mode: 0o777, ...owner, size: 0, typeflag: '2', linkname: entry.target });
    } else if (entry.content !== undefined) {
      const data = Buffer.from(entry.content);
      yield* headerBlocks({ name, mode: entry.mode, ...owner, size: data.length, typeflag: '0' });
      yield data;
      yield padding(data.length);
    } else if (entry.source !== undefined) {
      const file = await open(entry.source, 'r');
      try {
        const { size } = await file.stat();
        yield* headerBlocks({ name, mode: entry.mode, ...owner, size, typeflag: '0' });
        let written = 0;
        for await (const chunk of file.createReadStream({ autoClose: false, highWaterMark: 1 << 20 }) as AsyncIterable<Buffer>) {
          written += chunk.length;
          if (written > size) break;
          yield chunk;
        }
        if (written !== size) throw new Error(`${entry.source} changed size while being archived (${size} -> ${written} bytes)`);
        yield padding(size);
      } finally {
        await file.close();
      }
    } else throw new Error(`file ${entry.path} has neither source nor content`);
  }
  yield Buffer.alloc(2 * BLOCK);
}

function hashing(hash: Hash, counter: { bytes: number }): Transform {
  return new Transform({
    transform(chunk: Buffer, _encoding, callback) {
      hash.update(chunk);
      counter.bytes += chunk.length;
      callback(null, chunk);
    },
  });
}

/** Writes the layer's gzip tarball to `file`; its digest (compressed) and diff_id (uncompressed). */
export async function writeLayer(entries: LayerEntry[], file: string): Promise<WrittenLayer> {
  const uncompressed = { hash: createHash('sha256'), counter: { bytes: 0 } };
  const compressed = { hash: createHash('sha256'), counter: { bytes: 0 } };
  await pipeline(
    Readable.from(tarStream(normalizeEntries(entries))),
    hashing(uncompressed.hash, uncompressed.counter),
    createGzip({ level: 6 }),
    hashing(compressed.hash, compressed.counter),
    createWriteStream(file),
  );
  return {
    digest: `sha256:${compressed.hash.digest('hex')}`,
    size: compressed.counter.bytes,
    diffId: `sha256:${uncompressed.hash.digest('hex')}`,
    uncompressedSize: uncompressed.counter.bytes,
  };
}

/**
 * Writes the image as an OCI archive (an uncompressed tar of an OCI image layout) at `file`, single
 * platform linux/amd64. index.json names it `ref` in both annotations containerd reads (see above).
 * `scratchDir` holds the layer tarballs meanwhile.
 */
export async function writeOciArchive(file: string, image: OciImage, scratchDir: string): Promise<WrittenArchive> {
  await mkdir(scratchDir, { recursive: true });
  const layers: WrittenLayer[] = [];
  const blobs: LayerEntry[] = [];
  for (const [i, layer] of image.layers.entries()) {
    const path = join(scratchDir, `layer-${i}.tar.gz`);
    const written = await writeLayer(layer.entries, path);
    layers.push(written);
    blobs.push({ path: `/blobs/sha256/${written.digest.slice('sha256:'.length)}`, type: 'file', mode: 0o644, source: path });
  }
  const created = new Date(EPOCH_SECONDS * 1000).toISOString().replace('.000Z', 'Z');
  const config = Buffer.from(
    JSON.stringify({
      created,
      architecture: 'amd64',
      os: 'linux',
      config: image.config,
      rootfs: { type: 'layers', diff_ids: layers.map((l) => l.diffId) },
      history: image.layers.map((l) => ({ created, created_by: l.createdBy })),
    }),
  );
  const configDigest = sha256(config);
  const manifest = Buffer.from(
    JSON.stringify({
      schemaVersion: 2,
      mediaType: MEDIA_TYPES.manifest,
      config: { mediaType: MEDIA_TYPES.config, digest: configDigest, size: config.length },
      layers: layers.map((l) => ({ mediaType: MEDIA_TYPES.layerGzip, digest: l.digest, size: l.size })),
    }),
  );
  const manifestDigest = sha256(manifest);
  const index = JSON.stringify({
    schemaVersion: 2,
    mediaType: MEDIA_TYPES.index,
    manifests: [
      {
        mediaType: MEDIA_TYPES.manifest,
        digest: manifestDigest,
        size: manifest.length,
        platform: { architecture: 'amd64', os: 'linux' },
        annotations: { [CONTAINERD_IMAGE_NAME]: image.ref, [OCI_REF_NAME]: image.ref },
      },
    ],
  });
  const members: LayerEntry[] = [
    { path: '/oci-layout', type: 'file', mode: 0o644, content: JSON.stringify({ imageLayoutVersion: '1.0.0' }) },
    { path: '/index.json', type: 'file', mode: 0o644, content: index },
    { path: '/blobs', type: 'dir', mode: 0o755 },
    { path: '/blobs/sha256', type: 'dir', mode: 0o755 },
    { path: `/blobs/sha256/${configDigest.slice('sha256:'.length)}`, type: 'file', mode: 0o644, content: config },
    { path: `/blobs/sha256/${manifestDigest.slice('sha256:'.length)}`, type: 'file', mode: 0o644, content: manifest },
    ...blobs,
  ];
  await pipeline(Readable.from(tarStream(members)), createWriteStream(file));
  return { manifestDigest, configDigest, layers };
}

// -------------------------------------------------------------------------------------------------
// Reading

export interface TarMember {
  /** Path as stored, without a leading `./` or trailing `/`. */
  name: string;
  type: 'file' | 'dir' | 'symlink' | 'hardlink' | 'other';
  mode: number;
  uid: number;
  gid: number;
  linkname: string;
  data: Buffer;
}

function field(block: Buffer, offset: number, length: number): string {
  const raw = block.subarray(offset, offset + length);
  const end = raw.indexOf(0);
  return raw.subarray(0, end < 0 ? length : end).toString('utf8');
}

function number(block: Buffer, offset: number, length: number): number {
  const text = field(block, offset, length).trim();
  return text === '' ? 0 : Number.parseInt(text, 8);
}

/** The members of an in-memory tar (ustar, PAX path/linkpath records, GNU long names). */
export function parseTar(tar: Buffer): TarMember[] {
  const members: TarMember[] = [];
  let offset = 0;
  let longName: string | undefined;
  let longLink: string | undefined;
  while (offset + BLOCK <= tar.length) {
    const block = tar.subarray(offset, offset + BLOCK);
    if (block.every((b) => b === 0)) break;
    const size = number(block, 124, 12);
    const typeflag = String.fromCharCode(block[156]!);
    const data = tar.subarray(offset + BLOCK, offset + BLOCK + size);
    offset += BLOCK + Math.ceil(size / BLOCK) * BLOCK;
    if (typeflag === 'x') {
      for (const match of data.toString('utf8').matchAll(/\d+ (\w+)=([^\n]*)\n/g)) {
        if (match[1] === 'path') longName = match[2];
        if (match[1] === 'linkpath') longLink = match[2];
      }
      continue;
    }
    if (typeflag === 'L' || typeflag === 'K') {
      const value = data.toString('utf8').replace(/\0+$/, '');
      if (typeflag === 'L') longName = value;
      else longLink = value;
      continue;
    }
    if (typeflag === 'g') continue;
    const prefix = field(block, 345, 155);
    const stored = longName ?? (prefix ? `${prefix}/${field(block, 0, 100)}` : field(block, 0, 100));
    const types: Record<string, TarMember['type']> = { '0': 'file', '\0': 'file', '5': 'dir', '2': 'symlink', '1': 'hardlink' };
    members.push({
      name: stored.replace(/^\.\//, '').replace(/\/+$/, ''),
      type: types[typeflag] ?? 'other',
      mode: number(block, 100, 8),
      uid: number(block, 108, 8),
      gid: number(block, 116, 8),
      linkname: longLink ?? field(block, 157, 100),
      data,
    });
    longName = undefined;
    longLink = undefined;
  }
  return members;
}

export interface OciArchiveContents {
  /** The digest of the image's manifest, as index.json gives it. */
  manifestDigest: string;
  /** The annotations of the manifest's descriptor in index.json (its names). */
  annotations: Record<string, string>;
  platform: { architecture: string; os: string } | undefined;
  manifest: { mediaType: string; config: { digest: string }; layers: Array<{ mediaType: string; digest: string; size: number }> };
  config: { architecture: string; os: string; config: ContainerConfig; rootfs: { type: string; diff_ids: string[] } };
  /** Each layer's members, in order. */
  layers: TarMember[][];
}

/**
 * Reads an OCI archive written by writeOciArchive (or any single-image OCI archive) into memory,
 * checking every blob against its digest and every layer against its diff_id.
 */
export async function readOciArchive(file: string): Promise<OciArchiveContents> {
  const members = parseTar(await readFile(file));
  const byName = new Map(members.map((m) => [m.name, m]));
  const layout = byName.get('oci-layout');
  if (!layout || (JSON.parse(layout.data.toString()) as { imageLayoutVersion: string }).imageLayoutVersion !== '1.0.0') {
    throw new Error(`${file}: no oci-layout 1.0.0`);
  }
  const blob = (digest: string, size?: number): Buffer => {
    const member = byName.get(`blobs/${digest.replace(':', '/')}`);
    if (!member) throw new Error(`${file}: blob ${digest} is missing`);
    if (sha256(member.data) !== digest) throw new Error(`${file}: blob ${digest} does not match its digest`);
    if (size !== undefined && member.data.length !== size) throw new Error(`${file}: blob ${digest} is ${member.data.length} bytes, not ${size}`);
    return member.data;
  };
  const indexMember = byName.get('index.json');
  if (!indexMember) throw new Error(`${file}: no index.json`);
  const index = JSON.parse(indexMember.data.toString()) as {
    manifests: Array<{
      mediaType: string;
      digest: string;
      size: number;
      platform?: { architecture: string; os: string };
      annotations?: Record<string, string>;
    }>;
  };
  if (index.manifests.length !== 1) throw new Error(`${file}: ${index.manifests.length} manifests in index.json, expected 1`);
  const descriptor = index.manifests[0]!;
  if (descriptor.mediaType !== MEDIA_TYPES.manifest) throw new Error(`${file}: index.json points at a ${descriptor.mediaType}`);
  const manifest = JSON.parse(blob(descriptor.digest, descriptor.size).toString()) as OciArchiveContents['manifest'] & {
    config: { digest: string; size: number; mediaType: string };
  };
  const config = JSON.parse(blob(manifest.config.digest, manifest.config.size).toString()) as OciArchiveContents['config'];
  if (config.rootfs.diff_ids.length !== manifest.layers.length) throw new Error(`${file}: diff_ids and layers differ in number`);
  const layers = manifest.layers.map((layer, i) => {
    const tar = gunzipSync(blob(layer.digest, layer.size));
    if (sha256(tar) !== config.rootfs.diff_ids[i]) throw new Error(`${file}: layer ${i} does not match its diff_id`);
    return parseTar(tar);
  });
  return { manifestDigest: descriptor.digest, annotations: descriptor.annotations ?? {}, platform: descriptor.platform, manifest, config, layers };
}

/**
 * Unpacks the image's layers into `dir` (owners kept when we are root), as a runtime would see the
 * rootfs; layers written here have no whiteouts, others' are refused.
 */
export async function unpackOciArchive(file: string, dir: string): Promise<OciArchiveContents> {
  const contents = await readOciArchive(file);
  const asRoot = process.getuid?.() === 0;
  await rm(dir, { recursive: true, force: true });
  await mkdir(dir, { recursive: true });
  const directories: Array<[string, TarMember]> = [];
  for (const layer of contents.layers) {
    for (const member of layer) {
      if (posix.basename(member.name).startsWith('.wh.')) throw new Error(`${member.name}: whiteouts are not supported`);
      const target = join(dir, posix.normalize(`/${member.name}`));
      if (member.type === 'dir') {
        await mkdir(target, { recursive: true });
        directories.push([target, member]);
        continue;
      }
      await rm(target, { force: true });
      if (member.type === 'file') await writeFile(target, member.data, { mode: member.mode & 0o777 });
      else if (member.type === 'symlink') await symlink(member.linkname, target);
      else throw new Error(`${member.name}: ${member.type} members are not supported`);
      if (asRoot) await lchown(target, member.uid, member.gid);
      if (member.type === 'file') await chmod(target, member.mode);
    }
  }
  // Directories last: a read-only or foreign-owned directory must not stop its own files being written.
  for (const [target, member] of directories.reverse()) {
    if (asRoot) await chown(target, member.uid, member.gid);
    await chmod(target, member.mode);
  }
  return contents;
}
