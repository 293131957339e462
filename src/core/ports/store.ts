import type { CertInfo } from '../certificates/certificate.ts';
import type { CertPair } from './localapi.ts';

/** How a kube replica watches its Secrets: one watch per Secret by name, or one per group by label. */
export type WatchScope = 'secret' | 'group';
/** --mode in Kubernetes mode: rw writes (issues), ro only reads, auto elects a writer with the group's Lease. */
export type ShareMode = 'rw' | 'ro' | 'auto';

export interface StoredCert {
  pair: CertPair;
  info: CertInfo;
  /**
   * When this process obtained the pair from tailscaled (epoch ms). Absent for a pair read from a store:
   * the renewal rule then measures from notBefore (see renewal.ts usableStart).
   */
  obtainedAt?: number;
}

/**
 * What a store holds for a domain. `unusable` (garbage, mismatched, expired, hand-edited) is distinct
 * from `absent`, and a failed read is neither: it throws CERTSHARE_STORE_UNAVAILABLE, and the loop never
 * answers a read failure with an issuance.
 */
export type StoreRead = (
  | { state: 'absent' }
  | { state: 'valid'; cert: StoredCert }
  /**
   * `empty`: the record exists but holds no pair at all, what a writer's intent looks like before its first
   * certificate (start-up, not damage: core/loop/startup-grace.ts). Garbage or half a pair is never `empty`.
   */
  | {
      state: 'unusable';
      reason: string;
      empty?: boolean;
      /**
       * The record's pair, whole and for the domain, only its validity ended: the name was issued before, so
       * its next issuance is a renewal (a replica restarted after its only copy expired, at a member cut off
       * from the ledger's home). Never served. Only a store that pins the issuer reports it: a pair anybody
       * can make must not take a name out of the first-issuance queue.
       */
      expired?: StoredCert;
    }
) & {
  coordination?: Coordination;
  /**
   * The certificate of record: the pair the record's writer last stored, as the record itself names it (a
   * Secret's serial and not-after annotations, which outlive a hand edit of its data). A replica that may not
   * issue puts back only this pair, or one that expires later (issuance-policy.ts mayRestore): a pair it holds
   * from before a renewal it never saw would bring back what the renewal replaced. Absent: the record names
   * none (deleted, or never written by certshare), or a store only its own writer writes (dir).
   */
  record?: RecordedCert;
  /**
   * The serials the record names as replaced because the CA asked for it now (SaveOptions.replacedNow), newest
   * first, comma-separated as read: the reader bounds it (untrusted-values.ts boundReplacedNow) before use.
   */
  replacedNow?: string;
  /**
   * The newest pair valid now that this store saw for the domain (a watch event, a list, a read or its
   * own write), when the read itself holds no pair as new: garbage, a key mismatch, a hand edit (an older
   * valid pair included), a deletion. The loop weighs it as it weighs a stored certificate, so a replica
   * that only now became the writer restores the newest pair known instead of an older one of its own,
   * which may be due: an issuance in a window that pair already covered. Never an expired pair.
   * A store that only its own writer ever writes to (dir) offers none: that loop holds all it stored.
   */
  lastValid?: StoredCert;
  /**
   * A pair stored for later (CertStore.savePending): whole, for the domain, not expired, valid only from its
   * notBefore (its issuer's clock ahead). The newest issuance of the name: no replica serves it before its
   * notBefore, and no writer orders the renewal it is (cert-loop.ts bounds how late it may start).
   */
  pending?: StoredCert;
};

/** What a record names as its certificate: the serial, and its notAfter (epoch ms) when readable. */
export interface RecordedCert {
  serial: string;
  notAfter: number | undefined;
}

/** What writers tell each other through the store, so no replica issues twice or early. */
export interface Coordination {
  /** A writer announced a CertPair call: who, and when (epoch ms). */
  intent?: { holder: string; at: number };
  /** No CertPair call before this instant (epoch ms): a rate limit any replica ran into. */
  retryNotBefore?: number;
  /**
   * An operator's renew request not answered yet (its id: asked, and no answer recorded for it). The
   * answer is recorded with the certificate that serves it, in the same write (SaveOptions.renewAnswer),
   * so a writer that restarts after the write finds it answered and issues nothing more for it.
   */
  renewRequest?: string;
}

/** The answer to a renew request, recorded on the store: the request's id and what became of it. */
export interface RenewAnswer {
  id: string;
  /** `issued <serial>`, or `refused <code> <reason>: <why>`. */
  outcome: string;
}

export interface SaveOptions {
  /** The renew request this certificate serves: its answer is written with the certificate, atomically. */
  renewAnswer?: RenewAnswer;
  /**
   * The serial of the certificate this one replaces because the CA asked for it now (ARI: a revocation): the
   * record names it (StoreRead.replacedNow) so that every replica counts it as bad if its proxy still serves it.
   */
  replacedNow?: string;
}

export interface LoadOptions {
  /**
   * Read from the source of truth, not from a copy a watch keeps: a reader whose certificate stayed due
   * longer than the writer needs to renew it doubts its copy (a watch stalled without failing).
   */
  fresh?: boolean;
}

/**
 * Every call takes the loop's signal and must end promptly once it aborts (the daemon is stopping); a
 * store behind a network also bounds each call with its own timeout, so no call can wedge a loop.
 */
export interface CertStore {
  readonly kind: string;
  load(domain: string, signal: AbortSignal, options?: LoadOptions): Promise<StoreRead>;
  /** Writes a validated pair. Throws CERTSHARE_STORE_CONFLICT when someone else wrote first. */
  save(domain: string, cert: StoredCert, signal: AbortSignal, options?: SaveOptions): Promise<void>;
  /**
   * Stores a pair valid only later beside the served one (never in its place: whatever mounts the record would
   * serve it at once), so a successor holds it rather than order the same renewal again. A later save() of a pair
   * that ends as late removes it. Compare-and-swap like save().
   */
  savePending?(domain: string, cert: StoredCert, signal: AbortSignal): Promise<void>;
  /** Records the answer to a renew request that issues nothing (a refusal); compare-and-swap like an intent. */
  recordRenewAnswer?(domain: string, answer: RenewAnswer, signal: AbortSignal): Promise<void>;
  /** Announces a CertPair call before it is made (compare-and-swap; CERTSHARE_STORE_CONFLICT if raced). */
  recordIntent?(domain: string, holder: string, at: number, signal: AbortSignal): Promise<void>;
  /** Withdraws this replica's intent after tailscaled answered with an error: others need not wait for it. */
  clearIntent?(domain: string, signal: AbortSignal): Promise<void>;
  /** Records that no CertPair call may happen before `until`, for every replica and for restarts. */
  recordRateLimit?(domain: string, until: number, signal: AbortSignal): Promise<void>;
  /** Calls `listener` whenever the stored pair may have changed (a reader's wake-up). */
  watch?(domain: string, listener: () => void): () => void;
}

/** Whether this replica may ask tailscaled for certificates (the writer) or only reads them. */
export interface IssuanceRole {
  /** Names this replica in intents and logs (the Pod name in Kubernetes). */
  readonly identity: string;
  canIssue(domain: string): boolean;
  /**
   * May write the store to put back a certificate it holds that the store lost (a restore, never an
   * issuance): the writer, also once it stopped issuing, and with a Lease any candidate of the group until
   * it stops (LeaseElector). Default: canIssue.
   */
  canWrite?(domain: string): boolean;
  /** Resolves when the role may have changed (e.g. a lease was won or lost). */
  onChange?(listener: () => void): () => void;
}

export function staticRole(identity: string, writer: boolean): IssuanceRole {
  return { identity, canIssue: () => writer };
}
