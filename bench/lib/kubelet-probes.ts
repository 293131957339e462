// The probes the kubelet sends certshare's container as the injector writes it (src/injector/sidecar.ts
// certshareContainer: readiness GET /healthz, liveness a TCP connect, each at its period), sent to a replica of the
// bench: a replica at rest in a Pod answers them, and its CPU time at rest includes them.
import { connect } from 'node:net';
import type { V1Container } from '../../src/kube/transport/client-node.ts';
import { setTimeout as sleep } from 'node:timers/promises';
import { injectedContainer } from './certshare.ts';
import { httpRequest } from './http.ts';

export interface KubeletProbes {
  /** Probes answered, and failed (a refused connection, an answer other than an HTTP status). */
  readonly answered: number;
  readonly failed: number;
  stop(): void;
}

type Probe = NonNullable<V1Container['readinessProbe']>;

/** The injected container's probes (the probes do not depend on its Pod). */
function injectedProbes(): Probe[] {
  const c = injectedContainer();
  return [c.readinessProbe, c.livenessProbe].filter((p): p is Probe => p !== undefined);
}

/** One probe of `probe`'s kind to `127.0.0.1:port`: an HTTP GET, or a TCP connect; whether it was answered. */
function sendProbe(probe: Probe, port: number): Promise<boolean> {
  if (probe.httpGet) {
    return httpRequest({ port }, 'GET', probe.httpGet.path ?? '/').then(
      () => true,
      () => false,
    );
  }
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1');
    socket.once('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('error', () => resolve(false));
  });
}

/**
 * The probes the kubelet sends the injected container in `hours`, one after another (each kind in its
 * proportion, `pauseMs` apart). V8 optimizes a function once it has run often enough, however long that took,
 * and its first optimization pages its compiler in: a replica's RSS after hours in a Pod is read after these
 * (docs/performance.md, resources).
 */
export async function sendProbesOf(port: number, hours: number, pauseMs = 5): Promise<{ answered: number; failed: number }> {
  const probes = injectedProbes().map((probe) => ({ probe, count: Math.round((hours * 3600) / (probe.periodSeconds ?? 10)) }));
  const total = Math.max(...probes.map((p) => p.count));
  const result = { answered: 0, failed: 0 };
  for (let i = 0; i < total; i++) {
    for (const { probe, count } of probes) {
      // Spread evenly: a kind sent `count` times over `total` steps.
      if (Math.floor(((i + 1) * count) / total) === Math.floor((i * count) / total)) continue;
      if (await sendProbe(probe, port)) result.answered++;
      else result.failed++;
    }
    await sleep(pauseMs);
  }
  return result;
}

/** Sends the injected container's readiness and liveness probes to `127.0.0.1:port`, each every periodSeconds. */
export function probeAsKubelet(port: number): KubeletProbes {
  const state = { answered: 0, failed: 0 };
  const count = (ok: boolean): void => {
    if (ok) state.answered++;
    else state.failed++;
  };
  const timers = injectedProbes().map((probe) => setInterval(() => void sendProbe(probe, port).then(count), (probe.periodSeconds ?? 10) * 1000));
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
