// The served check's and the advertisement's metrics, registered beside the daemon's (http/daemon-metrics.ts).
import { Counter, Gauge, type Registry } from 'prom-client';
import { SERVED_OUTCOMES, type ServedOutcome, type ServedVerdict } from '../core/served/served-certificate.ts';

/**
 * The status a domain's gauge reports: the outcome, except for a previous certificate the proxy still serves
 * that holds the replica out of rotation: `previous_replaced_now` when the CA asked to replace it now (a
 * revocation) and the reload window has passed, else `previous_expiring` (inside the readiness lead before its expiry).
 */
const SERVED_STATUSES = [...SERVED_OUTCOMES, 'previous_expiring', 'previous_replaced_now'] as const;
type ServedStatus = (typeof SERVED_STATUSES)[number];

export function servedStatus(outcome: ServedOutcome, verdict: ServedVerdict, replacedNow = false): ServedStatus {
  if (outcome !== 'previous' || verdict.verdict !== 'bad') return outcome;
  return replacedNow ? 'previous_replaced_now' : 'previous_expiring';
}

export class ServedMetrics {
  readonly #outcome: Gauge;
  readonly #checks: Counter;
  readonly #expiration: Gauge;
  readonly #stale: Gauge;
  readonly #advertised: Gauge;
  readonly advertiseErrors: Counter;

  constructor(registry: Registry) {
    const registers = [registry];
    this.#outcome = new Gauge({
      name: 'certshare_served_certificate_status',
      help:
        'What the proxy served at the last check, per domain: 1 for the outcome (current, previous, previous_expiring, previous_replaced_now, ' +
        'expired, other_name, ' +
        'other, handshake_failed, unknown), 0 for the rest.',
      labelNames: ['domain', 'outcome'],
      registers,
    });
    this.#checks = new Counter({
      name: 'certshare_served_checks_total',
      help: "TLS handshakes with the proxy's listener by outcome (--served-check).",
      labelNames: ['domain', 'outcome'],
      registers,
    });
    this.#expiration = new Gauge({
      name: 'certshare_served_certificate_expiration_timestamp_seconds',
      help: 'NotAfter of the certificate the proxy was last seen serving, per domain.',
      labelNames: ['domain'],
      registers,
    });
    this.#stale = new Gauge({
      name: 'certshare_served_certificate_stale',
      help: 'The proxy still serves the previous certificate longer than --served-stale-after after a renewal (1) or not (0).',
      labelNames: ['domain'],
      registers,
    });
    this.#advertised = new Gauge({
      name: 'certshare_service_advertised',
      help: "Whether tailscaled's prefs advertise the Tailscale Service (1) or not (0), as last read or written.",
      labelNames: ['service'],
      registers,
    });
    this.advertiseErrors = new Counter({
      name: 'certshare_advertise_errors_total',
      help: "Failed reads or edits of tailscaled's prefs for the Service advertisement, by code.",
      labelNames: ['code'],
      registers,
    });
  }

  checked(domain: string, outcome: ServedOutcome): void {
    this.#checks.inc({ domain, outcome });
  }

  served(domain: string, status: ServedStatus, notAfter: number | undefined, stale: boolean): void {
    for (const s of SERVED_STATUSES) this.#outcome.set({ domain, outcome: s }, s === status ? 1 : 0);
    if (notAfter !== undefined) this.#expiration.set({ domain }, notAfter / 1000);
    this.#stale.set({ domain }, stale ? 1 : 0);
  }

  advertised(service: string, advertised: boolean): void {
    this.#advertised.set({ service }, advertised ? 1 : 0);
  }
}
