// What the proxy really serves, compared with what certshare holds: the pure half of the served check
// (src/served/served-checker.ts probes the proxy's TLS listener and feeds these functions).
import type { HeldValidity } from '../renewal/renewal.ts';
import { iso } from '../ports/clock.ts';

/**
 * One outcome per check of a domain:
 * - `current`: the leaf certshare holds now;
 * - `previous`: a leaf certshare held before for the domain, still valid (the proxy has not picked up a renewal yet);
 * - `expired`: a leaf outside its validity window, whatever it is;
 * - `other_name`: a leaf that does not cover the domain asked for (SNI);
 * - `other`: a valid leaf for the domain that certshare never held (self-signed, another issuer, a stale file);
 * - `handshake_failed`: the proxy answered TLS and ended the handshake with an alert every client gets (a worker that
 *   cannot read or use the key: served-probe.ts), while a TCP probe of the proxy still passes;
 * - `unknown`: no TLS answer (refused, timed out, not TLS): the check could not run, which says nothing of
 *   what clients get (left to the proxy's own readiness probe).
 */
export const SERVED_OUTCOMES = ['current', 'previous', 'expired', 'other_name', 'other', 'handshake_failed', 'unknown'] as const;
export type ServedOutcome = (typeof SERVED_OUTCOMES)[number];

/** The leaf a TLS handshake with the proxy returned for one SNI name. @forTests */
export interface ServedLeaf {
  fingerprint256: string;
  serial: string;
  notBefore: number;
  notAfter: number;
  /** The leaf's names cover the SNI name asked for. */
  coversName: boolean;
}

export type ServedProbe = { leaf: ServedLeaf } | { failure: ServedProbeFailure; detail: string };
/** `alert`: the proxy's TLS ended the handshake with an alert; the others are no TLS answer. */
export type ServedProbeFailure = 'refused' | 'timeout' | 'not_tls' | 'alert' | 'error';

/** What certshare held for a domain: the current leaf and the ones before it (newest first). */
export interface HeldLeaves {
  current: { fingerprint256: string } | undefined;
  previous: readonly string[];
}

export function classifyServed(probe: ServedProbe, held: HeldLeaves, now: number): ServedOutcome {
  if (!('leaf' in probe)) return probe.failure === 'alert' ? 'handshake_failed' : 'unknown';
  const { leaf } = probe;
  if (now < leaf.notBefore || now >= leaf.notAfter) return 'expired';
  if (!leaf.coversName) return 'other_name';
  if (held.current?.fingerprint256 === leaf.fingerprint256) return 'current';
  if (held.previous.includes(leaf.fingerprint256)) return 'previous';
  return 'other';
}

/** Outcomes that take the replica out of rotation: clients would get a certificate certshare does not vouch for. */
const BAD: ReadonlySet<ServedOutcome> = new Set(['expired', 'other_name', 'other']);

/** What the checks of one domain established so far. */
export interface ServedState {
  /** The latest check's outcome. */
  outcome: ServedOutcome;
  /** The latest outcome with a leaf, and that leaf (absent before any). */
  known?: { outcome: Exclude<ServedOutcome, 'unknown' | 'handshake_failed'>; leaf: ServedLeaf };
  /** Checks in a row, up to this one, that ended in `handshake_failed`. */
  failedInARow?: number;
}

/**
 * Failed handshakes in a row that take the replica out: the first may be a race with certshare's first write of
 * the files (nginx alerts until then), which the recheck a moment later no longer sees.
 */
const FAILED_HANDSHAKES_OUT = 2;

/** Folds one check into the state: one without a leaf (`unknown`, `handshake_failed`) keeps the last leaf seen. */
export function nextServedState(state: ServedState | undefined, probe: ServedProbe, outcome: ServedOutcome): ServedState {
  if ('leaf' in probe && outcome !== 'unknown' && outcome !== 'handshake_failed') return { outcome, known: { outcome, leaf: probe.leaf } };
  const failedInARow = outcome === 'handshake_failed' ? (state?.failedInARow ?? 0) + 1 : 0;
  return { outcome, ...(state?.known ? { known: state.known } : {}), ...(failedInARow ? { failedInARow } : {}) };
}

/** The proxy failed the last FAILED_HANDSHAKES_OUT handshakes or more. */
function failing(state: ServedState | undefined): boolean {
  return state?.outcome === 'handshake_failed' && (state.failedInARow ?? 0) >= FAILED_HANDSHAKES_OUT;
}

/**
 * Whether the domain's served certificate keeps the replica in rotation at `now`, judged from the last TLS
 * answer (a check that could not run changes nothing): `ok` while the proxy served certshare's current or
 * previous leaf and that leaf is before its `end` (the readiness lead before its notAfter); `bad` when it
 * served an expired leaf, one for another name or one certshare never held, or the leaf it served reached its
 * end, or it ended the last handshakes with an alert, or it serves a previous leaf the CA asked to replace now
 * (from `replacedNowAt`: the reload window's end, replaceNowFrom); `unconfirmed` before
 * any TLS answer.
 */
export type ServedVerdict = { verdict: 'ok' } | { verdict: 'bad'; why: string } | { verdict: 'unconfirmed' };

export function servedVerdict(state: ServedState | undefined, now: number, end: (held: HeldValidity) => number, replacedNowAt?: number): ServedVerdict {
  if (failing(state)) return { verdict: 'bad', why: describeOutcome('handshake_failed') };
  const known = state?.known;
  if (!known) return { verdict: 'unconfirmed' };
  if (BAD.has(known.outcome)) return { verdict: 'bad', why: describeOutcome(known.outcome) };
  if (replacedNowAt !== undefined && now >= replacedNowAt) return { verdict: 'bad', why: REPLACED_NOW_WHY };
  const endsAt = end({ notBefore: known.leaf.notBefore, notAfter: known.leaf.notAfter });
  if (now >= endsAt) return { verdict: 'bad', why: `the proxy serves a certificate that expires at ${iso(known.leaf.notAfter)}` };
  return { verdict: 'ok' };
}

/** When servedVerdict may change by time alone (the served leaf reaching its end), or undefined. */
export function servedVerdictEdge(
  state: ServedState | undefined,
  now: number,
  end: (held: HeldValidity) => number,
  replacedNowAt?: number,
): number | undefined {
  const known = state?.known;
  if (!known || BAD.has(known.outcome) || failing(state)) return undefined;
  const endsAt = end({ notBefore: known.leaf.notBefore, notAfter: known.leaf.notAfter });
  const edges = [endsAt, replacedNowAt ?? Infinity].filter((at) => at > now);
  return edges.length ? Math.min(...edges) : undefined;
}

const REPLACED_NOW_WHY = 'the proxy still serves a certificate the CA asked to replace now (revoked, or an incident), past the reload window';

/** A certificate serial as node:crypto writes it (upper-case hex), whatever case it came in. */
export const serialKey = (serial: string): string => serial.toUpperCase();

/**
 * When the served leaf starts to count bad because the CA asked to replace it now (ARI: a revocation, an
 * incident), or undefined: only a `previous` leaf (one certshare held and replaced, never the current one,
 * whoever named the serial) in `replacedNow`, from `reloadWindowEnd` on (the proxy had its time to reload).
 */
export function replaceNowFrom(state: ServedState | undefined, replacedNow: ReadonlySet<string>, reloadWindowEnd: number): number | undefined {
  const known = state?.known;
  if (known?.outcome !== 'previous' || !replacedNow.has(serialKey(known.leaf.serial))) return undefined;
  return reloadWindowEnd;
}

export function describeOutcome(outcome: ServedOutcome): string {
  switch (outcome) {
    case 'current':
      return 'the proxy serves the current certificate';
    case 'previous':
      return 'the proxy still serves the previous certificate';
    case 'expired':
      return 'the proxy serves an expired certificate';
    case 'other_name':
      return 'the proxy serves a certificate for another name';
    case 'other':
      return 'the proxy serves a certificate certshare never held';
    case 'handshake_failed':
      return 'the proxy fails the TLS handshake (an alert): clients get no certificate';
    case 'unknown':
      return 'no TLS answer from the proxy';
  }
}

/**
 * Keeps the leaves certshare held for a domain, newest first: a replaced leaf becomes `previous` (the last
 * `keep` of them) so that a proxy still serving it is told apart from one serving something else.
 */
export function holdLeaf(held: HeldLeaves, fingerprint256: string | undefined, keep = 3): HeldLeaves {
  const current = held.current?.fingerprint256;
  if (fingerprint256 === current) return held;
  const previous = current
    ? [current, ...held.previous.filter((f) => f !== current && f !== fingerprint256)]
    : held.previous.filter((f) => f !== fingerprint256);
  return { current: fingerprint256 ? { fingerprint256 } : undefined, previous: previous.slice(0, keep) };
}
