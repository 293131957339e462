import type { V1Secret } from './transport/client-node.ts';
import { expiredInfo, inspectCertPair, validateCertPair } from '../core/certificates/certificate.ts';
import { errorMessage } from '../core/errors.ts';
import { pendingRenewRequest } from '../core/renewal/renew-request.ts';
import type { Coordination, RecordedCert, RenewAnswer, StoreRead, StoredCert } from '../core/ports/store.ts';
import { iso } from '../core/ports/clock.ts';
import { REPLACED_NOW_MAX, boundReplacedNow } from '../core/values/untrusted-values.ts';

export const LABEL_MANAGED_BY = 'app.kubernetes.io/managed-by';
export const LABEL_GROUP = 'certshare.io/group';
const ANNOTATION_NOT_AFTER = 'certshare.io/not-after';
export const ANNOTATION_SERIAL = 'certshare.io/serial';
export const ANNOTATION_WRITER = 'certshare.io/written-by';
/** RFC 3339: when the writer obtained the certificate from tailscaled (the renewal rule measures from it). */
const ANNOTATION_OBTAINED_AT = 'certshare.io/obtained-at';
/** JSON {"holder","at"}: a writer is about to call CertPair. @forTests */
export const ANNOTATION_INTENT = 'certshare.io/issuing';
/** RFC 3339: no CertPair call for this domain before then, on any replica. */
const ANNOTATION_RETRY_NOT_BEFORE = 'certshare.io/retry-not-before';
/** An operator's renew request (certshare renew): its id. The operator writes it; the writer never does. */
export const ANNOTATION_RENEW_REQUESTED = 'certshare.io/renew-requested';
/** The id of the last renew request the writer answered, and what became of it (written together). */
export const ANNOTATION_RENEW_ANSWERED = 'certshare.io/renew-answered';
export const ANNOTATION_RENEW_OUTCOME = 'certshare.io/renew-outcome';
/**
 * The data keys of a pair valid only later (StoreRead.pending): beside tls.crt and tls.key, never in them, which
 * whatever mounts the kubernetes.io/tls Secret (a proxy, an ingress) would serve at once.
 */
const DATA_PENDING_CERT = 'pending.crt';
const DATA_PENDING_KEY = 'pending.key';
/**
 * The serials of certificates replaced because the CA asked for it now (ARI: a revocation), newest first,
 * comma-separated, at most REPLACED_NOW_MAX: every replica counts its proxy still serving one as bad.
 */
const ANNOTATION_REPLACED_NOW = 'certshare.io/replaced-now';
/** The serial of a certificate this member issued on its own while the federation home was unreachable. */
export const ANNOTATION_BREAK_GLASS = 'certshare.io/break-glass';

/**
 * What certshare keeps of a Secret: the fields it reads and writes back (see certSecret below), without
 * managedFields, timestamps or owner references. A few KB per domain, the Secret's data included.
 */
export interface WatchedSecret {
  type?: string | undefined;
  metadata: { name: string; resourceVersion?: string | undefined; labels?: Record<string, string>; annotations?: Record<string, string> };
  data?: Record<string, string>;
}

/** The fields of a Secret the codec reads: a WatchedSecret, or a V1Secret as client-node returns it. */
interface SecretFields {
  type?: string | undefined;
  metadata?:
    | { resourceVersion?: string | undefined; labels?: Record<string, string> | undefined; annotations?: Record<string, string> | undefined }
    | undefined;
  data?: Record<string, string> | undefined;
}

/** Reduces a Secret from a list, a watch event or a write's answer to a WatchedSecret (undefined without a name). */
export function slimSecret(object: unknown): WatchedSecret | undefined {
  const { type, metadata, data } = (object ?? {}) as {
    type?: string;
    metadata?: { name?: string; resourceVersion?: string; labels?: Record<string, string>; annotations?: Record<string, string> };
    data?: Record<string, string>;
  };
  if (!metadata?.name) return undefined;
  const { name, resourceVersion, labels, annotations } = metadata;
  return {
    ...(type !== undefined ? { type } : {}),
    metadata: { name, resourceVersion, ...(labels ? { labels } : {}), ...(annotations ? { annotations } : {}) },
    ...(data ? { data } : {}),
  };
}

/**
 * Whether `a` is an older version of one Secret than `b`. The API server's resourceVersion is etcd's revision, a
 * decimal integer that grows with every write; anything else orders nothing (false), and neither does an absence.
 */
export function olderVersion(a: WatchedSecret | null | undefined, b: WatchedSecret | null | undefined): boolean {
  const [x, y] = [a?.metadata.resourceVersion, b?.metadata.resourceVersion];
  if (x === undefined || y === undefined || !/^[0-9]{1,30}$/.test(x) || !/^[0-9]{1,30}$/.test(y)) return false;
  return BigInt(x) < BigInt(y);
}

const decode = (value: string | undefined): string | undefined => (value === undefined ? undefined : Buffer.from(value, 'base64').toString('utf8'));

/** The coordination annotations; malformed values are ignored (a hand edit must not block issuance forever). */
export function readCoordination(secret: SecretFields): Coordination {
  const annotations = secret.metadata?.annotations ?? {};
  const coordination: Coordination = {};
  const until = Date.parse(annotations[ANNOTATION_RETRY_NOT_BEFORE] ?? '');
  if (Number.isFinite(until)) coordination.retryNotBefore = until;
  const renew = pendingRenewRequest(annotations[ANNOTATION_RENEW_REQUESTED], annotations[ANNOTATION_RENEW_ANSWERED]);
  if (renew !== undefined) coordination.renewRequest = renew;
  try {
    const intent = JSON.parse(annotations[ANNOTATION_INTENT] ?? 'null') as { holder?: unknown; at?: unknown } | null;
    const at = typeof intent?.at === 'string' ? Date.parse(intent.at) : NaN;
    if (typeof intent?.holder === 'string' && Number.isFinite(at)) coordination.intent = { holder: intent.holder, at };
  } catch {
    // Not JSON: no intent.
  }
  return coordination;
}

/** An X.509 serial as certSecret writes it (hex, at most 20 octets and a sign octet): a longer annotation is no record. */
const RECORD_SERIAL = /^[0-9A-Fa-f]{1,42}$/;

/**
 * The certificate of record the Secret's annotations name (StoreRead.record): the serial certSecret wrote with the
 * pair, bounded (anyone with the Secret's write verb can set it), and its not-after if that parses.
 */
function recordOf(secret: SecretFields): RecordedCert | undefined {
  const annotations = secret.metadata?.annotations ?? {};
  const serial = annotations[ANNOTATION_SERIAL];
  if (serial === undefined || !RECORD_SERIAL.test(serial)) return undefined;
  const notAfter = Date.parse(annotations[ANNOTATION_NOT_AFTER] ?? '');
  return { serial, notAfter: Number.isFinite(notAfter) ? notAfter : undefined };
}

/** What a Secret holds for `domain`: an empty or hand-edited Secret is `unusable`, never an error. */
export function readCertSecret(secret: SecretFields, domain: string, now: number): StoreRead {
  const read = readCertData(secret, domain, now);
  const record = recordOf(secret);
  if (read.state === 'valid') {
    // Only for the certificate it was written with: a hand-edited Secret falls back to notBefore.
    const annotations = secret.metadata?.annotations ?? {};
    const obtainedAt = Date.parse(annotations[ANNOTATION_OBTAINED_AT] ?? '');
    if (annotations[ANNOTATION_SERIAL] === read.cert.info.serial && Number.isFinite(obtainedAt)) read.cert.obtainedAt = obtainedAt;
  }
  const pending = readPending(secret, domain, now);
  const replacedNow = secret.metadata?.annotations?.[ANNOTATION_REPLACED_NOW];
  return {
    ...read,
    coordination: readCoordination(secret),
    ...(record ? { record } : {}),
    ...(pending ? { pending } : {}),
    ...(replacedNow !== undefined ? { replacedNow } : {}),
  };
}

/**
 * The Secret's pair stored for later, if whole, for `domain` and not expired (valid now too: a writer stopped at
 * its notBefore, before it moved it into tls.crt); anything else is no pair (a hand edit loses nothing served).
 */
function readPending(secret: SecretFields, domain: string, now: number): StoredCert | undefined {
  const certPem = decode(secret.data?.[DATA_PENDING_CERT]);
  const keyPem = decode(secret.data?.[DATA_PENDING_KEY]);
  if (!certPem || !keyPem) return undefined;
  const pair = { certPem, keyPem };
  try {
    const info = inspectCertPair(pair, domain);
    return now < info.notAfter ? { pair, info } : undefined;
  } catch {
    return undefined;
  }
}

function readCertData(secret: SecretFields, domain: string, now: number): StoreRead {
  const certPem = decode(secret.data?.['tls.crt']);
  const keyPem = decode(secret.data?.['tls.key']);
  // The writer's intent record before the first issuance has stored anything (certSecret below).
  if (!certPem && !keyPem) return { state: 'unusable', reason: 'Secret holds no tls.crt / tls.key', empty: true };
  if (!certPem || !keyPem) return { state: 'unusable', reason: `Secret lacks ${certPem ? 'tls.key' : 'tls.crt'}` };
  const pair = { certPem, keyPem };
  try {
    return { state: 'valid', cert: { pair, info: validateCertPair(pair, domain, now) } };
  } catch (err) {
    const expired = expiredInfo(pair, domain, now);
    return { state: 'unusable', reason: errorMessage(err), ...(expired ? { expired: { pair, info: expired } } : {}) };
  }
}

export interface SecretMeta {
  namespace: string;
  group: string | undefined;
  writer: string | undefined;
}

/**
 * The Secret to write: `base` (the last read, if any) with certshare's labels restored, other people's
 * labels and annotations kept, and the resourceVersion of `base` for compare-and-swap.
 */
export function certSecret(
  domain: string,
  base: SecretFields | undefined,
  meta: SecretMeta,
  change: {
    cert?: StoredCert;
    /** A pair valid only later, stored beside the served one (StoreRead.pending). */
    pending?: StoredCert;
    coordination: Coordination;
    renewAnswer?: RenewAnswer | undefined;
    /** The serial of the certificate `cert` replaces because the CA asked for it now (SaveOptions.replacedNow). */
    replacedNow?: string | undefined;
    /** Set beside certshare's own; null removes one. */
    annotations?: Record<string, string | null> | undefined;
  },
): V1Secret {
  const labels: Record<string, string> = { ...base?.metadata?.labels, [LABEL_MANAGED_BY]: 'certshare' };
  if (meta.group) labels[LABEL_GROUP] = meta.group;
  const annotations: Record<string, string> = { ...base?.metadata?.annotations };
  delete annotations[ANNOTATION_INTENT];
  delete annotations[ANNOTATION_RETRY_NOT_BEFORE];
  const { intent, retryNotBefore } = change.coordination;
  if (intent) annotations[ANNOTATION_INTENT] = JSON.stringify({ holder: intent.holder, at: iso(intent.at) });
  if (retryNotBefore !== undefined) annotations[ANNOTATION_RETRY_NOT_BEFORE] = iso(retryNotBefore);
  if (change.renewAnswer) {
    annotations[ANNOTATION_RENEW_ANSWERED] = change.renewAnswer.id;
    annotations[ANNOTATION_RENEW_OUTCOME] = change.renewAnswer.outcome;
  }
  for (const [name, value] of Object.entries(change.annotations ?? {})) {
    if (value === null) delete annotations[name];
    else annotations[name] = value;
  }
  if (change.replacedNow) {
    // Added to those named before (an unreadable value is dropped, not carried): the latest REPLACED_NOW_MAX.
    const before = boundReplacedNow(annotations[ANNOTATION_REPLACED_NOW]).serials;
    const serials = [...new Set([change.replacedNow.toUpperCase(), ...before.map((s) => s.toUpperCase())])];
    annotations[ANNOTATION_REPLACED_NOW] = serials.slice(0, REPLACED_NOW_MAX).join(',');
  }
  let data = base?.data ?? { 'tls.crt': '', 'tls.key': '' };
  if (change.cert) {
    annotations[ANNOTATION_NOT_AFTER] = iso(change.cert.info.notAfter);
    annotations[ANNOTATION_SERIAL] = change.cert.info.serial;
    if (change.cert.obtainedAt !== undefined) annotations[ANNOTATION_OBTAINED_AT] = iso(change.cert.obtainedAt);
    else delete annotations[ANNOTATION_OBTAINED_AT];
    if (meta.writer) annotations[ANNOTATION_WRITER] = meta.writer;
    const keep = pendingData(data, domain, change.cert.info.notAfter);
    data = { 'tls.crt': Buffer.from(change.cert.pair.certPem).toString('base64'), 'tls.key': Buffer.from(change.cert.pair.keyPem).toString('base64'), ...keep };
  }
  if (change.pending) {
    const { certPem, keyPem } = change.pending.pair;
    data = { ...data, [DATA_PENDING_CERT]: Buffer.from(certPem).toString('base64'), [DATA_PENDING_KEY]: Buffer.from(keyPem).toString('base64') };
  }
  const resourceVersion = base?.metadata?.resourceVersion;
  return {
    apiVersion: 'v1',
    kind: 'Secret',
    // A Secret someone created with another type keeps it: the type is immutable, the keys are what matter.
    type: base?.type ?? 'kubernetes.io/tls',
    metadata: { name: domain, namespace: meta.namespace, labels, annotations, ...(resourceVersion ? { resourceVersion } : {}) },
    data,
  };
}

/**
 * The pending keys of `data` that outlive a save of a pair ending at `notAfter`: only a pair that ends later (a
 * restore of an older copy must not drop the newest issuance); one the save makes served, or garbage, goes.
 */
function pendingData(data: Record<string, string>, domain: string, notAfter: number): Record<string, string> {
  const pending = readPending({ data }, domain, Number.NEGATIVE_INFINITY);
  if (!pending || pending.info.notAfter <= notAfter) return {};
  return { [DATA_PENDING_CERT]: data[DATA_PENDING_CERT]!, [DATA_PENDING_KEY]: data[DATA_PENDING_KEY]! };
}
