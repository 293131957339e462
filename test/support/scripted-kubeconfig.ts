// A kubeconfig for a scripted node:http2 server standing in for an apiserver (localhost, a certificate of
// the test CA: makePair's default), as certshare accepts one: the server, its CA and a token, inline.
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { testCa } from './certs.ts';

export async function scriptedKubeconfig(dir: string, name: string, port: number): Promise<string> {
  const path = join(dir, `${name}.kubeconfig`);
  const ca = Buffer.from((await testCa()).certPem).toString('base64');
  const cluster = `{server: "https://localhost:${port}", certificate-authority-data: "${ca}"}`;
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
