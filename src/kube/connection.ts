import { readFile } from 'node:fs/promises';
import { CoreV1Api, KubeConfig } from './transport/client-node.ts';
import { CertshareError, errorMessage, type ErrorCode } from '../core/errors.ts';
import { DEFAULT_REQUEST_TIMEOUT_MS, closeKubeSessions, makeApi } from './transport/https-transport.ts';
import { readInlineKubeconfig } from './kubeconfig-file.ts';
import { kubeconfigSource } from './kubeconfig-source.ts';

const SA_NAMESPACE = '/var/run/secrets/kubernetes.io/serviceaccount/namespace';

export interface KubeConnection {
  config: KubeConfig;
  core: CoreV1Api;
  namespace: string;
  /** The bound of one API request (see DEFAULT_REQUEST_TIMEOUT_MS); APIs made from this connection use it. */
  requestTimeoutMs: number;
  /** Closes the API connections (HTTP/2 sessions) so the process can exit; later calls reconnect. */
  close(): void;
}

/**
 * In-cluster credentials inside a Pod, KUBECONFIG (or ~/.kube/config) outside. `kubeconfig` and
 * `namespace`: another cluster's (the federation home's), from a kubeconfig file the platform mounts.
 * A kubeconfig file holds inline credentials only (kubeconfig-file.ts), unless `anyKubeconfig`: the
 * `certshare renew` command, run by a person with their own kubeconfig (a cloud's exec plugin, say).
 */
export async function connectKube(
  env: NodeJS.ProcessEnv,
  options: { requestTimeoutMs?: number; kubeconfig?: string; namespace?: string; anyKubeconfig?: boolean } = {},
): Promise<KubeConnection> {
  const requestTimeoutMs = options.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
  const config = new KubeConfig();
  const source = options.kubeconfig ? kubeconfigSource({ KUBECONFIG: options.kubeconfig }) : kubeconfigSource(env);
  // Checked before client-node sees it: its loading alone reads the file a `token-file` names.
  const inline = source.kind === 'file' && !options.anyKubeconfig ? await readInlineKubeconfig(source.path) : undefined;
  try {
    if (inline !== undefined) config.loadFromString(inline);
    else if (source.kind === 'file') config.loadFromFile(source.path);
    else config.loadFromCluster();
  } catch (err) {
    throw new CertshareError('CERTSHARE_BAD_CONFIG', { source: 'Kubernetes credentials', reason: `cannot be loaded: ${errorMessage(err)}` }, { cause: err });
  }
  const namespace =
    options.namespace ||
    env.POD_NAMESPACE ||
    (await readFile(SA_NAMESPACE, 'utf8').then(
      (s) => s.trim(),
      () => '',
    )) ||
    config.getContextObject(config.getCurrentContext())?.namespace ||
    'default';
  return { config, core: makeApi(config, CoreV1Api, requestTimeoutMs), namespace, requestTimeoutMs, close: () => closeKubeSessions(config) };
}

/** The HTTP status of a failed API call, if it got one (client-node's ApiException carries `code`, our watch `statusCode`). */
export function apiStatus(err: unknown): number | undefined {
  const { code, statusCode } = (err ?? {}) as { code?: unknown; statusCode?: unknown };
  if (typeof code === 'number') return code;
  return typeof statusCode === 'number' ? statusCode : undefined;
}

/** The API server refused the caller (401 Unauthorized, 403 Forbidden): see CertshareError.refused. */
export function isRefusedStatus(err: unknown): boolean {
  const status = apiStatus(err);
  return status === 401 || status === 403;
}

/** The stable code of a failed call for a log line's `code` field (e.g. CERTSHARE_KUBE_TIMEOUT), if it has one. */
export function apiErrorCode(err: unknown): ErrorCode | undefined {
  return err instanceof CertshareError ? err.code : undefined;
}

/** "reason: message" from an ApiException's JSON body, or the error's own message. */
export function apiErrorText(err: unknown): string {
  const body = (err as { body?: unknown })?.body;
  if (typeof body === 'string') {
    try {
      const status = JSON.parse(body) as { reason?: string; message?: string };
      if (status.message) return `${apiStatus(err) ?? ''} ${status.reason ?? ''}: ${status.message}`.trim();
    } catch {
      // Not JSON: fall through.
    }
  }
  return errorMessage(err);
}
