// The injector's CA rotation policy: pure decisions over plain data, no I/O, time passed in.
//
// cert-controller replaces CA and leaf at once, so a caller still holding the old caBundle fails until
// it catches up (its issues #13, #26, #50). Here rotation overlaps in four observed steps:
//   1. a new CA joins the bundle well before the signing CA's rotation point;
//   2. the bundle is written into every injected object (webhook configurations, CRDs, APIServices);
//   3. only once every object has been OBSERVED carrying the new CA (for `propagationGraceMs`, the time
//      the apiserver's informers take to see the write) do leaves get signed by it;
//   4. the old CA leaves the bundle only after the last leaf it signed has expired.
// The driver (src/injector) applies one action at a time and asks again; each rule below is a small
// function, checked in order, in the style of cert-manager's trigger policies.

export interface RotationPolicy {
  /** Lifetime of a new CA. */
  caLifetimeMs: number;
  /** Create the next CA this long before the newest CA expires; must exceed the propagation time. */
  caRotateBeforeMs: number;
  /** Lifetime of a new leaf (capped at its CA's expiry). */
  leafLifetimeMs: number;
  /** Renew the leaf this long before it expires. */
  leafRenewBeforeMs: number;
  /** How long a CA must have been observed in every object before leaves are signed by it. */
  propagationGraceMs: number;
}

/** A CA certificate of the bundle; `id` is its serial (or any stable unique name). */
export interface CaRecord {
  id: string;
  notBefore: number;
  notAfter: number;
  /**
   * False for a CA whose key is lost (its certificate recovered from the objects' bundles after its Secret
   * was deleted with no replica left to restore it): it stays trusted until its last leaf expired, signs nothing.
   */
  canSign?: boolean;
}

export interface LeafRecord {
  serial: string;
  /** The id of the CA that signed it. */
  signedBy: string;
  notBefore: number;
  notAfter: number;
}

export interface RotationState {
  /** The CAs of the bundle, oldest first (the order they were created in). */
  bundle: CaRecord[];
  /** The leaf being served, if any. */
  leaf: LeafRecord | undefined;
  /** Per CA id: the latest expiry of any leaf it signed (a CA with none signed has no entry). */
  lastLeafExpiry: Record<string, number>;
  /** The objects that must carry the bundle, by name (e.g. "mutatingwebhookconfiguration/certshare"). */
  objects: string[];
  /** Per object: the CA ids its caBundle was last observed to contain, each with the time first seen there. */
  observed: Record<string, Record<string, number>>;
  /** Per object: the CA ids last written to it and not contradicted by a later observation. */
  published: Record<string, string[]>;
}

export type RotationAction =
  | { kind: 'create-ca'; reason: string; notBefore: number; notAfter: number }
  | { kind: 'publish'; reason: string; objects: string[]; caIds: string[] }
  | { kind: 'issue-leaf'; reason: string; signer: string; notBefore: number; notAfter: number }
  | { kind: 'retire-ca'; reason: string; caId: string };

/** @forTests */
export interface RotationDecision {
  /** The next thing to do, or undefined when nothing is due now. */
  action: RotationAction | undefined;
  /** When something becomes due on its own (no new observation needed); undefined if nothing ever does. */
  nextCheckAt: number | undefined;
}

export function emptyRotationState(objects: string[]): RotationState {
  return { bundle: [], leaf: undefined, lastLeafExpiry: {}, objects: [...objects], observed: {}, published: {} };
}

/**
 * The most CAs a bundle holds: what a reader believes of the CA Secret (its first blocks) and what the writer writes.
 * The rotation keeps a CA at most its lifetime and adds one every lifetime minus --ca-rotate-before. The CA Secret
 * is the injector's account's to write too (a stolen token): unbounded, every replica parsed and verified each of
 * its blocks at each pass and the writer published them all (docs/security.md, "Values read back").
 */
export const MAX_BUNDLE_CAS = 8;

/** Rejects policies under which overlap cannot work (a new CA would be due before the last one propagated). */
export function rotationPolicyProblem(p: RotationPolicy): string | undefined {
  const all = [p.caLifetimeMs, p.caRotateBeforeMs, p.leafLifetimeMs, p.leafRenewBeforeMs];
  if (!all.every((ms) => Number.isFinite(ms) && ms > 0) || !(p.propagationGraceMs >= 0)) return 'lifetimes and rotation points must be positive';
  if (p.caRotateBeforeMs >= p.caLifetimeMs) return 'the CA rotation point must fall inside the CA lifetime';
  if (Math.ceil(p.caLifetimeMs / (p.caLifetimeMs - p.caRotateBeforeMs)) + 1 > MAX_BUNDLE_CAS)
    return `the CA rotation point must leave at most ${MAX_BUNDLE_CAS} CAs in the bundle at once (--ca-rotate-before at most 6/7 of the CA lifetime)`;
  if (p.leafRenewBeforeMs >= p.leafLifetimeMs) return 'the leaf renewal point must fall inside the leaf lifetime';
  if (p.caRotateBeforeMs <= p.propagationGraceMs) return 'the CA must rotate earlier than the propagation grace before its expiry';
  return undefined;
}

/** The newest CA that can sign: the one rotation points are measured from. */
const newest = (s: RotationState): CaRecord | undefined => s.bundle.findLast((ca) => ca.canSign !== false);

/** The instant from which every object has carried `caId` for `graceMs`; undefined while one lacks it. */
function trustedEverywhereSince(s: RotationState, caId: string, graceMs: number): number | undefined {
  let since = -Infinity;
  for (const object of s.objects) {
    const seen = s.observed[object]?.[caId];
    if (seen === undefined) return undefined;
    since = Math.max(since, seen + graceMs);
  }
  return since;
}

/**
 * The grace covers the apiserver's caches before a leaf moves to another CA; they trust the current leaf
 * meanwhile. The current leaf's own CA needs none, and with no leaf yet there is nothing to keep
 * working: the first leaf is served as soon as its CA is seen stored.
 */
const graceFor = (s: RotationState, p: RotationPolicy, caId: string): number => (s.leaf === undefined || s.leaf.signedBy === caId ? 0 : p.propagationGraceMs);

/** The CA a new leaf should be signed by: the newest valid one that every object has carried long enough. */
function preferredSigner(s: RotationState, p: RotationPolicy, now: number): CaRecord | undefined {
  for (let i = s.bundle.length - 1; i >= 0; i--) {
    const ca = s.bundle[i]!;
    if (now < ca.notBefore || now >= ca.notAfter || ca.canSign === false) continue;
    const since = trustedEverywhereSince(s, ca.id, graceFor(s, p, ca.id));
    if (since !== undefined && now >= since) return ca;
  }
  return undefined;
}

function newCaRule(s: RotationState, p: RotationPolicy, now: number): RotationAction | undefined {
  const last = newest(s);
  if (last === undefined) {
    const reason = s.bundle.length === 0 ? 'no CA yet' : 'no CA in the bundle has its key';
    return { kind: 'create-ca', reason, notBefore: now, notAfter: now + p.caLifetimeMs };
  }
  if (now >= last.notAfter - p.caRotateBeforeMs) {
    return { kind: 'create-ca', reason: `CA ${last.id} reached its rotation point`, notBefore: now, notAfter: now + p.caLifetimeMs };
  }
  return undefined;
}

function sameIds(a: readonly string[] | undefined, b: readonly string[]): boolean {
  return a !== undefined && a.length === b.length && b.every((id) => a.includes(id));
}

/** Writes are not repeated while in flight: an object is due when what was last written to it is not the bundle. */
function publishRule(s: RotationState): RotationAction | undefined {
  const caIds = s.bundle.map((ca) => ca.id);
  const behind = s.objects.filter((object) => !sameIds(s.published[object], caIds));
  if (behind.length === 0 || caIds.length === 0) return undefined;
  return { kind: 'publish', reason: `${behind.length} object(s) do not carry the current bundle`, objects: behind, caIds };
}

function leafRule(s: RotationState, p: RotationPolicy, now: number): RotationAction | undefined {
  const signer = preferredSigner(s, p, now);
  if (signer === undefined) return undefined;
  const notAfter = Math.min(now + p.leafLifetimeMs, signer.notAfter);
  const issue = (reason: string): RotationAction => ({ kind: 'issue-leaf', reason, signer: signer.id, notBefore: now, notAfter });
  const leaf = s.leaf;
  if (leaf === undefined) return issue('no leaf yet');
  if (now >= leaf.notAfter) return issue(`leaf ${leaf.serial} expired`);
  if (leaf.signedBy !== signer.id) return issue(`CA ${signer.id} is now trusted everywhere; leaf ${leaf.serial} is signed by ${leaf.signedBy}`);
  // A leaf capped at its CA's expiry cannot be improved by the same CA: wait for the next one instead of re-issuing.
  if (now >= leaf.notAfter - p.leafRenewBeforeMs && notAfter > leaf.notAfter) return issue(`leaf ${leaf.serial} reached its renewal point`);
  return undefined;
}

function retireRule(s: RotationState, now: number): RotationAction | undefined {
  const signerIndex = s.bundle.findIndex((ca) => ca.id === s.leaf?.signedBy);
  for (const [i, ca] of s.bundle.entries()) {
    if (now >= ca.notAfter && s.bundle.length > 1) return { kind: 'retire-ca', reason: `CA ${ca.id} expired`, caId: ca.id };
    // Only CAs older than the signer: a newer one is on its way in, not out.
    if (i >= signerIndex) continue;
    const lastLeaf = s.lastLeafExpiry[ca.id];
    if (lastLeaf === undefined || now >= lastLeaf) return { kind: 'retire-ca', reason: `the last leaf signed by CA ${ca.id} has expired`, caId: ca.id };
  }
  return undefined;
}

function nextCheck(s: RotationState, p: RotationPolicy, now: number): number | undefined {
  const times: number[] = [];
  const last = newest(s);
  if (last) times.push(last.notAfter - p.caRotateBeforeMs);
  for (const ca of s.bundle) {
    times.push(ca.notAfter);
    const since = trustedEverywhereSince(s, ca.id, graceFor(s, p, ca.id));
    if (since !== undefined) times.push(since);
    const lastLeaf = s.lastLeafExpiry[ca.id];
    if (lastLeaf !== undefined) times.push(lastLeaf);
  }
  if (s.leaf) times.push(s.leaf.notAfter - p.leafRenewBeforeMs, s.leaf.notAfter);
  const future = times.filter((t) => t > now);
  return future.length === 0 ? undefined : Math.min(...future);
}

/** The next action under `policy` at `now`, in priority order: a new CA, publishing, the leaf, retiring. */
export function decideRotation(s: RotationState, policy: RotationPolicy, now: number): RotationDecision {
  const action = newCaRule(s, policy, now) ?? publishRule(s) ?? leafRule(s, policy, now) ?? retireRule(s, now);
  return { action, nextCheckAt: nextCheck(s, policy, now) };
}

// --- transitions: what the driver records once an action succeeded --------------------------------

export function withLeaf(s: RotationState, leaf: LeafRecord): RotationState {
  const previous = s.lastLeafExpiry[leaf.signedBy];
  return {
    ...s,
    leaf,
    lastLeafExpiry: { ...s.lastLeafExpiry, [leaf.signedBy]: Math.max(previous ?? -Infinity, leaf.notAfter) },
  };
}

export function withoutCa(s: RotationState, caId: string): RotationState {
  const { [caId]: _gone, ...lastLeafExpiry } = s.lastLeafExpiry;
  return { ...s, bundle: s.bundle.filter((ca) => ca.id !== caId), lastLeafExpiry };
}

export function withPublished(s: RotationState, objects: string[], caIds: string[]): RotationState {
  const published = { ...s.published };
  for (const object of objects) published[object] = [...caIds];
  return { ...s, published };
}

/** A write failed: the object is due again. */
function withPublishFailed(s: RotationState, object: string): RotationState {
  const { [object]: _failed, ...published } = s.published;
  return { ...s, published };
}

/**
 * Records what an object's caBundle was seen to contain; a CA seen before keeps its first-seen time.
 * Content other than what was last written (someone edited it, or the write was lost) makes it due again.
 */
export function withObservation(s: RotationState, object: string, caIds: string[], now: number): RotationState {
  const before = s.observed[object] ?? {};
  const seen: Record<string, number> = {};
  for (const id of caIds) seen[id] = before[id] ?? now;
  const next = { ...s, observed: { ...s.observed, [object]: seen } };
  return sameIds(s.published[object], caIds) ? next : withPublishFailed(next, object);
}
