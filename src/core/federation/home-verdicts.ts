// The federation home (docs/federation.md): first pieces, pure. A member cluster's writer normally leaves
// issuance to the one writer that holds the group's Lease on the home apiserver and mirrors the home's
// Secret of record into its own. These functions say what a member may do when the home cannot be
// reached, and which copy wins when it can again. Nothing here knows Kubernetes.
import { renewalTime, rotationExitTime, type HeldValidity, type RenewalPolicy } from '../renewal/renewal.ts';
import { iso } from '../ports/clock.ts';
import type { Coordination } from '../ports/store.ts';
import { CLOCK_SKEW_MS, type UntrustedValue } from '../values/untrusted-values.ts';

/**
 * The safety point of a certificate while the home is unreachable: halfway from its renewal point to the
 * instant the readiness gate takes the replicas out of rotation ahead of its expiry (renewal.ts
 * rotationExitTime, which holds the readiness lead). Before it, a member serves its copy and issues
 * nothing: a home outage shorter than half the renewal margin (15 days of a 90-day certificate's 30, a
 * day and a half of a 6-day one's 3) costs no issuance at all, whatever the number of clusters. From it,
 * a member may issue once on its own (break-glass): the other half is left for that issuance to get
 * through a CA that fails or rate-limits (retries on the backoff, a Retry-After of hours) and still land
 * before the gate would take the Pods out.
 * @forTests
 */
export function breakGlassPoint(held: HeldValidity, policy: Pick<RenewalPolicy, 'renewFraction'>, readinessLeadMs: number): number {
  const renewal = renewalTime(held, policy);
  const exit = rotationExitTime(held, policy, readinessLeadMs);
  return renewal + Math.floor(Math.max(0, exit - renewal) / 2);
}

type HomeOutageVerdict =
  /** Serve the local copy; look again at `until` (the safety point), or when the home answers. */
  | { kind: 'serve'; until: number }
  /** Past the safety point (or no valid copy at all): this member may issue once, recorded locally. */
  | { kind: 'break_glass' }
  /** This member already issued on its own in this window: it serves that certificate, never a second. */
  | { kind: 'broken'; serial: string };

/**
 * A member's break-glass issuance as its local Secret records it: the certificate it issued, and the window
 * it was spent in, named by the copy it replaced (null: the member held no valid copy). `window` undefined:
 * a record of before windows were named (the serial alone).
 */
interface BreakGlassRecord {
  serial: string;
  window: string | null | undefined;
}

// A serial is hex (X509Certificate.serialNumber); RFC 5280 bounds it to 20 octets.
const RECORD = /^([0-9A-F]{1,40})(?: replacing ([0-9A-F]{1,40}|none))?$/;

/** The annotation's value: `<serial> replacing <serial of the copy it replaced, or none>`. */
export function formatBreakGlassRecord(record: { serial: string; window: string | null }): string {
  return `${record.serial} replacing ${record.window ?? 'none'}`;
}

/** Reads the annotation's value; anything else than formatBreakGlassRecord's form (or a bare serial) is no record. */
export function parseBreakGlassRecord(value: string | undefined): BreakGlassRecord | undefined {
  const match = value === undefined || value.length > 100 ? null : RECORD.exec(value);
  if (!match) return undefined;
  const window = match[2];
  return { serial: match[1]!, window: window === undefined ? undefined : window === 'none' ? null : window };
}

/**
 * Whether the window of the copy `serial` (undefined: no valid copy) is spent: the record names it. A later
 * window (the member now holds another certificate: its own break-glass one, or the home's) has its own one.
 * A record of before windows were named stands for as long as its certificate is the member's.
 * @forTests
 */
export function breakGlassSpent(record: BreakGlassRecord | undefined, serial: string | undefined): boolean {
  if (!record) return false;
  if (record.window === undefined) return record.serial === serial;
  return record.window === (serial ?? null);
}

/**
 * A break-glass claim as read back: the time it recorded (undefined: nothing, or not a time), and when it was
 * created, by the apiserver's stamp (no writer sets it), on the member's clock.
 */
export interface ClaimRead {
  recorded: number | undefined;
  created: number;
}

/**
 * The latest time a claim of the window of `copy` may record and be believed (see windowClaimable): one lifetime
 * of the copy (plus the clock skew) from its creation, or from now if that is earlier.
 */
function latestBelievableClaim(copy: { notBefore: number; notAfter: number }, created: number, now: number): number {
  return Math.min(created, now) + (copy.notAfter - copy.notBefore) + CLOCK_SKEW_MS;
}

/**
 * Whether a member may claim the window of its copy, expiring at `notAfter` (undefined: it holds none), given what
 * each of its earlier break-glass claims recorded: the notAfter of the copy it replaced or of the certificate it
 * stored (undefined: nothing). A member holds the newest copy it knows (reconcile), so a window older than one it
 * claimed or issued past is a pair put back (kept by whoever reads the Secret), and no copy at all after a claim
 * is a Secret emptied: neither is a window of its own. A claim's name guards its own window; this, the older ones.
 * Whoever may create a Lease in the namespace may write a claim: a claim speaks of a certificate that existed when
 * it was created, so a recorded time later than one lifetime of the copy from its creation (plus the clock skew)
 * is no certificate a member stored, and is ignored (unbelievedClaims says which). Else a claim dated 9999 would
 * switch the member's break-glass off for good, and claims dated a lifetime apart, written once, would each be
 * believed in turn, for years (nobody but a cluster administrator may delete a claim).
 * @forTests
 */
export function windowClaimable(copy: { notBefore: number; notAfter: number } | undefined, claims: ReadonlyArray<ClaimRead>, now: number): boolean {
  if (copy === undefined) return claims.length === 0;
  return claims.every(({ recorded, created }) => recorded === undefined || recorded > latestBelievableClaim(copy, created, now) || copy.notAfter >= recorded);
}

/** The claims' recorded times that windowClaimable ignores, as values out of their bound (to be counted and told). */
export function unbelievedClaims(copy: { notBefore: number; notAfter: number } | undefined, claims: ReadonlyArray<ClaimRead>, now: number): UntrustedValue[] {
  if (copy === undefined) return [];
  return claims.flatMap(({ recorded, created }) => {
    const latest = latestBelievableClaim(copy, created, now);
    if (recorded === undefined || recorded <= latest) return [];
    return [
      {
        field: 'break-glass-claim',
        value: iso(recorded),
        why: `later than one lifetime of the held copy from the claim's creation plus the clock skew (${iso(latest)})`,
      },
    ];
  });
}

/**
 * What a member's writer may do while the home is unreachable. `held`: its local copy, if any (an expired one
 * only from a pinned issuer: StoreRead.expired).
 * `breakGlass`: the record in its local Secret (a restart or a takeover of the local Lease does not forget
 * it): the window it names is spent.
 */
export function homeOutageVerdict(input: {
  held: (HeldValidity & { serial: string }) | undefined;
  now: number;
  policy: Pick<RenewalPolicy, 'renewFraction'>;
  readinessLeadMs: number;
  breakGlass?: BreakGlassRecord | undefined;
}): HomeOutageVerdict {
  const copy = input.held && input.now < input.held.notAfter ? input.held : undefined;
  // The window is the held copy's, expired or not: a copy issued in the window of no copy ("replacing none")
  // that expired since has a window of its own.
  if (input.breakGlass && breakGlassSpent(input.breakGlass, input.held?.serial)) return { kind: 'broken', serial: input.breakGlass.serial };
  if (!copy) return { kind: 'break_glass' };
  const at = breakGlassPoint(copy, input.policy, input.readinessLeadMs);
  return input.now >= at ? { kind: 'break_glass' } : { kind: 'serve', until: at };
}

/**
 * Whether the holder of the group's home Lease has failed the group, judged by its results, not by its Lease (which
 * whoever holds the home credential writes): the group's newest copy (the latest notAfter among `copies`, the home's
 * and the member's, valid or expired) passed its safety point with no renewal at the home. A pair stored for later
 * (`pending`) that ends later and starts by the readiness exit is the renewal, valid soon (its CA's clock ahead). No copy at
 * all is no verdict (a first issuance, which may wait in the budget's queue for days): `{ failed: false }`.
 * `until`: the safety point, when a holder that renews nothing fails.
 * @forTests
 */
export function homeWriterVerdict(input: {
  copies: ReadonlyArray<(HeldValidity & { serial: string }) | undefined>;
  pending?: HeldValidity | undefined;
  now: number;
  policy: Pick<RenewalPolicy, 'renewFraction'>;
  readinessLeadMs: number;
}): { failed: false; until?: number } | { failed: true; serial: string; since: number; exit: number } {
  let newest: (HeldValidity & { serial: string }) | undefined;
  for (const copy of input.copies) if (copy && (!newest || copy.notAfter > newest.notAfter)) newest = copy;
  if (!newest) return { failed: false };
  const since = breakGlassPoint(newest, input.policy, input.readinessLeadMs);
  const { pending } = input;
  // The loop waits for such a pair up to the readiness exit (latestPendingStart): so does this verdict.
  const pendingBound = rotationExitTime(newest, input.policy, input.readinessLeadMs);
  if (pending && pending.notAfter > newest.notAfter && pending.notBefore <= pendingBound) return { failed: false };
  return input.now >= since ? { failed: true, serial: newest.serial, since, exit: pendingBound } : { failed: false, until: since };
}

/**
 * Whether a member counts the home as cut off for the renewal of a copy whose holder failed it (homeWriterVerdict: past
 * its safety point `since`, its readiness exit `exit`) although the home answers reads: the member's own writes to the
 * home (the Lease's takeover or renewal, the Secret of record's intent or certificate) have failed since `failingSince`,
 * none going through since, for a bound past the later of the two: twice the home Lease duration (six looks of the
 * Lease), at most a quarter of the time left to the exit. The home's etcd out of space, an admission policy or webhook
 * refusing, writes timing out: no takeover stands, no intent, no certificate stored, and the copy would run out. Then the
 * outage rules answer (break-glass, once per window and member). A write lost to a newer version (409) is no failure:
 * the home stored someone's.
 * @forTests
 */
export function homeWritesRefused(input: { failingSince: number | undefined; since: number; exit: number; now: number; leaseDurationMs: number }): boolean {
  if (input.failingSince === undefined) return false;
  const bound = Math.min(2 * input.leaseDurationMs, Math.max(0, input.exit - input.since) / 4);
  return input.now >= Math.max(input.since, input.failingSince) + bound;
}

/**
 * The home's coordination as believed in a window whose holder failed (homeWriterVerdict), by a member that first judged
 * it failed at `since`. An intent is believed as stamped no later than `since` plus the longest Lease a holder is
 * believed to hold (`leaseBoundMs`), the clock skew and two intent lifetimes (`intentTtlMs`): a deposed holder's call
 * and one by a member that waited for it and took over start by then. A later stamp is believed as that bound (it still
 * blocks, up to one lifetime more), never dropped: a genuine call by a member that took over after this one must be
 * waited for, as the thief's re-stamped intents must not hold every writer for good. `busyUntil`: when the believed
 * intent stops blocking (no takeover of the Lease before: lease-elector.ts failedHolder). A recorded rate limit holds
 * no renewal past the safety point: the loop's own backoff paces its calls (the CA that limits says so again).
 * Written again and again with the home credential, either held every renewal of the group for good.
 * @forTests
 */
export function boundFailedWindow(
  coordination: Coordination,
  window: { since: number; leaseBoundMs: number; intentTtlMs: number },
): { coordination: Coordination; refused: UntrustedValue[]; busyUntil: number | undefined } {
  const bounded: Coordination = { ...coordination };
  const refused: UntrustedValue[] = [];
  if (coordination.retryNotBefore !== undefined) {
    delete bounded.retryNotBefore;
    refused.push({ field: 'retry-not-before', value: iso(coordination.retryNotBefore), why: 'past the safety point of a copy its holder did not renew' });
  }
  const intent = coordination.intent;
  if (!intent) return { coordination: bounded, refused, busyUntil: undefined };
  const latest = failedWindowIntentBound(window);
  if (intent.at > latest) {
    bounded.intent = { ...intent, at: latest };
    const why = `stamped later than ${iso(latest)}, believed as stamped then: the safety point passed unrenewed, judged so since ${iso(window.since)}`;
    refused.push({ field: 'issuing', value: `${intent.holder.slice(0, 253)} at ${iso(intent.at)}`, why });
  }
  return { coordination: bounded, refused, busyUntil: bounded.intent!.at + window.intentTtlMs };
}

/** The latest stamp of an intent believed in a failed window (boundFailedWindow); past it plus one lifetime, nothing blocks. @forTests */
export function failedWindowIntentBound(window: { since: number; leaseBoundMs: number; intentTtlMs: number }): number {
  return window.since + window.leaseBoundMs + CLOCK_SKEW_MS + 2 * window.intentTtlMs;
}

/** What a copy of the certificate of record holds, reduced to what reconciliation compares. */
export interface CopyView {
  serial: string;
  notBefore: number;
  notAfter: number;
}

type Reconciliation =
  | { kind: 'in_sync' }
  /** The home holds the newest valid certificate: write it into the member's local Secret. */
  | { kind: 'mirror_to_local' }
  /** The member holds a newer one (break-glass while the home was away): write it to the home. */
  | { kind: 'push_to_home' };

/**
 * Once the home answers again: the newest valid certificate (the latest notAfter among those valid now)
 * wins everywhere, and no copy is ever overwritten by one that expires earlier. An invalid copy (expired,
 * not yet valid, absent) never wins. Ties by notAfter keep what each side holds (two break-glass issuances
 * expiring in the same second): the home's is written locally, so every member converges on one.
 */
export function reconcile(home: CopyView | undefined, local: CopyView | undefined, now: number): Reconciliation {
  const valid = (c: CopyView | undefined): c is CopyView => c !== undefined && now >= c.notBefore && now < c.notAfter;
  const h = valid(home) ? home : undefined;
  const l = valid(local) ? local : undefined;
  if (!h && !l) return { kind: 'in_sync' };
  if (h && l && h.serial === l.serial) return { kind: 'in_sync' };
  if (!l || (h && h.notAfter >= l.notAfter)) return { kind: 'mirror_to_local' };
  return { kind: 'push_to_home' };
}
