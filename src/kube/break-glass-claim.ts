// A member's break-glass claims (docs/federation.md, "The home unreachable"; docs/security.md, "Break-glass
// claims"). The record in the member's Secret says which window a break-glass issuance was spent in, but whoever
// may write that Secret (the sidecar's token, a tenant of the namespace with the default `edit` role) may also
// erase it: put the old pair back, drop the annotation, delete the Pods, and a cut-off member would break glass
// again in the same window. So before its writer issues on its own it creates a Lease named after the group, the
// name and the window: a create is atomic (AlreadyExists: the window is spent), and neither the sidecar's Role
// nor, with manifests/base's policy certshare-break-glass-claims, the namespace's roles may update or delete one,
// so nothing that writes the Secret gives a window back. Each claim records the notAfter of the copy it replaced
// (its closing one, of the certificate stored): a window older than those is a pair put back, never claimed.
import { createHash } from 'node:crypto';
import { unbelievedClaims, windowClaimable, type ClaimRead } from '../core/federation/home-verdicts.ts';
import { iso, type Clock } from '../core/ports/clock.ts';
import type { Logger } from '../core/ports/logger.ts';
import { OutOfBoundsLog, type UntrustedValue } from '../core/values/untrusted-values.ts';
import { CoordinationV1Api, V1MicroTime, type V1Lease } from './transport/client-node.ts';
import { apiStatus, type KubeConnection } from './connection.ts';
import { makeApi, withSignal } from './transport/https-transport.ts';

const LABEL_CLAIM = 'certshare.io/break-glass-claim';
/** The claims of one group and name, for the list by label. */
const LABEL_OF = 'certshare.io/break-glass-of';
const ANNOTATION_NOT_AFTER = 'certshare.io/break-glass-not-after';
/**
 * The claims read at once. Every claim of the name is read, however many: more Leases can only make a member hold
 * back, never issue (a cap was a switch: whoever may create Leases passed it, and every break-glass of the name
 * failed; docs/security.md). A page bounds what is held at once, a Lease being up to the apiserver's largest object.
 */
const CLAIMS_PAGE = 10;

const digest = (...parts: string[]): string => createHash('sha256').update(parts.join('\0')).digest('hex').slice(0, 32);

/**
 * The two claims of a window, names of 48 and 50 characters (a Lease name may have 253; the group, the name and
 * the serial, each bounded elsewhere, go through the hash, so no two windows share a name).
 * `first`: taken before the window's first break-glass call. `last`: taken once its certificate is stored
 * (closing the window), or by a successor of a writer that stored nothing (killed, or its CA failed until the
 * successor took over): that successor's one more call. Two Leases at most per window and member.
 * @forTests
 */
export function breakGlassClaimNames(group: string, domain: string, window: string | null): { first: string; last: string } {
  const first = `certshare-glass-${digest(group, domain, window ?? 'none')}`;
  return { first, last: `${first}-2` };
}

/** What a claim attempt found: the window is this writer's to issue in, spent, or older than one claimed before. */
export type ClaimAnswer = 'claimed' | 'spent' | 'superseded';

interface BreakGlassClaimsOptions {
  connection: KubeConnection;
  group: string;
  identity: string;
  clock: Clock;
  logger: Logger;
  /** A claim's time out of its bound, ignored: counted and told (certshare_out_of_bounds_values_total, an Event). */
  onOutOfBounds?: (where: string, value: UntrustedValue) => void;
}

export class BreakGlassClaims {
  readonly #api: CoordinationV1Api;
  readonly #o: BreakGlassClaimsOptions;
  readonly #outOfBounds: OutOfBoundsLog;

  constructor(options: BreakGlassClaimsOptions) {
    this.#o = options;
    this.#api = makeApi(options.connection.config, CoordinationV1Api, options.connection.requestTimeoutMs);
    this.#outOfBounds = new OutOfBoundsLog(options.logger, (where, value) => options.onOutOfBounds?.(where, value));
  }

  /** The window's two Leases, for logs. */
  names(domain: string, window: string | null): { first: string; last: string } {
    return breakGlassClaimNames(this.#o.group, domain, window);
  }

  /**
   * Takes the window of the copy `window` (its serial; null: none) valid over `validity`: its first claim, else
   * its last (the first claimant stored nothing since, or the window would be closed), unless an earlier claim
   * recorded a newer copy or certificate. Anything else than an answer (a refusal, a timeout, an apiserver error)
   * is thrown: no claim, no break-glass issuance.
   */
  async claim(domain: string, window: string | null, validity: { notBefore: number; notAfter: number } | undefined): Promise<ClaimAnswer> {
    if (!(await this.#claimable(domain, validity))) return 'superseded';
    const notAfter = validity?.notAfter;
    const names = this.names(domain, window);
    if (await this.#create(names.first, domain, window, 'first', notAfter)) return 'claimed';
    return (await this.#create(names.last, domain, window, 'last', notAfter)) ? 'claimed' : 'spent';
  }

  /** Closes the window once its certificate (expiring at `notAfter`) is stored: its last claim (taken: closed too). */
  async close(domain: string, window: string | null, notAfter: number): Promise<void> {
    await this.#create(this.names(domain, window).last, domain, window, 'last', notAfter);
  }

  /**
   * Whether the name's claims (listed by their label, page by page) leave the window of `validity` claimable:
   * windowClaimable over each page, the first that says no ends the list.
   */
  async #claimable(domain: string, validity: { notBefore: number; notAfter: number } | undefined): Promise<boolean> {
    const { connection, clock } = this.#o;
    const labelSelector = `${LABEL_OF}=${digest(this.#o.group, domain)}`;
    let page: string | undefined;
    do {
      const list = await this.#api.listNamespacedLease(
        { namespace: connection.namespace, labelSelector, limit: CLAIMS_PAGE, ...(page === undefined ? {} : { _continue: page }) },
        withSignal(AbortSignal.timeout(connection.requestTimeoutMs)),
      );
      const claims = (list.items ?? []).map((lease) => claimRead(lease, clock));
      const now = clock.now();
      this.#outOfBounds.read(`the break-glass claims of ${domain}`, unbelievedClaims(validity, claims, now));
      if (!windowClaimable(validity, claims, now)) return false;
      page = list.metadata?._continue || undefined;
    } while (page !== undefined);
    return true;
  }

  /** Creates the Lease; false: it exists (409). */
  async #create(name: string, domain: string, window: string | null, which: 'first' | 'last', notAfter: number | undefined): Promise<boolean> {
    const { connection, identity, clock, group } = this.#o;
    const body: V1Lease = {
      apiVersion: 'coordination.k8s.io/v1',
      kind: 'Lease',
      metadata: {
        name,
        namespace: connection.namespace,
        labels: { 'app.kubernetes.io/managed-by': 'certshare', [LABEL_CLAIM]: which, [LABEL_OF]: digest(group, domain) },
        annotations: {
          // For the person reading it: what the hash stands for.
          'certshare.io/break-glass-window': `${domain} replacing ${window ?? 'none'}`,
          ...(notAfter === undefined ? {} : { [ANNOTATION_NOT_AFTER]: iso(notAfter) }),
        },
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

/**
 * What a claim recorded, and when the apiserver created it, on `clock` (the stamp is in whole seconds: the end of
 * its second; none, which no apiserver sends: now).
 */
function claimRead(lease: V1Lease, clock: Clock): ClaimRead {
  const value = lease.metadata?.annotations?.[ANNOTATION_NOT_AFTER];
  const at = value !== undefined && value.length <= 30 ? Date.parse(value) : Number.NaN;
  const stamped = lease.metadata?.creationTimestamp?.getTime();
  const wall = stamped !== undefined && Number.isFinite(stamped) ? stamped + 999 : undefined;
  const created = wall === undefined ? clock.now() : (clock.atWallTime?.(wall) ?? wall);
  return { recorded: Number.isFinite(at) ? at : undefined, created };
}
