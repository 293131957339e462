// The injector's Prometheus metrics: what its alerts need (a CA or the served leaf near expiry, rotation
// stuck, injections refused or failing), named like the daemon's (timestamps, base units, _total).
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { Server as HttpsServer, createServer as createHttpsServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { Counter, Gauge, Registry } from 'prom-client';
import type { RotationAction, RotationState } from '../core/injector-ca/ca-rotation.ts';
import { collectNodeMetrics } from '../http/daemon-metrics.ts';
import type { UntrustedValue } from '../core/values/untrusted-values.ts';
import { checkedPair, servePair, type ServingPair } from '../tls/serving-pair.ts';
import { dateHeaderWithoutIcu } from '../http/date-header.ts';

type AdmissionResult = 'injected' | 'skipped' | 'rejected' | 'invalid';

export class InjectorMetrics {
  readonly registry = new Registry();
  readonly #actions: Counter;
  readonly #failures: Counter;
  readonly #admissions: Counter;
  readonly #outOfBounds: Counter;

  constructor(state: () => RotationState, options: { defaultMetrics?: boolean; writer?: () => boolean } = {}) {
    const registers = [this.registry];
    const writer = options.writer ?? (() => true);
    new Gauge({
      name: 'certshare_injector_writer',
      help: 'Whether this replica holds the injector Lease and writes the CAs, the leaf and the caBundles (1) or only reads and serves (0).',
      registers,
      collect() {
        this.set(writer() ? 1 : 0);
      },
    });
    new Gauge({
      name: 'certshare_injector_ca_expiration_timestamp_seconds',
      help: 'NotAfter of each CA in the bundle (serial label: the CA).',
      labelNames: ['serial'],
      registers,
      collect() {
        this.reset();
        for (const ca of state().bundle) this.set({ serial: ca.id }, ca.notAfter / 1000);
      },
    });
    new Gauge({
      name: 'certshare_injector_leaf_expiration_timestamp_seconds',
      help: "NotAfter of the webhook's serving certificate (absent before the first).",
      registers,
      collect() {
        this.reset();
        const leaf = state().leaf;
        if (leaf) this.set(leaf.notAfter / 1000);
      },
    });
    this.#actions = new Counter({
      name: 'certshare_injector_rotation_steps_total',
      help: 'CA rotation steps applied, by step (create-ca, publish, issue-leaf, retire-ca).',
      labelNames: ['step'],
      registers,
    });
    this.#failures = new Counter({
      name: 'certshare_injector_rotation_failures_total',
      help: 'Rotation passes that failed, by kind (conflict: lost a compare-and-swap and re-read; error: the API failed).',
      labelNames: ['kind'],
      registers,
    });
    this.#admissions = new Counter({
      name: 'certshare_injector_admissions_total',
      help: 'Admission requests by result (injected, skipped, rejected for a bad annotation, invalid request).',
      labelNames: ['result'],
      registers,
    });
    this.#outOfBounds = new Counter({
      name: 'certshare_injector_out_of_bounds_values_total',
      help:
        'Values read back out of their bound and ignored, by field (lease-duration: the injector Lease held longer than twice --lease-duration; ' +
        'lease-transitions: its count of takeovers at the largest the field holds; injector-ca: a certificate of the CA Secret that is no ' +
        'CA the injector writes, or whose key is not its own; injector-leaf: a serving pair not signed by a CA of the bundle, or not ' +
        'its own; last-leaf-expiry: a record of the CA Secret that is no time).',
      labelNames: ['field'],
      registers,
    });
    for (const field of ['lease-duration', 'lease-transitions', 'injector-ca', 'injector-leaf', 'last-leaf-expiry']) this.#outOfBounds.inc({ field }, 0);
    for (const step of ['create-ca', 'publish', 'issue-leaf', 'retire-ca']) this.#actions.inc({ step }, 0);
    for (const kind of ['conflict', 'error']) this.#failures.inc({ kind }, 0);
    for (const result of ['injected', 'skipped', 'rejected', 'invalid']) this.#admissions.inc({ result }, 0);
    if (options.defaultMetrics ?? true) collectNodeMetrics(this.registry);
  }

  step(action: RotationAction): void {
    this.#actions.inc({ step: action.kind });
  }

  failure(kind: 'conflict' | 'error'): void {
    this.#failures.inc({ kind });
  }

  outOfBounds(_where: string, value: UntrustedValue): void {
    this.#outOfBounds.inc({ field: value.field });
  }

  admission(result: AdmissionResult): void {
    this.#admissions.inc({ result });
  }
}

/** The result of one AdmissionReview answer, for the counter. */
export function admissionResult(answer: unknown): AdmissionResult {
  const response = (answer as { response?: { allowed?: boolean; patch?: string } }).response;
  if (response?.allowed === false) return 'rejected';
  return response?.patch ? 'injected' : 'skipped';
}

/**
 * GET /metrics over plain HTTP (like the daemon's port 9002), or over HTTPS when `tls` gives the first pair
 * (--metrics-tls); setPair serves a renewed pair from the next handshake on (src/tls/serving-pair.ts).
 */
export async function startMetricsServer(
  metrics: InjectorMetrics,
  host: string,
  port: number,
  tls?: ServingPair,
): Promise<{ port: number; setPair(pair: ServingPair): string; close(): Promise<void> }> {
  const handler = (req: IncomingMessage, res: ServerResponse): void => {
    if (req.method !== 'GET' || (req.url ?? '').split('?')[0] !== '/metrics') {
      res.writeHead(404).end();
      return;
    }
    metrics.registry.metrics().then(
      (body) => res.writeHead(200, { 'content-type': metrics.registry.contentType }).end(body),
      () => res.writeHead(500).end(),
    );
  };
  const server: Server = tls ? createHttpsServer(checkedPair(tls).options, handler) : createServer(handler);
  dateHeaderWithoutIcu(server);
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => resolve());
  });
  return {
    port: (server.address() as AddressInfo).port,
    setPair(pair) {
      if (!(server instanceof HttpsServer)) throw new Error('the metrics listener serves plain HTTP');
      return servePair(server, pair);
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
