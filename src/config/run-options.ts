import { SERVE_CONFIG_SERVICES, advertises, type DaemonConfig, type StoreChoice, type TlsChoice } from './daemon-config.ts';
import { formatGoDuration } from '../core/values/duration.ts';
import { normalizeDomain } from '../core/certificates/domain.ts';
import { parseBudget } from '../core/issuance/issuance-budget.ts';
import { DEFAULT_ISSUANCE_CONCURRENCY } from '../core/issuance/issuance-slots.ts';
import { CertshareError, errorMessage } from '../core/errors.ts';
import { podAddressesFromEnv } from '../core/values/pod-addresses.ts';
import { parseHostPort } from '../core/values/listen-address.ts';
import { isHttpUrl } from '../core/values/http-url.ts';
import { MAX_STARTUP_GRACE_MS } from '../core/loop/startup-grace.ts';
import { isObjectName } from '../core/values/kube-names.ts';
import { parseReloadCommand } from '../delivery/reload-command.ts';
import { isServiceName, parseServiceName, serviceDomain } from '../core/served/advertisement.ts';
import { parseReloadSignal } from '../delivery/reload-signal.ts';
import { checkHaproxyPath } from '../delivery/haproxy.ts';
import { LETS_ENCRYPT_DIRECTORY } from '../acme/renewal-info-client.ts';
import { type CommandHelp, duration, type FlagSpec, type FlagValues } from '../flags/flags.ts';
import { isLogLevel, LOG_FLAGS, LOG_LEVELS, logFormatFrom } from '../logging/log-format.ts';
import { badFlag, firstBroken, type ConfigRule } from './config-rules.ts';

export type { DaemonConfig, ShareMode, StoreChoice, WatchScope } from './daemon-config.ts';

/** The sections of `certshare run --help`, by task, in this order. */
const RUN_GROUPS = [
  'tailscaled and domains',
  'store',
  'delivery to the proxy',
  'renewal and retries',
  'limits and ARI',
  'Kubernetes',
  'readiness and routing',
  'served check and Tailscale Services',
  'serving and logs',
  'shutdown',
] as const;

const DOMAINS_REQUIRED = 'one of --domain or --serve-config';

export const RUN_FLAGS = [
  {
    name: 'localapi',
    group: 'tailscaled and domains',
    placeholder: 'PATH|URL',
    default: '/var/run/tailscale/tailscaled.sock',
    help: "tailscaled's LocalAPI: a unix socket path or an http:// URL.",
  },
  {
    name: 'domain',
    group: 'tailscaled and domains',
    placeholder: 'FQDN',
    multiple: true,
    required: DOMAINS_REQUIRED,
    help: 'A domain to keep a certificate for.',
  },
  {
    name: 'serve-config',
    group: 'tailscaled and domains',
    placeholder: 'FILE',
    required: DOMAINS_REQUIRED,
    help: 'A Tailscale ServeConfig JSON file whose HTTPS hosts are the domains; watched.',
    detail: 'A file that does not exist yet (in an existing directory) is waited for, /healthz answering 503 until it has been read once.',
  },
  {
    name: 'store',
    group: 'store',
    placeholder: 'dir:PATH|kube',
    help: 'Where certificates live: a directory, or one Kubernetes Secret per domain.',
    detail: 'Default: kube inside a cluster (KUBERNETES_SERVICE_HOST set), dir:./certshare-certs outside.',
  },
  {
    name: 'reload-command',
    group: 'delivery to the proxy',
    placeholder: 'CMD',
    help: 'Command run after certificate files changed; a failure is logged and tried again, never fatal.',
    detail:
      'A JSON array (e.g. \'["nginx","-s","reload"]\') runs without a shell everywhere; a plain string (e.g. "nginx -s reload") ' +
      'runs through /bin/sh where there is one and is split on spaces where there is none (the distroless image).',
  },
  {
    name: 'reload-timeout',
    group: 'delivery to the proxy',
    placeholder: 'DURATION',
    default: '60s',
    help: 'Kill the reload command, and every process it started, after this long.',
    detail:
      "Also the bound of each exchange with HAProxy's runtime API (--haproxy-socket), and how long the proxy's workers from " +
      'before --reload-signal may still accept: past it the reload did not take (docs/proxies.md).',
  },
  {
    name: 'check-interval',
    group: 'renewal and retries',
    placeholder: 'DURATION',
    default: '24h',
    help: 'Longest wait between two looks at a certificate that is not due.',
  },
  {
    name: 'reload-signal',
    group: 'delivery to the proxy',
    placeholder: 'HUP|USR1|USR2',
    help: 'Instead of a command, send this signal to the process --reload-pidfile names.',
    detail: "nginx: HUP. In a Pod: a shared process namespace and the proxy's master running as certshare's uid (docs/proxies.md).",
  },
  {
    name: 'reload-pidfile',
    group: 'delivery to the proxy',
    placeholder: 'FILE',
    help: 'The pid file of the process --reload-signal signals, read afresh at every reload.',
    detail: "E.g. nginx's pid file in a volume shared with the proxy's container.",
  },
  {
    name: 'haproxy-crt-dir',
    group: 'delivery to the proxy',
    placeholder: 'DIR',
    help: "Write DIR/<domain>.pem (chain and key, 0600, atomic) for HAProxy's crt.",
    detail: 'HAProxy mounts DIR at the same path.',
  },
  {
    name: 'haproxy-socket',
    group: 'delivery to the proxy',
    placeholder: 'PATH',
    help: "HAProxy's runtime API socket: each renewed certificate is pushed to it, no reload.",
    detail: '`stats socket PATH level admin` in HAProxy; `set ssl cert` then `commit ssl cert`; --reload-timeout bounds each exchange.',
  },
  {
    name: 'renew-fraction',
    group: 'renewal and retries',
    placeholder: 'FRACTION',
    default: '1/3',
    help: 'Renew when less than this share of the lifetime remains.',
    detail: 'Half for lifetimes under 10 days. Between 0 and 1, both excluded (e.g. 1/3 or 0.33).',
  },
  {
    name: 'first-retry',
    group: 'renewal and retries',
    placeholder: 'DURATION',
    default: '1m',
    help: 'First wait after a failed issuance, doubling up to --retry-cap.',
    detail: 'Also the least time between two issuances of a domain.',
  },
  { name: 'retry-cap', group: 'renewal and retries', placeholder: 'DURATION', default: '24h', help: 'Longest wait between issuance attempts.' },
  {
    name: 'rate-limit-retry',
    group: 'renewal and retries',
    placeholder: 'DURATION',
    default: '1h',
    help: 'First wait after a rate limit without Retry-After, doubling up to --retry-cap.',
  },
  {
    name: 'cert-timeout',
    group: 'renewal and retries',
    placeholder: 'DURATION',
    default: '5m',
    help: 'Timeout of one CertPair call (ACME issuance can take minutes).',
    detail:
      "Keep it far above an issuance's time: tailscaled cancels an issuance whose caller went away, " +
      'and one cut after the CA finalized the order loses a certificate the CA counted.',
  },
  {
    name: 'acme-directory',
    group: 'limits and ARI',
    placeholder: 'URL|none',
    default: LETS_ENCRYPT_DIRECTORY,
    help: 'The ACME directory whose Renewal Information (ARI) the writer asks; none turns ARI off.',
    detail:
      'The writer asks its renewalInfo endpoint when the CA wants a certificate replaced. ' +
      'A private CA is trusted through NODE_EXTRA_CA_CERTS (docs/install.md).',
  },
  {
    name: 'ari-interval',
    group: 'limits and ARI',
    placeholder: 'DURATION',
    default: '6h',
    help: 'Longest wait between two ARI checks of a certificate.',
    detail: "The CA's Retry-After may ask again sooner (at least a minute).",
  },
  {
    name: 'issuance-budget',
    group: 'limits and ARI',
    placeholder: 'COUNT/WINDOW',
    default: '50/168h',
    help: 'At most COUNT first issuances per registered domain in any WINDOW; 0 disables.',
    detail:
      "Let's Encrypt's limit (a registered domain is e.g. <tailnet>.ts.net); renewals are exempt. " +
      'Domains without a certificate go first, then the soonest to expire; the rest wait.',
  },
  {
    name: 'name-limit',
    group: 'limits and ARI',
    placeholder: 'COUNT/WINDOW',
    default: '5/168h',
    help: 'At most COUNT certificates per exact name in any WINDOW, whatever asks; 0 disables.',
    detail:
      "Let's Encrypt's limit per exact name set, kept in the issuance budget's ledger (off with --issuance-budget 0). " +
      'A renew request is refused once it would leave fewer than 2 for ordinary renewals.',
  },
  {
    name: 'budget-namespace',
    group: 'limits and ARI',
    placeholder: 'NS',
    help: "Keep the issuance budget's ledger in this namespace, shared by every group of the cluster.",
    detail:
      "The platform's namespace: one ConfigMap certshare-budget-<registered domain> that every group of the cluster shares, so the " +
      'budget holds for the tailnet as a whole (needs get and update on it; the platform creates it). Default: a ledger per group, ' +
      'certshare-<group>-ledger.',
  },
  {
    name: 'issuance-concurrency',
    group: 'limits and ARI',
    placeholder: 'N',
    default: String(DEFAULT_ISSUANCE_CONCURRENCY),
    help: 'At most N domains issue at once; the others wait their turn.',
    detail: 'tailscaled runs one ACME order at a time anyway; more calls in flight only hold memory here and wait there.',
  },
  {
    name: 'mode',
    group: 'Kubernetes',
    placeholder: 'rw|ro|auto',
    aliasesEnv: ['TS_CERT_SHARE_MODE'],
    help: 'rw writes (issues), ro only reads, auto elects a writer with a Lease.',
    detail: 'Default: rw for the Pod whose name ends in -0, ro otherwise.',
  },
  { name: 'group', group: 'Kubernetes', placeholder: 'NAME', help: 'Group label on Secrets. Default: the Pod name without its ordinal.' },
  {
    name: 'watch-scope',
    group: 'Kubernetes',
    placeholder: 'secret|group',
    default: 'secret',
    help: "secret watches each domain's Secret by name; group watches the group's Secrets at once.",
    detail:
      'secret: RBAC resourceNames, least privilege. group: one label selector, for many domains; ' +
      'needs list and watch on every Secret of the namespace (manifests/group-scope).',
  },
  {
    name: 'federation-kubeconfig',
    group: 'Kubernetes',
    placeholder: 'FILE',
    help: "The federation home's kubeconfig: one writer, Secret of record and ledger across clusters.",
    detail:
      "A kubeconfig the platform mounts from a Secret (the injector's --sidecar-home-kubeconfig-secret). The writer " +
      'election, the Secrets of record and the ledger live at the home; the local writer mirrors them into the local ' +
      'Secrets (docs/federation.md). Needs --federation-namespace and --federation-cluster.',
  },
  {
    name: 'federation-namespace',
    group: 'Kubernetes',
    placeholder: 'NS',
    help: "The namespace at the federation home holding the group's Lease, Secrets and ledger.",
  },
  {
    name: 'federation-lease-duration',
    group: 'Kubernetes',
    placeholder: 'DURATION',
    default: '1h',
    help: "How long the federation home's writer keeps the home Lease without renewing it.",
    detail:
      'Long on purpose: the holder renews it every third of it with one update (no read first), so 1h costs the home ' +
      '4.3 requests per group-hour, its watch included (docs/federation.md); a writer that dies without releasing it is replaced within it.',
  },
  {
    name: 'federation-cluster',
    group: 'Kubernetes',
    placeholder: 'NAME',
    help: "This member cluster's name in the home Lease's holder (<cluster>/<pod>) and in logs.",
  },
  {
    name: 'federation-trust-anchors',
    group: 'Kubernetes',
    placeholder: 'FILE',
    help: "PEM CA certificates a federated group's certificates chain to (default: the CAs Node trusts).",
    detail:
      'A pair read from the home or the local Secret, or written to the home, counts only if its signatures verify up to one of ' +
      "them; any other is refused (CERTSHARE_CERT_UNTRUSTED) and never served. The default is Node's CA store: its Mozilla " +
      "roots (Let's Encrypt's among them) and NODE_EXTRA_CA_CERTS (a private CA, docs/install.md). A file pins to its CAs only.",
  },
  {
    name: 'out-dir',
    group: 'delivery to the proxy',
    placeholder: 'DIR',
    help: 'Also project the current certificates into DIR/<domain>/, then run --reload-command.',
  },
  {
    name: 'lease-duration',
    group: 'Kubernetes',
    placeholder: 'DURATION',
    default: '15s',
    help: 'With --mode auto: how long a writer keeps the group Lease without renewing it.',
  },
  {
    name: 'readiness-gate',
    group: 'readiness and routing',
    placeholder: 'TYPE',
    help: "Keep this condition of the Pod's own status True only while every certificate is valid.",
  },
  {
    name: 'readiness-lead',
    group: 'readiness and routing',
    placeholder: 'DURATION',
    default: '1m',
    help: 'Turn the readiness condition False this long before a certificate expires.',
    detail:
      'So the Pod has left the endpoints by then. At most 5% of the lifetime and half the time from the renewal point: ' +
      'a renewal that works never takes the Pod out.',
  },
  {
    name: 'routing-check',
    group: 'readiness and routing',
    placeholder: 'URL',
    multiple: true,
    help: "A Service's health URL that must route to this Pod before the gate turns True.",
    detail: 'Recognised by the Pod-IPv4 header or a routing proof (docs/design.md); needs --readiness-gate and POD_IPS.',
  },
  {
    name: 'routing-attempts',
    group: 'readiness and routing',
    placeholder: 'N',
    default: '9',
    help: "Fresh connections, in parallel, in a routing check's first wave.",
    detail: "Later waves take 3 x the endpoints seen answering (Tailscale's rule); they go on for 30 s before the condition says NotRouted.",
  },
  {
    name: 'served-check',
    group: 'served check and Tailscale Services',
    placeholder: 'HOST:PORT',
    help: "The proxy's TLS listener, whose certificate for each domain certshare compares with its own.",
    detail: 'certshare connects with SNI per domain and compares the certificate served with the one it holds.',
  },
  {
    name: 'served-check-interval',
    group: 'served check and Tailscale Services',
    placeholder: 'DURATION',
    default: '1m',
    help: 'Steady interval of the served check (it also runs after every certificate change).',
  },
  {
    name: 'served-check-timeout',
    group: 'served check and Tailscale Services',
    placeholder: 'DURATION',
    default: '5s',
    help: 'Bound on one TLS handshake of the served check.',
  },
  {
    name: 'served-stale-after',
    group: 'served check and Tailscale Services',
    placeholder: 'DURATION',
    default: '5m',
    help: 'Warn when the proxy still serves the previous certificate this long after a renewal.',
    detail: "The warning is a metric, an Event and an alert; at most halfway to that certificate's leaving rotation.",
  },
  {
    name: 'advertise-services',
    group: 'served check and Tailscale Services',
    placeholder: 'svc:NAME|serve-config',
    multiple: true,
    help: 'A Tailscale Service advertised only while its certificate is held and served.',
    detail: "Through tailscaled's prefs; needs --served-check. serve-config: the Services of the --serve-config file, followed as it changes.",
  },
  {
    name: 'advertise-agent',
    group: 'served check and Tailscale Services',
    placeholder: 'DIR',
    help: "Advertise through certshare advertise-agent's exchange directory, not by editing prefs.",
    detail: 'certshare then needs no right on tailscaled but certificates (set by certshare injector).',
  },
  {
    name: 'advertise-bootstrap',
    group: 'served check and Tailscale Services',
    boolean: true,
    help: "Advertise a Service before its first certificate, so that control grants the Service's domain.",
    detail:
      'Only while no valid certificate for it exists in the group (Secret, federation home) and the proxy serves none: off where other ' +
      'clusters serve the same Service without a federation home.',
  },
  {
    name: 'advertise-left-to-file',
    group: 'served check and Tailscale Services',
    placeholder: 'svc:NAME',
    multiple: true,
    help: "A Service left to the owner of tailscaled's config file: said once at start, never advertised.",
    detail: "Set by certshare injector in place of --advertise-services when tailscaled's container declares TS_EXPERIMENTAL_VERSIONED_CONFIG_DIR.",
  },
  {
    name: 'advertise-failover',
    group: 'served check and Tailscale Services',
    placeholder: 'DURATION',
    default: '20s',
    help: 'On shutdown, after withdrawing the Services, wait this long for control to move clients.',
    detail: "Tailscale's own proxies wait 20s.",
  },
  {
    name: 'leave-token',
    group: 'served check and Tailscale Services',
    placeholder: 'TOKEN',
    help: 'Enables GET /leave-rotation for a preStop hook sending this token.',
    detail:
      'The hook sends the value in the Certshare-Leave-Token header; certshare leaves rotation, then answers, only while its Pod ' +
      'is being deleted (409 before). Needs --store kube and POD_NAME.',
  },
  { name: 'listen', group: 'serving and logs', placeholder: 'ADDR:PORT', default: '[::]:9002', help: 'Address for GET /healthz and GET /metrics.' },
  {
    name: 'tls',
    group: 'serving and logs',
    placeholder: 'dir:PATH|secret:NAME',
    help: 'Serve /healthz and /metrics over HTTPS with a pair from a directory or a Secret.',
    detail:
      "tls.crt and tls.key from a directory (e.g. a mounted Secret) or a kubernetes.io/tls Secret of the Pod's namespace " +
      '(needs --store kube); a renewed pair is served from the next handshake on, without restart.',
  },
  ...LOG_FLAGS,
  {
    name: 'startup-grace',
    group: 'serving and logs',
    placeholder: 'DURATION',
    default: '30s',
    help: 'How long what every start goes through logs at info before it warns; at most 10m.',
    detail:
      'tailscaled not listening yet and an empty Secret while the first issuance runs; later (or once tailscaled answered, ' +
      'or a certificate was held) they are warnings. 0 warns at once.',
  },
  {
    name: 'drain-delay',
    group: 'shutdown',
    placeholder: 'DURATION',
    default: '5s',
    help: "Injected: the preStop sleep given to the Pod's other containers that have none.",
    detail:
      'So the proxy keeps serving while the Pod leaves the endpoints (set by certshare injector). certshare itself does not wait: ' +
      'as a native sidecar it is stopped after them.',
  },
  {
    name: 'shutdown-timeout',
    group: 'shutdown',
    placeholder: 'DURATION',
    default: '25s',
    help: 'Exit no later than this after SIGTERM.',
    detail:
      'Injected, it follows the drain delay within terminationGracePeriodSeconds: unset, the injector fits it into what ' +
      'the drain leaves (5s at least); given, it refuses a Pod where the two do not fit.',
  },
] as const satisfies readonly FlagSpec<(typeof RUN_GROUPS)[number]>[];

/** The parsed values of `certshare run`. */
export type RunValues = FlagValues<typeof RUN_FLAGS>;

/** `certshare run --help` and its part of docs/configuration.md. */
export const RUN_HELP: CommandHelp = {
  command: 'run',
  summary: 'Keeps certificates for the given domains, issued through tailscaled, in a directory or Kubernetes Secrets.',
  flags: RUN_FLAGS,
  groups: RUN_GROUPS,
  example:
    "certshare run --localapi /var/run/tailscale/tailscaled.sock --domain web.tailnet-1234.ts.net --store dir:/etc/certs --reload-command 'nginx -s reload'",
};

function parseFraction(text: string): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*(?:\/\s*(\d+(?:\.\d+)?))?\s*$/.exec(text);
  if (!m) throw badFlag('--renew-fraction', `"${text}" is not a fraction (e.g. 1/3 or 0.33)`);
  return Number(m[1]) / Number(m[2] ?? 1);
}

/**
 * Flags and environment to a DaemonConfig: each value parsed on its own (syntax), then every rule that
 * relates values checked in one place, validateConfig. Throws CERTSHARE_BAD_FLAG (exit 2).
 */
function domainsFrom(values: RunValues): string[] {
  return (values.domain ?? []).map((d) => {
    try {
      return normalizeDomain(d);
    } catch (err) {
      throw badFlag('--domain', `${errorMessage(err)}`);
    }
  });
}

/** Without --store, a Pod (KUBERNETES_SERVICE_HOST set) keeps its certificates in Secrets. */
function storeFrom(values: RunValues, env: NodeJS.ProcessEnv): StoreChoice {
  const storeText = values.store ?? (env.KUBERNETES_SERVICE_HOST ? 'kube' : 'dir:./certshare-certs');
  if (storeText === 'kube') return { kind: 'kube' };
  if (storeText.startsWith('dir:') && storeText.length > 4) return { kind: 'dir', path: storeText.slice(4) };
  throw badFlag('--store', `must be dir:PATH or kube, got "${storeText}"`);
}

function listenFrom(values: RunValues): { host: string; port: number } {
  try {
    return parseHostPort(values.listen);
  } catch (err) {
    throw badFlag('--listen', `${(err as Error).message}`);
  }
}

export function daemonConfigFrom(values: RunValues, env: NodeJS.ProcessEnv): DaemonConfig {
  const domains = domainsFrom(values);
  const store = storeFrom(values, env);
  const listen = listenFrom(values);
  const tls = tlsChoice(values.tls);
  const reloadText = values['reload-command'];
  const signalText = values['reload-signal'];
  const podName = env.POD_NAME || undefined;
  const mode = values.mode;
  if (mode !== undefined && mode !== 'rw' && mode !== 'ro' && mode !== 'auto') throw badFlag('--mode', `must be rw, ro or auto, got "${mode}"`);
  const watchScope = values['watch-scope'];
  if (watchScope !== 'secret' && watchScope !== 'group') throw badFlag('--watch-scope', `must be secret or group, got "${watchScope}"`);
  const config: DaemonConfig = {
    localapi: values.localapi,
    domains: [...new Set(domains)],
    serveConfig: values['serve-config'],
    store,
    listen,
    tls,
    reloadCommand: reloadText === undefined ? undefined : parseReloadCommand(reloadText),
    reloadTimeoutMs: duration(values, 'reload-timeout'),
    reloadSignal: signalText === undefined ? undefined : parseReloadSignal(signalText),
    reloadPidFile: values['reload-pidfile'],
    haproxyCrtDir: values['haproxy-crt-dir'],
    haproxySocket: values['haproxy-socket'],
    renewal: { renewFraction: parseFraction(values['renew-fraction']), checkIntervalMs: duration(values, 'check-interval') },
    backoff: {
      firstRetryMs: duration(values, 'first-retry'),
      retryCapMs: duration(values, 'retry-cap'),
      rateLimitFirstRetryMs: duration(values, 'rate-limit-retry'),
    },
    certTimeoutMs: duration(values, 'cert-timeout'),
    acmeDirectory: acmeDirectory(values['acme-directory']),
    ariIntervalMs: duration(values, 'ari-interval'),
    issuanceBudget: parseBudget(values['issuance-budget']),
    nameLimit: parseBudget(values['name-limit'], '--name-limit'),
    budgetNamespace: values['budget-namespace'],
    federation: federationFrom(values),
    issuanceConcurrency: Number(values['issuance-concurrency']),
    logLevel: values['log-level'],
    logFormat: logFormatFrom(values),
    startupGraceMs: duration(values, 'startup-grace'),
    mode: mode ?? (podName && /-0$/.test(podName) ? 'rw' : podName ? 'ro' : 'rw'),
    group: values.group ?? podName?.replace(/-\d+$/, ''),
    watchScope,
    outDir: values['out-dir'],
    readinessGate: values['readiness-gate'],
    readinessLeadMs: duration(values, 'readiness-lead'),
    routingChecks: values['routing-check'] ?? [],
    routingAttempts: Number(values['routing-attempts']),
    servedCheck: servedCheckTarget(values['served-check']),
    servedCheckIntervalMs: duration(values, 'served-check-interval'),
    servedCheckTimeoutMs: duration(values, 'served-check-timeout'),
    servedStaleAfterMs: duration(values, 'served-stale-after'),
    advertiseServices: advertisedServices(values['advertise-services'] ?? []),
    advertiseFailoverMs: duration(values, 'advertise-failover'),
    advertiseAgent: values['advertise-agent'] || undefined,
    advertiseBootstrap: values['advertise-bootstrap'] ?? false,
    advertiseLeftToFile: values['advertise-left-to-file'] ?? [],
    leaveToken: values['leave-token'] || undefined,
    drainDelayMs: duration(values, 'drain-delay'),
    leaseDurationMs: duration(values, 'lease-duration'),
    shutdownTimeoutMs: duration(values, 'shutdown-timeout'),
    podName,
    pod: podAddressesFromEnv(env),
  };
  const broken = validateConfig(config);
  if (broken) throw new CertshareError('CERTSHARE_BAD_FLAG', broken);
  return config;
}

function leaveTokenRules(c: DaemonConfig): ConfigRule[] {
  if (c.leaveToken === undefined) return [];
  return [
    [
      !/^[A-Za-z0-9_-]{16,128}$/.test(c.leaveToken),
      '--leave-token',
      () => 'must be 16 to 128 characters of A-Z a-z 0-9 _ - (a random value the preStop hook sends)',
    ],
    // GET /leave-rotation acts only on a Pod being deleted, which certshare learns from the apiserver.
    [
      c.store.kind !== 'kube' || !c.podName,
      '--leave-token',
      () => 'needs --store kube and POD_NAME: GET /leave-rotation acts only while the Pod is terminating',
    ],
  ];
}

function domainAndDurationRules(c: DaemonConfig): ConfigRule[] {
  const positive: Array<[string, number]> = [
    ['--check-interval', c.renewal.checkIntervalMs],
    ['--first-retry', c.backoff.firstRetryMs],
    ['--retry-cap', c.backoff.retryCapMs],
    ['--rate-limit-retry', c.backoff.rateLimitFirstRetryMs],
    ['--cert-timeout', c.certTimeoutMs],
    ['--ari-interval', c.ariIntervalMs],
    ['--reload-timeout', c.reloadTimeoutMs],
    ['--lease-duration', c.leaseDurationMs],
    ['--shutdown-timeout', c.shutdownTimeoutMs],
    ['--served-check-interval', c.servedCheckIntervalMs],
    ['--served-check-timeout', c.servedCheckTimeoutMs],
  ];
  return [
    [c.domains.length === 0 && !c.serveConfig, '--domain', () => 'give at least one, or a --serve-config file'],
    [
      !(c.renewal.renewFraction > 0 && c.renewal.renewFraction < 1),
      '--renew-fraction',
      () => `must be between 0 and 1, both excluded (e.g. 1/3 or 0.33), got ${c.renewal.renewFraction}`,
    ],
    ...positive.map(([flag, ms]): ConfigRule => [!(ms > 0), flag, () => `must be longer than 0`]),
  ];
}

function reloadRules(c: DaemonConfig): ConfigRule[] {
  return [
    [c.reloadSignal !== undefined && c.reloadCommand !== undefined, '--reload-command', () => 'give it or --reload-signal, not both'],
    [c.reloadSignal !== undefined && !c.reloadPidFile, '--reload-signal', () => 'needs --reload-pidfile (the pid file of the process to signal)'],
    [c.reloadPidFile !== undefined && c.reloadSignal === undefined, '--reload-pidfile', () => 'needs --reload-signal (e.g. HUP for nginx)'],
    [
      c.haproxySocket !== undefined && !c.haproxyCrtDir,
      '--haproxy-socket',
      () => 'needs --haproxy-crt-dir (the files HAProxy loaded, whose names the runtime API takes)',
    ],
    [c.haproxyCrtDir !== undefined && checkHaproxyPath(c.haproxyCrtDir) !== undefined, '--haproxy-crt-dir', () => checkHaproxyPath(c.haproxyCrtDir!)!],
  ];
}

function limitRules(c: DaemonConfig): ConfigRule[] {
  return [
    [c.backoff.firstRetryMs > c.backoff.retryCapMs, '--first-retry', () => 'must not be above --retry-cap'],
    [c.backoff.rateLimitFirstRetryMs > c.backoff.retryCapMs, '--rate-limit-retry', () => 'must not be above --retry-cap'],
    [!isLogLevel(c.logLevel), '--log-level', () => `must be ${LOG_LEVELS.join(', ')}`],
    [
      c.startupGraceMs > MAX_STARTUP_GRACE_MS,
      '--startup-grace',
      () => `must be at most ${formatGoDuration(MAX_STARTUP_GRACE_MS)} (a longer one would hide a tailscaled that never starts)`,
    ],
    [!(Number.isInteger(c.routingAttempts) && c.routingAttempts >= 1), '--routing-attempts', () => `must be a positive integer`],
    [!(Number.isInteger(c.issuanceConcurrency) && c.issuanceConcurrency >= 1), '--issuance-concurrency', () => `must be a positive integer`],
  ];
}

function kubeStoreRules(c: DaemonConfig): ConfigRule[] {
  const kubeOnly: Array<[string, unknown]> = [
    ['--tls secret:NAME', c.tls?.kind === 'secret' ? c.tls : undefined],
    ['--out-dir', c.outDir],
    ['--readiness-gate', c.readinessGate],
    ['--routing-check', c.routingChecks.length > 0 ? c.routingChecks : undefined],
  ];
  return [
    ...kubeOnly.map(([flag, value]): ConfigRule => [value !== undefined && c.store.kind !== 'kube', flag, () => `needs --store kube`]),
    [c.store.kind === 'kube' && c.mode === 'auto' && !c.group, '--mode auto', () => 'needs --group or POD_NAME to name the group Lease'],
    [c.watchScope === 'group' && c.store.kind !== 'kube', '--watch-scope group', () => 'needs --store kube'],
    [c.budgetNamespace !== undefined && c.store.kind !== 'kube', '--budget-namespace', () => 'needs --store kube'],
  ];
}

function budgetGroupAndGateRules(c: DaemonConfig): ConfigRule[] {
  return [
    [c.budgetNamespace !== undefined && !c.issuanceBudget, '--budget-namespace', () => 'needs an --issuance-budget (it names where that budget is kept)'],
    [c.budgetNamespace !== undefined && !isObjectName(c.budgetNamespace), '--budget-namespace', () => `"${c.budgetNamespace}" is not a namespace name`],
    [c.watchScope === 'group' && !c.group, '--watch-scope group', () => "needs --group or POD_NAME: the group's label selects its Secrets"],
    [c.readinessGate !== undefined && !c.podName, '--readiness-gate', () => 'needs POD_NAME (downward API fieldRef metadata.name)'],
    [
      c.routingChecks.length > 0 && !c.readinessGate,
      '--routing-check',
      () => 'needs --readiness-gate (the check holds the gate False until the Service routes here)',
    ],
    ...c.routingChecks.map((url): ConfigRule => [!isHttpUrl(url), '--routing-check', () => `"${url}" is not an http:// or https:// URL`]),
  ];
}

function advertiseRules(c: DaemonConfig): ConfigRule[] {
  return [
    [
      advertises(c) && !c.servedCheck,
      '--advertise-services',
      () => 'needs --served-check: a Service is advertised only while the proxy is seen serving its certificate',
    ],
    [
      c.advertiseServices === SERVE_CONFIG_SERVICES && !c.serveConfig,
      '--advertise-services serve-config',
      () => 'needs --serve-config: the ServeConfig file whose Services it advertises',
    ],
    ...(c.advertiseServices === SERVE_CONFIG_SERVICES ? [] : c.advertiseServices).map(
      (service): ConfigRule => [
        !c.serveConfig && serviceDomain(service, c.domains) === undefined,
        '--advertise-services',
        () => `${service} has no --domain whose first label is ${service.slice(4)} (a Service's certificate is for <name>.<tailnet>.ts.net)`,
      ],
    ),
    [
      c.advertiseLeftToFile.length > 0 && advertises(c),
      '--advertise-left-to-file',
      () => "leaves the advertisement to tailscaled's config file: give --advertise-services or this, not both",
    ],
    ...c.advertiseLeftToFile.map(
      (service): ConfigRule => [
        !isServiceName(service),
        '--advertise-left-to-file',
        () => `"${service}" is not a Tailscale Service name (svc:<dns-label>, lower case)`,
      ],
    ),
  ];
}

function failoverAcmeAndPodRules(c: DaemonConfig): ConfigRule[] {
  return [
    [
      // With --leave-token the wait runs in the preStop call, before the stop and outside its bound.
      advertises(c) && !c.leaveToken && c.advertiseFailoverMs >= c.shutdownTimeoutMs,
      '--advertise-failover',
      () => 'must be below --shutdown-timeout (the shutdown waits it out, then stops the rest), or give --leave-token',
    ],
    [
      c.acmeDirectory !== undefined && !isHttpUrl(c.acmeDirectory),
      '--acme-directory',
      () => `"${c.acmeDirectory}" is not an http:// or https:// URL (or none, to turn ACME Renewal Information off)`,
    ],
    [
      c.pod.invalid.length > 0,
      'POD_IPS/POD_IP',
      () => `holds ${c.pod.invalid.map((ip) => `"${ip}"`).join(', ')}, not an IP address (set POD_IPS from the downward API fieldRef status.podIPs)`,
    ],
    [
      c.routingChecks.length > 0 && !c.pod.ipv4,
      '--routing-check',
      () => "needs the Pod's IPv4 address in POD_IPS (hint: env POD_IPS from the downward API fieldRef status.podIPs), to recognise its own answer",
    ],
  ];
}

/**
 * Every rule of the configuration that is not the syntax of one value, checked before anything starts
 * (as Tailscale's containerboot settings.validate() does): the first broken rule, or undefined.
 */
function validateConfig(c: DaemonConfig): { flag: string; rule: string } | undefined {
  const rules: ConfigRule[] = [
    ...domainAndDurationRules(c),
    ...reloadRules(c),
    ...limitRules(c),
    ...kubeStoreRules(c),
    ...federationRules(c),
    ...budgetGroupAndGateRules(c),
    ...advertiseRules(c),
    ...leaveTokenRules(c),
    ...failoverAcmeAndPodRules(c),
  ];
  return firstBroken(rules);
}

/**
 * --advertise-services: Service names, or `serve-config` alone for the Services of the --serve-config file
 * (a name next to it would be advertised whatever the file says, which is what the value is there to avoid).
 */
function advertisedServices(values: string[]): DaemonConfig['advertiseServices'] {
  if (!values.includes(SERVE_CONFIG_SERVICES)) return [...new Set(values.map(parseServiceName))];
  if (values.length > 1)
    throw badFlag('--advertise-services', `${SERVE_CONFIG_SERVICES} takes the Services from the ServeConfig: give no Service name with it`);
  return SERVE_CONFIG_SERVICES;
}

/** --served-check: HOST:PORT of the proxy's TLS listener. */
function servedCheckTarget(text: string | undefined): { host: string; port: number } | undefined {
  if (text === undefined || text === '') return undefined;
  try {
    const { host, port } = parseHostPort(text, '127.0.0.1');
    if (port === 0) throw new Error('port 0 names no listener');
    return { host: host === '' || host === '::' || host === '0.0.0.0' ? '127.0.0.1' : host, port };
  } catch (err) {
    throw badFlag('--served-check', `${(err as Error).message}`);
  }
}

/** --acme-directory: a URL (checked by validateConfig), or none for no ARI. */
function acmeDirectory(text: string): string | undefined {
  const value = text.trim();
  return value === 'none' ? undefined : value;
}

/** A listener's TLS source, `dir:PATH` or `secret:NAME` (--tls; the injector's --metrics-tls). */
export function tlsChoice(text: string | undefined, flag = 'tls'): TlsChoice | undefined {
  if (text === undefined || text === '') return undefined;
  if (text.startsWith('dir:') && text.length > 4) return { kind: 'dir', path: text.slice(4) };
  if (text.startsWith('secret:') && isObjectName(text.slice(7))) return { kind: 'secret', name: text.slice(7) };
  throw badFlag(`--${flag}`, `must be dir:PATH or secret:NAME (a Secret name), got "${text}"`);
}

/** --federation-*: all three, or none. */
function federationFrom(values: RunValues): DaemonConfig['federation'] {
  const kubeconfig = values['federation-kubeconfig'];
  const namespace = values['federation-namespace'];
  const cluster = values['federation-cluster'];
  if (kubeconfig === undefined && namespace === undefined && cluster === undefined && values['federation-trust-anchors'] === undefined) return undefined;
  return {
    kubeconfig: kubeconfig ?? '',
    namespace: namespace ?? '',
    cluster: cluster ?? '',
    leaseDurationMs: duration(values, 'federation-lease-duration'),
    trustAnchors: values['federation-trust-anchors'],
  };
}

function federationRules(c: DaemonConfig): ConfigRule[] {
  const f = c.federation;
  if (!f) return [];
  return [
    [c.store.kind !== 'kube', '--federation-kubeconfig', () => 'needs --store kube'],
    [
      !f.kubeconfig || !f.namespace || !f.cluster,
      '--federation-kubeconfig',
      () => 'needs --federation-namespace and --federation-cluster (the three go together)',
    ],
    [!!f.namespace && !isObjectName(f.namespace), '--federation-namespace', () => `"${f.namespace}" is not a namespace name`],
    [!!f.cluster && !/^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/.test(f.cluster), '--federation-cluster', () => `"${f.cluster}" is not a DNS label`],
    [!c.group, '--federation-kubeconfig', () => 'needs --group or POD_NAME: the home keeps one Lease per group'],
  ];
}
