import type { BackoffPolicy } from '../core/backoff.ts';
import { isFqdn, normaliseDomain } from '../core/domain.ts';
import { parseDuration } from '../core/duration.ts';
import { CertshareError } from '../core/errors.ts';
import type { RenewalPolicy } from '../core/renewal.ts';
import { parseListenAddress } from '../server/http-server.ts';
import type { FlagSpec, FlagValues } from './flags.ts';

export type StoreChoice = { kind: 'dir'; path: string } | { kind: 'kube' };
export type ShareMode = 'rw' | 'ro' | 'auto';

export interface DaemonConfig {
  localapi: string;
  domains: string[];
  serveConfig: string | undefined;
  store: StoreChoice;
  listen: string;
  reloadCommand: string | undefined;
  reloadTimeoutMs: number;
  renewal: RenewalPolicy;
  backoff: BackoffPolicy;
  certTimeoutMs: number;
  logLevel: string;
  /** Kubernetes mode. */
  mode: ShareMode;
  group: string | undefined;
  outDir: string | undefined;
  readinessGate: string | undefined;
  routingChecks: string[];
  routingAttempts: number;
  drainDelayMs: number;
  leaseDurationMs: number;
  shutdownTimeoutMs: number;
}

export const RUN_FLAGS: FlagSpec[] = [
  { name: 'localapi', placeholder: 'PATH|URL', default: '/var/run/tailscale/tailscaled.sock', help: "tailscaled's LocalAPI: a unix socket path or an http:// URL." },
  { name: 'domain', placeholder: 'FQDN', multiple: true, help: 'A domain to keep a certificate for.' },
  { name: 'serve-config', placeholder: 'FILE', help: 'A Tailscale ServeConfig JSON file whose HTTPS hosts are the domains; watched for changes.' },
  { name: 'store', placeholder: 'dir:PATH|kube', help: 'Where certificates live: a directory, or one Kubernetes Secret per domain. Default: kube inside a cluster, dir:./certshare-certs outside.' },
  { name: 'listen', placeholder: 'ADDR:PORT', default: '[::]:9002', help: 'Address for GET /healthz and GET /metrics.' },
  { name: 'reload-command', placeholder: 'CMD', help: 'Command run after certificate files changed (e.g. "nginx -s reload"), through /bin/sh where there is one, split on spaces and run directly otherwise (distroless); failures are logged, never fatal.' },
  { name: 'reload-timeout', placeholder: 'DURATION', default: '60s', help: 'Kill the reload command after this long.' },
  { name: 'check-interval', placeholder: 'DURATION', default: '24h', help: 'Longest wait between two looks at a certificate that is not due.' },
  { name: 'renew-fraction', placeholder: 'FRACTION', default: '1/3', help: 'Renew when less than this share of the lifetime remains (half for lifetimes under 10 days).' },
  { name: 'first-retry', placeholder: 'DURATION', default: '1m', help: 'First wait after a failed issuance, doubling up to --retry-cap.' },
  { name: 'retry-cap', placeholder: 'DURATION', default: '24h', help: 'Longest wait between issuance attempts.' },
  { name: 'rate-limit-retry', placeholder: 'DURATION', default: '1h', help: 'First wait after a rate limit without Retry-After, doubling up to --retry-cap.' },
  { name: 'cert-timeout', placeholder: 'DURATION', default: '5m', help: 'Timeout of one CertPair call (ACME issuance can take minutes).' },
  { name: 'log-level', placeholder: 'LEVEL', default: 'info', help: 'debug, info, warn or error.' },
  { name: 'mode', placeholder: 'rw|ro|auto', aliasesEnv: ['TS_CERT_SHARE_MODE'], help: 'Kubernetes: rw writes (issues), ro only reads, auto elects a writer. Default: rw for the Pod whose name ends in -0, ro otherwise.' },
  { name: 'group', placeholder: 'NAME', help: 'Kubernetes: group label on Secrets. Default: the Pod name without its ordinal.' },
  { name: 'out-dir', placeholder: 'DIR', help: 'Kubernetes: also project the current certificates into DIR/<domain>/ (atomic), then run --reload-command.' },
  { name: 'readiness-gate', placeholder: 'TYPE', help: "Kubernetes: keep this condition type of the Pod's own status True only while every domain has a valid certificate." },
  { name: 'routing-check', placeholder: 'URL', multiple: true, help: "Kubernetes: a Service's health URL that must route to this Pod (Pod-IPv4 header) before the gate turns True." },
  { name: 'routing-attempts', placeholder: 'N', default: '9', help: "Kubernetes: calls per routing check before giving up for a while (Tailscale's rule: replicas x 3)." },
  { name: 'lease-duration', placeholder: 'DURATION', default: '15s', help: 'Kubernetes, --mode auto: how long a writer keeps the group Lease without renewing it.' },
  { name: 'drain-delay', placeholder: 'DURATION', default: '5s', help: 'On SIGTERM: time between taking the Pod out of rotation and exiting.' },
  { name: 'shutdown-timeout', placeholder: 'DURATION', default: '25s', help: 'Exit no later than this after SIGTERM (keep below terminationGracePeriodSeconds).' },
];

function parseFraction(text: string): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*(?:\/\s*(\d+(?:\.\d+)?))?\s*$/.exec(text);
  const value = m ? Number(m[1]) / Number(m[2] ?? 1) : NaN;
  if (!(value > 0 && value < 1)) throw new CertshareError('CERTSHARE_BAD_FLAG', `--renew-fraction must be between 0 and 1 (e.g. 1/3 or 0.33), got "${text}"`);
  return value;
}

/** A Go-style duration flag in milliseconds; CERTSHARE_BAD_FLAG naming the flag otherwise. */
export function duration(values: FlagValues, name: string): number {
  try {
    return parseDuration(String(values[name]));
  } catch (err) {
    throw new CertshareError('CERTSHARE_BAD_FLAG', `--${name}: ${(err as Error).message}`);
  }
}

function positiveInteger(values: FlagValues, name: string): number {
  const n = Number(values[name]);
  if (!Number.isInteger(n) || n < 1) throw new CertshareError('CERTSHARE_BAD_FLAG', `--${name} must be a positive integer, got "${String(values[name])}"`);
  return n;
}

export function daemonConfigFrom(values: FlagValues, env: NodeJS.ProcessEnv): DaemonConfig {
  const domains = ((values.domain as string[] | undefined) ?? []).map(normaliseDomain);
  for (const d of domains) if (!isFqdn(d)) throw new CertshareError('CERTSHARE_BAD_FLAG', `--domain: "${d}" is not a fully qualified domain name`);
  const serveConfig = values['serve-config'] as string | undefined;
  if (domains.length === 0 && !serveConfig) throw new CertshareError('CERTSHARE_BAD_FLAG', 'give at least one --domain or a --serve-config file');

  const storeText = (values.store as string | undefined) ?? (env.KUBERNETES_SERVICE_HOST ? 'kube' : 'dir:./certshare-certs');
  let store: StoreChoice;
  if (storeText === 'kube') store = { kind: 'kube' };
  else if (storeText.startsWith('dir:') && storeText.length > 4) store = { kind: 'dir', path: storeText.slice(4) };
  else throw new CertshareError('CERTSHARE_BAD_FLAG', `--store must be dir:PATH or kube, got "${storeText}"`);

  const listen = String(values.listen);
  try {
    parseListenAddress(listen);
  } catch (err) {
    throw new CertshareError('CERTSHARE_BAD_FLAG', `--listen: ${(err as Error).message}`);
  }
  const mode = values.mode as string | undefined;
  if (mode !== undefined && mode !== 'rw' && mode !== 'ro' && mode !== 'auto') throw new CertshareError('CERTSHARE_BAD_FLAG', `--mode must be rw, ro or auto, got "${mode}"`);
  const logLevel = String(values['log-level']);
  if (!['debug', 'info', 'warn', 'error'].includes(logLevel)) throw new CertshareError('CERTSHARE_BAD_FLAG', `--log-level must be debug, info, warn or error`);
  const retryCapMs = duration(values, 'retry-cap');
  const firstRetryMs = duration(values, 'first-retry');
  if (firstRetryMs <= 0 || retryCapMs < firstRetryMs) throw new CertshareError('CERTSHARE_BAD_FLAG', '--first-retry must be positive and not above --retry-cap');
  const checkIntervalMs = duration(values, 'check-interval');
  if (checkIntervalMs <= 0) throw new CertshareError('CERTSHARE_BAD_FLAG', '--check-interval must be positive');
  const podName = env.POD_NAME;
  return {
    localapi: String(values.localapi),
    domains,
    serveConfig,
    store,
    listen,
    reloadCommand: values['reload-command'] as string | undefined,
    reloadTimeoutMs: duration(values, 'reload-timeout'),
    renewal: { renewFraction: parseFraction(String(values['renew-fraction'])), checkIntervalMs },
    backoff: { firstRetryMs, retryCapMs, rateLimitFirstRetryMs: duration(values, 'rate-limit-retry') },
    certTimeoutMs: duration(values, 'cert-timeout'),
    logLevel,
    mode: (mode as ShareMode | undefined) ?? (podName && /-0$/.test(podName) ? 'rw' : podName ? 'ro' : 'rw'),
    group: (values.group as string | undefined) ?? podName?.replace(/-\d+$/, ''),
    outDir: values['out-dir'] as string | undefined,
    readinessGate: values['readiness-gate'] as string | undefined,
    routingChecks: (values['routing-check'] as string[] | undefined) ?? [],
    routingAttempts: positiveInteger(values, 'routing-attempts'),
    drainDelayMs: duration(values, 'drain-delay'),
    leaseDurationMs: duration(values, 'lease-duration'),
    shutdownTimeoutMs: duration(values, 'shutdown-timeout'),
  };
}
