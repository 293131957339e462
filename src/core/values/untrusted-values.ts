// Times certshare reads from objects that a credential other than its own process can write: a domain's
// Secret (the writer's token of any replica, the federation account at a home) and its coordination
// annotations. Each is believed only inside the bound a correct writer keeps, so that nobody holding such a
// credential can make every writer wait until 9999: a value out of its bound is ignored (as if absent),
// and reported (a log line, a metric, an Event). The issuance ledger's entries are bounded in
// issuance-budget.ts (believedEntries) with the same report.
import { iso } from '../ports/clock.ts';
import { errorText } from '../errors.ts';
import type { Logger } from '../ports/logger.ts';
import type { Coordination, StoreRead, StoredCert } from '../ports/store.ts';

/**
 * How far ahead of this process's clock a time another writer stamped may be (clock skew between
 * replicas, or between a member and its home). Its value and why: docs/security.md, "Values read back".
 */
export const CLOCK_SKEW_MS = 30_000;

/** What an ignored value was: the annotation's or the ledger's own name for it. */
type UntrustedField =
  | 'retry-not-before'
  | 'issuing'
  | 'obtained-at'
  | 'pending-not-before'
  | 'ledger-entry'
  | 'ledger-part'
  | 'break-glass-claim'
  | 'lease-duration'
  | 'lease-transitions'
  | 'injector-ca'
  | 'injector-leaf'
  | 'last-leaf-expiry'
  | 'replaced-now';

/** Where an ignored value is counted and told besides the log (a metric, an Event). */
export type OutOfBoundsReport = (where: string, value: UntrustedValue) => void;

export interface UntrustedValue {
  field: UntrustedField;
  /** The value as read (a date, or an entry's fields), for the log line and the Event. */
  value: string;
  /** Why it is out of bounds. */
  why: string;
}

interface CoordinationBounds {
  /** --retry-cap: the longest wait a writer records after a rate limit (issue-failures.ts caps it so). */
  retryCapMs: number;
}

interface ReadBounds extends CoordinationBounds {
  /** The latest notBefore a pair stored for later may have (boundPending); undefined: none checked. */
  pendingLatest?: number | undefined;
}

/**
 * A pair stored for later (StoreRead.pending) is believed only if it starts no later than `latest`: the readiness
 * exit of the certificate held (renewal.ts rotationExitTime), or with none held the retry cap from now (pending-pair.ts
 * latestPendingStart). A writer waits for such a pair instead of renewing: one a stolen token writes valid from next
 * year would otherwise hold every renewal while what is served expires. Why that bound: docs/security.md, "Values read
 * back".
 */
function boundPending(pending: StoredCert, latest: number): UntrustedValue | undefined {
  if (pending.info.notBefore <= latest) return undefined;
  return {
    field: 'pending-not-before',
    value: `${pending.info.serial} valid from ${iso(pending.info.notBefore)}`,
    why: `later than ${iso(latest)}, the readiness exit of the certificate held (with none, the retry cap from now)`,
  };
}

/**
 * The coordination a store read returned, with each time out of its bound removed: a retry date later than
 * the retry cap from now (a correct writer records none later), an intent stamped later than now plus the
 * clock skew (a correct writer stamps the instant it writes, so an intent blocks at most its TTL, the call
 * timeout plus its margin, plus the skew).
 * @forTests
 */
export function boundCoordination(
  coordination: Coordination,
  now: number,
  bounds: CoordinationBounds,
): { coordination: Coordination; refused: UntrustedValue[] } {
  const refused: UntrustedValue[] = [];
  const bounded: Coordination = { ...coordination };
  const until = coordination.retryNotBefore;
  if (until !== undefined && until > now + bounds.retryCapMs) {
    delete bounded.retryNotBefore;
    refused.push({ field: 'retry-not-before', value: iso(until), why: `later than the retry cap (--retry-cap) from now, ${iso(now + bounds.retryCapMs)}` });
  }
  const intent = coordination.intent;
  if (intent && intent.at > now + CLOCK_SKEW_MS) {
    delete bounded.intent;
    refused.push({ field: 'issuing', value: `${intent.holder} at ${iso(intent.at)}`, why: `stamped in the future (later than ${iso(now + CLOCK_SKEW_MS)})` });
  }
  return { coordination: bounded, refused };
}

/**
 * How many times its own Lease duration a candidate believes of a holder's: a rollout that lengthens the duration
 * keeps the holders of the old one, which renew every third of theirs, never taken over while they live.
 */
export const LEASE_DURATION_FACTOR = 2;

/**
 * A group Lease's leaseDurationSeconds as a candidate whose own duration is `ownMs` believes it: up to
 * LEASE_DURATION_FACTOR times its own. Whoever may update the Lease (a group's writer token, a tenant; at a
 * federation home the federation account) could write 2^31 s once and hold every candidate off for 68 years,
 * long after its credential was rotated; bounded, holding the Lease takes a write at least every bound.
 * Absent: the candidate's own.
 * @forTests
 */
export function boundLeaseDuration(seconds: number | undefined, ownMs: number): { ms: number; refused?: UntrustedValue } {
  if (seconds === undefined) return { ms: ownMs };
  const bound = ownMs * LEASE_DURATION_FACTOR;
  if (seconds * 1000 <= bound) return { ms: seconds * 1000 };
  return {
    ms: bound,
    refused: {
      field: 'lease-duration',
      value: `${seconds}s`,
      why: `longer than ${LEASE_DURATION_FACTOR} times this replica's own duration: taken as ${bound / 1000}s`,
    },
  };
}

/** The largest leaseTransitions the apiserver stores: the field is an int32, and a request with one more is refused (400). */
const LEASE_TRANSITIONS_MAX = 2_147_483_647;

/**
 * The leaseTransitions a candidate writes when it takes a Lease over from the count it read: one more, up to
 * the int32 the field is. Whoever may update the Lease could write 2^31 - 1 once: every takeover's update,
 * one more, would then be refused for good and no candidate ever hold the Lease again, after the credential
 * that wrote it was rotated. No election reaches that count: it is kept there, and told.
 * @forTests
 */
export function nextLeaseTransitions(count: number | undefined): { count: number; refused?: UntrustedValue } {
  const read = count ?? 0;
  if (read < LEASE_TRANSITIONS_MAX) return { count: read + 1 };
  return {
    count: LEASE_TRANSITIONS_MAX,
    refused: { field: 'lease-transitions', value: String(read), why: 'the largest count the Lease holds: a takeover writes it again instead of one more' },
  };
}

/** The longest renew request id believed (an annotation value can be 256 KiB; an id is a timestamp or a token). */
const RENEW_ID_MAX = 128;

/** Whether `id` is a renew request id as certshare renew writes one: printable ASCII, no space, at most RENEW_ID_MAX. */
export function isRenewId(id: string): boolean {
  return id.length > 0 && id.length <= RENEW_ID_MAX && /^[\x21-\x7e]+$/.test(id);
}

/**
 * Reports ignored values: `report` (a metric, an Event) at every read that holds one, a log line only when
 * a value is first seen in a place (a record read each turn would otherwise log each turn).
 */
export class OutOfBoundsLog {
  readonly #seen = new Map<string, Set<string>>();
  readonly #log: Logger;
  readonly #report: (where: string, value: UntrustedValue) => void;

  constructor(log: Logger, report: (where: string, value: UntrustedValue) => void) {
    this.#log = log;
    this.#report = report;
  }

  /** What the latest read of `where` ignored (none: forgets what it held, so a value written again logs again). */
  read(where: string, refused: readonly UntrustedValue[]): void {
    const before = this.#seen.get(where);
    const now = new Set<string>();
    for (const value of refused) {
      const key = `${value.field}\u0000${value.value}\u0000${value.why}`;
      now.add(key);
      this.#report(where, value);
      if (!before?.has(key)) this.#log.warn({ code: 'CERTSHARE_UNTRUSTED_VALUE', field: value.field }, untrustedText(where, value));
    }
    if (now.size) this.#seen.set(where, now);
    else this.#seen.delete(where);
  }

  /**
   * `read` with its coordination bounded (boundCoordination), an obtained-at in the future dropped (the
   * renewal rule would measure from it: a date past notAfter would renew only at expiry; without it the rule
   * measures from notBefore, earlier, never later) and a pair stored for later that starts too late (boundPending);
   * what it ignored reported as `where`'s.
   */
  bounded(read: StoreRead, where: string, now: number, bounds: ReadBounds): StoreRead {
    const { coordination, refused } = read.coordination
      ? boundCoordination(read.coordination, now, bounds)
      : { coordination: undefined, refused: [] as UntrustedValue[] };
    let out: StoreRead = refused.length ? { ...read, coordination } : read;
    const future = (cert: StoredCert | undefined): boolean => cert?.obtainedAt !== undefined && cert.obtainedAt > now + CLOCK_SKEW_MS;
    const withoutObtainedAt = (cert: StoredCert): StoredCert => {
      refused.push({ field: 'obtained-at', value: iso(cert.obtainedAt!), why: `in the future (later than ${iso(now + CLOCK_SKEW_MS)})` });
      const { obtainedAt: _ignored, ...rest } = cert;
      return rest;
    };
    if (out.state === 'valid' && future(out.cert)) out = { ...out, cert: withoutObtainedAt(out.cert) };
    if (future(out.lastValid)) out = { ...out, lastValid: withoutObtainedAt(out.lastValid!) };
    const late = out.pending && bounds.pendingLatest !== undefined ? boundPending(out.pending, bounds.pendingLatest) : undefined;
    if (late) {
      refused.push(late);
      const { pending: _ignored, ...rest } = out;
      out = rest;
    }
    const replaced = boundReplacedNow(out.replacedNow);
    if (replaced.refused) {
      refused.push(replaced.refused);
      const { replacedNow: _ignored, ...rest } = out;
      out = rest;
    }
    this.read(where, refused);
    return out;
  }
}

/** The most serials a record names as replaced because the CA asked for it now (the latest few renewals). */
export const REPLACED_NOW_MAX = 4;

/** An X.509 serial as certshare writes one (hex, at most 20 octets and a sign octet). */
const SERIAL = '[0-9A-Fa-f]{1,42}';
const REPLACED_NOW_FORM = new RegExp(`^${SERIAL}(,${SERIAL}){0,${REPLACED_NOW_MAX - 1}}$`);

/**
 * The serials a record names as replaced because the CA asked for it now: at most REPLACED_NOW_MAX, each a hex
 * serial, comma-separated (the form manifests/base/admission-policy.yaml admits); anything else is ignored whole.
 * Whoever writes it can name any serial, so a named serial counts only against a leaf the replica held and replaced,
 * never its current one (served-certificate.ts replaceNowFrom): it cannot switch a replica off.
 */
export function boundReplacedNow(text: string | undefined): { serials: string[]; refused?: UntrustedValue } {
  if (text === undefined) return { serials: [] };
  if (REPLACED_NOW_FORM.test(text)) return { serials: text.split(',') };
  const why = `not up to ${REPLACED_NOW_MAX} comma-separated hex serials`;
  return { serials: [], refused: { field: 'replaced-now', value: text.slice(0, 200), why } };
}

/** The log line's and the Event's text for an ignored value. */
export function untrustedText(where: string, value: UntrustedValue): string {
  return `CERTSHARE_UNTRUSTED_VALUE ${errorText('CERTSHARE_UNTRUSTED_VALUE', { field: value.field, where, value: value.value, why: value.why })}`;
}
