// A member's break-glass claims (docs/federation.md, "The home unreachable"). The record in the member's Secret
// says which window a break-glass issuance was spent in, but whoever may write that Secret (the sidecar's token,
// a tenant of the namespace with the default `edit` role) may also erase it: put the old pair back, drop the
// annotation, delete the Pods, and a cut-off member would break glass again in the same window. So before its
// writer issues on its own it creates a Lease named after the group, the name and the window: a create is
// atomic (AlreadyExists: the window is spent), and neither the sidecar's Role nor `edit`/`admin` may update or
// delete a Lease, so nothing that writes the Secret can give a window back.
import { createHash } from 'node:crypto';
import type { Clock } from '../core/ports/clock.ts';
import { CoordinationV1Api, V1MicroTime, type V1Lease } from './transport/client-node.ts';
import { apiStatus, type KubeConnection } from './connection.ts';
import { makeApi, withSignal } from './transport/https-transport.ts';

/**
 * The two claims of a window, names of 48 and 50 characters (a Lease name may have 253; the group, the name and
 * the serial, each bounded elsewhere, go through the hash, so no two windows share a name).
 * `first`: taken before the window's first break-glass call. `last`: taken once its certificate is stored
 * (closing the window), or by a successor of a writer that stored nothing (killed, or its CA failed until the
 * successor took over): that successor's one more call. Two Leases at most per window and member.
 * @forTests
 */
export function breakGlassClaimNames(group: string, domain: string, window: string | null): { first: string; last: string } {
  const digest = createHash('sha256')
    .update(`${group}\0${domain}\0${window ?? 'none'}`)
    .digest('hex')
    .slice(0, 32);
  const first = `certshare-glass-${digest}`;
  return { first, last: `${first}-2` };
}

/** What a claim attempt found: the window is this writer's to issue in, or spent. */
export type ClaimAnswer = 'claimed' | 'spent';

export class BreakGlassClaims {
  readonly #api: CoordinationV1Api;
  readonly #o: { connection: KubeConnection; group: string; identity: string; clock: Clock };

  constructor(options: { connection: KubeConnection; group: string; identity: string; clock: Clock }) {
    this.#o = options;
    this.#api = makeApi(options.connection.config, CoordinationV1Api, options.connection.requestTimeoutMs);
  }

  /** The window's two Leases, for logs. */
  names(domain: string, window: string | null): { first: string; last: string } {
    return breakGlassClaimNames(this.#o.group, domain, window);
  }

  /**
   * Takes the window: its first claim, else its last (the first claimant stored nothing since, or the window
   * would be closed). Anything else than a create or AlreadyExists (a refusal, a timeout, an apiserver error)
   * is thrown: no claim, no break-glass issuance.
   */
  async claim(domain: string, window: string | null): Promise<ClaimAnswer> {
    const names = breakGlassClaimNames(this.#o.group, domain, window);
    if (await this.#create(names.first, domain, window, 'first')) return 'claimed';
    return (await this.#create(names.last, domain, window, 'last')) ? 'claimed' : 'spent';
  }

  /** Closes the window once its certificate is stored: its last claim, taken (already taken is closed too). */
  async close(domain: string, window: string | null): Promise<void> {
    await this.#create(breakGlassClaimNames(this.#o.group, domain, window).last, domain, window, 'last');
  }

  /** Creates the Lease; false: it exists (409). */
  async #create(name: string, domain: string, window: string | null, which: 'first' | 'last'): Promise<boolean> {
    const { connection, identity, clock } = this.#o;
    const body: V1Lease = {
      apiVersion: 'coordination.k8s.io/v1',
      kind: 'Lease',
      metadata: {
        name,
        namespace: connection.namespace,
        labels: { 'app.kubernetes.io/managed-by': 'certshare', 'certshare.io/break-glass-claim': which },
        // For the person reading it: what the hash stands for.
        annotations: { 'certshare.io/break-glass-window': `${domain} replacing ${window ?? 'none'}` },
      },
      spec: { holderIdentity: identity, acquireTime: new V1MicroTime(clock.now()) },
    };
    try {
      await this.#api.createNamespacedLease({ namespace: connection.namespace, body }, withSignal(AbortSignal.timeout(connection.requestTimeoutMs)));
      return true;
    } catch (err) {
      if (apiStatus(err) === 409) return false;
      throw err;
    }
  }
}
