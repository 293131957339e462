// The ConfigMap recording the form of certshare's container as this injector writes it (mutate.ts's
// sidecarForm): the admission policy certshare-sidecar-as-injected (manifests/injector/admission-policy.yaml)
// reads it as its parameters and admits a container named certshare, in an opted-in namespace, only in that
// form. Written by every replica at start, before it answers the webhook, so the policy and the webhook
// compare with the same settings; the writer writes it again at each resync (keepSidecarForm).
import type { V1ConfigMap } from '../kube/transport/client-node.ts';
import type { Clock } from '../core/ports/clock.ts';
import { CertshareError, errorMessage } from '../core/errors.ts';
import type { Logger } from '../core/ports/logger.ts';
import { apiErrorText, apiStatus, type KubeConnection } from '../kube/connection.ts';
import { withSignal } from '../kube/transport/https-transport.ts';

/** Its name, in the injector's namespace: the policy binding's paramRef, the Role and certshare-injector-creates-own-objects name it. @forTests */
export const SIDECAR_FORM_CONFIGMAP = 'certshare-injector-sidecar';

/**
 * The most the form holds: certshare-injector-creates-own-objects admits no larger ConfigMap from the injector's
 * account, and certshare-sidecar-as-injected, which reads it at every Pod creation of the opted-in namespaces,
 * refuses every Pod rather than read a larger one (a stolen token's, written before that policy). The injector's
 * own is a dozen keys of a few hundred characters (one per platform setting: the daemon has fewer than 64 flags).
 * @forTests
 */
export const SIDECAR_FORM_BOUNDS = { keys: 128, valueChars: 8192 } as const;

/** Settings whose form would pass those bounds are refused at start (CERTSHARE_BAD_FLAG), before anything is written. */
export function checkSidecarFormBounds(form: Record<string, string>): void {
  const keys = Object.keys(form);
  const long = keys.find((k) => form[k]!.length > SIDECAR_FORM_BOUNDS.valueChars);
  if (keys.length <= SIDECAR_FORM_BOUNDS.keys && long === undefined) return;
  throw new CertshareError('CERTSHARE_BAD_FLAG', {
    flag: '--sidecar-flags, --sidecar-*',
    rule:
      `the sidecar's form holds at most ${SIDECAR_FORM_BOUNDS.keys} settings of at most ${SIDECAR_FORM_BOUNDS.valueChars} characters ` +
      `(certshare-sidecar-as-injected reads it at every Pod creation): ${long === undefined ? `${keys.length} settings` : `${long} is longer`}`,
  });
}

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

/**
 * The writer (the Lease's holder) writes its form again when it becomes the writer and at each resync: the
 * injector's account may replace the ConfigMap, and one write of another form, or of none, by a stolen token
 * would otherwise refuse every Pod of the opted-in namespaces until a replica restarted. `published` is called
 * after each write.
 */
export function keepSidecarForm(options: {
  connection: KubeConnection;
  namespace: string;
  form: Record<string, string>;
  writer: { canIssue(): boolean; onChange(listener: () => void): () => void };
  clock: Clock;
  resyncMs: number;
  timeoutMs: number;
  logger: Logger;
  published: () => void;
}): { stop(): Promise<void> } {
  const stopped = new AbortController();
  let wake = new AbortController();
  const unsubscribe = options.writer.onChange(() => wake.abort());
  const run = async () => {
    while (!stopped.signal.aborted) {
      wake = new AbortController();
      if (options.writer.canIssue()) {
        try {
          await publishSidecarForm(options.connection, options.namespace, options.form, AbortSignal.timeout(options.timeoutMs));
          options.published();
        } catch (err) {
          options.logger.warn(
            { code: 'CERTSHARE_STORE_UNAVAILABLE', err: errorMessage(err) },
            "the sidecar's form not written again; tried at the next resync",
          );
        }
      }
      await options.clock.sleep(options.resyncMs, AbortSignal.any([stopped.signal, wake.signal])).catch(() => {});
    }
  };
  const done = run();
  return {
    async stop() {
      unsubscribe();
      stopped.abort();
      await done;
    },
  };
}
