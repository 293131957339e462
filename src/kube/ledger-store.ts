import type { V1ConfigMap } from './transport/client-node.ts';
import { CertshareError } from '../core/errors.ts';
import { decodeLedger, encodeLedger, type LedgerEntry, type LedgerSnapshot, type LedgerStore } from '../core/issuance/issuance-budget.ts';
import { isObjectName } from '../core/values/kube-names.ts';
import { apiErrorText, apiStatus, type KubeConnection } from './connection.ts';
import { withSignal } from './transport/https-transport.ts';
import { LABEL_GROUP, LABEL_MANAGED_BY } from './secret-codec.ts';

const KEY = 'ledger.json';

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
 * nothing else, so a missing one is an error, not something to create.
 */
export class KubeLedgerStore implements LedgerStore {
  readonly kind = 'kube';
  readonly #conn: KubeConnection;
  readonly #group: string | undefined;
  readonly #placement: Placement;
  /** The labels and annotations each ledger was read with, written back (a group's: with certshare's labels). */
  readonly #metadata = new Map<string, Pick<NonNullable<V1ConfigMap['metadata']>, 'labels' | 'annotations'>>();

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
    const text = map.data?.[KEY];
    if (text === undefined) {
      throw new CertshareError('CERTSHARE_STORE_CORRUPT', {
        object: `issuance ledger ConfigMap ${namespace}/${name}`,
        damage: `no ${KEY}`,
        consequence: 'no first issuance until it is repaired or deleted by hand',
      });
    }
    this.#metadata.set(name, { labels: map.metadata?.labels, annotations: map.metadata?.annotations });
    return { entries: decodeLedger(text, `ConfigMap ${namespace}/${name}`), version: map.metadata?.resourceVersion ?? '' };
  }

  async write(entries: LedgerEntry[], previous: LedgerSnapshot, signal: AbortSignal, registeredDomain: string): Promise<void> {
    const { core } = this.#conn;
    const { namespace, name } = this.#where(registeredDomain);
    const read = previous.version === undefined ? undefined : this.#metadata.get(name);
    const labels =
      this.#placement.kind === 'shared'
        ? read?.labels
        : { ...read?.labels, [LABEL_MANAGED_BY]: 'certshare', ...(this.#group ? { [LABEL_GROUP]: this.#group } : {}) };
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
      data: { [KEY]: encodeLedger(entries) },
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
