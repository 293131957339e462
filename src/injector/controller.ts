// Drives the CA rotation policy (src/core/injector-ca/ca-rotation.ts) against the cluster: the CAs live in one Secret,
// the serving leaf in another, the bundle in the objects named by flag. Every replica reads (watching the
// Secrets and the objects) and serves the leaf; only the holder of the writer role (a Lease, as for the
// daemon's groups) writes. Every write is still compare-and-swap on the resourceVersion it read, so a
// holder whose Lease has just run out and its successor deciding the same action cost one 409 and a
// re-read, never two CAs or two leaves.
import { EventEmitter } from 'node:events';
import { X509Certificate } from 'node:crypto';
import type { V1Secret, CustomObjectsApi } from '../kube/transport/client-node.ts';
import {
  decideRotation,
  emptyRotationState,
  withLeaf,
  withObservation,
  withoutCa,
  withPublished,
  MAX_BUNDLE_CAS,
  type CaRecord,
  type LeafRecord,
  type RotationAction,
  type RotationPolicy,
  type RotationState,
} from '../core/injector-ca/ca-rotation.ts';
import { type Clock, iso } from '../core/ports/clock.ts';
import { signedByCa } from '../core/certificates/trust.ts';
import { CLOCK_SKEW_MS, OutOfBoundsLog, type OutOfBoundsReport, type UntrustedValue } from '../core/values/untrusted-values.ts';
import { CertshareError, errorMessage } from '../core/errors.ts';
import type { Logger } from '../core/ports/logger.ts';
import type { IssuanceRole } from '../core/ports/store.ts';
import { apiErrorText, apiStatus, type KubeConnection } from '../kube/connection.ts';
import { withSignal } from '../kube/transport/https-transport.ts';
import { SecretWatch, type ObjectCollection } from '../kube/secret-watch.ts';
// The replica that wrote this version of a Secret, as the daemon's Secrets say it.
import { ANNOTATION_WRITER } from '../kube/secret-codec.ts';
import { createInjectorCa, issueServingLeaf, loadInjectorCa, type LeafNames } from './pki.ts';
import { TARGET_API, type Target } from '../core/injector-ca/ca-targets.ts';
import { observedCaSerials, observedCas, targetKey, withCaBundle } from './targets.ts';
import type { ServingPair } from './tls-server.ts';
import { checkedPair } from '../tls/serving-pair.ts';

interface InjectorControllerOptions {
  connection: KubeConnection;
  custom: CustomObjectsApi;
  clock: Clock;
  logger: Logger;
  policy: RotationPolicy;
  targets: Target[];
  caSecret: string;
  tlsSecret: string;
  names: LeafNames;
  /** Called with each new valid leaf to serve (the TLS server's setPair). */
  serve: (pair: ServingPair) => void;
  /** Re-read the injected objects at least this often (someone may edit a caBundle). */
  resyncMs: number;
  /** After an error, the first wait (doubling up to resyncMs). */
  firstRetryMs?: number;
  /** Where a value read back from the Secrets and not believed is counted (the injector's metrics); it is logged besides. */
  onOutOfBounds?: OutOfBoundsReport;
  /**
   * Who may write (the injector's LeaseElector). Without it this replica always writes: one replica alone,
   * or tests of the rotation itself.
   */
  writer?: IssuanceRole;
}

const LAST_LEAF_EXPIRY = 'certshare.io/last-leaf-expiry';
const SIGNED_BY = 'certshare.io/signed-by';
/** The scope canIssue() is asked about: the injector has one writer for everything it keeps. */
const WRITER_SCOPE = 'injector';
const CA_KEY = (serial: string) => `ca-${serial}.key`;
const CERT_BLOCK = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g;
/** The largest block of ca.crt read as a CA: several times an RSA 4096 CA's, whose key is the largest a CA uses. */
const MAX_CA_PEM = 8 * 1024;

const b64 = (text: string) => Buffer.from(text).toString('base64');
const unb64 = (text: string | undefined) => Buffer.from(text ?? '', 'base64').toString('utf8');

/** A write lost a compare-and-swap: re-read and decide again at once. */
class Conflict extends Error {}

/** The writer role was lost before a write: nothing is written, the replica goes on reading. */
class NotWriter extends Error {}

interface CaEntry extends CaRecord {
  certPem: string;
}

interface InjectorControllerEvents {
  served: [serial: string];
  action: [action: RotationAction];
  /** A pass failed: lost a compare-and-swap (re-read at once) or an error (retried with backoff). */
  failed: [kind: 'conflict' | 'error', error: string];
}

export class InjectorController extends EventEmitter<InjectorControllerEvents> {
  readonly #o: InjectorControllerOptions;
  #state: RotationState;
  #caSecret: V1Secret | null = null;
  #tlsSecret: V1Secret | null = null;
  #cas: CaEntry[] = [];
  readonly #targetObjects = new Map<string, Record<string, unknown> | null>();
  readonly #abort = new AbortController();
  #wake: AbortController | undefined;
  #woken = false;
  #done: Promise<void> | undefined;
  readonly #watches: SecretWatch[] = [];
  #unsubscribe: (() => void) | undefined;
  #servedSerial: string | undefined;
  readonly #outOfBounds: OutOfBoundsLog;
  /** Actions applied since start, by kind (tests and metrics read it). */
  readonly counts: Record<RotationAction['kind'] | 'conflict' | 'error', number> = {
    'create-ca': 0,
    publish: 0,
    'issue-leaf': 0,
    'retire-ca': 0,
    conflict: 0,
    error: 0,
  };

  constructor(options: InjectorControllerOptions) {
    super();
    this.#o = options;
    this.#state = emptyRotationState(options.targets.map(targetKey));
    this.#outOfBounds = new OutOfBoundsLog(options.logger, (where, value) => options.onOutOfBounds?.(where, value));
  }

  get state(): RotationState {
    return this.#state;
  }

  /** Whether this replica holds the writer role now. */
  get isWriter(): boolean {
    return this.#o.writer?.canIssue(WRITER_SCOPE) ?? true;
  }

  start(): void {
    if (this.#done) return;
    // Becoming the writer wakes the loop: a step a former writer left undone is taken at once.
    this.#unsubscribe = this.#o.writer?.onChange?.(() => this.wake());
    const { connection, clock, logger, custom } = this.#o;
    for (const name of [this.#o.caSecret, this.#o.tlsSecret]) {
      this.#watches.push(new SecretWatch({ connection, name, clock, logger, onChange: () => this.wake() }));
    }
    // The targets are watched the same way (list, then watch with bookmarks, resume, relist on 410, backoff):
    // a caBundle wiped by a redeploy of the configuration (Helm, Argo CD) is written back within a second.
    for (const target of this.#o.targets) {
      const api = TARGET_API[target.kind];
      const collection: ObjectCollection = {
        path: `/apis/${api.group}/${api.version}/${api.plural}`,
        list: (query, signal) => custom.listClusterCustomObject({ ...api, ...query }, withSignal(signal)) as ReturnType<ObjectCollection['list']>,
      };
      const targetLogger = logger.child({ target: targetKey(target) });
      this.#watches.push(new SecretWatch({ connection, name: target.name, clock, logger: targetLogger, collection, onChange: () => this.wake() }));
    }
    for (const watch of this.#watches) watch.start();
    this.#done = this.#run();
  }

  /** Look again now (a Secret changed, or a test wants it). */
  wake(): void {
    this.#woken = true;
    this.#wake?.abort();
  }

  async stop(): Promise<void> {
    this.#unsubscribe?.();
    this.#abort.abort();
    this.#wake?.abort();
    await Promise.all(this.#watches.map((w) => w.stop()));
    await this.#done;
  }

  async #run(): Promise<void> {
    const { clock, logger, resyncMs } = this.#o;
    let failures = 0;
    while (!this.#abort.signal.aborted) {
      let waitMs = resyncMs;
      this.#woken = false;
      try {
        await this.#refresh();
        const decision = decideRotation(this.#state, this.#o.policy, clock.now());
        if (decision.action && !this.isWriter) {
          // A reader: the writer takes the step; its Secret writes (watched) wake this loop to serve.
          logger.debug({ action: decision.action.kind }, 'CA rotation step due; left to the writer');
        } else if (decision.action) {
          logger.info({ action: decision.action.kind, reason: decision.action.reason }, 'CA rotation step');
          await this.#apply(decision.action);
          this.counts[decision.action.kind]++;
          this.emit('action', decision.action);
          waitMs = 0;
        } else if (decision.nextCheckAt !== undefined) {
          waitMs = Math.min(resyncMs, Math.max(0, decision.nextCheckAt - clock.now()));
        }
        failures = 0;
      } catch (err) {
        if (this.#abort.signal.aborted) break;
        if (err instanceof NotWriter) {
          logger.info({ err: err.message }, 'no longer the writer; reading only');
        } else if (err instanceof Conflict) {
          this.counts.conflict++;
          this.emit('failed', 'conflict', err.message);
          logger.debug({ err: err.message }, 'lost a compare-and-swap; re-reading');
          waitMs = 0;
        } else {
          failures++;
          this.counts.error++;
          const first = this.#o.firstRetryMs ?? 500;
          waitMs = Math.min(resyncMs, first * 2 ** Math.min(failures - 1, 16));
          const code = err instanceof CertshareError ? err.code : 'CERTSHARE_STORE_UNAVAILABLE';
          logger.warn({ code, err: errorMessage(err), retryInMs: waitMs }, 'injector CA step failed');
          this.emit('failed', 'error', errorMessage(err));
        }
      }
      if (waitMs > 0 && !this.#woken) {
        this.#wake = new AbortController();
        await clock.sleep(waitMs, AbortSignal.any([this.#wake.signal, this.#abort.signal])).catch(() => {});
      }
    }
  }

  /** Every write asks first: leadership counts until the Lease's last renewal plus its duration, no longer. */
  #mayWrite(what: string): void {
    if (!this.isWriter) throw new NotWriter(`not the writer any more; not writing ${what}`);
  }

  #call() {
    // The transport bounds every call (connectKube's requestTimeoutMs); this adds the stop signal.
    return withSignal(this.#abort.signal);
  }

  async #readSecret(name: string): Promise<V1Secret | null> {
    const { core, namespace } = this.#o.connection;
    try {
      return await core.readNamespacedSecret({ name, namespace }, this.#call());
    } catch (err) {
      if (apiStatus(err) === 404) return null;
      throw unavailable('read', `Secret ${namespace}/${name}`, err);
    }
  }

  /** Creates (when `previous` is null) or replaces the Secret at the version read; a 409/404 is a Conflict. */
  async #writeSecret(name: string, previous: V1Secret | null, body: V1Secret): Promise<V1Secret> {
    const { core, namespace } = this.#o.connection;
    this.#mayWrite(`Secret ${namespace}/${name}`);
    const identity = this.#o.writer?.identity;
    const annotations = { ...body.metadata?.annotations, ...(identity ? { [ANNOTATION_WRITER]: identity } : {}) };
    const full: V1Secret = {
      ...body,
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { ...body.metadata, annotations, name, namespace, ...(previous ? { resourceVersion: previous.metadata?.resourceVersion } : {}) },
    };
    try {
      return previous === null
        ? await core.createNamespacedSecret({ namespace, body: full }, this.#call())
        : await core.replaceNamespacedSecret({ name, namespace, body: full }, this.#call());
    } catch (err) {
      const status = apiStatus(err);
      if (status === 409 || status === 404) throw new Conflict(`Secret ${namespace}/${name} changed meanwhile`);
      throw unavailable('write', `Secret ${namespace}/${name}`, err);
    }
  }

  /**
   * A Secret deleted (or emptied) by hand is written back from the last one read, never answered with a
   * new CA: a new CA would replace the one every caller trusts at once, cert-controller's failure mode.
   */
  async #restored(name: string, current: V1Secret | null, last: V1Secret | null): Promise<V1Secret | null> {
    const lost = current === null || Object.keys(current.data ?? {}).length === 0;
    if (!lost || !last?.data || Object.keys(last.data).length === 0) return current;
    // A reader keeps what it read (and serves its leaf); the writer restores.
    if (!this.isWriter) return last;
    this.#o.logger.warn({ code: 'CERTSHARE_STORE_CORRUPT', secret: name }, 'Secret deleted or emptied; restoring it from the last read');
    const { resourceVersion: _old, uid: _uid, creationTimestamp: _created, managedFields: _fields, ...metadata } = last.metadata ?? {};
    return this.#writeSecret(name, current, { type: last.type, metadata, data: last.data });
  }

  /** Reads both Secrets and every target, and rebuilds the policy's view (keeping first-seen times). */
  async #refresh(): Promise<void> {
    const now = this.#o.clock.now();
    const [caRead, tlsRead] = await Promise.all([this.#readSecret(this.#o.caSecret), this.#readSecret(this.#o.tlsSecret)]);
    const [restoredCa, tlsSecret] = await Promise.all([
      this.#restored(this.#o.caSecret, caRead, this.#caSecret),
      this.#restored(this.#o.tlsSecret, tlsRead, this.#tlsSecret),
    ]);
    await Promise.all(
      this.#o.targets.map(async (target) => {
        const object = await this.#readTarget(target);
        this.#targetObjects.set(targetKey(target), object);
      }),
    );
    const caSecret = restoredCa ?? (await this.#recoveredCaSecret(tlsSecret, now));
    this.#caSecret = caSecret;
    this.#tlsSecret = tlsSecret;
    const ca = casIn(caSecret, now);
    this.#cas = ca.cas;
    // The writer keeps only a leaf naming what it would name; a reader serves any leaf of the bundle (a rollout adding a name).
    const leaf = leafRecordOf(tlsSecret, this.#cas, now, this.isWriter ? this.#o.names : undefined);
    const where = (name: string) => `the Secret ${this.#o.connection.namespace}/${name}`;
    this.#outOfBounds.read(where(this.#o.caSecret), ca.refused);
    this.#outOfBounds.read(where(this.#o.tlsSecret), leaf.refused);
    const bundle = this.#cas.map(({ certPem: _pem, ...ca }) => ca);
    let state: RotationState = { ...this.#state, bundle, lastLeafExpiry: ca.lastLeafExpiry, leaf: leaf.leaf };
    const ids = state.bundle.map((ca) => ca.id);
    for (const target of this.#o.targets) {
      const key = targetKey(target);
      const object = this.#targetObjects.get(key);
      const seen = object ? observedCaSerials(target.kind, object) : [];
      state = withObservation(state, key, seen, now);
      // What is there already is what a write would put there.
      if (seen.length === ids.length && ids.every((id) => seen.includes(id))) state = withPublished(state, [key], ids);
    }
    this.#state = state;
    this.#serveCurrent(now);
  }

  /**
   * The CA Secret is gone and no replica read it (all restarted meanwhile): its keys are lost, but the
   * objects still carry its CAs, and the served leaf is signed by one of them. A new CA alone would replace
   * them at once (cert-controller's failure mode); instead the CA Secret is written again with those CAs,
   * keyless, and the leaf's expiry: they stay trusted until it expires, a new CA joins and signs from then on.
   */
  async #recoveredCaSecret(tlsSecret: V1Secret | null, now: number): Promise<V1Secret | null> {
    if (!this.isWriter) return null;
    const recovered = new Map<string, string>();
    for (const target of this.#o.targets) {
      const object = this.#targetObjects.get(targetKey(target));
      if (object) for (const [serial, pem] of observedCas(target.kind, object)) recovered.set(serial, pem);
    }
    if (recovered.size === 0) return null;
    const cas: CaEntry[] = [...recovered].slice(0, MAX_BUNDLE_CAS).map(([id, certPem]) => {
      const cert = new X509Certificate(certPem);
      return { id, notBefore: cert.validFromDate.getTime(), notAfter: cert.validToDate.getTime(), canSign: false, certPem };
    });
    this.#cas = cas;
    const { leaf } = leafRecordOf(tlsSecret, this.#cas, now);
    const lastLeafExpiry = leaf && recovered.has(leaf.signedBy) ? { [leaf.signedBy]: leaf.notAfter } : {};
    this.#o.logger.warn(
      { code: 'CERTSHARE_STORE_CORRUPT', secret: this.#o.caSecret, cas: [...recovered.keys()], lastLeafExpiry },
      'CA Secret lost with its keys; its CAs recovered from the caBundles stay trusted until their last leaf expires, and a new CA takes over',
    );
    return this.#writeSecret(this.#o.caSecret, null, caSecretBody(cas, {}, lastLeafExpiry));
  }

  #serveCurrent(now: number): void {
    const leaf = this.#state.leaf;
    if (!leaf || leaf.serial === this.#servedSerial || now >= leaf.notAfter) return;
    const pair = { certPem: unb64(this.#tlsSecret?.data?.['tls.crt']), keyPem: unb64(this.#tlsSecret?.data?.['tls.key']) };
    try {
      this.#o.serve(pair);
      this.#servedSerial = leaf.serial;
      this.#o.logger.info({ serial: leaf.serial, signedBy: leaf.signedBy, notAfter: iso(leaf.notAfter) }, 'serving a new webhook certificate');
      this.emit('served', leaf.serial);
    } catch (err) {
      this.#o.logger.error(
        { code: 'CERTSHARE_CERT_INVALID', err: errorMessage(err) },
        'the webhook certificate in the Secret is unusable; keeping the current one',
      );
    }
  }

  async #readTarget(target: Target): Promise<Record<string, unknown> | null> {
    const api = TARGET_API[target.kind];
    try {
      return (await this.#o.custom.getClusterCustomObject({ ...api, name: target.name }, this.#call())) as Record<string, unknown>;
    } catch (err) {
      if (apiStatus(err) === 404) {
        this.#o.logger.warn(
          { code: 'CERTSHARE_BAD_CONFIG', target: targetKey(target) },
          'object to inject the caBundle into does not exist; no leaf can be trusted until it does',
        );
        return null;
      }
      throw unavailable('read', targetKey(target), err);
    }
  }

  async #apply(action: RotationAction): Promise<void> {
    const keys = { ...(this.#caSecret?.data ?? {}) };
    switch (action.kind) {
      case 'create-ca': {
        const ca = await createInjectorCa(action);
        const entry: CaEntry = { id: ca.serial, notBefore: ca.notBefore, notAfter: ca.notAfter, certPem: ca.certPem };
        keys[CA_KEY(ca.serial)] = b64(ca.keyPem);
        const cas = withNewCa(this.#cas, entry, this.#state.leaf?.signedBy);
        await this.#writeSecret(this.#o.caSecret, this.#caSecret, caSecretBody(cas, keys, this.#state.lastLeafExpiry));
        return;
      }
      case 'publish': {
        const bundlePem = this.#cas
          .filter((ca) => action.caIds.includes(ca.id))
          .map((ca) => ca.certPem)
          .join('');
        for (const target of this.#o.targets) {
          const key = targetKey(target);
          const object = this.#targetObjects.get(key);
          if (!action.objects.includes(key)) continue;
          // An error, not a skip: the pass backs off (and the target's watch wakes it once the object exists).
          if (!object)
            throw new CertshareError('CERTSHARE_BAD_CONFIG', { source: key, reason: 'does not exist: no leaf can be trusted until it carries the bundle' });
          const api = TARGET_API[target.kind];
          this.#mayWrite(`the caBundle of ${key}`);
          try {
            // The body carries the resourceVersion read: a replace is compare-and-swap.
            await this.#o.custom.replaceClusterCustomObject({ ...api, name: target.name, body: withCaBundle(target.kind, object, bundlePem) }, this.#call());
          } catch (err) {
            if (apiStatus(err) === 409) throw new Conflict(`${key} changed meanwhile`);
            throw unavailable('write', `the caBundle of ${key}`, err);
          }
        }
        return;
      }
      case 'issue-leaf': {
        const signer = this.#cas.find((ca) => ca.id === action.signer);
        const signerKey = keys[CA_KEY(action.signer)];
        if (!signer || signerKey === undefined)
          throw new CertshareError('CERTSHARE_STORE_CORRUPT', {
            object: `Secret ${this.#o.caSecret}`,
            damage: `no CA ${action.signer} or no key for it`,
            consequence: 'no leaf is signed by it',
          });
        const ca = await loadInjectorCa({ certPem: signer.certPem, keyPem: unb64(signerKey) });
        const leaf = await issueServingLeaf(ca, this.#o.names, action);
        // Intent first: the CA Secret records how long this CA must stay trusted before the leaf exists
        // anywhere. A crash in between leaves a CA in the bundle a little longer, never a leaf untrusted.
        const { lastLeafExpiry } = withLeaf(this.#state, { serial: leaf.serial, signedBy: signer.id, notBefore: leaf.notBefore, notAfter: leaf.notAfter });
        this.#caSecret = await this.#writeSecret(this.#o.caSecret, this.#caSecret, caSecretBody(this.#cas, keys, lastLeafExpiry));
        await this.#writeSecret(this.#o.tlsSecret, this.#tlsSecret, {
          type: 'kubernetes.io/tls',
          metadata: { labels: { 'app.kubernetes.io/managed-by': 'certshare-injector' }, annotations: { [SIGNED_BY]: signer.id } },
          data: { 'tls.crt': b64(leaf.chainPem), 'tls.key': b64(leaf.keyPem) },
        });
        return;
      }
      case 'retire-ca': {
        const { lastLeafExpiry } = withoutCa(this.#state, action.caId);
        delete keys[CA_KEY(action.caId)];
        const kept = this.#cas.filter((ca) => ca.id !== action.caId);
        await this.#writeSecret(this.#o.caSecret, this.#caSecret, caSecretBody(kept, keys, lastLeafExpiry));
        return;
      }
    }
  }
}

/**
 * What a read of the CA Secret, which the injector's account (a stolen token) may write, believes: the CAs of its
 * bundle an injector could have written (a self-signed CA certificate, valid from no later than now plus the
 * skew), each able to sign when the Secret holds its own key; and how long each must stay trusted, a record that
 * does not read as a time keeping its CA until that CA's own expiry. Only its first MAX_BUNDLE_CAS blocks are
 * read, each of at most MAX_CA_PEM: the rest is never parsed nor published. What it refuses is left out and reported.
 */
function casIn(caSecret: V1Secret | null, now: number): { cas: CaEntry[]; lastLeafExpiry: Record<string, number>; refused: UntrustedValue[] } {
  const cas: CaEntry[] = [];
  const refused: UntrustedValue[] = [];
  const refuse = (value: string, why: string) => refused.push({ field: 'injector-ca', value, why });
  const blocks = unb64(caSecret?.data?.['ca.crt']).match(CERT_BLOCK) ?? [];
  if (blocks.length > MAX_BUNDLE_CAS)
    refuse(
      `${blocks.length - MAX_BUNDLE_CAS} block(s) of ca.crt after its first ${MAX_BUNDLE_CAS}`,
      `more CAs than a bundle holds (${MAX_BUNDLE_CAS}): left out unread`,
    );
  for (const pem of blocks.slice(0, MAX_BUNDLE_CAS)) {
    if (pem.length > MAX_CA_PEM) {
      refuse(`a block of ca.crt of ${pem.length} bytes`, `longer than a CA's ${MAX_CA_PEM}: left out unread`);
      continue;
    }
    let cert: X509Certificate;
    try {
      cert = new X509Certificate(pem);
    } catch {
      refuse('a block of ca.crt', 'does not parse');
      continue;
    }
    const id = cert.serialNumber.toUpperCase();
    const notBefore = cert.validFromDate.getTime();
    if (!signedByCa(cert, cert)) refuse(id, 'is not a self-signed CA certificate');
    else if (notBefore > now + CLOCK_SKEW_MS) refuse(id, `is valid only from ${iso(notBefore)} (later than ${iso(now + CLOCK_SKEW_MS)})`);
    else if (!cas.some((ca) => ca.id === id)) {
      const key = caSecret?.data?.[CA_KEY(id)];
      const canSign = key !== undefined && keyMatches(cert, unb64(key));
      if (key !== undefined && !canSign) refuse(id, 'its key in the Secret is not its own: it signs nothing');
      cas.push({ id, notBefore, notAfter: cert.validToDate.getTime(), ...(canSign ? {} : { canSign }), certPem: `${pem}\n` });
    }
  }
  return { cas, lastLeafExpiry: lastLeafExpiryOf(caSecret, cas, refused), refused };
}

/** The record of how long each CA must stay trusted, for the CAs of `cas`; a value that is no time keeps its CA until its own expiry. */
function lastLeafExpiryOf(caSecret: V1Secret | null, cas: readonly CaEntry[], refused: UntrustedValue[]): Record<string, number> {
  const text = caSecret?.metadata?.annotations?.[LAST_LEAF_EXPIRY] ?? '{}';
  let record: unknown;
  try {
    record = JSON.parse(text);
  } catch {
    record = undefined;
  }
  const readable = record !== null && typeof record === 'object' && !Array.isArray(record);
  if (!readable) refused.push({ field: 'last-leaf-expiry', value: text.slice(0, 200), why: 'is not a JSON object of times' });
  const times = readable ? (record as Record<string, unknown>) : {};
  const out: Record<string, number> = {};
  for (const ca of cas) {
    const time = times[ca.id];
    if (typeof time === 'number' && Number.isFinite(time)) out[ca.id] = time;
    else if (!readable || time !== undefined) {
      if (readable) refused.push({ field: 'last-leaf-expiry', value: `${ca.id}: ${String(time).slice(0, 100)}`, why: 'is not a time' });
      out[ca.id] = ca.notAfter;
    }
  }
  return out;
}

/** Whether `keyPem` is `cert`'s key: the serving pair's own check (checkedPair), which refuses anything else. */
function keyMatches(cert: X509Certificate, keyPem: string): boolean {
  try {
    checkedPair({ certPem: cert.toString(), keyPem });
    return true;
  } catch {
    return false;
  }
}

/**
 * The serving leaf of the TLS Secret, which the injector's account may write too: believed (served, and the
 * rotation measured from it) only when its key is its own, a CA of the bundle signed it (the signer is the one
 * whose key verifies it) and it is valid from no later than now plus the skew; with `names`, only when it names
 * each of them. Anything else is no leaf: the writer signs one, the replicas keep serving theirs meanwhile.
 */
function leafRecordOf(secret: V1Secret | null, cas: readonly CaEntry[], now: number, names?: LeafNames): { leaf?: LeafRecord; refused: UntrustedValue[] } {
  const pem = unb64(secret?.data?.['tls.crt']).match(CERT_BLOCK)?.[0];
  if (!pem) return { refused: [] };
  const refuse = (value: string, why: string) => ({ refused: [{ field: 'injector-leaf' as const, value, why }] });
  let cert: X509Certificate;
  try {
    cert = new X509Certificate(pem);
  } catch {
    return refuse('tls.crt', 'does not parse');
  }
  const serial = cert.serialNumber.toUpperCase();
  const notBefore = cert.validFromDate.getTime();
  if (!keyMatches(cert, unb64(secret?.data?.['tls.key']))) return refuse(serial, 'tls.key is not its key');
  const signer = cas.find((ca) => signedByCa(cert, new X509Certificate(ca.certPem)));
  if (!signer) return refuse(serial, `is signed by none of the ${cas.length} CA(s) of the bundle`);
  if (notBefore > now + CLOCK_SKEW_MS) return refuse(serial, `is valid only from ${iso(notBefore)} (later than ${iso(now + CLOCK_SKEW_MS)})`);
  const unnamed = [
    ...(names?.dnsNames ?? []).filter((name) => cert.checkHost(name, { subject: 'never', wildcards: false }) === undefined),
    ...(names?.ipAddresses ?? []).filter((ip) => cert.checkIP(ip) === undefined),
  ];
  if (unnamed.length > 0) return refuse(serial, `does not name ${unnamed.join(', ')}`);
  return { leaf: { serial, signedBy: signer.id, notBefore, notAfter: cert.validToDate.getTime() }, refused: [] };
}

/**
 * The bundle `cas` with `added` last, at most MAX_BUNDLE_CAS (past them a reader would leave the new CA out): a full
 * bundle (only ever one a stolen token wrote) loses its oldest CAs but the signer of the leaf served.
 */
function withNewCa(cas: readonly CaEntry[], added: CaEntry, signer: string | undefined): CaEntry[] {
  const kept = [...cas];
  while (kept.length >= MAX_BUNDLE_CAS) {
    const oldest = kept.findIndex((ca) => ca.id !== signer);
    kept.splice(oldest === -1 ? 0 : oldest, 1);
  }
  return [...kept, added];
}

/** The CA Secret: the bundle of `cas`, the keys of those that have one, and how long each must stay trusted. */
function caSecretBody(cas: CaEntry[], keys: Record<string, string>, lastLeafExpiry: Record<string, number>): V1Secret {
  const data: Record<string, string> = { 'ca.crt': b64(cas.map((ca) => ca.certPem).join('')) };
  for (const ca of cas) {
    const key = keys[CA_KEY(ca.id)];
    if (key !== undefined) data[CA_KEY(ca.id)] = key;
  }
  const labels = { 'app.kubernetes.io/managed-by': 'certshare-injector' };
  return { type: 'Opaque', metadata: { labels, annotations: { [LAST_LEAF_EXPIRY]: JSON.stringify(lastLeafExpiry) } }, data };
}

/** A read or write of `object` failed at the API server for another reason than its absence or a conflict. */
function unavailable(action: 'read' | 'write', object: string, err: unknown): CertshareError {
  return new CertshareError('CERTSHARE_STORE_UNAVAILABLE', { action, object, cause: apiErrorText(err) }, { cause: err });
}
