// `certshare injector`'s flags and the configuration they make (the injector itself: src/injector/injector.ts):
// each value's syntax checked where it is parsed, every rule that relates values in one table (config-rules.ts,
// as the daemon's run-options.ts). The injection's own check of the defaults runs at the injector's start.
import { isIP } from 'node:net';
import { hostname } from 'node:os';
import { rotationPolicyProblem, type RotationPolicy } from '../core/injector-ca/ca-rotation.ts';
import { parseTarget, type Target } from '../core/injector-ca/ca-targets.ts';
import { errorMessage } from '../core/errors.ts';
import type { ShareMode } from '../core/ports/store.ts';
import { isConfigMapKey, isObjectName } from '../core/values/kube-names.ts';
import { parseHostPort } from '../core/values/listen-address.ts';
import { type CommandHelp, duration, type FlagSpec, type FlagValues } from '../flags/flags.ts';
import { isLogLevel, LOG_FLAGS, LOG_LEVELS, logFormatFrom, type LogFormat } from '../logging/log-format.ts';
import { tlsChoice } from './run-options.ts';
import type { TlsChoice } from './daemon-config.ts';
import { badFlag, firstBroken, type ConfigRule } from './config-rules.ts';
import { DEFAULT_IMAGE, DEFAULT_READINESS_GATE, type CaBundleSource, type InjectionDefaults, type SidecarResources } from './injection-defaults.ts';

/** The sections of `certshare injector --help`, by task, in this order. */
const INJECTOR_GROUPS = ['serving and logs', 'webhook certificate', 'CA rotation', 'Kubernetes', 'injected sidecar', 'shutdown'] as const;

export const INJECTOR_FLAGS = [
  {
    name: 'listen',
    group: 'serving and logs',
    placeholder: 'ADDR:PORT',
    default: '[::]:8443',
    help: 'Address of the webhook (HTTPS: POST /mutate, GET /healthz).',
  },
  {
    name: 'metrics-listen',
    group: 'serving and logs',
    placeholder: 'ADDR:PORT',
    default: '[::]:9003',
    help: 'Address for GET /metrics (plain HTTP unless --metrics-tls, for Prometheus).',
  },
  {
    name: 'metrics-tls',
    group: 'serving and logs',
    placeholder: 'dir:PATH|secret:NAME',
    help: 'Serve /metrics over HTTPS with a pair from a directory or a Secret, followed.',
    detail:
      'tls.crt and tls.key from a directory (a mounted Secret) or a kubernetes.io/tls Secret of the namespace: ' +
      "a renewed pair is served from the next handshake on (as the daemon's --tls).",
  },
  ...LOG_FLAGS,
  {
    name: 'service',
    group: 'webhook certificate',
    placeholder: 'NAME',
    default: 'certshare-injector',
    help: "The webhook's Service, whose names the serving certificate covers.",
    detail: 'The leaf covers <svc>, <svc>.<ns>, <svc>.<ns>.svc, <svc>.<ns>.svc.cluster.local.',
  },
  {
    name: 'service-namespace',
    group: 'webhook certificate',
    placeholder: 'NAMESPACE',
    help: "The Service's namespace. Default: the injector's own (POD_NAMESPACE).",
  },
  {
    name: 'extra-san',
    group: 'webhook certificate',
    placeholder: 'NAME|IP',
    multiple: true,
    help: 'A further DNS name or IP address in the leaf (e.g. 127.0.0.1 for a webhook called by URL).',
  },
  {
    name: 'inject-ca-into',
    group: 'webhook certificate',
    placeholder: 'KIND/NAME',
    multiple: true,
    default: 'mutatingwebhookconfiguration/certshare-injector',
    help: 'An object whose caBundle the injector keeps.',
    detail: 'mutatingwebhookconfiguration/NAME, validatingwebhookconfiguration/NAME, customresourcedefinition/NAME (conversion webhook), ' + 'apiservice/NAME.',
  },
  {
    name: 'ca-secret',
    group: 'webhook certificate',
    placeholder: 'NAME',
    default: 'certshare-injector-ca',
    help: 'Secret holding the CAs of the bundle and their keys.',
  },
  {
    name: 'tls-secret',
    group: 'webhook certificate',
    placeholder: 'NAME',
    default: 'certshare-injector-tls',
    help: "Secret holding the webhook's serving certificate (kubernetes.io/tls).",
  },
  { name: 'ca-lifetime', group: 'CA rotation', placeholder: 'DURATION', default: '8760h', help: 'Lifetime of a new CA.' },
  {
    name: 'ca-rotate-before',
    group: 'CA rotation',
    placeholder: 'DURATION',
    default: '2160h',
    help: 'Add the next CA to the bundle this long before the newest CA expires.',
    detail: 'At most 6/7 of --ca-lifetime: a bundle holds at most 8 CAs.',
  },
  {
    name: 'leaf-lifetime',
    group: 'CA rotation',
    placeholder: 'DURATION',
    default: '720h',
    help: 'Lifetime of a serving certificate (never beyond its CA).',
  },
  {
    name: 'leaf-renew-before',
    group: 'CA rotation',
    placeholder: 'DURATION',
    default: '240h',
    help: 'Renew the serving certificate this long before it expires.',
  },
  {
    name: 'propagation-grace',
    group: 'CA rotation',
    placeholder: 'DURATION',
    default: '30s',
    help: 'How long every object must be seen carrying a new CA before it signs.',
    detail: "Leaves are signed by a new CA only after this, for the apiserver's caches.",
  },
  {
    name: 'lease',
    group: 'Kubernetes',
    placeholder: 'NAME',
    default: 'certshare-injector',
    help: 'Lease electing the one replica that writes the CAs, the leaf and the caBundles.',
    detail: "In the injector's namespace; the other replicas read and serve.",
  },
  {
    name: 'lease-duration',
    group: 'Kubernetes',
    placeholder: 'DURATION',
    default: '15s',
    help: 'How long the writer keeps the Lease without renewing it (failover time).',
  },
  {
    name: 'resync',
    group: 'Kubernetes',
    placeholder: 'DURATION',
    default: '10m',
    help: 'Re-read the Secrets and the objects at least this often (they are watched as well).',
    detail: "The writer writes the sidecar's form (its ConfigMap) again as often.",
  },
  { name: 'kube-timeout', group: 'Kubernetes', placeholder: 'DURATION', default: '10s', help: 'Timeout of one Kubernetes API call.' },
  { name: 'sidecar-image', group: 'injected sidecar', placeholder: 'IMAGE', default: DEFAULT_IMAGE, help: 'Image of the injected certshare container.' },
  {
    name: 'sidecar-image-pull-policy',
    group: 'injected sidecar',
    placeholder: 'Always|IfNotPresent|Never',
    default: '',
    help: "imagePullPolicy of the injected certshare container (default: the cluster's).",
  },
  {
    name: 'sidecar-flags',
    group: 'injected sidecar',
    placeholder: "'--NAME=VALUE ...'",
    default: '',
    help: "The platform's `certshare run` flags for every injected sidecar.",
    detail:
      'The issuance budget and concurrency, lease, retry policy, reload command, ...: ' +
      "a Pod's certshare.io/flags may set only its drain delay, shutdown timeout, readiness lead, routing checks, log level, " +
      'served check and advertised Services.',
  },
  {
    name: 'sidecar-ca-configmap',
    group: 'injected sidecar',
    placeholder: 'NAME[:KEY]',
    default: '',
    help: "A ConfigMap of each Pod's namespace whose KEY holds CA certificates the sidecar trusts.",
    detail:
      "KEY defaults to ca.crt. PEM CA certificates trusted besides the system's (NODE_EXTRA_CA_CERTS): a private ACME CA's, whose " +
      'directory --sidecar-flags names with --acme-directory. Mounted into the certshare container only; a Pod whose namespace lacks it ' +
      'does not start (a FailedMount event names it).',
  },
  {
    name: 'sidecar-home-kubeconfig-secret',
    group: 'injected sidecar',
    placeholder: 'NAME',
    default: '',
    help: "A Secret of each Pod's namespace whose key kubeconfig reaches the federation home.",
    detail:
      "Mounted into certshare's container only, as --federation-kubeconfig (docs/federation.md); name the home's namespace and this " +
      'cluster in --sidecar-flags (--federation-namespace, --federation-cluster). Never a Pod annotation: a Pod must not pick its home.',
  },
  {
    name: 'default-mode',
    group: 'injected sidecar',
    placeholder: 'rw|ro|auto',
    default: 'auto',
    help: 'Mode of injected sidecars without certshare.io/mode.',
  },
  {
    name: 'default-out-dir',
    group: 'injected sidecar',
    placeholder: 'DIR',
    default: '/certs',
    help: 'Certificate directory of injected sidecars without certshare.io/out-dir.',
  },
  {
    name: 'sidecar-resources',
    group: 'injected sidecar',
    placeholder: 'JSON',
    default: '',
    help: "Requests and limits of the injected certshare container, as a container's `resources` in JSON.",
    detail:
      'E.g. \'{"requests":{"cpu":"100m","memory":"160Mi"},"limits":{"memory":"256Mi"}}\' for groups of 500 domains ' +
      '(docs/performance.md). Default: those for one domain.',
  },
  {
    name: 'default-readiness-gate',
    group: 'injected sidecar',
    placeholder: 'TYPE|none',
    default: DEFAULT_READINESS_GATE,
    help: 'Readiness gate of injected Pods without certshare.io/readiness-gate.',
  },
  {
    name: 'default-socket-volume',
    group: 'injected sidecar',
    placeholder: 'VOLUME',
    default: 'tailscale-socket',
    help: "The Pod volume holding tailscaled's socket, without certshare.io/socket-volume.",
  },
  {
    name: 'tailscale-operator',
    group: 'injected sidecar',
    placeholder: 'grant|manual',
    default: 'grant',
    help: "Make the advertise agent of Pods that advertise Services tailscaled's operator, or not.",
    detail:
      `grant: the injector adds a passwd entry and TS_EXTRA_ARGS=--operator=certshare-advertise to tailscaled's container unless ` +
      "the Pod says certshare.io/tailscale-operator: manual; certshare's own uid never is (docs/tailscale-services.md).",
  },
  {
    name: 'proxygroup-namespaces',
    group: 'injected sidecar',
    placeholder: 'NS,...',
    default: '',
    help: "Namespaces of Tailscale's operator's ProxyGroups, whose Pods get the advertise agent.",
    detail:
      "A Pod there labelled as a ProxyGroup's, its tailscaled run from the operator's config file, gets the advertise agent, made " +
      "tailscaled's operator by a postStart hook in tailscaled's container; the agent only withdraws from the file's list " +
      '(docs/tailscale-services.md). Only namespaces where no tenant creates Pods.',
  },
  {
    name: 'drain-delay',
    group: 'shutdown',
    placeholder: 'DURATION',
    default: '5s',
    help: 'On SIGTERM: keep answering this long before the listener closes.',
    detail: 'Each kept-alive connection is closed after its response meanwhile; the endpoint is gone by then.',
  },
] as const satisfies readonly FlagSpec<(typeof INJECTOR_GROUPS)[number]>[];

/** The parsed values of `certshare injector`. */
type InjectorValues = FlagValues<typeof INJECTOR_FLAGS>;

/** `certshare injector --help` and its part of docs/configuration.md. */
export const INJECTOR_HELP: CommandHelp = {
  command: 'injector',
  summary:
    'A mutating admission webhook adding certshare as a native sidecar to Pods annotated certshare.io/inject: "true", ' +
    'serving TLS from its own CA, rotated with overlap.',
  flags: INJECTOR_FLAGS,
  groups: INJECTOR_GROUPS,
  example: "certshare injector --sidecar-image registry.example.com/certshare:0.1.0 --sidecar-flags='--issuance-budget=20/168h'",
};

/** What the injector runs with (src/injector/injector.ts startInjector). */
export interface InjectorConfig {
  listen: { host: string; port: number };
  metricsListen: { host: string; port: number };
  metricsTls: TlsChoice | undefined;
  service: string;
  serviceNamespace: string | undefined;
  extraDnsNames: string[];
  extraIps: string[];
  targets: Target[];
  caSecret: string;
  tlsSecret: string;
  policy: RotationPolicy;
  lease: string;
  leaseDurationMs: number;
  /** Names this replica in the Lease and in the Secrets it writes (POD_NAME in the Deployment). */
  identity: string;
  resyncMs: number;
  kubeTimeoutMs: number;
  drainDelayMs: number;
  defaults: InjectionDefaults;
  logLevel: string;
  logFormat: LogFormat;
}

/** The key of --sidecar-ca-configmap without one: kube-root-ca.crt's and cert-manager's name for a CA. */
const DEFAULT_CA_KEY = 'ca.crt';

function listenAddress(values: InjectorValues, name: 'listen' | 'metrics-listen'): { host: string; port: number } {
  try {
    return parseHostPort(values[name]);
  } catch (err) {
    throw badFlag(`--${name}`, (err as Error).message);
  }
}

export function injectorConfigFrom(values: InjectorValues, env: NodeJS.ProcessEnv): InjectorConfig {
  const extras = values['extra-san'] ?? [];
  const gate = values['default-readiness-gate'];
  const config: InjectorConfig = {
    listen: listenAddress(values, 'listen'),
    metricsListen: listenAddress(values, 'metrics-listen'),
    metricsTls: tlsChoice(values['metrics-tls'], 'metrics-tls'),
    service: values.service,
    serviceNamespace: values['service-namespace'] ?? env.POD_NAMESPACE,
    extraDnsNames: extras.filter((e) => isIP(e) === 0),
    extraIps: extras.filter((e) => isIP(e) !== 0),
    targets: values['inject-ca-into'].map(parseTarget),
    caSecret: values['ca-secret'],
    tlsSecret: values['tls-secret'],
    policy: {
      caLifetimeMs: duration(values, 'ca-lifetime'),
      caRotateBeforeMs: duration(values, 'ca-rotate-before'),
      leafLifetimeMs: duration(values, 'leaf-lifetime'),
      leafRenewBeforeMs: duration(values, 'leaf-renew-before'),
      propagationGraceMs: duration(values, 'propagation-grace'),
    },
    lease: values.lease,
    leaseDurationMs: duration(values, 'lease-duration'),
    identity: env.POD_NAME || `certshare-injector-${hostname()}-${process.pid}`,
    resyncMs: duration(values, 'resync'),
    kubeTimeoutMs: duration(values, 'kube-timeout'),
    drainDelayMs: duration(values, 'drain-delay'),
    defaults: {
      image: values['sidecar-image'],
      // Checked by validateInjectorConfig.
      mode: values['default-mode'] as ShareMode,
      outDir: values['default-out-dir'],
      readinessGate: gate === 'none' ? undefined : gate,
      socketVolume: values['default-socket-volume'],
      // Read by the injection as an admission reads them, at the injector's start (injector.ts checkDefaults).
      sidecarFlags: values['sidecar-flags'],
      imagePullPolicy: pullPolicy(values['sidecar-image-pull-policy']),
      caBundle: caBundleSource(values['sidecar-ca-configmap']),
      homeKubeconfigSecret: homeKubeconfigSecret(values['sidecar-home-kubeconfig-secret'], values['sidecar-flags']),
      resources: sidecarResources(values['sidecar-resources']),
      grantTailscaleOperator: grantsOperator(values['tailscale-operator']),
      proxyGroupNamespaces: namespaceList(values['proxygroup-namespaces']),
    },
    logLevel: values['log-level'],
    logFormat: logFormatFrom(values),
  };
  const broken = validateInjectorConfig(config);
  if (broken) throw badFlag(broken.flag, broken.rule);
  return config;
}

function namespaceList(value: string): string[] {
  const names = value
    .split(',')
    .map((n) => n.trim())
    .filter((n) => n !== '');
  const bad = names.find((n) => !/^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/.test(n));
  if (bad !== undefined) throw badFlag('--proxygroup-namespaces', `"${bad}" is not a namespace name`);
  return names;
}

function grantsOperator(value: string): boolean {
  if (value !== 'grant' && value !== 'manual') throw badFlag('--tailscale-operator', `must be grant or manual, got "${value}"`);
  return value === 'grant';
}

/**
 * Every rule of the injector's configuration that is not the syntax of one value, checked before anything
 * starts (as the daemon's validateConfig): the first broken rule, or undefined. Whether the defaults would
 * refuse every Pod that asks for certshare is the injection's to say: the injector checks it at its start.
 * @forTests
 */
export function validateInjectorConfig(c: InjectorConfig): { flag: string; rule: string } | undefined {
  const policyProblem = rotationPolicyProblem(c.policy);
  const resources = resourcesProblem(c.defaults.resources);
  const rules: ConfigRule[] = [
    [policyProblem !== undefined, '--ca-lifetime, --ca-rotate-before, --leaf-lifetime, --leaf-renew-before, --propagation-grace', () => policyProblem!],
    [!['rw', 'ro', 'auto'].includes(c.defaults.mode), '--default-mode', () => `must be rw, ro or auto, got "${c.defaults.mode}"`],
    [!isLogLevel(c.logLevel), '--log-level', () => `must be ${LOG_LEVELS.join(', ')}`],
    [!(c.resyncMs > 0 && c.kubeTimeoutMs > 0), '--resync, --kube-timeout', () => 'must be positive'],
    [c.leaseDurationMs < 1000, '--lease-duration', () => 'must be at least 1s (the Lease counts whole seconds)'],
    [resources !== undefined, '--sidecar-resources', () => resources!],
  ];
  return firstBroken(rules);
}

const QUANTITY_SUFFIX: Record<string, number> = {
  m: 1e-3,
  k: 1e3,
  M: 1e6,
  G: 1e9,
  T: 1e12,
  P: 1e15,
  E: 1e18,
  Ki: 2 ** 10,
  Mi: 2 ** 20,
  Gi: 2 ** 30,
  Ti: 2 ** 40,
  Pi: 2 ** 50,
  Ei: 2 ** 60,
};

/** A Kubernetes quantity (resource.Quantity's syntax, without exponents), in its base unit. */
function quantityValue(text: string): number | undefined {
  const m = /^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$/.exec(text);
  if (!m) return undefined;
  return Number(m[1]) * (QUANTITY_SUFFIX[m[2] ?? ''] ?? 1);
}

const SIDECAR_RESOURCE_NAMES = ['cpu', 'memory', 'ephemeral-storage'];

/** What the apiserver would refuse in every injected Pod: a name or quantity it does not know, a request above its limit. */
function resourcesProblem(resources: SidecarResources | undefined): string | undefined {
  if (resources === undefined) return undefined;
  for (const [key, entries] of Object.entries(resources)) {
    if (key !== 'requests' && key !== 'limits') return `"${key}" is neither requests nor limits`;
    if (entries === null || typeof entries !== 'object' || Array.isArray(entries)) return `${key} must map resource names to quantities`;
    for (const [name, quantity] of Object.entries(entries as Record<string, unknown>)) {
      if (!SIDECAR_RESOURCE_NAMES.includes(name)) return `${key}.${name}: certshare's container takes ${SIDECAR_RESOURCE_NAMES.join(', ')} only`;
      if (typeof quantity !== 'string' || quantityValue(quantity) === undefined)
        return `${key}.${name}: ${JSON.stringify(quantity)} is not a quantity (e.g. 100m, 128Mi)`;
    }
  }
  for (const name of SIDECAR_RESOURCE_NAMES) {
    const request = resources.requests?.[name];
    const limit = resources.limits?.[name];
    if (request !== undefined && limit !== undefined && quantityValue(String(request))! > quantityValue(String(limit))!)
      return `requests.${name} (${request}) must not be above limits.${name} (${limit})`;
  }
  return undefined;
}

/** --sidecar-resources: JSON, checked by validateInjectorConfig. */
function sidecarResources(text: string): SidecarResources | undefined {
  if (text.trim() === '') return undefined;
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (err) {
    throw badFlag('--sidecar-resources', `is not JSON: ${errorMessage(err)}`);
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed))
    throw badFlag('--sidecar-resources', 'must be a JSON object like {"requests":{...},"limits":{...}}');
  return parsed as SidecarResources;
}

function pullPolicy(text: string): string | undefined {
  if (text === '') return undefined;
  if (!['Always', 'IfNotPresent', 'Never'].includes(text)) {
    throw badFlag('--sidecar-image-pull-policy', `must be Always, IfNotPresent or Never, got "${text}"`);
  }
  return text;
}

/** --sidecar-ca-configmap NAME[:KEY]: checked at start, as the apiserver would check the volume's names. */
function caBundleSource(text: string): CaBundleSource | undefined {
  if (text === '') return undefined;
  const [configMap = '', key = DEFAULT_CA_KEY, ...rest] = text.split(':');
  if (!isObjectName(configMap) || rest.length > 0)
    throw badFlag('--sidecar-ca-configmap', `must be NAME or NAME:KEY with NAME a ConfigMap name (lower-case letters, digits, '-' and '.'), got "${text}"`);
  if (!isConfigMapKey(key))
    throw badFlag('--sidecar-ca-configmap', `"${key}" is not a ConfigMap key (letters, digits, '-', '_' and '.', not starting with "..")`);
  return { configMap, key };
}

/** --sidecar-home-kubeconfig-secret: a Secret name, with the home's namespace and this cluster's name in --sidecar-flags. */
function homeKubeconfigSecret(text: string, flags: string): string | undefined {
  if (text === '') return undefined;
  if (!isObjectName(text)) throw badFlag('--sidecar-home-kubeconfig-secret', `"${text}" is not a Secret name`);
  for (const needed of ['--federation-namespace', '--federation-cluster']) {
    if (!flags.split(/\s+/).some((f) => f === needed || f.startsWith(`${needed}=`)))
      throw badFlag('--sidecar-home-kubeconfig-secret', `needs ${needed} in --sidecar-flags`);
  }
  return text;
}
