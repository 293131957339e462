import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { request as httpsRequest } from 'node:https';
import type { ControlPlane } from '../harness/control-plane.ts';

/**
 * A raw request under the token of a ServiceAccount's kubeconfig (kubeconfigFor): the rights a test checks
 * are the token's own, with no client reading the object first (kubectl patch would GET it). A PATCH is a
 * JSON merge patch.
 */
export async function asAccount(cp: ControlPlane, kubeconfig: string, method: string, path: string, body?: unknown): Promise<{ status: number; body: string }> {
  const token = /token:\s*"?([^\s"]+)/.exec(await readFile(kubeconfig, 'utf8'))?.[1];
  assert.ok(token, 'a token in the kubeconfig');
  const type = method === 'PATCH' ? 'application/merge-patch+json' : 'application/json';
  return new Promise((resolve, reject) => {
    const req = httpsRequest(
      new URL(path, cp.server),
      { method, ca: cp.caPem, agent: false, headers: { authorization: `Bearer ${token}`, 'content-type': type }, timeout: 10_000 },
      (res) => {
        let text = '';
        res.setEncoding('utf8').on('data', (c: string) => (text += c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: text }));
      },
    );
    req.on('error', reject);
    req.end(body === undefined ? undefined : JSON.stringify(body));
  });
}
