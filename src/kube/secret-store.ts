import { isCurrentlyValid } from '../core/certificates/certificate.ts';
import type { Clock } from '../core/ports/clock.ts';
import { CertshareError, errorMessage } from '../core/errors.ts';
import type { Logger } from '../core/ports/logger.ts';
import type { CertStore, Coordination, LoadOptions, RenewAnswer, SaveOptions, StoreRead, StoredCert, WatchScope } from '../core/ports/store.ts';
import { checkTrusted, type TrustAnchors } from '../core/certificates/trust.ts';
import { apiErrorText, apiStatus, isRefusedStatus, type KubeConnection } from './connection.ts';
import { withSignal } from './transport/https-transport.ts';
import {
  ANNOTATION_SERIAL,
  LABEL_GROUP,
  LABEL_MANAGED_BY,
  certSecret,
  readCertSecret,
  readCoordination,
  slimSecret,
  type SecretMeta,
  olderVersion,
  type WatchedSecret,
} from './secret-codec.ts';
import { SecretWatch } from './secret-watch.ts';

/** The label selector of a group's Secrets: the labels certSecret writes. @forTests */
export const groupSelector = (group: string): string => `${LABEL_MANAGED_BY}=certshare,${LABEL_GROUP}=${group}`;

/**
 * What a GET reports: its answer, unless the watch (or a write) brought a newer version while it was under way.
 * The older answer is old news: a reader would warn about an empty Secret it already saw filled.
 */
const newestOf = (answer: WatchedSecret | null, known: WatchedSecret | null | undefined): WatchedSecret | null =>
  olderVersion(answer, known) ? known! : answer;

/** A domain some loop follows: its listeners, and in `secret` scope the watch of its own Secret. */
interface Followed {
  listeners: Set<() => void>;
  watch?: SecretWatch;
}

/**
 * One `kubernetes.io/tls` Secret per domain, named after it. Every write is compare-and-swap on the
 * resourceVersion of the last read: a 409 surfaces as CERTSHARE_STORE_CONFLICT and the loop re-reads
 * and decides again. Any failed read is CERTSHARE_STORE_UNAVAILABLE, never "absent". Every call ends
 * when the loop's signal aborts, and within the connection's request timeout otherwise.
 *
 * Reads come from the watch. A followed domain's Secret is kept as the watch delivered it (and as this
 * store's own writes answered), and load() serves that while the watch is synced: at rest and on a
 * renewal a reader makes no GET at all. Why a cached object is safe:
 * - A stale object can cost a 409, never an extra issuance. A writer records its intent with a
 *   compare-and-swap write on the resourceVersion of the object its decision was made on (the last
 *   load(), kept apart from the cache, which the watch may move meanwhile) before every CertPair call;
 *   if the Secret changed since, that write fails with 409 and nothing is issued. After any failed
 *   write the next load() of that domain asks the API server (GET), so a 409 is not repeated from the
 *   same stale object.
 * - A watch that failed, ended in 410 Gone or has not listed yet is not synced: load() asks the API
 *   server (GET), as it did before this cache existed.
 * - "absent" comes only from a real 404 or from a synced list or watch that shows no such Secret (a
 *   DELETED event, or a list without it); never from an error.
 * - A GET or a write answered after the watch delivered a newer version (by resourceVersion) is older
 *   news: it neither replaces that version nor is what load() returns.
 * Nothing per domain is parsed ahead: the Secret's few KB are kept, the pair is validated on load().
 *
 * The last valid pair: per followed domain, the newest pair valid now that a watch event, a list, a GET
 * or this store's own write showed, kept (one StoredCert reference) to be offered by load() as
 * `lastValid` while the Secret holds garbage, a mismatched key, an older pair or nothing (StoreRead). The
 * watch may deliver a renewal and a hand edit over it together, so a reader's loop never reads the
 * renewal; should it become the writer, it restores that pair rather than its own older one, which may
 * be due. A pair is parsed when a Secret whose data changed replaces it (a renewal, a hand edit, a
 * deletion: rare), and kept if valid and newer than the one kept; load() keeps what it validated anyway.
 * Forgotten when it expires or no loop follows the domain any more. A restart starts with what this
 * replica projected before it (`earlierCopies`, its files, read once per domain at the first load()): a
 * pair only this Pod still had (a renewal a hand edit overwrote while every replica restarted) is not lost
 * with the process, and the writer restores it rather than an older one (or a mirrored home's older one);
 * never over a Secret whose record names a pair stored since (#adoptEarlierCopy).
 *
 * `trust` (a federated group's stores, kube-backend.ts): a pair whose chain reaches none of the anchors
 * (core/certificates/trust.ts) reads as `unusable`, is never kept as the last valid pair, and is never written.
 *
 * `watchScope`: `secret` (the default, least privilege) watches each domain's Secret by name, which
 * RBAC restricts with resourceNames; `group` lists and watches the group's Secrets with one label
 * selector (needs list and watch on every Secret of the namespace) and dispatches by name.
 */
/** Where a replica finds the copies it made before a restart (CertDirectory: its projected files). */
interface EarlierCopies {
  read(domain: string, now: number): Promise<StoreRead>;
}

interface SecretStoreOptions {
  connection: KubeConnection;
  clock: Clock;
  logger: Logger;
  group?: string | undefined;
  writer?: string | undefined;
  watchScope?: WatchScope;
  onError?: (operation: 'read' | 'write') => void;
  /** Each write of a domain's Secret: `failed` unless stored or lost to a newer version (409: the apiserver stores writes). */
  onWrite?: (domain: string, failed: boolean) => void;
  earlierCopies?: EarlierCopies | undefined;
  trust?: StoreTrust | undefined;
}

/** Issuer pinning (core/certificates/trust.ts): the anchors a stored pair must chain to, and who hears of one that does not. */
export interface StoreTrust {
  anchors: TrustAnchors;
  onUntrusted(domain: string, serial: string, reason: string): void;
}

export class KubeSecretStore implements CertStore {
  readonly kind = 'kube';
  readonly #conn: KubeConnection;
  readonly #clock: Clock;
  readonly #logger: Logger;
  readonly #meta: SecretMeta;
  readonly #scope: WatchScope;
  /** What the last load() or write of each domain saw (null: absent): the base of the next compare-and-swap. */
  readonly #lastRead = new Map<string, WatchedSecret | null>();
  /**
   * Secrets as their watch delivered them, or as a write or a GET answered (null: absent). Secret scope:
   * the followed domains'; group scope: every Secret of the group (what a replica of the group follows).
   */
  readonly #cache = new Map<string, WatchedSecret | null>();
  /** Per domain, the newest valid pair seen (see the class comment). */
  readonly #lastValid = new Map<string, StoredCert>();
  /** Where this replica's earlier copies are (its projected files), and the domains already read from there. */
  readonly #earlierCopies: EarlierCopies | undefined;
  readonly #earlierRead = new Set<string>();
  /** Earlier copies not taken yet: the Secret's record names another pair, which may be newer (#adoptEarlierCopy). */
  readonly #earlierCopy = new Map<string, StoredCert>();
  /** An earlier copy that had expired (from a pinned issuer only): the name was held, whatever the Secret holds now. */
  readonly #earlierExpired = new Map<string, StoredCert>();
  /** Domains whose last write failed: the cache may be behind, the next load() asks the API server. */
  readonly #stale = new Set<string>();
  readonly #followed = new Map<string, Followed>();
  #groupWatch: SecretWatch | undefined;
  readonly #onError: (operation: 'read' | 'write') => void;
  readonly #onWrite: (domain: string, failed: boolean) => void;
  readonly #trust: StoreTrust | undefined;
  readonly #judge: TrustJudge;
  /** GETs of a single Secret made by load() (a watch that serves reads makes none at rest). */
  gets = 0;

  constructor(options: SecretStoreOptions) {
    this.#trust = options.trust;
    this.#conn = options.connection;
    this.#clock = options.clock;
    this.#logger = options.logger;
    this.#meta = { namespace: options.connection.namespace, group: options.group, writer: options.writer };
    this.#scope = options.watchScope ?? 'secret';
    if (this.#scope === 'group' && !options.group) throw new CertshareError('CERTSHARE_BAD_CONFIG', { source: 'watch scope group', reason: 'needs a group' });
    this.#onError = options.onError ?? (() => {});
    this.#onWrite = options.onWrite ?? (() => {});
    this.#earlierCopies = options.earlierCopies;
    this.#judge = new TrustJudge(this.#trust, this.#logger, this.#conn.namespace);
  }

  /**
   * Group scope: lists the group's Secrets once, awaited, then watches them. A 401/403 means the Role does
   * not allow it: a CERTSHARE_BAD_CONFIG error with a hint (a start-up check). Another failure (the API
   * server unreachable) is left to the watch's own retries. Secret scope: nothing to do ahead.
   */
  async start(): Promise<void> {
    if (this.#scope !== 'group' || this.#groupWatch) return;
    const watch = this.#makeGroupWatch();
    this.#groupWatch = watch;
    try {
      await watch.prime();
    } catch (err) {
      const status = apiStatus(err);
      if (status === 401 || status === 403) {
        this.#groupWatch = undefined;
        throw groupListRefused(this.#conn.namespace, err);
      }
      this.#logger.warn({ code: 'CERTSHARE_STORE_UNAVAILABLE', err: apiErrorText(err) }, 'cannot list the group Secrets yet; the watch retries');
    }
    watch.start();
  }

  async load(domain: string, signal?: AbortSignal, options?: LoadOptions): Promise<StoreRead> {
    // `fresh`: the caller doubts the watched copy (see LoadOptions): ask the API server.
    let secret = options?.fresh ? undefined : this.#watched(domain);
    const watch = options?.fresh ? undefined : this.#watchOf(domain);
    // A watch just started is listing: its answer is as fresh as a GET, and a GET beside it would double
    // the start-up requests (a failed or finished first list settles at once).
    if (secret === undefined && watch && (await unlessAborted(watch.firstList, signal))) secret = this.#watched(domain);
    if (secret === undefined) {
      try {
        this.gets++;
        const answer = slimSecret(await this.#conn.core.readNamespacedSecret({ name: domain, namespace: this.#conn.namespace }, withSignal(signal))) ?? null;
        secret = newestOf(answer, this.#cache.get(domain));
      } catch (err) {
        if (apiStatus(err) !== 404) {
          this.#onError('read');
          throw secretUnavailable('read', this.#conn.namespace, domain, err);
        }
        secret = null;
      }
      this.#remember(domain, secret);
      this.#stale.delete(domain);
    }
    this.#lastRead.set(domain, secret);
    const now = this.#clock.now();
    await this.#readEarlierCopy(domain);
    const stored: StoreRead = secret === null ? { state: 'absent' } : this.#trusted(domain, readCertSecret(secret, domain, now), true);
    const read = withEarlierExpired(stored, this.#earlierExpired.get(domain));
    if (read.state === 'valid') this.#keepValid(domain, read.cert);
    this.#adoptEarlierCopy(domain, secret, read);
    const kept = this.#lastValid.get(domain);
    if (kept && !isCurrentlyValid(kept.info, now)) this.#lastValid.delete(domain);
    if (!kept || !isCurrentlyValid(kept.info, now)) return read;
    return read.state === 'valid' && read.cert.info.notAfter >= kept.info.notAfter ? read : { ...read, lastValid: kept };
  }

  /** `annotations`: set beside the certificate's own (the federation's break-glass record). */
  async save(domain: string, cert: StoredCert, signal?: AbortSignal, options?: SaveOptions & { annotations?: Record<string, string> }): Promise<void> {
    // Never written where every reader would refuse it (a member pushing to the home included).
    if (this.#trust) checkTrusted(cert.pair.certPem, domain, this.#trust.anchors);
    // A new certificate ends any intent; a rate limit still in force stays recorded.
    const { retryNotBefore } = this.#lastCoordination(domain);
    const coordination = retryNotBefore !== undefined && retryNotBefore > this.#clock.now() ? { retryNotBefore } : {};
    const { renewAnswer, replacedNow, annotations } = options ?? {};
    await this.#write(domain, { cert, coordination, renewAnswer, replacedNow, annotations }, signal);
    this.#keepValid(domain, cert);
  }

  /** Stores a pair valid only later beside the served one (CertStore.savePending), on the last read; `annotations` as save's. */
  async savePending(domain: string, cert: StoredCert, signal?: AbortSignal, options?: { annotations?: Record<string, string> }): Promise<void> {
    if (this.#trust) checkTrusted(cert.pair.certPem, domain, this.#trust.anchors);
    await this.#write(domain, { pending: cert, coordination: this.#lastCoordination(domain), annotations: options?.annotations }, signal);
  }

  /** The answer to a renew request that issued nothing (a refusal), on the last read (compare-and-swap). */
  recordRenewAnswer(domain: string, answer: RenewAnswer, signal?: AbortSignal): Promise<void> {
    return this.#write(domain, { coordination: this.#lastCoordination(domain), renewAnswer: answer }, signal);
  }

  recordIntent(domain: string, holder: string, at: number, signal?: AbortSignal): Promise<void> {
    return this.#write(domain, { coordination: { ...this.#lastCoordination(domain), intent: { holder, at } } }, signal);
  }

  clearIntent(domain: string, signal?: AbortSignal): Promise<void> {
    const { intent: _withdrawn, ...rest } = this.#lastCoordination(domain);
    return this.#write(domain, { coordination: rest }, signal);
  }

  recordRateLimit(domain: string, until: number, signal?: AbortSignal): Promise<void> {
    const { intent: _ended, ...rest } = this.#lastCoordination(domain);
    return this.#write(domain, { coordination: { ...rest, retryNotBefore: until } }, signal);
  }

  /** Removes an annotation of the domain's Secret (compare-and-swap on the last read); the pair and coordination stay. */
  removeAnnotation(domain: string, name: string, signal?: AbortSignal): Promise<void> {
    return this.#write(domain, { coordination: this.#lastCoordination(domain), annotations: { [name]: null } }, signal);
  }

  /** An annotation of the domain's Secret as the last load() or write saw it. */
  annotation(domain: string, name: string): string | undefined {
    return this.#lastRead.get(domain)?.metadata.annotations?.[name];
  }

  watch(domain: string, listener: () => void): () => void {
    let followed = this.#followed.get(domain);
    if (!followed) {
      followed = { listeners: new Set() };
      this.#followed.set(domain, followed);
      if (this.#scope === 'secret') {
        followed.watch = new SecretWatch({
          connection: this.#conn,
          name: domain,
          clock: this.#clock,
          logger: this.#logger,
          onList: (secrets) => this.#listed(domain, secrets.find((s) => s.metadata.name === domain) ?? null),
          onEvent: (type, secret) => this.#remember(domain, type === 'DELETED' ? null : secret),
          onChange: () => this.#notify(domain),
        });
        followed.watch.start();
      } else if (!this.#groupWatch) {
        // start() was not called (tests using the store alone): the watch lists on its own.
        this.#groupWatch = this.#makeGroupWatch();
        this.#groupWatch.start();
      }
    }
    const listeners = followed.listeners;
    listeners.add(listener);
    return () => {
      listeners.delete(listener);
      if (listeners.size > 0 || this.#followed.get(domain) !== followed) return;
      this.#followed.delete(domain);
      this.#stale.delete(domain);
      this.#lastValid.delete(domain);
      this.#earlierRead.delete(domain);
      this.#earlierCopy.delete(domain);
      if (!followed.watch) return; // group scope: the group watch keeps the Secret current
      this.#cache.delete(domain);
      void followed.watch.stop();
    };
  }

  async stop(): Promise<void> {
    const watches = [...this.#followed.values()].flatMap((f) => (f.watch ? [f.watch] : []));
    if (this.#groupWatch) watches.push(this.#groupWatch);
    await Promise.all(watches.map((w) => w.stop()));
  }

  /** The watch that follows the domain's Secret, if any. */
  #watchOf(domain: string): SecretWatch | undefined {
    return this.#scope === 'group' ? this.#groupWatch : this.#followed.get(domain)?.watch;
  }

  /** The domain's Secret as the synced watch knows it (null: absent); undefined when load() must ask. */
  #watched(domain: string): WatchedSecret | null | undefined {
    if (this.#stale.has(domain) || !this.#watchOf(domain)?.synced) return undefined;
    // The group watch holds the whole group: a Secret it has not delivered is not in the group.
    return this.#scope === 'group' ? (this.#cache.get(domain) ?? null) : this.#cache.get(domain);
  }

  /** Keeps what a watch event, a GET or a write answered (secret scope: for a followed domain only). */
  #remember(domain: string, secret: WatchedSecret | null): void {
    if (olderVersion(secret, this.#cache.get(domain))) return; // a GET or a write answered after the watch moved on
    this.#superseded(domain, this.#cache.get(domain), secret);
    if (this.#scope === 'group' && secret === null) this.#cache.delete(domain);
    else if (this.#scope === 'group' || this.#followed.has(domain)) this.#cache.set(domain, secret);
  }

  /** A list is a fresh snapshot: it replaces what was known, including after a failed write. */
  #listed(domain: string, secret: WatchedSecret | null): void {
    this.#remember(domain, secret);
    this.#stale.delete(domain);
  }

  #notify(domain: string): void {
    for (const listener of this.#followed.get(domain)?.listeners ?? []) listener();
  }

  #makeGroupWatch(): SecretWatch {
    return new SecretWatch({
      connection: this.#conn,
      labelSelector: groupSelector(this.#meta.group!), // the constructor checked it
      clock: this.#clock,
      logger: this.#logger,
      onList: (secrets) => {
        // The group as it is now: replaces everything known, GET answers and failed writes included.
        const listed = new Map(secrets.map((secret) => [secret.metadata.name, secret]));
        for (const domain of this.#followed.keys()) this.#superseded(domain, this.#cache.get(domain), listed.get(domain) ?? null);
        this.#cache.clear();
        this.#stale.clear();
        for (const [name, secret] of listed) this.#cache.set(name, secret);
        for (const domain of [...this.#followed.keys()]) this.#notify(domain);
      },
      onEvent: (type, secret) => {
        const domain = secret.metadata.name;
        this.#remember(domain, type === 'DELETED' ? null : secret);
        this.#notify(domain);
      },
    });
  }

  /**
   * `previous` (what was known of a followed domain's Secret) gives way to `next`: if the pair changed,
   * the one leaving may be the newest valid pair this replica will have seen (a renewal a hand edit
   * overwrote before any load() read it), so it is parsed, once, and kept if so.
   */
  #superseded(domain: string, previous: WatchedSecret | null | undefined, next: WatchedSecret | null): void {
    if (!previous?.data || !this.#followed.has(domain)) return; // only what some loop follows is kept
    const data = previous.data;
    if (next?.data?.['tls.crt'] === data['tls.crt'] && next?.data?.['tls.key'] === data['tls.key']) return;
    const read = this.#trusted(domain, readCertSecret(previous, domain, this.#clock.now()), false);
    if (read.state === 'valid') this.#keepValid(domain, read.cert);
  }

  /** Once per followed domain: the pair this replica projected before (its files) joins the last valid pair. */
  async #readEarlierCopy(domain: string): Promise<void> {
    if (!this.#earlierCopies || this.#earlierRead.has(domain) || !this.#followed.has(domain)) return;
    this.#earlierRead.add(domain);
    try {
      const read = this.#trusted(domain, await this.#earlierCopies.read(domain, this.#clock.now()), false);
      if (read.state === 'valid') this.#earlierCopy.set(domain, read.cert);
      else if (read.state === 'unusable' && read.expired) this.#earlierExpired.set(domain, read.expired);
    } catch (err) {
      this.#logger.warn({ domain, err: errorMessage(err) }, 'could not read the earlier copy of the certificate');
    }
  }

  /**
   * The earlier copy joins the last valid pair unless the Secret, without a valid pair, names another (its serial
   * annotation outlives a hand edit; a deleted Secret names none): older files over a renewal this replica never
   * saw would bring back what it replaced (a revoked pair, a key renewed away). A valid Secret decides by expiry.
   */
  #adoptEarlierCopy(domain: string, secret: WatchedSecret | null, read: StoreRead): void {
    const copy = this.#earlierCopy.get(domain);
    if (!copy) return;
    const named = secret?.metadata.annotations?.[ANNOTATION_SERIAL];
    if (read.state !== 'valid' && named !== undefined && named !== copy.info.serial) return;
    this.#earlierCopy.delete(domain);
    this.#keepValid(domain, copy);
  }

  /**
   * With trust anchors: a valid pair whose chain does not reach them is unusable (never served, kept or
   * offered as lastValid), and a pair for later (StoreRead.pending) no pair; each reported once when `report`.
   */
  #trusted(domain: string, whole: StoreRead, report: boolean): StoreRead {
    const { pending, ...read } = whole;
    const later = pending && this.#judge.reason(`${domain} pending`, domain, pending, report) === undefined ? { pending } : {};
    if (read.state === 'unusable' && read.expired) return { ...trustedExpired(read, domain, this.#trust), ...later };
    if (read.state !== 'valid') return { ...read, ...later };
    const reason = this.#judge.reason(domain, domain, read.cert, report);
    if (reason === undefined) return { ...read, ...later };
    return { state: 'unusable', reason, ...(read.coordination ? { coordination: read.coordination } : {}), ...later };
  }

  /** Keeps `cert` as a followed domain's last valid pair unless the one kept expires as late or later. */
  #keepValid(domain: string, cert: StoredCert): void {
    if (!this.#followed.has(domain)) return;
    const kept = this.#lastValid.get(domain);
    if (!kept || kept.info.notAfter < cert.info.notAfter) this.#lastValid.set(domain, cert);
  }

  #lastCoordination(domain: string): Coordination {
    const seen = this.#lastRead.get(domain);
    return seen ? readCoordination(seen) : {};
  }

  async #write(domain: string, change: Parameters<typeof certSecret>[3], signal: AbortSignal | undefined): Promise<void> {
    const { core, namespace } = this.#conn;
    const seen = this.#lastRead.get(domain);
    if (seen === undefined) throw secretChanged(namespace, domain, 'written before it was read');
    const body = certSecret(domain, seen ?? undefined, this.#meta, change);
    try {
      const written =
        seen === null
          ? await core.createNamespacedSecret({ namespace, body }, withSignal(signal))
          : await core.replaceNamespacedSecret({ name: domain, namespace, body }, withSignal(signal));
      this.#onWrite(domain, false);
      const answer = slimSecret(written) ?? null;
      this.#lastRead.set(domain, answer);
      // Newer than anything the watch delivered so far; its own event for this write follows.
      this.#remember(domain, answer);
    } catch (err) {
      // Whatever happened, the next write must follow a fresh read, from the API server.
      this.#lastRead.delete(domain);
      this.#stale.add(domain);
      if (!signal?.aborted) this.#onWrite(domain, apiStatus(err) !== 409);
      if (apiStatus(err) === 409 || apiStatus(err) === 404) throw secretChanged(namespace, domain, err);
      this.#onError('write');
      throw secretUnavailable('write', namespace, domain, err);
    }
  }
}

/** Issuer pinning's verdicts on the pairs a store reads, an untrusted pair reported once (not at every read). */
class TrustJudge {
  readonly #trust: StoreTrust | undefined;
  readonly #logger: Logger;
  readonly #namespace: string;
  /** Per place (a domain's served pair, its pair for later), the serial of the untrusted pair last reported. */
  readonly #reported = new Map<string, string>();

  constructor(trust: StoreTrust | undefined, logger: Logger, namespace: string) {
    [this.#trust, this.#logger, this.#namespace] = [trust, logger, namespace];
  }

  /** Why `cert` (read at `place`) is not trusted; undefined when it is, or when nothing is pinned. */
  reason(place: string, domain: string, cert: StoredCert, report: boolean): string | undefined {
    if (!this.#trust) return undefined;
    const { serial } = cert.info;
    const reason = untrustedReason(cert.pair.certPem, domain, this.#trust.anchors);
    if (!report) return reason;
    if (reason === undefined) this.#reported.delete(place);
    else if (this.#reported.get(place) !== serial) {
      this.#reported.set(place, serial);
      this.#logger.warn({ code: 'CERTSHARE_CERT_UNTRUSTED', domain, serial, namespace: this.#namespace }, reason);
      this.#trust.onUntrusted(domain, serial, reason);
    }
    return reason;
  }
}

/** `promise`'s value, or false as soon as `signal` aborts. */
function unlessAborted(promise: Promise<boolean>, signal: AbortSignal | undefined): Promise<boolean> {
  if (!signal) return promise;
  if (signal.aborted) return Promise.resolve(false);
  return new Promise((resolve) => {
    const aborted = () => resolve(false);
    signal.addEventListener('abort', aborted, { once: true });
    void promise.then((value) => {
      signal.removeEventListener('abort', aborted);
      resolve(value);
    });
  });
}

/** Group scope's start-up check: the Role does not let certshare list and watch the namespace's Secrets. */
function groupListRefused(namespace: string, err: unknown): CertshareError {
  const reason =
    `needs list and watch on Secrets in namespace ${namespace}: ${apiErrorText(err)} ` +
    '(grant the Role certshare-group-reader of manifests/group-scope, or use --watch-scope secret)';
  return new CertshareError('CERTSHARE_BAD_CONFIG', { source: '--watch-scope group', reason }, { cause: err });
}

/** A compare-and-swap write found Secret `namespace/domain` changed (409) or gone (404) since its last read, or never read it. */
function secretChanged(namespace: string, domain: string, err: unknown): CertshareError {
  const detail = typeof err === 'string' ? err : apiErrorText(err);
  return new CertshareError(
    'CERTSHARE_STORE_CONFLICT',
    { object: `Secret ${namespace}/${domain}`, detail },
    typeof err === 'string' ? undefined : { cause: err },
  );
}

/** A GET or a write of Secret `namespace/domain` failed for another reason than its absence or a conflict. */
function secretUnavailable(verb: 'read' | 'write', namespace: string, domain: string, err: unknown): CertshareError {
  return new CertshareError(
    'CERTSHARE_STORE_UNAVAILABLE',
    { action: verb, object: `Secret ${namespace}/${domain}`, cause: apiErrorText(err) },
    {
      cause: err,
      refused: isRefusedStatus(err),
    },
  );
}

/** Why the certificate's chain does not reach the trust anchors, or undefined when it does. */
function untrustedReason(certPem: string, domain: string, anchors: TrustAnchors): string | undefined {
  try {
    checkTrusted(certPem, domain, anchors);
    return undefined;
  } catch (err) {
    return errorMessage(err);
  }
}

/**
 * A Secret whose data no longer holds a pair (a hand edit) over the copy this replica projected, which had
 * expired: that copy still says the name was held (StoreRead's `expired`, from a pinned issuer only).
 */
function withEarlierExpired(read: StoreRead, earlier: StoredCert | undefined): StoreRead {
  return earlier && read.state === 'unusable' && !read.expired && !read.empty ? { ...read, expired: earlier } : read;
}

/** An expired pair says the name was held only if its issuer is pinned and it chains to an anchor (StoreRead). @forTests */
export function trustedExpired(read: StoreRead & { state: 'unusable' }, domain: string, trust: StoreTrust | undefined): StoreRead {
  const { expired, ...rest } = read;
  return trust && expired && untrustedReason(expired.pair.certPem, domain, trust.anchors) === undefined ? read : rest;
}
