// tailscaled's config file as Tailscale's operator hands it to a ProxyGroup Pod: a Secret the kubelet mounts, which
// containerboot reads through TS_EXPERIMENTAL_VERSIONED_CONFIG_DIR and reloads when the kubelet swaps `..data`.
import { mkdir, rename, symlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

/** The file name containerboot 1.102.5 looks for: cap-<version> up to tailscaled's capability version (142). */
export const CONFIG_FILE = 'cap-142.hujson';

/**
 * The operator's config as the kubelet projects a Secret: the content in a directory of its own, `..data` linking
 * to it, the file a link through `..data`. A new version is a new directory and `..data` renamed over (atomic).
 * `file`: the Secret's key (the operator's own, cap-<its minimum capability version>.hujson, in its Secrets).
 */
export async function projectConfig(dir: string, version: number, config: Record<string, unknown>, file = CONFIG_FILE): Promise<void> {
  const data = join(dir, `..v${version}`);
  await mkdir(data, { recursive: true });
  await writeFile(join(data, file), JSON.stringify(config));
  await symlink(`..v${version}`, join(dir, '..data_tmp'));
  await rename(join(dir, '..data_tmp'), join(dir, '..data'));
  if (version === 1) await symlink(join('..data', file), join(dir, file));
}
