import type { CertInfo } from './certificate.ts';
import type { CertPair } from './localapi.ts';

export interface StoredCert {
  pair: CertPair;
  info: CertInfo;
}

/**
 * What a store holds for a domain. `unusable` (garbage, mismatched, expired, hand-edited) is distinct
 * from `absent`, and a failed read is neither: it throws CERTSHARE_STORE_UNAVAILABLE, and the loop never
 * answers a read failure with an issuance.
 */
export type StoreRead =
  | { state: 'absent' }
  | { state: 'valid'; cert: StoredCert }
  | { state: 'unusable'; reason: string };

export interface CertStore {
  readonly kind: string;
  load(domain: string, signal: AbortSignal): Promise<StoreRead>;
  /** Writes a validated pair. Throws CERTSHARE_STORE_CONFLICT when someone else wrote first. */
  save(domain: string, cert: StoredCert, signal: AbortSignal): Promise<void>;
  /** Calls `listener` whenever the stored pair may have changed (a reader's wake-up). */
  watch?(domain: string, listener: () => void): () => void;
}

/** Whether this replica may ask tailscaled for certificates (the writer) or only reads them. */
export interface IssuanceRole {
  canIssue(domain: string): boolean;
  /** Resolves when the role may have changed (e.g. a lease was won or lost). */
  onChange?(listener: () => void): () => void;
}

export const alwaysWriter: IssuanceRole = { canIssue: () => true };
export const alwaysReader: IssuanceRole = { canIssue: () => false };
