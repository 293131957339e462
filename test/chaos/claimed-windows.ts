// A federated member's break-glass issuance is known from its writer's log ("break-glass: issued", once the
// certificate is stored) or its Secret's record. A writer that obtained the certificate and then lost its store
// (the apiserver down, the Lease gone, killed) logs neither, and its issuance would count as a second one in
// the window (invariant 1): yet it claimed the window first ("break-glass: window claimed", before the call).
// So a claim stands for the claiming process's next issuance of that name: one issuance per claim, none after
// the process ended (a successor claims again before it calls).
import type { Issuance } from './ledger.ts';

interface Claim {
  /** The member (its index) whose writer claimed. */
  member: number;
  replica: string;
  domain: string;
  window: string;
  at: number;
  /** When the claiming process ended (its replica logged a new start): no issuance of it after that. */
  endedAt?: number;
  usedBy?: string;
}

export class ClaimedWindows {
  readonly #claims: Claim[] = [];

  /** `replica` of member `member` logged "break-glass: window claimed" for `domain`, window `window`, at `at`. */
  claimed(member: number, replica: string, domain: string, window: string, at: number): void {
    this.#claims.push({ member, replica, domain, window, at });
  }

  /** `replica` started a new process at `at`: the claims of its earlier ones stand for nothing more. */
  started(replica: string, at: number): void {
    for (const c of this.#claims) if (c.replica === replica && c.endedAt === undefined && c.at <= at) c.endedAt = at;
  }

  /**
   * The window claimed for `issuance`: its replica's latest claim of the name before it, of the same process,
   * not yet taken by another issuance (then taken by this one). Undefined: no claim stands for it.
   */
  take(issuance: Issuance): { member: number; window: string } | undefined {
    const claim = this.#claims
      .filter((c) => c.replica === issuance.emulator && c.domain === issuance.domain && c.at <= issuance.time && (c.endedAt ?? Infinity) > issuance.time)
      .at(-1);
    if (!claim || (claim.usedBy !== undefined && claim.usedBy !== issuance.serial)) return undefined;
    claim.usedBy = issuance.serial;
    return { member: claim.member, window: claim.window };
  }
}
