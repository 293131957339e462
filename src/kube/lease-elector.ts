import { randomBytes } from 'node:crypto';
import { CoordinationV1Api, type V1Lease, V1MicroTime } from './transport/client-node.ts';
import { jitter } from '../core/issuance/backoff.ts';
import { type Clock, iso } from '../core/ports/clock.ts';
import { CertshareError } from '../core/errors.ts';
import type { Logger } from '../core/ports/logger.ts';
import type { IssuanceRole } from '../core/ports/store.ts';
import { boundLeaseDuration, nextLeaseTransitions, OutOfBoundsLog, type OutOfBoundsReport } from '../core/values/untrusted-values.ts';
import { apiErrorCode, apiErrorText, apiStatus, type KubeConnection } from './connection.ts';
import { makeApi, withSignal } from './transport/https-transport.ts';

/**
 * A Lease's MicroTime as client-node's V1MicroTime writes it (milliseconds, then 000), from iso(): not
 * through Date's toISOString, which would page in ICU's time zone data at the first renewal.
 * @forTests
 */
export class MicroTime extends V1MicroTime {
  override toISOString(): string {
    return `${iso(this.getTime()).slice(0, -1)}000Z`;
  }
}

/** client-node hands MicroTime back as a string or a Date, depending on the path. */
const stamp = (time: unknown): string => (time instanceof Date ? iso(time.getTime()) : String(time ?? ''));

/**
 * A Lease identity for this process: the Pod's name, readable in `kubectl get lease`, and a suffix of its
 * own. The Pod name alone is not unique: a StatefulSet's Pod deleted with --force comes back under the
 * same name while the old process may still run (a node that stopped answering keeps its containers),
 * and the new one, seeing its own name as the holder, renewed the Lease at once instead of waiting for it
 * to expire: two writers. Found on a real cluster (test/cluster/e2e, the writer force-deleted: the Lease went on
 * naming the Pod, now the recreated one, with no transition and no wait).
 */
export function leaseIdentity(podName: string): string {
  return `${podName}_${randomBytes(4).toString('hex')}`;
}

/** Which Lease, held by whom, for how long: what the elector is told, apart from what it is handed. */
interface LeaseSpec {
  /** The Lease's name: one per group. */
  name: string;
  identity: string;
  leaseDurationMs: number;
  /** How often the holder renews (client-go's default ratio: a third of the duration). */
  renewEveryMs?: number;
  /** How often a follower looks at the Lease. */
  retryEveryMs?: number;
  /**
   * A Lease that does not exist is an error instead of one to create (the federation home: the platform
   * creates one per group it knows; a member never makes up a group there).
   */
  mustExist?: boolean;
}

interface LeaseElectorDeps {
  connection: KubeConnection;
  clock: Clock;
  logger: Logger;
  onLeadershipChange?: (leader: boolean) => void;
  /** A holder's duration out of its bound (boundLeaseDuration), at each read: counted and told. */
  onOutOfBounds?: OutOfBoundsReport | undefined;
  /**
   * Why another holder has failed by its results, or undefined: a holder so judged is taken over at the next
   * look, whatever its renewTime says (the federation home, whose Lease a stolen credential can hold without
   * issuing: federation-home.ts). Other candidates judge alike: a compare-and-swap decides.
   */
  failedHolder?: () => string | undefined;
  /** A failed holder was taken over: who it was, and why. */
  onTakeOver?: (holder: string, reason: string) => void;
  /** Each write of the Lease: `failed` unless stored or lost to a newer version (409: the apiserver stores writes). */
  onWrite?: (failed: boolean) => void;
}

/**
 * Elects the writer of a group with a coordination.k8s.io/v1 Lease, the client-go way: take it when
 * it is free or its holder has not renewed for a whole duration *as measured on our own clock* (no
 * trust in other replicas' clocks); resourceVersion conflicts decide races. Leadership counts only
 * until the last successful renewal plus the duration: past that, canIssue() is false at once, whether
 * or not the API server can be reached. One attempt (read, then write) never outlasts the interval
 * between attempts, so an API server that stops answering cannot stretch the loop's timing.
 */
export class LeaseElector implements IssuanceRole {
  readonly identity: string;
  readonly #lease: Required<Omit<LeaseSpec, 'mustExist'>> & Pick<LeaseSpec, 'mustExist'>;
  readonly #deps: LeaseElectorDeps;
  readonly #api: CoordinationV1Api;
  readonly #listeners = new Set<() => void>();
  readonly #abort = new AbortController();
  #leaderUntil = 0;
  #observed: { key: string; at: number } | undefined;
  /** The Lease as our last write left it: a holder renews on it (compare-and-swap) without reading first. */
  #mine: V1Lease | undefined;
  #wasLeader = false;
  #done: Promise<void> | undefined;
  #expiryWatch: AbortController | undefined;
  /** Cuts the wait between two looks short (look()). */
  #nap = new AbortController();
  /** A holder's duration believed shorter than it says (boundLeaseDuration): logged once per value. */
  readonly #outOfBounds: OutOfBoundsLog;

  constructor(lease: LeaseSpec, deps: LeaseElectorDeps) {
    this.identity = lease.identity;
    this.#outOfBounds = new OutOfBoundsLog(deps.logger, (where, value) => deps.onOutOfBounds?.(where, value));
    this.#lease = {
      renewEveryMs: Math.max(100, Math.floor(lease.leaseDurationMs / 3)),
      retryEveryMs: Math.max(100, Math.floor(lease.leaseDurationMs / 3)),
      ...lease,
    };
    this.#deps = deps;
    this.#api = makeApi(deps.connection.config, CoordinationV1Api, deps.connection.requestTimeoutMs);
  }

  canIssue(): boolean {
    return this.#deps.clock.now() < this.#leaderUntil;
  }

  /**
   * Every candidate of the group, leader or not, may put back a certificate it holds that the Secret lost
   * (a restore: compare-and-swap on the object read, never an issuance) until it stops. A leader that lost
   * the Lease to API errors could not look before it went, and its successor may never have seen that
   * certificate (a hand edit right after a renewal): whoever still holds it repairs the Secret.
   */
  canWrite(): boolean {
    return !this.#abort.signal.aborted;
  }

  get isLeader(): boolean {
    return this.canIssue();
  }

  onChange(listener: () => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  start(): void {
    this.#done ??= this.#run();
  }

  /** Looks at the Lease now rather than at the next interval (a holder judged failed: failedHolder). */
  look(): void {
    this.#nap.abort();
  }

  /**
   * Stops campaigning; a holder releases the Lease so another replica takes over at once. The release is
   * best effort, given up when `signal` aborts (the shutdown budget); the Lease then simply expires.
   */
  async stop(signal?: AbortSignal): Promise<void> {
    this.#abort.abort();
    await this.#done;
    this.#expiryWatch?.abort();
    if (this.#leaderUntil > this.#deps.clock.now()) {
      this.#leaderUntil = 0;
      this.#notify();
      await this.#release(signal).catch((err: unknown) =>
        this.#deps.logger.warn({ err: apiErrorText(err), code: apiErrorCode(err) }, 'could not release the lease'),
      );
    }
  }

  async #run(): Promise<void> {
    const { clock, logger, connection } = this.#deps;
    while (!this.#abort.signal.aborted) {
      // A fixed cadence: an attempt gets at most one interval, and the next one starts an interval after
      // it began, so a holder whose API server stops answering still tries ~3 times per lease duration.
      const startedAt = clock.now();
      const intervalMs = jitter(this.canIssue() ? this.#lease.renewEveryMs : this.#lease.retryEveryMs, 0.1);
      try {
        const attempt = AbortSignal.timeout(Math.round(Math.min(intervalMs, connection.requestTimeoutMs)));
        await this.#tryAcquireOrRenew(AbortSignal.any([this.#abort.signal, attempt]));
      } catch (err) {
        if (this.#abort.signal.aborted) break;
        if (apiStatus(err) !== 409) logger.warn({ err: apiErrorText(err), code: apiErrorCode(err) }, 'lease update failed');
      }
      this.#notify();
      // A look asked for (look()) meanwhile ends the wait at once: the sleep rejects an aborted signal.
      await clock.sleep(Math.max(0, startedAt + intervalMs - clock.now()), AbortSignal.any([this.#abort.signal, this.#nap.signal])).catch(() => {});
      if (this.#nap.signal.aborted) this.#nap = new AbortController();
    }
  }

  async #tryAcquireOrRenew(signal: AbortSignal): Promise<void> {
    const { connection, clock } = this.#deps;
    const { name, leaseDurationMs } = this.#lease;
    const namespace = connection.namespace;
    const startedAt = clock.now();
    if (this.#mine && this.canIssue()) {
      const mine = this.#mine;
      this.#mine = undefined;
      try {
        this.#mine = await this.#replace(this.#leaseBody(mine, startedAt), signal);
        this.#won(startedAt);
        return;
      } catch (err) {
        // Changed since our last write (a takeover, the platform's annotation): read it, as a candidate does.
        if (apiStatus(err) !== 409) throw err;
      }
    }
    let lease: V1Lease | undefined;
    try {
      lease = await this.#api.readNamespacedLease({ name, namespace }, withSignal(signal));
    } catch (err) {
      if (apiStatus(err) !== 404) throw err;
    }
    if (!lease) {
      if (this.#lease.mustExist) {
        throw new CertshareError('CERTSHARE_HOME_UNUSABLE', { where: `Lease ${namespace}/${name}`, problem: 'does not exist: a group the home does not know' });
      }
      this.#mine = await this.#api.createNamespacedLease({ namespace, body: this.#leaseBody(undefined, startedAt) }, withSignal(signal));
      this.#won(startedAt);
      return;
    }
    const spec = lease.spec ?? {};
    const holder = spec.holderIdentity ?? '';
    // Expiry is judged by how long *we* have seen the same record, never by the holder's timestamps.
    const key = `${holder}|${stamp(spec.renewTime)}|${lease.metadata?.resourceVersion ?? ''}`;
    if (this.#observed?.key !== key) this.#observed = { key, at: clock.now() };
    const { ms: duration, refused } = boundLeaseDuration(spec.leaseDurationSeconds, leaseDurationMs);
    const transitions = nextLeaseTransitions(spec.leaseTransitions).refused;
    const ignored = [...(refused && holder !== this.identity ? [refused] : []), ...(transitions ? [transitions] : [])];
    this.#outOfBounds.read(`the Lease ${namespace}/${name}`, ignored);
    const free = holder === '' || clock.now() >= this.#observed.at + duration;
    const failed = holder === this.identity || free ? undefined : this.#deps.failedHolder?.();
    if (holder !== this.identity && !free && failed === undefined) {
      this.#leaderUntil = 0;
      return;
    }
    this.#mine = await this.#replace(this.#leaseBody(lease, startedAt), signal);
    if (failed !== undefined) this.#deps.onTakeOver?.(holder, failed);
    this.#won(startedAt);
  }

  /** An update of the Lease, told to onWrite (not when the elector stops: that is no answer of the apiserver). */
  async #replace(body: V1Lease, signal: AbortSignal): Promise<V1Lease> {
    const { connection, onWrite } = this.#deps;
    try {
      const written = await this.#api.replaceNamespacedLease({ name: this.#lease.name, namespace: connection.namespace, body }, withSignal(signal));
      onWrite?.(false);
      return written;
    } catch (err) {
      if (!this.#abort.signal.aborted) onWrite?.(apiStatus(err) !== 409);
      throw err;
    }
  }

  #leaseBody(current: V1Lease | undefined, now: number): V1Lease {
    const spec = current?.spec ?? {};
    const takingOver = spec.holderIdentity !== this.identity;
    return {
      apiVersion: 'coordination.k8s.io/v1',
      kind: 'Lease',
      metadata: {
        name: this.#lease.name,
        namespace: this.#deps.connection.namespace,
        ...(current?.metadata?.resourceVersion ? { resourceVersion: current.metadata.resourceVersion } : {}),
        // Someone else's labels and annotations stay (the platform's, at a federation home: its admission
        // policy refuses an update that drops them).
        ...(current?.metadata?.labels ? { labels: current.metadata.labels } : {}),
        ...(current?.metadata?.annotations ? { annotations: current.metadata.annotations } : {}),
      },
      spec: {
        holderIdentity: this.identity,
        leaseDurationSeconds: Math.max(1, Math.ceil(this.#lease.leaseDurationMs / 1000)),
        acquireTime: takingOver ? new MicroTime(now) : (spec.acquireTime ?? new MicroTime(now)),
        renewTime: new MicroTime(now),
        leaseTransitions: takingOver && current ? nextLeaseTransitions(spec.leaseTransitions).count : (spec.leaseTransitions ?? 0),
      },
    };
  }

  #won(startedAt: number): void {
    // Counted from before the request: the API server may have stored it at any moment after.
    this.#leaderUntil = startedAt + this.#lease.leaseDurationMs;
    // If renewals stop succeeding, the loops must hear that leadership ended the moment it does.
    this.#expiryWatch?.abort();
    const watch = new AbortController();
    this.#expiryWatch = watch;
    this.#deps.clock.sleep(Math.max(0, this.#leaderUntil - this.#deps.clock.now()) + 1, watch.signal).then(
      () => this.#notify(),
      () => {},
    );
  }

  async #release(signal: AbortSignal | undefined): Promise<void> {
    const { connection } = this.#deps;
    const { name } = this.#lease;
    const lease = await this.#api.readNamespacedLease({ name, namespace: connection.namespace }, withSignal(signal));
    if (lease.spec?.holderIdentity !== this.identity) return;
    lease.spec.holderIdentity = '';
    lease.spec.renewTime = undefined;
    await this.#api.replaceNamespacedLease({ name, namespace: connection.namespace, body: lease }, withSignal(signal));
  }

  #notify(): void {
    const leader = this.canIssue();
    if (leader !== this.#wasLeader) {
      this.#wasLeader = leader;
      this.#deps.logger.info({ lease: this.#lease.name, identity: this.identity }, leader ? 'became the writer' : 'no longer the writer');
      this.#deps.onLeadershipChange?.(leader);
      for (const listener of this.#listeners) listener();
    }
  }
}
