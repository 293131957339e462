// The probes the kubelet sends certshare's container as the injector writes it (src/injector/sidecar.ts
// certshareContainer: readiness GET /healthz, liveness a TCP connect, each at its period), sent to a replica of the
// bench: a replica at rest in a Pod answers them, and its CPU time at rest includes them.
import { connect } from 'node:net';
import type { V1Container } from '../../src/kube/transport/client-node.ts';
import { certshareContainer } from '../../src/injector/sidecar.ts';
import { httpRequest } from './http.ts';

export interface KubeletProbes {
  /** Probes answered, and failed (a refused connection, an answer other than an HTTP status). */
  readonly answered: number;
  readonly failed: number;
  stop(): void;
}

type Probe = NonNullable<V1Container['readinessProbe']>;

/** The injected container's probes, from its description (a Pod of one domain; the probes do not depend on it). */
function injectedProbes(): Probe[] {
  const c = certshareContainer({
    image: 'bench',
    domains: ['bench.example'],
    mode: 'auto',
    outDir: '/certs',
    readinessGate: undefined,
    socketVolume: 'socket',
    certsVolume: 'certs',
  });
  return [c.readinessProbe, c.livenessProbe].filter((p): p is Probe => p !== undefined);
}

/** Sends the injected container's readiness and liveness probes to `127.0.0.1:port`, each every periodSeconds. */
export function probeAsKubelet(port: number): KubeletProbes {
  const state = { answered: 0, failed: 0 };
  const count = (ok: boolean): void => {
    if (ok) state.answered++;
    else state.failed++;
  };
  const timers = injectedProbes().map((probe) => {
    const send = probe.httpGet
      ? () =>
          httpRequest({ port }, 'GET', probe.httpGet!.path ?? '/').then(
            () => count(true),
            () => count(false),
          )
      : () => {
          const socket = connect(port, '127.0.0.1');
          socket.once('connect', () => {
            count(true);
            socket.destroy();
          });
          socket.once('error', () => count(false));
        };
    return setInterval(send, (probe.periodSeconds ?? 10) * 1000);
  });
  return {
    get answered() {
      return state.answered;
    },
    get failed() {
      return state.failed;
    },
    stop() {
      for (const t of timers) clearInterval(t);
    },
  };
}
