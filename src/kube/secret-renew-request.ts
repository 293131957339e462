// `certshare renew <domain>` in a cluster: writes the renew request annotation on the domain's Secret, once.
// Only `patch` on that Secret is needed: an empty merge patch reads it (the answer is the object), and
// the request is a merge patch on the resourceVersion read (compare-and-swap), so two operators asking at
// once make one request, and a request already pending is not replaced (one request, not two).
import type { V1Secret } from './transport/client-node.ts';
import { setHeaderOptions, PatchStrategy } from './transport/client-node.ts';
import { CertshareError } from '../core/errors.ts';
import { pendingRenewRequest } from '../core/renewal/renew-request.ts';
import { apiErrorText, apiStatus, type KubeConnection } from './connection.ts';
import { withSignal } from './transport/https-transport.ts';
import { ANNOTATION_RENEW_ANSWERED, ANNOTATION_RENEW_OUTCOME, ANNOTATION_RENEW_REQUESTED } from './secret-codec.ts';

type RenewRequestResult =
  /** Written now; `last`: the outcome of the request answered before (what the name limit then left). */
  | { kind: 'requested'; id: string; last?: string | undefined }
  /** One was pending already: that one stands (`previous`: the last answered, if any). */
  | { kind: 'pending'; id: string };

/** How many times a request is tried again after the Secret changed between its read and its write. */
const MAX_CONFLICTS = 3;

export async function requestRenewal(connection: KubeConnection, domain: string, id: string, signal?: AbortSignal): Promise<RenewRequestResult> {
  for (let attempt = 0; ; attempt++) {
    const secret = await patch(connection, domain, {}, signal);
    const annotations = secret.metadata?.annotations ?? {};
    const pending = pendingRenewRequest(annotations[ANNOTATION_RENEW_REQUESTED], annotations[ANNOTATION_RENEW_ANSWERED]);
    if (pending !== undefined) return { kind: 'pending', id: pending };
    try {
      await patch(
        connection,
        domain,
        { metadata: { resourceVersion: secret.metadata?.resourceVersion, annotations: { [ANNOTATION_RENEW_REQUESTED]: id } } },
        signal,
      );
      return { kind: 'requested', id, last: annotations[ANNOTATION_RENEW_OUTCOME] };
    } catch (err) {
      if (!(err instanceof CertshareError && err.code === 'CERTSHARE_STORE_CONFLICT') || attempt >= MAX_CONFLICTS) throw err;
    }
  }
}

/** The last answer recorded on the Secret: the request id and its outcome (for `certshare renew --wait`). */
export async function renewAnswer(connection: KubeConnection, domain: string, signal?: AbortSignal): Promise<{ id?: string; outcome?: string }> {
  const annotations = (await patch(connection, domain, {}, signal)).metadata?.annotations ?? {};
  return { id: annotations[ANNOTATION_RENEW_ANSWERED], outcome: annotations[ANNOTATION_RENEW_OUTCOME] };
}

async function patch(connection: KubeConnection, domain: string, body: object, signal: AbortSignal | undefined): Promise<V1Secret> {
  const { core, namespace } = connection;
  try {
    return await core.patchNamespacedSecret({ name: domain, namespace, body }, withSignal(signal, setHeaderOptions('Content-Type', PatchStrategy.MergePatch)));
  } catch (err) {
    const status = apiStatus(err);
    const where = `Secret ${namespace}/${domain}`;
    if (status === 409) throw new CertshareError('CERTSHARE_STORE_CONFLICT', { object: where, detail: apiErrorText(err) }, { cause: err });
    if (status === 404) {
      throw new CertshareError(
        'CERTSHARE_BAD_CONFIG',
        { source: where, reason: `does not exist: no certificate was stored for ${domain} in this namespace (see --namespace)` },
        {
          cause: err,
        },
      );
    }
    if (status === 401 || status === 403) {
      throw new CertshareError(
        'CERTSHARE_BAD_CONFIG',
        { source: where, reason: `${apiErrorText(err)} (certshare renew needs patch on that Secret; see docs/renew.md)` },
        {
          cause: err,
          refused: true,
        },
      );
    }
    throw new CertshareError('CERTSHARE_STORE_UNAVAILABLE', { action: 'patch', object: where, cause: apiErrorText(err) }, { cause: err });
  }
}
