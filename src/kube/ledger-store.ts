import type { V1ConfigMap } from './transport/client-node.ts';
import { CertshareError } from '../core/errors.ts';
import { decodeLedger, encodeLedger, type LedgerEntry, type LedgerSnapshot, type LedgerStore } from '../core/issuance-budget.ts';
import { apiErrorText, apiStatus, type KubeConnection } from './connection.ts';
import { withSignal } from './transport/https-transport.ts';
import { LABEL_GROUP, LABEL_MANAGED_BY } from './secret-codec.ts';

const KEY = 'ledger.json';

/**
 * The ConfigMap holding a group's issuance ledger: one per group, shared by every writer it ever has
 * (`certshare-ledger` for a replica run without a group, outside a Pod).
 */
export function ledgerName(group: string | undefined): string {
  return group ? `certshare-${group}-ledger` : 'certshare-ledger';
}

/**
 * The issuance budget's ledger in the cluster: a ConfigMap `certshare-<group>-ledger` (not a Secret: it
 * holds domain names and times, nothing secret; RBAC names it in resourceNames). Writes are
 * compare-and-swap on the resourceVersion read, so two writers during a failover never both take the
 * last slot. A read that fails (403, outage, timeout) throws: never an empty ledger.
 */
export class KubeLedgerStore implements LedgerStore {
  readonly kind = 'kube';
  readonly #conn: KubeConnection;
  readonly #name: string;
  readonly #group: string | undefined;

  constructor(connection: KubeConnection, group: string | undefined) {
    this.#conn = connection;
    this.#group = group;
    this.#name = ledgerName(group);
  }

  async read(signal: AbortSignal): Promise<LedgerSnapshot> {
    const { core, namespace } = this.#conn;
    let map: V1ConfigMap;
    try {
      map = await core.readNamespacedConfigMap({ name: this.#name, namespace }, withSignal(signal));
    } catch (err) {
      if (apiStatus(err) === 404) return { entries: [], version: undefined };
      throw new CertshareError('CERTSHARE_STORE_UNAVAILABLE', `cannot read the issuance ledger ConfigMap ${namespace}/${this.#name}: ${apiErrorText(err)}`, {
        cause: err,
      });
    }
    const text = map.data?.[KEY];
    if (text === undefined) {
      throw new CertshareError(
        'CERTSHARE_STORE_CORRUPT',
        `issuance ledger ConfigMap ${namespace}/${this.#name} has no ${KEY}; no first issuance until it is repaired or deleted by hand`,
      );
    }
    return { entries: decodeLedger(text, `ConfigMap ${namespace}/${this.#name}`), version: map.metadata?.resourceVersion ?? '' };
  }

  async write(entries: LedgerEntry[], previous: LedgerSnapshot, signal: AbortSignal): Promise<void> {
    const { core, namespace } = this.#conn;
    const body: V1ConfigMap = {
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: {
        name: this.#name,
        namespace,
        labels: { [LABEL_MANAGED_BY]: 'certshare', ...(this.#group ? { [LABEL_GROUP]: this.#group } : {}) },
        ...(previous.version === undefined ? {} : { resourceVersion: previous.version }),
      },
      data: { [KEY]: encodeLedger(entries) },
    };
    try {
      if (previous.version === undefined) await core.createNamespacedConfigMap({ namespace, body }, withSignal(signal));
      else await core.replaceNamespacedConfigMap({ name: this.#name, namespace, body }, withSignal(signal));
    } catch (err) {
      const status = apiStatus(err);
      if (status === 409 || status === 404) {
        throw new CertshareError('CERTSHARE_STORE_CONFLICT', `issuance ledger ${namespace}/${this.#name} changed meanwhile: ${apiErrorText(err)}`, {
          cause: err,
        });
      }
      throw new CertshareError('CERTSHARE_STORE_UNAVAILABLE', `cannot write the issuance ledger ConfigMap ${namespace}/${this.#name}: ${apiErrorText(err)}`, {
        cause: err,
      });
    }
  }
}
