// ACME Renewal Information (RFC 9773): the CA's suggested renewal window for one certificate, as pure
// decisions over plain data (no I/O, time passed in, randomness injected).
//
// The at-most-one-order guard. cert-manager 1.21 (its issue #8993) issued five certificates in ten
// seconds: it told whether a stored window belonged to the certificate it held by comparing the window's
// start with the certificate's notBefore, and Let's Encrypt's notBefore, backdated by an hour, sat before
// the previous certificate's window, so each new certificate inherited the window that had just renewed
// its predecessor. Here no timestamp ever decides whose answer it is:
//   1. An answer belongs to the ARI certificate ID it was fetched for (certificate-id.ts: the CA's key ID
//      and the serial; no two certificates of a CA share it). `withAnswer` drops an answer for any other ID,
//      and `holding` forgets the answer as soon as the held certificate's ID changes: a window fetched for
//      the previous certificate, or one that began before a backdated notBefore, can never reach the new
//      certificate. The new certificate's own window counts only once it has been fetched for its ID,
//      after it was first held (a fresh answer).
//   2. At most one ARI-driven order per certificate: `ariRenewalDone` records the ID (in `renewed`) once
//      the renewal its answer asked for has returned a pair (a new certificate, or the same one from
//      tailscaled's cache), and `ariVerdict` never asks again for an ID recorded there, whatever the CA
//      answers later (a CA that keeps the window in the past). A call that failed is not recorded: it is retried on the loop's
//      backoff, as any due renewal is, so a transient error does not leave a revoked certificate in place.
//   3. A certificate must have been held for `minHoldMs` (the loop's least time between two issuances)
//      before its answer may start an order, so even a CA that answers "renew now" for every new
//      certificate gets one order per certificate at that pace at most; the loop's own storm bound,
//      slots and budget apply on top, as for any renewal.
// Everything that is not a valid answer for the held certificate leaves the expiry rule (renewal.ts) in
// force: the ARI time can only make a renewal earlier, never later.
import { CertshareError } from '../errors.ts';
import { isHttpUrl } from '../values/http-url.ts';
import { iso } from '../ports/clock.ts';

/** The CA's suggested window, milliseconds since the epoch; start <= end. */
export interface SuggestedWindow {
  start: number;
  end: number;
}

/** A validated renewalInfo answer for one certificate. */
export interface RenewalInfo {
  /** The ARI certificate ID the answer was fetched for. */
  certId: string;
  window: SuggestedWindow;
  /** The CA's page about why the window is what it is (an incident, a revocation); http(s) only. */
  explanationUrl?: string | undefined;
  /** When the answer was received (the daemon's clock). */
  fetchedAt: number;
}

/** What the validation reads of the certificate the answer is about. */
export interface AriCertificate {
  certId: string;
  notBefore: number;
  notAfter: number;
}

/** RFC 3339 date-time (section 5.6), what RFC 9773 requires for start and end. */
const RFC3339 = /^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$/;
const MAX_EXPLANATION_URL_CHARS = 2048;

function badAnswer(cert: AriCertificate, reason: string): CertshareError {
  return new CertshareError('CERTSHARE_ARI_BAD_RESPONSE', { request: 'renewalInfo for', url: cert.certId, flaw: `rejected: ${reason}` });
}

function timestamp(value: unknown, field: string, cert: AriCertificate): number {
  if (typeof value !== 'string') throw badAnswer(cert, `suggestedWindow.${field} is missing or not a string`);
  const ms = RFC3339.test(value) ? Date.parse(value) : Number.NaN;
  if (Number.isNaN(ms)) throw badAnswer(cert, `suggestedWindow.${field} ${JSON.stringify(value.slice(0, 64))} is not an RFC 3339 date-time`);
  return ms;
}

function explanationUrl(value: unknown): string | undefined {
  if (typeof value !== 'string' || value.length > MAX_EXPLANATION_URL_CHARS || !isHttpUrl(value)) return undefined;
  return new URL(value).href;
}

/**
 * Validates a renewalInfo body for `cert`. Throws CERTSHARE_ARI_BAD_RESPONSE for malformed JSON, a missing
 * or non-RFC 3339 start or end, an inverted window (end before start) and a window that starts after the
 * certificate expires (it could never be acted on in time: a CA's mistake or an answer about another
 * certificate). A window in the past is valid: it is how a CA asks for a replacement now (revocation,
 * incident). An explanationURL that is not an http(s) URL is dropped, not fatal.
 */
export function parseRenewalInfo(body: string, cert: AriCertificate, fetchedAt: number): RenewalInfo {
  let json: unknown;
  try {
    json = JSON.parse(body);
  } catch {
    throw badAnswer(cert, 'not JSON');
  }
  if (typeof json !== 'object' || json === null || Array.isArray(json)) throw badAnswer(cert, 'not a JSON object');
  const window = (json as { suggestedWindow?: unknown }).suggestedWindow;
  if (typeof window !== 'object' || window === null || Array.isArray(window)) throw badAnswer(cert, 'suggestedWindow is missing or not an object');
  const start = timestamp((window as { start?: unknown }).start, 'start', cert);
  const end = timestamp((window as { end?: unknown }).end, 'end', cert);
  if (end < start) throw badAnswer(cert, `inverted window: end ${iso(end)} is before start ${iso(start)}`);
  if (start >= cert.notAfter) {
    throw badAnswer(cert, `window starts ${iso(start)}, after the certificate expires (${iso(cert.notAfter)})`);
  }
  const url = explanationUrl((json as { explanationURL?: unknown }).explanationURL);
  return { certId: cert.certId, window: { start, end }, ...(url ? { explanationUrl: url } : {}), fetchedAt };
}

/**
 * A time chosen uniformly inside the window (RFC 9773 section 4.2), `random` returning [0, 1). A window
 * already over gives `now`: the CA asks for a replacement at once.
 * @forTests
 */
export function chooseRenewalTime(window: SuggestedWindow, now: number, random: () => number): number {
  if (window.end <= now) return now;
  const drawn = random();
  const r = Number.isFinite(drawn) ? Math.min(Math.max(drawn, 0), 1) : 0;
  return Math.min(window.start + Math.floor(r * (window.end - window.start)), window.end);
}

/** An answer kept for the held certificate, with the time chosen inside its window. */
interface AriAnswer extends RenewalInfo {
  renewAt: number;
}

/** The writer's ARI memory for one domain. Replace it with the functions below; never mutate it. */
export interface AriState {
  /** The ARI ID of the certificate held, undefined before the first one. */
  certId: string | undefined;
  /** When this state first saw that certificate held. */
  heldSince: number;
  /** The latest valid answer for certId: never one for another ID. */
  answer: AriAnswer | undefined;
  /** IDs whose answer already drove a renewal, newest last (bounded: IDs only move forward). */
  renewed: readonly string[];
}

const RENEWED_MEMORY = 16;

export const NO_ARI_STATE: AriState = Object.freeze({ certId: undefined, heldSince: 0, answer: undefined, renewed: Object.freeze([]) as readonly string[] });

/** The state once `certId` is the certificate held at `now`: another ID than before drops the answer (rule 1). */
export function holding(state: AriState, certId: string, now: number): AriState {
  if (state.certId === certId) return state;
  return { certId, heldSince: now, answer: undefined, renewed: state.renewed };
}

/**
 * The state with a new answer: dropped unless it is for the certificate held and fetched since it was
 * held (rule 1). The chosen time is kept while the CA repeats the same window, so asking again does not
 * draw again (a draw per check would move the time towards the window's start); a new window draws anew.
 */
export function withAnswer(state: AriState, info: RenewalInfo, random: () => number): AriState {
  if (info.certId !== state.certId || info.fetchedAt < state.heldSince) return state;
  const previous = state.answer;
  const sameWindow = previous !== undefined && previous.window.start === info.window.start && previous.window.end === info.window.end;
  const renewAt = sameWindow ? previous.renewAt : chooseRenewalTime(info.window, info.fetchedAt, random);
  return { ...state, answer: { ...info, renewAt } };
}

/** The state once the renewal the held certificate's answer asked for returned a pair, new or the same (rule 2). */
export function ariRenewalDone(state: AriState): AriState {
  if (state.certId === undefined || state.renewed.includes(state.certId)) return state;
  return { ...state, renewed: [...state.renewed, state.certId].slice(-RENEWED_MEMORY) };
}

/**
 * Why ARI asks for an order: `ca_requested` when the time chosen inside the window is reached,
 * `ca_requested_now` when the window was already over when it arrived (what a CA answers for a revoked
 * certificate or one caught in an incident).
 */
export type AriReason = 'ca_requested' | 'ca_requested_now';

/** Why ARI has nothing to say about the held certificate (the expiry rule alone decides). */
type AriSilence = 'no_certificate' | 'no_answer' | 'already_renewed';

export type AriVerdict =
  /** Order now, for this reason. */
  | { kind: 'order'; reason: AriReason; answer: AriAnswer }
  /** Not yet: the answer makes the certificate due at `at` (the earlier of this and the expiry rule applies). */
  | { kind: 'wait'; at: number; reason: AriReason; answer: AriAnswer }
  | { kind: 'silent'; why: AriSilence };

/** What ARI says about the certificate held at `now`, under rules 1 to 3. */
export function ariVerdict(state: AriState, now: number, minHoldMs: number): AriVerdict {
  if (state.certId === undefined) return { kind: 'silent', why: 'no_certificate' };
  if (state.renewed.includes(state.certId)) return { kind: 'silent', why: 'already_renewed' };
  const answer = state.answer;
  if (answer === undefined || answer.certId !== state.certId) return { kind: 'silent', why: 'no_answer' };
  const reason: AriReason = answer.window.end <= answer.fetchedAt ? 'ca_requested_now' : 'ca_requested';
  const at = Math.max(answer.renewAt, state.heldSince + Math.max(0, minHoldMs));
  return now >= at ? { kind: 'order', reason, answer } : { kind: 'wait', at, reason, answer };
}

/**
 * The least hold (rule 3) the loop asks for, whatever its minimum interval: tailscaled reads min_validity in
 * whole seconds, so the value ariMinValidityMs asks (what is left rounded up, plus a second, under a cap
 * rounded down) exceeds what the certificate has left only once it has been held for about three seconds.
 * Sooner, tailscaled would hand back the certificate the CA wants replaced and the guard would count that
 * as the one order. Only a scaled-down test's minimum interval (below a minute) is raised by it.
 */
export const ARI_MIN_HOLD_MS = 5000;

/**
 * The `min_validity` that makes tailscaled order anew for an ARI-driven renewal. tailscaled keeps its cached
 * pair while at least min_validity of it remains, and a revoked certificate may have most of its life left,
 * so the expiry rule's value (renewal.ts minValidityFor, capped at the renewal share of a fresh
 * certificate) would hand the revoked pair back. Asked: one second more than the held certificate has
 * left, in whole seconds; never more than a fresh certificate from this issuer has (`freshValidityMs`),
 * which would make every later call order again. A certificate held for the hold (rule 3, at least
 * ARI_MIN_HOLD_MS) has less left than a fresh one by at least that long, so the value fits under the cap.
 */
export function ariMinValidityMs(held: { notAfter: number }, now: number, freshValidityMs: number): number {
  const wanted = Math.ceil(Math.max(0, held.notAfter - now) / 1000) * 1000 + 1000;
  return Math.max(1000, Math.min(wanted, Math.floor(freshValidityMs / 1000) * 1000));
}

/** One line for /healthz's detail and the logs: the window, the time chosen in it and the CA's explanation. */
export function describeAriAnswer(answer: AriAnswer): string {
  const explanation = answer.explanationUrl ? ` (the CA explains: ${answer.explanationUrl})` : '';
  return `CA suggests renewal ${iso(answer.window.start)}..${iso(answer.window.end)}, chosen ${iso(answer.renewAt)}${explanation}`;
}

/** When to ask the CA again: after its Retry-After, at least `floorMs` and at most `capMs` (--ari-interval) from `now`. */
export function nextAriCheck(now: number, retryAfterMs: number | undefined, policy: { floorMs: number; capMs: number }): number {
  const floor = Math.min(policy.floorMs, policy.capMs);
  const wait = retryAfterMs === undefined ? policy.capMs : Math.min(Math.max(retryAfterMs, floor), policy.capMs);
  return now + wait;
}

/**
 * Where a writer's loop reads the ARI state of the certificate it holds and reports the renewal it asked
 * for (the daemon's checker, src/acme/ari-checker.ts, fetches the answers). Keyed by the certificate's
 * serial as well as the domain: a state kept for the previous certificate, while the new one's ARI ID is
 * still being computed, is never handed out for the new one (rule 1).
 */
export interface AriStateSource {
  /** The state for certificate `serial` of `domain`; undefined while none is known for that certificate. */
  stateFor(domain: string, serial: string): AriState | undefined;
  /** The ARI-driven renewal of certificate `serial` returned a pair (ariRenewalDone): no second order for it. */
  renewalDone(domain: string, serial: string): void;
}
