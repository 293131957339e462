// Whether certshare's own Pod is being deleted: what GET /leave-rotation must know before it acts (a caller
// that read the token from the Pod's spec must not take a running replica out of rotation). Learned from the
// answer to an empty strategic merge patch of the Pod's status, the right certshare already holds for its
// readiness condition (patch pods/status; certshare-own-pod-status admits it from the Pod's own token, and an
// empty patch changes nothing): no new right such as `get pods`.
import { setHeaderOptions, PatchStrategy } from './transport/client-node.ts';
import type { KubeConnection } from './connection.ts';
import { withSignal } from './transport/https-transport.ts';

/** Asks the apiserver whether the Pod has a deletionTimestamp; true once, true for good (a deletion is never undone). */
export function podTerminationProbe(connection: KubeConnection, podName: string): (signal: AbortSignal) => Promise<boolean> {
  let terminating = false;
  return async (signal) => {
    if (terminating) return true;
    const pod = await connection.core.patchNamespacedPodStatus(
      { name: podName, namespace: connection.namespace, body: {} },
      withSignal(signal, setHeaderOptions('Content-Type', PatchStrategy.StrategicMergePatch)),
    );
    terminating = Boolean(pod.metadata?.deletionTimestamp);
    return terminating;
  };
}
