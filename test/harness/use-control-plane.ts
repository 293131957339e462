// node:test glue: one control plane per test file (or per describe block).
//
//   const cp = useControlPlane();
//   test('...', async () => { const kc = new KubeConfig(); kc.loadFromFile(cp().adminKubeconfigPath); ... });
import { after, before } from 'node:test';
import { startControlPlane, type ControlPlane, type ControlPlaneOptions } from './control-plane.ts';
import { stopLeftRunning } from './left-running.ts';

/**
 * Generous on purpose: on a fresh machine the first start builds kube-apiserver/kubectl/etcd from
 * source (tens of minutes on 2 cores). Explicit hook timeouts are not cut by `--test-timeout`.
 */
export const CONTROL_PLANE_HOOK_TIMEOUT_MS = 80 * 60_000;

/**
 * Registers before()/after() hooks in the current scope that start and stop a control plane.
 * Returns an accessor; calling it before the hook ran throws.
 */
export function useControlPlane(options: ControlPlaneOptions = {}): () => ControlPlane {
  let cp: ControlPlane | undefined;
  before(
    async () => {
      cp = await startControlPlane(options);
    },
    { timeout: CONTROL_PLANE_HOOK_TIMEOUT_MS },
  );
  after(
    async () => {
      // A replica a failed test left running (left-running.ts) goes before the control plane it talks to.
      await stopLeftRunning();
      await cp?.stop();
    },
    { timeout: 60_000 },
  );
  return () => {
    if (!cp) throw new Error('control plane not started (useControlPlane() hooks have not run or failed)');
    return cp;
  };
}
