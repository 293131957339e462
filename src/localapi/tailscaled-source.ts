// tailscaled as the daemon uses it: its LocalAPI client (--localapi, --cert-timeout) and the watch of its IPN bus
// for the cert domains (cert-domains-watcher.ts), sharing the count of malformed bus lines and reporting to the
// daemon's metrics and health.
import type { Clock } from '../core/ports/clock.ts';
import { errorMessage } from '../core/errors.ts';
import type { LocalApi } from '../core/ports/localapi.ts';
import type { Logger } from '../core/ports/logger.ts';
import type { StartupGrace } from '../core/loop/startup-grace.ts';
import { createLocalApiClient } from './client.ts';
import { CertDomainsWatcher } from './cert-domains-watcher.ts';

/** The daemon's metrics of the IPN bus's watch (http/daemon-metrics.ts). */
interface BusMetrics {
  busBadLines: { inc(): void };
  busConnected: { set(value: number): void };
  busReconnects: { inc(): void };
}

/** tailscaled's LocalAPI (--localapi, --cert-timeout; `localApi` replaces it in tests) and the watch of its IPN bus for the cert domains. */
export function tailscaledSource(
  settings: { localapi: string; certTimeoutMs: number },
  deps: {
    clock: Clock;
    logger: Logger;
    startup: StartupGrace;
    localApi: LocalApi | undefined;
    metrics: BusMetrics;
    /** Told what keeps the domains from being learned, and undefined once it is over (core/loop/health.ts). */
    health: { sourceProblem(message: string | undefined): void };
  },
): { localApi: LocalApi; watcher: CertDomainsWatcher } {
  const { clock, logger, metrics } = deps;
  const onBadLine = (err: unknown): void => {
    metrics.busBadLines.inc();
    logger.warn({ err: errorMessage(err) }, 'skipped a malformed IPN bus line');
  };
  const localApi = deps.localApi ?? createLocalApiClient({ address: settings.localapi, certTimeoutMs: settings.certTimeoutMs, logger, onBadLine });
  const watcher = new CertDomainsWatcher({
    localApi,
    clock,
    logger: logger.child({ component: 'ipn-bus' }),
    onConnectionChange: (up) => metrics.busConnected.set(up ? 1 : 0),
    onReconnect: () => metrics.busReconnects.inc(),
    onBadLine,
    onProblem: (message) => deps.health.sourceProblem(message),
    startup: deps.startup.condition(),
  });
  watcher.onChange(() => logger.info({ certDomains: [...watcher.current()].sort() }, 'tailscaled cert domains'));
  return { localApi, watcher };
}
