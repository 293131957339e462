// The ConfigMap recording the form of certshare's container as this injector writes it (mutate.ts's
// sidecarForm): the admission policy certshare-sidecar-as-injected (manifests/injector/admission-policy.yaml)
// reads it as its parameters and admits a container named certshare, in an opted-in namespace, only in that
// form. Written by every replica at start, before it answers the webhook, so the policy and the webhook
// compare with the same settings.
import type { V1ConfigMap } from '../kube/transport/client-node.ts';
import { CertshareError } from '../core/errors.ts';
import { apiErrorText, apiStatus, type KubeConnection } from '../kube/connection.ts';
import { withSignal } from '../kube/transport/https-transport.ts';

/** Its name, in the injector's namespace: the policy binding's paramRef, the Role and certshare-injector-creates-own-objects name it. @forTests */
export const SIDECAR_FORM_CONFIGMAP = 'certshare-injector-sidecar';

/** Creates the ConfigMap, or replaces it whole (another replica's, or an older injector's settings). */
export async function publishSidecarForm(connection: KubeConnection, namespace: string, form: Record<string, string>, signal: AbortSignal): Promise<void> {
  const body: V1ConfigMap = { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: SIDECAR_FORM_CONFIGMAP, namespace }, data: form };
  try {
    try {
      await connection.core.createNamespacedConfigMap({ namespace, body }, withSignal(signal));
    } catch (err) {
      if (apiStatus(err) !== 409) throw err;
      // Unconditional (no resourceVersion): every replica writes what its own flags say.
      await connection.core.replaceNamespacedConfigMap({ name: SIDECAR_FORM_CONFIGMAP, namespace, body }, withSignal(signal));
    }
  } catch (err) {
    const object = `the ConfigMap ${namespace}/${SIDECAR_FORM_CONFIGMAP} (the sidecar's form, read by the admission policy certshare-sidecar-as-injected)`;
    throw new CertshareError('CERTSHARE_STORE_UNAVAILABLE', { action: 'write', object, cause: apiErrorText(err) }, { cause: err });
  }
}
