// A kubeconfig for a scripted node:http2 server standing in for an apiserver (localhost, any certificate).
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';

export async function scriptedKubeconfig(dir: string, name: string, port: number): Promise<string> {
  const path = join(dir, `${name}.kubeconfig`);
  const cluster = `{server: "https://localhost:${port}", insecure-skip-tls-verify: true}`;
  await writeFile(
    path,
    [
      'apiVersion: v1',
      'kind: Config',
      `clusters: [{name: c, cluster: ${cluster}}]`,
      'users: [{name: u, user: {token: t}}]',
      'contexts: [{name: x, context: {cluster: c, user: u, namespace: n}}]',
      'current-context: x',
      '',
    ].join('\n'),
  );
  return path;
}
