// The federation home's start-up check (docs/federation.md): the group's Lease at the home exists and may be
// read and updated with the member's kubeconfig, and which failed home calls are an outage (the home down or
// unreachable) rather than a refusal or garbage: the outage rules (break-glass) answer only the first.
import { systemClock, type Clock } from '../core/ports/clock.ts';
import { doubling } from '../core/issuance/backoff.ts';
import { CertshareError, errorMessage } from '../core/errors.ts';
import type { Logger } from '../core/ports/logger.ts';
import { CoordinationV1Api } from './transport/client-node.ts';
import { apiErrorText, apiStatus, type KubeConnection } from './connection.ts';
import { apiReadiness, makeApi, withSignal, type ApiReadiness } from './transport/https-transport.ts';

/** The home Lease of a group: the same name as the group's Lease in a cluster. */
export const homeLeaseName = (group: string): string => `certshare-${group}`;

/** Errors that mean the home cannot be reached (or is down), not that it refused or answered garbage. */
// An HTTP/2 stream or session ended by the peer (a proxy or load balancer in front of the home resets it)
// carries no answer at all: an outage, not garbage (the chaos run's partitions found a sidecar restarted
// during one refusing to start).
const OUTAGE_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ETIMEDOUT',
  'EPIPE',
  'ENOTFOUND',
  'EAI_AGAIN',
  'ERR_HTTP2_STREAM_ERROR',
  'ERR_HTTP2_SESSION_ERROR',
  'ERR_HTTP2_GOAWAY_SESSION',
  'ERR_HTTP2_INVALID_SESSION',
]);
const OUTAGE_CERTSHARE = new Set(['CERTSHARE_KUBE_TIMEOUT', 'CERTSHARE_KUBE_CONNECTION_LOST']);

/**
 * Whether a failed home call is an outage, which the safety point and break-glass answer. Anything else
 * (401/403, 404 on the Lease, an answer that is not the API's) is not: no member issues on its account.
 * @forTests
 */
export function isHomeOutage(err: unknown): boolean {
  for (let e: unknown = err, depth = 0; e && depth < 6; e = (e as { cause?: unknown }).cause, depth++) {
    const status = apiStatus(e);
    if (status !== undefined) return status >= 500 || status === 429;
    const code = (e as { code?: unknown }).code;
    if (typeof code === 'string' && (OUTAGE_CODES.has(code) || OUTAGE_CERTSHARE.has(code))) return true;
    if (e instanceof AggregateError && e.errors.some((inner) => isHomeOutage(inner))) return true;
  }
  return false;
}

/** How long a refusal of the start-up check and of /readyz may last before it is taken as the kubeconfig's. */
const REFUSED_AT_START_MS = 20_000;

/**
 * The start-up check of the home: the group's Lease exists (the platform creates it: a group the home does
 * not know is an error, never one to make up) and may be read and updated (an update dry run, which the
 * apiserver authorizes and admits like the real one). Refused, unknown or garbage: CERTSHARE_HOME_UNUSABLE,
 * fatal. Unreachable: logged, the member starts with its local copies (the outage rules hold). Refused by a
 * home that is not ready (a restarted apiserver authorizes before its policy is loaded) is unreachable too:
 * its refusal says nothing about the kubeconfig yet, and a later refusal never makes an issuer. A home that
 * refuses /readyz as well is asked again for `refusedForMs`, then the refusal stands (CERTSHARE_HOME_UNUSABLE).
 */
export async function checkHome(
  home: KubeConnection,
  group: string,
  logger: Logger,
  options: { clock?: Clock; homeReadiness?: () => Promise<ApiReadiness>; refusedForMs?: number } = {},
): Promise<void> {
  const { clock = systemClock, homeReadiness = () => apiReadiness(home.config, home.requestTimeoutMs), refusedForMs = REFUSED_AT_START_MS } = options;
  const name = homeLeaseName(group);
  const where = `Lease ${home.namespace}/${name}`;
  const unusable = (problem: string, cause?: unknown): CertshareError =>
    new CertshareError('CERTSHARE_HOME_UNUSABLE', { where, problem }, { cause, refused: isRefusal(cause) });
  const unreachable = (why: string, err: unknown): void =>
    logger.warn({ code: 'CERTSHARE_STORE_UNAVAILABLE', err: apiErrorText(err) }, `federation home ${why} at start; serving the local copies`);
  const deadline = clock.now() + refusedForMs;
  for (let attempt = 1; ; attempt++) {
    try {
      await readAndDryRunLease(home, name, where, logger, unusable);
      return;
    } catch (err) {
      if (err instanceof CertshareError && err.code === 'CERTSHARE_HOME_UNUSABLE') throw err;
      if (isHomeOutage(err)) return unreachable('unreachable', err);
      const status = apiStatus(err);
      if (status === 404) throw unusable('does not exist: a group the home does not know (the platform creates its Lease)', err);
      if (!isRefusal(err)) throw unusable(`not an answer of a Kubernetes API: ${errorMessage(err)}`, err);
      const readiness = await homeReadiness();
      if (readiness === 'not_ready') return unreachable('not ready (it refused the check while starting up)', err);
      const rights = `the kubeconfig lacks the rights (get and update the Lease): ${apiErrorText(err)}`;
      if (readiness === 'ready') throw unusable(rights, err);
      // /readyz refused too: an apiserver whose policy is still loading, or a hardened one that shows it
      // to nobody; only time tells them apart, and a member must not run on for good without its rights.
      if (clock.now() >= deadline) throw unusable(`${rights} (refused for ${Math.round(refusedForMs / 1000)} s, /readyz too)`, err);
      logger.info({ where, attempt }, 'federation home refused the check and its /readyz: trying again');
      await clock.sleep(Math.min(doubling(250, attempt, 4000), Math.max(0, deadline - clock.now())));
    }
  }
}

const isRefusal = (err: unknown): boolean => apiStatus(err) === 401 || apiStatus(err) === 403;

/**
 * Reads the Lease and dry-runs its update. A conflict means another member's writer renewed the Lease
 * between the read and the dry run (members start together): read it again. Past the last attempt the
 * conflict stands as the answer: the update was authorized (the apiserver checks the resourceVersion after
 * RBAC), its admission is seen at the first real write.
 */
async function readAndDryRunLease(
  home: KubeConnection,
  name: string,
  where: string,
  logger: Logger,
  unusable: (problem: string) => CertshareError,
): Promise<void> {
  const api = makeApi(home.config, CoordinationV1Api, home.requestTimeoutMs);
  for (let attempt = 1; ; attempt++) {
    const lease = await api.readNamespacedLease({ name, namespace: home.namespace }, withSignal(AbortSignal.timeout(home.requestTimeoutMs)));
    if (lease?.metadata?.name !== name || typeof lease.spec !== 'object')
      throw unusable('the answer is not a Lease: is the kubeconfig pointed at an apiserver?');
    try {
      await api.replaceNamespacedLease({ name, namespace: home.namespace, body: lease, dryRun: 'All' }, withSignal(AbortSignal.timeout(home.requestTimeoutMs)));
      return;
    } catch (err) {
      if (apiStatus(err) !== 409) throw err;
      if (attempt === 3) {
        logger.warn({ where }, 'federation home: the Lease changed under each start-up check; its admission is checked at the first write');
        return;
      }
    }
  }
}
