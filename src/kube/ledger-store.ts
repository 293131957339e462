import type { V1ConfigMap } from './transport/client-node.ts';
import { CertshareError, errorMessage } from '../core/errors.ts';
import { decodeLedger, encodeLedger, type LedgerEntry, type LedgerPart, type LedgerSnapshot, type LedgerStore } from '../core/issuance/issuance-budget.ts';
import { isObjectName } from '../core/values/kube-names.ts';
import { apiErrorText, apiStatus, type KubeConnection } from './connection.ts';
import { withSignal } from './transport/https-transport.ts';
import { LABEL_GROUP, LABEL_MANAGED_BY } from './secret-codec.ts';

const KEY = 'ledger.json';
/**
 * The part of a shared ledger one namespace's accounts write, `ledger.<namespace>.json` (a namespace name
 * has no dot, so no part is ever `ledger.json`, the unattributed ledger of 0.1.0, read by all, written by
 * none). The admission policy (manifests/budget) admits an account's update only when every other key is
 * unchanged: a part is its namespace's, whatever the token.
 */
const PART = /^ledger\.([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)\.json$/;
/** A part's bound where read, as where admitted (manifests/budget/admission-policy.yaml; 0.1.0's ledger.json: 256 KiB). */
const maxBytes = (key: string): number => (key === KEY ? 262_144 : 65_536);
const partKey = (namespace: string): string => `ledger.${namespace}.json`;

/**
 * The ConfigMap holding a group's issuance ledger: one per group, shared by every writer it ever has
 * (`certshare-ledger` for a replica run without a group, outside a Pod).
 */
function ledgerName(group: string | undefined): string {
  return group ? `certshare-${group}-ledger` : 'certshare-ledger';
}

/**
 * The ConfigMap holding the ledger of one registered domain in the platform's namespace (--budget-namespace),
 * shared by every group of the cluster: `certshare-budget-<registered domain>`, e.g.
 * certshare-budget-tailnet-0000.ts.net. A registered domain is a DNS name, so the name is a valid object
 * name unless it is too long; then CERTSHARE_BAD_CONFIG (never a name of another object).
 */
function budgetLedgerName(registeredDomain: string): string {
  const name = `certshare-budget-${registeredDomain}`;
  if (!isObjectName(name))
    throw new CertshareError('CERTSHARE_BAD_CONFIG', { source: `registered domain "${registeredDomain}"`, reason: 'makes no ledger ConfigMap name' });
  return name;
}

/** Where the ledger lives: the group's own ConfigMap, or one per registered domain in the platform's namespace. */
type Placement = { kind: 'group'; name: string } | { kind: 'shared'; namespace: string };

/**
 * The issuance budget's ledger in the cluster: a ConfigMap (not a Secret: it holds domain names and times,
 * nothing secret; RBAC names it in resourceNames). Writes are compare-and-swap on the resourceVersion
 * read, so two writers during a failover (or two groups sharing a registered domain's ledger) never both
 * take the last slot. A read that fails (403, outage, timeout) throws: never an empty ledger.
 *
 * Per group (the default): `certshare-<group>-ledger` in the group's namespace, created on the first
 * write. Shared (`budgetNamespace`): `certshare-budget-<registered domain>` in the platform's namespace,
 * which the platform creates (manifests/budget): the sidecars need get and update on that one object and
 * nothing else, so a missing one is an error, not something to create. There each namespace's accounts
 * write their own part only (`ledger.<namespace>.json`, the caller's connection's namespace: a sidecar's
 * own, the home namespace for a federation account), and every other key goes back as read.
 */
export class KubeLedgerStore implements LedgerStore {
  readonly kind = 'kube';
  readonly #conn: KubeConnection;
  readonly #group: string | undefined;
  readonly #placement: Placement;
  /**
   * What each ledger was read with, written back: its labels and annotations (a group's: with certshare's
   * labels) and, for a shared one, every key at the version read (the other parts go back unchanged).
   */
  readonly #metadata = new Map<
    string,
    Pick<NonNullable<V1ConfigMap['metadata']>, 'labels' | 'annotations'> & { data?: Record<string, string>; version?: string }
  >();

  constructor(connection: KubeConnection, group: string | undefined, options: { budgetNamespace?: string | undefined } = {}) {
    this.#conn = connection;
    this.#group = group;
    this.#placement = options.budgetNamespace ? { kind: 'shared', namespace: options.budgetNamespace } : { kind: 'group', name: ledgerName(group) };
  }

  #where(registeredDomain: string): { namespace: string; name: string } {
    return this.#placement.kind === 'group'
      ? { namespace: this.#conn.namespace, name: this.#placement.name }
      : { namespace: this.#placement.namespace, name: budgetLedgerName(registeredDomain) };
  }

  async read(signal: AbortSignal, registeredDomain: string): Promise<LedgerSnapshot> {
    const { namespace, name } = this.#where(registeredDomain);
    let map: V1ConfigMap;
    try {
      map = await this.#conn.core.readNamespacedConfigMap({ name, namespace }, withSignal(signal));
    } catch (err) {
      if (apiStatus(err) === 404 && this.#placement.kind === 'group') return { entries: [], version: undefined };
      const missing = apiStatus(err) === 404 ? ' (the platform creates it: manifests/budget, or the Helm values budget.registeredDomains)' : '';
      const object = `the issuance ledger ConfigMap ${namespace}/${name}`;
      throw new CertshareError('CERTSHARE_STORE_UNAVAILABLE', { action: 'read', object, cause: `${apiErrorText(err)}${missing}` }, { cause: err });
    }
    const version = map.metadata?.resourceVersion ?? '';
    const metadata = { labels: map.metadata?.labels, annotations: map.metadata?.annotations };
    if (this.#placement.kind === 'shared') {
      this.#metadata.set(name, { ...metadata, data: { ...map.data }, version });
      return { ...this.#parts(map.data ?? {}, `${namespace}/${name}`), version };
    }
    const text = map.data?.[KEY];
    if (text === undefined) throw corrupt(`${namespace}/${name}`, `no ${KEY}`);
    this.#metadata.set(name, metadata);
    return { entries: decodeLedger(text, `ConfigMap ${namespace}/${name}`), version };
  }

  /**
   * A shared ledger's keys: this writer's part (none yet: empty), every other namespace's part and the
   * unattributed ledger.json of 0.1.0 as the others. A key of no part's form (only an administrator can
   * add one), and this writer's own part or ledger.json damaged, are CERTSHARE_STORE_CORRUPT: never read
   * as empty. Another namespace's part damaged or past its bound counts for nothing, its fault told: only
   * its own namespace's accounts can write it, and they could as well empty it.
   */
  #parts(data: Record<string, string>, where: string): { entries: LedgerEntry[]; others: LedgerPart[] } {
    const mine = partKey(this.#conn.namespace);
    let entries: LedgerEntry[] = [];
    const others: LedgerPart[] = [];
    for (const [key, text] of Object.entries(data).sort(([a], [b]) => (a < b ? -1 : 1))) {
      if (key !== KEY && !PART.test(key)) throw corrupt(where, `a key ${JSON.stringify(key.slice(0, 256))} that is no part (ledger.<namespace>.json)`);
      let part: LedgerEntry[];
      try {
        if (Buffer.byteLength(text) > maxBytes(key)) throw corrupt(where, `its part ${key} is larger than ${maxBytes(key)} bytes`);
        part = decodeLedger(text, `ConfigMap ${where}, ${key}`);
      } catch (err) {
        if (key === mine || key === KEY) throw err;
        others.push({ name: key, entries: [], fault: errorMessage(err) });
        continue;
      }
      if (key === mine) entries = part;
      else others.push({ name: key, entries: part });
    }
    return { entries, others };
  }

  async write(entries: LedgerEntry[], previous: LedgerSnapshot, signal: AbortSignal, registeredDomain: string): Promise<void> {
    const { core } = this.#conn;
    const { namespace, name } = this.#where(registeredDomain);
    const read = previous.version === undefined ? undefined : this.#metadata.get(name);
    const shared = this.#placement.kind === 'shared';
    if (shared && read?.version !== previous.version) {
      // The other parts must go back as they were at the version the compare-and-swap names.
      throw new CertshareError('CERTSHARE_STORE_CONFLICT', { object: `issuance ledger ${namespace}/${name}`, detail: 'read again since' });
    }
    const labels = shared ? read?.labels : { ...read?.labels, [LABEL_MANAGED_BY]: 'certshare', ...(this.#group ? { [LABEL_GROUP]: this.#group } : {}) };
    const annotations = read?.annotations;
    const body: V1ConfigMap = {
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: {
        name,
        namespace,
        ...(labels ? { labels } : {}),
        ...(annotations ? { annotations } : {}),
        ...(previous.version === undefined ? {} : { resourceVersion: previous.version }),
      },
      data: shared ? { ...read?.data, [partKey(this.#conn.namespace)]: encodeLedger(entries) } : { [KEY]: encodeLedger(entries) },
    };
    try {
      if (previous.version === undefined) await core.createNamespacedConfigMap({ namespace, body }, withSignal(signal));
      else await core.replaceNamespacedConfigMap({ name, namespace, body }, withSignal(signal));
    } catch (err) {
      const status = apiStatus(err);
      if (status === 409 || status === 404) {
        throw new CertshareError('CERTSHARE_STORE_CONFLICT', { object: `issuance ledger ${namespace}/${name}`, detail: apiErrorText(err) }, { cause: err });
      }
      throw new CertshareError(
        'CERTSHARE_STORE_UNAVAILABLE',
        { action: 'write', object: `the issuance ledger ConfigMap ${namespace}/${name}`, cause: apiErrorText(err) },
        { cause: err },
      );
    }
  }
}

function corrupt(where: string, damage: string): CertshareError {
  return new CertshareError('CERTSHARE_STORE_CORRUPT', {
    object: `issuance ledger ConfigMap ${where}`,
    damage,
    consequence: 'no first issuance until it is repaired or deleted by hand',
  });
}
