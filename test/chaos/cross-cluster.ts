// Invariant 2 across the clusters of a federated run (issue 40): a replica whose files hold an expired pair
// while its member's Secret holds none valid, and a valid pair existed that the member could have had. What
// it could have had depends on its way to the home: open, the home's pair of record (mirrored into the
// member's Secret by its writer, then to its files: two hops, twice the grace); cut off, its own break-glass issuance,
// which a member whose CA refused every call since the copy's renewal point cannot make (an injected fault
// is the CA's doing, not certshare's), and a member whose writer made no call at all should have.
import type { HomeLink } from './home.ts';
import { iso, renewalPoint, type CertRequest, type Issuance } from './ledger.ts';
import type { CertView } from './observers.ts';
import type { ValidElsewhere } from './secret-board.ts';

export interface ExpiredCopyFacts {
  now: number;
  graceMs: number;
  /** The replica's files: an expired pair whose key matches. */
  files: CertView;
  /** The latest of: files bad since, the replica ready, the API reachable, its Secret reads through. */
  from: number;
  link: HomeLink;
  /** How long a member may take to learn that its way to the home is cut: its kube request timeout. */
  noticeMs: number;
  /** Since when the member has had a writer (undefined: none now, nobody to break glass). */
  writerSince: number | undefined;
  /** A valid pair of the home's Secret of record, and one of any other Secret (the home's included). */
  home: ValidElsewhere | undefined;
  elsewhere: ValidElsewhere | undefined;
  /** The member's own CertPair calls and issuances of the domain (its replicas' emulators). */
  requests: readonly CertRequest[];
  issuances: readonly Issuance[];
}

/** Why the member should not hold an expired copy any more (the violation's text after "projects expired ..."), or undefined. */
export function needlessExpiry(f: ExpiredCopyFacts): string | undefined {
  const { now, link } = f;
  const late = (since: number): boolean => now - Math.max(since, f.from) > 2 * f.graceMs;
  if (link.open) {
    // Its writer mirrors the home's pair into its Secret: none while its writers are killed.
    const home = f.home;
    if (!home || f.writerSince === undefined || !late(Math.max(home.since, link.since, f.writerSince))) return undefined;
    return (
      `while its own Secret holds none valid and the Secret at home holds valid serial ${home.serial.slice(0, 8)} since ${iso(home.since)} ` +
      `(its way to the home open since ${iso(link.since)}, its writer since ${iso(f.writerSince)})`
    );
  }
  const cutFrom = Math.max(link.since, renewalPoint(f.files));
  const own = f.issuances.find((i) => i.time >= cutFrom && i.notBefore <= now && now < i.notAfter);
  if (own) {
    if (!late(own.time)) return undefined;
    return (
      `while its own Secret holds none valid and its member's CA issued serial ${own.serial.slice(0, 8)} at ${iso(own.time)} ` +
      `(cut off from the home since ${iso(link.since)})`
    );
  }
  const elsewhere = f.elsewhere;
  if (!elsewhere || f.writerSince === undefined || f.requests.some((r) => r.time >= cutFrom)) return undefined;
  // A member learns it is cut off when a request to the home fails: at worst one request timeout after the cut.
  if (!late(Math.max(link.since + f.noticeMs, f.files.notAfter, f.writerSince))) return undefined;
  return (
    `while its own Secret holds none valid, its member cut off from the home since ${iso(link.since)} made no CertPair call since ${iso(cutFrom)}, ` +
    `and the Secret at ${elsewhere.where} holds valid serial ${elsewhere.serial.slice(0, 8)} since ${iso(elsewhere.since)}`
  );
}

/**
 * Invariant 1 across the clusters: `cover`, issued in member `coverMember` (0-based), stranded there when that
 * member was cut off from the home from at most `graceMs` after its CA answered until `extra` was issued by a
 * writer of another member (`extraMember`). Nobody outside could know of `cover`: the home's copy ran out, and
 * the home's writer renewed it (seed 53). The cut, for the report, or undefined when `cover` could have been known.
 */
export function strandedIn(
  cover: Issuance,
  coverMember: number | undefined,
  extra: Issuance,
  extraMember: number | undefined,
  linkAt: (member: number, t: number) => HomeLink,
  graceMs: number,
): string | undefined {
  if (coverMember === undefined || extraMember === undefined || coverMember === extraMember || extra.time < cover.time) return undefined;
  const link = linkAt(coverMember, extra.time);
  if (link.open || link.since > cover.time + graceMs) return undefined;
  return `its member c${coverMember + 1} cut off from the home from ${iso(link.since)} until after ${iso(extra.time)}`;
}
