import { readFile } from 'node:fs/promises';
import { CORE_SCHEMA, load } from 'js-yaml';
import { CertshareError, errorMessage } from '../core/errors.ts';

// The one shape of kubeconfig the daemon and the injector load from a file: a server, its CA and a token
// or a client certificate, all inline. client-node would run an `exec` plugin or an `auth-provider`'s
// command, and read any file a path names (`token-file` at load, the others at the first request): whoever
// writes the kubeconfig (the federation home's Secret, a mounted file) would run a command or read a file in
// certshare's container. What is not on these lists is refused at start, before any request.

/** A kubeconfig with two CA bundles and a client certificate chain is some 20 KiB: 256 KiB is never one. @forTests */
export const MAX_KUBECONFIG_BYTES = 256 * 1024;

const TOP = new Set(['apiVersion', 'kind', 'clusters', 'users', 'contexts', 'current-context', 'preferences']);
const CLUSTER = new Set(['server', 'certificate-authority-data']);
const USER = new Set(['token', 'client-certificate-data', 'client-key-data']);
const CONTEXT = new Set(['cluster', 'user', 'namespace']);

/** Reads the kubeconfig at `path` and returns its text when it has the allowed shape; CERTSHARE_KUBECONFIG_REFUSED otherwise. */
export async function readInlineKubeconfig(path: string): Promise<string> {
  const refuse = (problem: string): never => {
    throw new CertshareError('CERTSHARE_KUBECONFIG_REFUSED', { path, problem });
  };
  let bytes: Buffer;
  try {
    bytes = await readFile(path);
  } catch (err) {
    throw new CertshareError('CERTSHARE_BAD_CONFIG', { source: 'Kubernetes credentials', reason: `cannot be loaded: ${errorMessage(err)}` }, { cause: err });
  }
  if (bytes.length > MAX_KUBECONFIG_BYTES) refuse(`${bytes.length} bytes, more than ${MAX_KUBECONFIG_BYTES}`);
  const text = bytes.toString('utf8');
  let doc: unknown;
  try {
    // The core schema: plain data, no custom types, no merge keys.
    doc = load(text, { schema: CORE_SCHEMA });
  } catch {
    refuse('not YAML'); // the parser's message would quote the file: keep credentials out of logs
  }
  checkShape(doc, refuse);
  return text;
}

function checkShape(doc: unknown, refuse: (problem: string) => never): void {
  const object = (value: unknown, where: string): Record<string, unknown> => {
    if (value === null || typeof value !== 'object' || Array.isArray(value)) refuse(`${where} is not a mapping`);
    return value as Record<string, unknown>;
  };
  const only = (value: Record<string, unknown>, allowed: Set<string>, where: string): void => {
    for (const key of Object.keys(value)) {
      if (!allowed.has(key)) refuse(`${where} has "${key.slice(0, 64)}": only ${[...allowed].join(', ')} are accepted`);
    }
  };
  const strings = (value: Record<string, unknown>, where: string): void => {
    for (const [key, v] of Object.entries(value)) if (typeof v !== 'string') refuse(`${where}.${key} is not a string`);
  };
  const list = (value: unknown, where: string): Record<string, unknown>[] => {
    if (value === undefined || value === null) return [];
    if (!Array.isArray(value)) refuse(`${where} is not a list`);
    return (value as unknown[]).map((entry, i) => object(entry, `${where}[${i}]`));
  };
  const root = object(doc, 'the kubeconfig');
  only(root, TOP, 'the kubeconfig');
  if (root.preferences !== undefined && Object.keys(object(root.preferences, 'preferences')).length > 0) refuse('preferences is not empty');
  for (const [name, allowed, field] of [
    ['clusters', CLUSTER, 'cluster'],
    ['users', USER, 'user'],
    ['contexts', CONTEXT, 'context'],
  ] as const) {
    for (const [i, entry] of list(root[name], name).entries()) {
      const where = `${name}[${i}]`;
      only(entry, new Set(['name', field]), where);
      if (typeof entry.name !== 'string') refuse(`${where}.name is not a string`);
      const body = object(entry[field] ?? {}, `${where}.${field}`);
      only(body, allowed, `${where}.${field}`);
      strings(body, `${where}.${field}`);
    }
  }
  for (const [i, entry] of list(root.users, 'users').entries()) {
    const user = object(entry.user ?? {}, `users[${i}].user`);
    const cert = user['client-certificate-data'] !== undefined;
    if (cert !== (user['client-key-data'] !== undefined)) refuse(`users[${i}].user: client-certificate-data and client-key-data go together`);
    if (cert === (user.token !== undefined)) refuse(`users[${i}].user: a token or a client certificate, one of the two`);
  }
  for (const [i, entry] of list(root.clusters, 'clusters').entries()) {
    const cluster = object(entry.cluster ?? {}, `clusters[${i}].cluster`);
    if (typeof cluster.server !== 'string' || !cluster.server.startsWith('https://')) refuse(`clusters[${i}].cluster.server is not an https:// URL`);
  }
}
