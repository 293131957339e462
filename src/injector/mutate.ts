// The mutation: an AdmissionReview v1 for a Pod in, a JSON patch adding certshare as a native sidecar out.
// Pure (no I/O): the HTTPS server calls admissionReviewResponse() per request.
import type { V1Container, V1Pod, V1PodSpec, V1Volume } from '../kube/transport/client-node.ts';
import { envName, findFlag, parseFlags } from '../flags/flags.ts';
import { isLogLevel, LOG_LEVELS_TEXT } from '../logging/log-format.ts';
import { RUN_FLAGS, daemonConfigFrom } from '../config/run-options.ts';
import { DEFAULT_READINESS_GATE, type InjectionDefaults } from '../config/injection-defaults.ts';
import { normalizeDomain } from '../core/certificates/domain.ts';
import { parseDuration } from '../core/values/duration.ts';
import { CertshareError, errorMessage } from '../core/errors.ts';
import { randomBytes } from 'node:crypto';
import {
  ADVERTISE_DIR,
  HEALTH_PORT,
  SIDECAR_NAME,
  advertiseAgentContainer,
  advertiseExchangeMounts,
  advertiseExchangeVolumes,
  caBundleVolume,
  homeKubeconfigVolume,
  certshareContainer,
  serviceAccountTokenVolume,
  type SidecarSettings,
} from './sidecar.ts';
import { LEAVE_ROTATION_PATH, LEAVE_TOKEN_HEADER } from '../core/served/leave-rotation.ts';
import { parseReloadSignal } from '../delivery/reload-signal.ts';
import {
  ADVERTISE_OWNER_ANNOTATION,
  configFileTailscaled,
  optedInProxyGroup,
  withProxyGroupSocket,
  wantsOperatorGrant,
  withOperatorGrant,
  withoutAutoAdvertisement,
} from './tailscale-operator.ts';
import { proxyTlsPort } from './served-check-port.ts';

/** @forTests */
export const ANNOTATION = {
  inject: 'certshare.io/inject',
  domains: 'certshare.io/domains',
  mode: 'certshare.io/mode',
  outDir: 'certshare.io/out-dir',
  readinessGate: 'certshare.io/readiness-gate',
  socketVolume: 'certshare.io/socket-volume',
  flags: 'certshare.io/flags',
  reloadSignal: 'certshare.io/reload-signal',
  reloadPidfile: 'certshare.io/reload-pidfile',
  haproxySocket: 'certshare.io/haproxy-socket',
  servedCheck: 'certshare.io/served-check',
} as const;

/** `certshare run` flags the injector sets from the annotations above and its defaults: not for certshare.io/flags. */
const OWNED_FLAGS: Record<string, string> = {
  domain: ANNOTATION.domains,
  'serve-config': ANNOTATION.domains,
  mode: ANNOTATION.mode,
  'out-dir': ANNOTATION.outDir,
  'readiness-gate': ANNOTATION.readinessGate,
  store: 'the injector (kube)',
  localapi: ANNOTATION.socketVolume,
  listen: 'the injector (the probes use its port)',
  'reload-signal': ANNOTATION.reloadSignal,
  'reload-pidfile': ANNOTATION.reloadPidfile,
  'haproxy-socket': ANNOTATION.haproxySocket,
  'haproxy-crt-dir': `${ANNOTATION.haproxySocket} (<out-dir>/haproxy)`,
};

/**
 * The `certshare run` flags a Pod's author may set in certshare.io/flags: how this Pod leaves and joins
 * rotation, and how much it logs. Each is bounded. Everything else is the platform's: the issuance
 * budget and concurrency (the tailnet's Let's Encrypt quota is shared by every namespace using it), the
 * group, the Lease, the retry policy, the reload command (a program run in the container holding the
 * token), the TLS source and the watch scope come from the injector's --sidecar-flags, never from a Pod.
 */
const POD_FLAGS: Record<string, (value: string) => string | undefined> = {
  'drain-delay': (v) => withinDuration(v, 60_000),
  'shutdown-timeout': (v) => withinDuration(v, 600_000),
  'readiness-lead': (v) => withinDuration(v, 3_600_000),
  'routing-attempts': (v) => (/^\d+$/.test(v) && Number(v) >= 1 && Number(v) <= 100 ? undefined : 'a whole number from 1 to 100'),
  'routing-check': (v) => {
    try {
      const url = new URL(v);
      return (url.protocol === 'http:' || url.protocol === 'https:') && url.username === '' && url.password === ''
        ? undefined
        : 'an http:// or https:// URL without credentials';
    } catch {
      return 'an http:// or https:// URL without credentials';
    }
  },
  'log-level': (v) => (isLogLevel(v) ? undefined : LOG_LEVELS_TEXT),
  // The Pod's own proxy only: a loopback address, so a Pod cannot make certshare a TLS prober of other hosts.
  'served-check': (v) => (/^(?:127\.0\.0\.1|\[::1\]):\d{1,5}$/.test(v) && Number(v.split(':').pop()) > 0 ? undefined : '127.0.0.1:PORT or [::1]:PORT'),
  'served-check-interval': (v) => withinDuration(v, 3_600_000),
  'served-stale-after': (v) => withinDuration(v, 86_400_000),
  'advertise-services': (v) => (/^svc:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/.test(v) ? undefined : 'a Tailscale Service name, svc:<dns-label>'),
  'advertise-failover': (v) => withinDuration(v, 60_000),
};
/** The injector flag that sets the platform's `certshare run` flags for every sidecar. */
const SIDECAR_FLAGS_FLAG = '--sidecar-flags';

function withinDuration(value: string, maxMs: number): string | undefined {
  let ms: number;
  try {
    ms = parseDuration(value);
  } catch {
    return `a duration up to ${maxMs / 1000}s`;
  }
  return ms >= 0 && ms <= maxMs ? undefined : `a duration up to ${maxMs / 1000}s`;
}

const CERTS_VOLUME = 'certshare-certs';
const TOKEN_VOLUME = 'certshare-token';
const CA_VOLUME = 'certshare-ca';
const HOME_VOLUME = 'certshare-federation';
/** Volumes of certshare's container that only the platform names (--sidecar-ca-configmap, --sidecar-home-kubeconfig-secret). */
const PLATFORM_VOLUMES = [CA_VOLUME, HOME_VOLUME];
/** The ServiceAccount admission plugin's per-Pod token volume. */
const AUTO_TOKEN_VOLUME = /^kube-api-access-/;

interface JsonPatchOp {
  op: 'add';
  path: string;
  value: unknown;
}

type Injection = { kind: 'skip'; reason: string } | { kind: 'inject'; pod: V1Pod; patch: JsonPatchOp[] };

function bad(annotation: string, message: string): CertshareError {
  return new CertshareError('CERTSHARE_BAD_ANNOTATION', { annotation, problem: message });
}

// A condition type is a qualified name, like a label key: an optional DNS subdomain prefix and a name.
const QUALIFIED_NAME = /^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$/;
const ABSOLUTE_PATH = /^\/[^\0,\n]*$/;

/** `path` is `dir` or lies below it. */
function isAtOrBelow(path: string, dir: string): boolean {
  return `${path.replace(/\/+$/, '')}/`.startsWith(`${dir.replace(/\/+$/, '')}/`);
}

/** The sidecar's settings from the Pod's annotations over the defaults; CERTSHARE_BAD_ANNOTATION on a bad value. */
function settingsFromAnnotations(annotations: Record<string, string>, defaults: InjectionDefaults): Omit<SidecarSettings, 'certsVolume' | 'tokenVolume'> {
  const domainsText = annotations[ANNOTATION.domains];
  if (domainsText === undefined || domainsText.trim() === '') throw bad(ANNOTATION.domains, 'required: the comma-separated domains to keep certificates for');
  const domains = domainsText
    .split(',')
    .filter((d) => d.trim() !== '')
    .map((d) => {
      try {
        return normalizeDomain(d);
      } catch (err) {
        throw bad(ANNOTATION.domains, errorMessage(err));
      }
    });

  const mode = annotations[ANNOTATION.mode] ?? defaults.mode;
  if (mode !== 'rw' && mode !== 'ro' && mode !== 'auto') throw bad(ANNOTATION.mode, `"${mode}" is not rw, ro or auto`);

  const outDir = annotations[ANNOTATION.outDir] ?? defaults.outDir;
  if (!ABSOLUTE_PATH.test(outDir) || outDir.split('/').includes('..')) throw bad(ANNOTATION.outDir, `"${outDir}" is not an absolute path without ".."`);

  const gateText = annotations[ANNOTATION.readinessGate];
  const readinessGate = gateText === undefined ? defaults.readinessGate : gateText === 'none' ? undefined : gateText;
  if (readinessGate !== undefined && !QUALIFIED_NAME.test(readinessGate))
    throw bad(ANNOTATION.readinessGate, `"${readinessGate}" is not a condition type (e.g. ${DEFAULT_READINESS_GATE}), nor "none"`);
  // The admission policy certshare-own-pod-status admits certshare's status patches for one condition
  // type only (its `gate` variable, which the platform sets with the injector's --default-readiness-gate):
  // any other gate could never turn True, and the Pod would never be Ready, with no word why.
  if (readinessGate !== undefined && readinessGate !== defaults.readinessGate)
    throw bad(
      ANNOTATION.readinessGate,
      `"${readinessGate}": certshare may set only the condition ${defaults.readinessGate ?? '(none: the injector has no gate)'} ` +
        '(the admission policy certshare-own-pod-status admits that one; change both with the injector\'s --default-readiness-gate), or "none"',
    );

  const socketVolume = annotations[ANNOTATION.socketVolume] ?? defaults.socketVolume;
  // The platform's flags first, the Pod's (allowed ones only) after: a Pod may change its own drain delay.
  const platform = extraEnvFromFlags(defaults.sidecarFlags, SIDECAR_FLAGS_FLAG, 'platform');
  const pod = extraEnvFromFlags(annotations[ANNOTATION.flags], ANNOTATION.flags, 'pod');
  const extraEnv = [...platform.filter((e) => !pod.some((p) => p.name === e.name)), ...pod];
  const reloadSignal = reloadSignalFromAnnotations(annotations);
  const haproxySocket = annotations[ANNOTATION.haproxySocket];
  if (haproxySocket !== undefined) checkFilePath(ANNOTATION.haproxySocket, haproxySocket);
  return {
    image: defaults.image,
    imagePullPolicy: defaults.imagePullPolicy,
    domains,
    mode,
    outDir,
    readinessGate,
    socketVolume,
    extraEnv,
    resources: defaults.resources,
    reloadSignal,
    haproxySocket,
  };
}

function checkFilePath(annotation: string, path: string): void {
  if (!ABSOLUTE_PATH.test(path) || path.split('/').includes('..') || path.endsWith('/'))
    throw bad(annotation, `"${path}" is not an absolute file path without ".."`);
}

/**
 * certshare.io/reload-signal and certshare.io/reload-pidfile: the Pod asks certshare to reload its proxy
 * with a signal (nginx with a stock configuration: HUP), which takes a shared process namespace. The Pod's
 * own choice (it opens its own containers to each other, docs/proxies.md): the signal from the allow list
 * of --reload-signal, the pid file an absolute path in a volume the Pod mounts (checked in injectionFor).
 */
function reloadSignalFromAnnotations(annotations: Record<string, string>): { signal: string; pidFile: string } | undefined {
  const signalText = annotations[ANNOTATION.reloadSignal];
  const pidFile = annotations[ANNOTATION.reloadPidfile];
  if (signalText === undefined && pidFile === undefined) return undefined;
  if (signalText === undefined) throw bad(ANNOTATION.reloadPidfile, `needs ${ANNOTATION.reloadSignal} (e.g. HUP for nginx)`);
  if (pidFile === undefined) throw bad(ANNOTATION.reloadSignal, `needs ${ANNOTATION.reloadPidfile} (the proxy's pid file, in a volume of the Pod)`);
  let signal: string;
  try {
    signal = parseReloadSignal(signalText).slice(3);
  } catch (err) {
    throw bad(ANNOTATION.reloadSignal, errorMessage(err).replace('--reload-signal: ', ''));
  }
  checkFilePath(ANNOTATION.reloadPidfile, pidFile);
  return { signal, pidFile };
}

/**
 * `certshare run` flags, `--name=value` separated by white space (a YAML folded block reads well), given to
 * the sidecar as CERTSHARE_<NAME> in the order written. A repeated flag that may repeat becomes the
 * comma-separated list its variable takes. From a Pod (certshare.io/flags) only the POD_FLAGS, each within
 * its bound; from the platform (--sidecar-flags) any flag the injector does not set itself.
 */
function extraEnvFromFlags(text: string | undefined, source: string, from: 'pod' | 'platform'): { name: string; value: string }[] {
  const values = new Map<string, string[]>();
  for (const token of (text ?? '').split(/\s+/).filter(Boolean)) {
    const match = /^--([a-z][a-z0-9-]*)=(.+)$/.exec(token);
    if (!match) throw bad(source, `"${token}" is not --name=value (values without white space)`);
    const [, name, value] = match as unknown as [string, string, string];
    const spec = findFlag(RUN_FLAGS, name);
    if (!spec) throw bad(source, `--${name} is not a flag of "certshare run"`);
    const owner = OWNED_FLAGS[name];
    if (owner) throw bad(source, `--${name} is set by ${owner}, not here`);
    if (from === 'pod') {
      const check = POD_FLAGS[name];
      if (!check) throw bad(source, `--${name} belongs to the platform, not to a Pod: set it for every sidecar with the injector's ${SIDECAR_FLAGS_FLAG}`);
      const problem = check(value);
      if (problem) throw bad(source, `--${name}=${value}: must be ${problem}`);
    }
    if (values.has(name) && !spec.multiple) throw bad(source, `--${name} given twice`);
    values.set(name, [...(values.get(name) ?? []), value]);
  }
  if (from === 'pod' && (values.get('routing-check')?.length ?? 0) > 4) throw bad(source, '--routing-check: at most 4');
  if (from === 'pod' && (values.get('advertise-services')?.length ?? 0) > 4) throw bad(source, '--advertise-services: at most 4');
  return [...values].map(([name, list]) => ({ name: envName(name), value: list.join(',') }));
}

/** Throws what an admission would answer for these --sidecar-flags. */
export function checkSidecarFlags(text: string): void {
  extraEnvFromFlags(text, SIDECAR_FLAGS_FLAG, 'platform');
}

/**
 * Throws what an admission would answer for a Pod that asks for certshare and sets nothing else (a domain,
 * the socket volume, all the time it wants to stop): a default that cannot work (an out-dir over the CA
 * bundle's directory, say) is the platform's, and would refuse every such Pod.
 */
export function checkInjectionDefaults(defaults: InjectionDefaults): void {
  injectionFor(probePod(defaults), defaults);
}

function probePod(defaults: InjectionDefaults): V1Pod {
  return {
    metadata: { name: 'probe-0', annotations: { [ANNOTATION.inject]: 'true', [ANNOTATION.domains]: 'probe.example.com' } },
    spec: {
      containers: [{ name: 'proxy', image: 'proxy' }],
      volumes: [{ name: defaults.socketVolume, emptyDir: {} }],
      terminationGracePeriodSeconds: 86_400,
    },
  };
}

/**
 * The variables of certshare's container whose value comes from the Pod (its annotations and certshare.io/flags,
 * each bounded by this webhook), is random per Pod (the leave token) or is there only when the Pod advertises
 * (the advertise agent's exchange: certshare's uid has no right on tailscaled either way; or the Services it asked
 * for, where tailscaled's config file advertises). Every other variable is the platform's.
 * @forTests
 */
export const POD_CHOSEN_ENV: readonly string[] = [
  ...[
    'domain',
    'mode',
    'out-dir',
    'readiness-gate',
    'reload-signal',
    'reload-pidfile',
    'haproxy-crt-dir',
    'haproxy-socket',
    'leave-token',
    'advertise-agent',
    'advertise-left-to-file',
  ],
  ...Object.keys(POD_FLAGS),
].map(envName);

/**
 * The form of certshare's container as this injector writes it, as the data of the ConfigMap the admission policy
 * certshare-sidecar-as-injected reads (a policy cannot ask the webhook): `image`; `pod-env`, the comma-separated
 * POD_CHOSEN_ENV; `field.<NAME>` for each variable from the Pod's own fields (its downward-API path); `env.<NAME>`
 * for each of the platform's, with its value (--sidecar-flags, the store, the socket, the CA bundle...); and for the
 * platform's volumes (the CA bundle, the home's kubeconfig) `mount.<volume>`, its path, and `volume.<volume>`, its
 * source (`configMap/<name>` or `secret/<name>`).
 */
export function sidecarForm(defaults: InjectionDefaults): Record<string, string> {
  const injection = injectionFor(probePod(defaults), defaults);
  const sidecar = injection.kind === 'inject' ? injection.pod.spec?.initContainers?.find((c) => c.name === SIDECAR_NAME) : undefined;
  if (!sidecar)
    throw new CertshareError('CERTSHARE_BAD_FLAG', { flag: '--default-*, --sidecar-*', rule: 'add no certshare container to a Pod that asks for it' });
  // The command and its arguments, each a list of words without spaces (DIST_COMMAND): the policy splits them.
  const form: Record<string, string> = {
    image: defaults.image,
    command: (sidecar.command ?? []).join(' '),
    args: (sidecar.args ?? []).join(' '),
    'pod-env': POD_CHOSEN_ENV.join(','),
  };
  for (const e of sidecar.env ?? []) {
    if (e.valueFrom?.fieldRef) form[`field.${e.name}`] = e.valueFrom.fieldRef.fieldPath;
    else if (!POD_CHOSEN_ENV.includes(e.name)) form[`env.${e.name}`] = e.value ?? '';
  }
  // The platform's own volumes (what the sidecar trusts, where its home is): where mounted, and from what.
  for (const volume of injection.kind === 'inject' ? (injection.pod.spec?.volumes ?? []) : []) {
    const mount = sidecar.volumeMounts?.find((m) => m.name === volume.name);
    if (!PLATFORM_VOLUMES.includes(volume.name) || !mount) continue;
    form[`mount.${volume.name}`] = mount.mountPath;
    form[`volume.${volume.name}`] = volume.configMap ? `configMap/${volume.configMap.name}` : `secret/${volume.secret?.secretName ?? ''}`;
  }
  return form;
}

/** Placeholders for the downward-API variables, to check a sidecar's settings as it will start with them. */
const DOWNWARD_EXAMPLE: Record<string, string> = { 'metadata.name': 'pod-0', 'metadata.namespace': 'default', 'status.podIPs': '10.0.0.1' };

/**
 * The sidecar's environment passes the daemon's own validation (value syntax and cross-field rules), so a
 * Pod that would crash-loop on a bad setting is refused at admission with the daemon's message instead.
 */
function checkSidecarEnv(container: V1Container): { drainDelayMs: number; shutdownTimeoutMs: number; advertiseFailoverMs: number } {
  const env: NodeJS.ProcessEnv = {};
  for (const e of container.env ?? []) env[e.name] = e.value ?? DOWNWARD_EXAMPLE[e.valueFrom?.fieldRef?.fieldPath ?? ''] ?? '';
  try {
    return daemonConfigFrom(parseFlags(RUN_FLAGS, [], env), env);
  } catch (err) {
    throw bad(ANNOTATION.flags, `the sidecar would not start: ${errorMessage(err)}`);
  }
}

/**
 * The proxy keeps serving for the drain delay once its Pod is being deleted: a `preStop` sleep (the
 * kubelet's own, no binary needed in the image) for each container that has no preStop of its own.
 * Deletion takes the Pod out of its EndpointSlices at once, but kube-proxy and load balancers follow only
 * after a moment, and the kubelet stops the containers at the same moment: on a real cluster (test/cluster/e2e)
 * nginx without the hook had exited within the second of the deletion, while the EndpointSlice changed
 * 20 ms after the deletion and kube-proxy's rules only after that. certshare itself, a native sidecar,
 * is stopped only after these containers.
 */
function withDrain(container: V1Container, drainDelayMs: number, leaveToken: string | undefined): V1Container {
  if (container.lifecycle?.preStop) return container;
  // A Pod that advertises Tailscale Services: the hook asks certshare to leave rotation (withdraw the Services,
  // wait the failover, then the drain delay) while tailscaled still runs; certshare, a native sidecar, would
  // hear of the stop only after tailscaled exited.
  if (leaveToken) {
    const httpGet = { path: LEAVE_ROTATION_PATH, port: HEALTH_PORT, httpHeaders: [{ name: LEAVE_TOKEN_HEADER, value: leaveToken }] };
    return { ...container, lifecycle: { ...container.lifecycle, preStop: { httpGet } } };
  }
  if (drainDelayMs <= 0) return container;
  return { ...container, lifecycle: { ...container.lifecycle, preStop: { sleep: { seconds: Math.ceil(drainDelayMs / 1000) } } } };
}

/** The variable holding the token of GET /leave-rotation (--leave-token). */
const LEAVE_TOKEN_ENV = envName('leave-token');

/**
 * A sidecar that advertises Tailscale Services gets a token for its preStop call (random per Pod: only a
 * reader of the Pod's spec, who may delete the Pod anyway, can make it leave rotation); `kept` is the one a
 * Pod injected before already holds.
 */
function withLeaveToken(sidecar: V1Container, kept: string | undefined): V1Container {
  const env = sidecar.env ?? [];
  if (!env.some((e) => e.name === envName('advertise-services'))) return sidecar;
  return { ...sidecar, env: [...env, { name: LEAVE_TOKEN_ENV, value: kept ?? randomBytes(24).toString('base64url') }] };
}

function envValue(container: V1Container, name: string): string | undefined {
  return container.env?.find((e) => e.name === name)?.value;
}

/** The certs volume: one the proxy already mounts at the out-dir, or the injector's own. */
function certsVolumeOf(spec: V1PodSpec, outDir: string): string | undefined {
  return (spec.containers ?? []).flatMap((c) => c.volumeMounts ?? []).find((m) => m.mountPath === outDir)?.name;
}

/** The certshare container the injector adds to this Pod (which, injected, mounts its certs volume in every container). */
function expectedSidecar(
  spec: V1PodSpec,
  settings: Omit<SidecarSettings, 'certsVolume' | 'tokenVolume'>,
  defaults: InjectionDefaults,
  keptLeaveToken?: string,
): V1Container {
  const certsVolume = certsVolumeOf(spec, settings.outDir) ?? CERTS_VOLUME;
  const proxyMounts = proxyMountsOf(spec, settings).map(({ name, mountPath }) => ({ name, mountPath }));
  const sidecar = certshareContainer({
    ...settings,
    certsVolume,
    tokenVolume: TOKEN_VOLUME,
    caVolume: defaults.caBundle ? CA_VOLUME : undefined,
    homeVolume: defaults.homeKubeconfigSecret ? HOME_VOLUME : undefined,
    proxyMounts,
  });
  return withFittedStop(withAdvertiseExchange(withLeaveToken(sidecar, keptLeaveToken)), spec);
}

/** The variable holding --shutdown-timeout. */
const SHUTDOWN_TIMEOUT_ENV = envName('shutdown-timeout');
/**
 * The shortest stop the injector fits certshare into: the stop keeps 3 s of it for the Kubernetes side of leaving
 * rotation (AFTER_FAILOVER_RESERVE_MS, http/rotation-exit.ts) and 1 s for the exit (STOP_RESERVE_MS,
 * kube/kube-backend.ts); 5 s leaves the readiness patch and the hand-over (the Secrets checked and put back, the
 * Lease released) 2 s each at the least, a few apiserver requests each.
 */
const MIN_FITTED_STOP_MS = 5000;
/** Where the injector says it fitted certshare's stop into the grace period, and from what. @forTests */
export const STOP_FITTED_ANNOTATION = 'certshare.io/stop-fitted';

/**
 * A sidecar whose --shutdown-timeout neither the Pod nor the platform gave: certshare's stop fitted into the grace
 * period after the preStop part (stopPlan), written as the variable, so the daemon and the stored Pod agree. The
 * default is kept where it fits; a stop that would be shorter than MIN_FITTED_STOP_MS is not fitted (checkStop
 * refuses the Pod). Deterministic from the Pod: a Pod injected before, or its stored copy, expects the same.
 */
function withFittedStop(sidecar: V1Container, spec: V1PodSpec): V1Container {
  if (envValue(sidecar, SHUTDOWN_TIMEOUT_ENV) !== undefined) return sidecar;
  let stop: ReturnType<typeof checkSidecarEnv>;
  try {
    stop = checkSidecarEnv(sidecar);
  } catch {
    return sidecar; // checkStop refuses it with the daemon's message.
  }
  const { graceSeconds, preStopSeconds } = stopPlan(spec, stop, envValue(sidecar, LEAVE_TOKEN_ENV) !== undefined);
  const leftMs = (graceSeconds - preStopSeconds) * 1000;
  if (leftMs >= stop.shutdownTimeoutMs || leftMs < MIN_FITTED_STOP_MS) return sidecar;
  return { ...sidecar, env: [...(sidecar.env ?? []), { name: SHUTDOWN_TIMEOUT_ENV, value: `${leftMs / 1000}s` }] };
}

/**
 * A sidecar that advertises Tailscale Services does it through the advertise agent (its own container, the
 * operator of tailscaled: src/served/advertise-agent.ts), never by editing the prefs itself.
 */
function withAdvertiseExchange(sidecar: V1Container): V1Container {
  if (envValue(sidecar, envName('advertise-services')) === undefined) return sidecar;
  return {
    ...sidecar,
    env: [...(sidecar.env ?? []), { name: envName('advertise-agent'), value: ADVERTISE_DIR }],
    volumeMounts: [...(sidecar.volumeMounts ?? []), ...advertiseExchangeMounts('request')],
  };
}

/**
 * The proxy's pid file and runtime API socket, in volumes of its own that certshare mounts too (one mount
 * per volume path; the out-dir's volume is mounted already), each with the annotation that asked for it.
 */
function proxyMountsOf(
  spec: V1PodSpec,
  settings: Omit<SidecarSettings, 'certsVolume' | 'tokenVolume'>,
): Array<{ name: string; mountPath: string; annotation: string }> {
  const proxyFiles: Array<[string, string | undefined]> = [
    [ANNOTATION.reloadPidfile, settings.reloadSignal?.pidFile],
    [ANNOTATION.haproxySocket, settings.haproxySocket],
  ];
  return proxyFiles
    .flatMap(([annotation, path]) => (path === undefined ? [] : [proxyFileVolume(spec, annotation, path)]))
    .filter((m, i, all) => m.mountPath !== settings.outDir && all.findIndex((o) => o.mountPath === m.mountPath) === i);
}

/**
 * Fields the apiserver fills in on a container it stores (its defaults), which the injector's own sidecar
 * does not write: present in a Pod it injected once the apiserver has decoded it again.
 */
const APISERVER_DEFAULTS: Record<string, unknown> = {
  terminationMessagePath: '/dev/termination-log',
  terminationMessagePolicy: 'File',
  timeoutSeconds: 1,
  successThreshold: 1,
  scheme: 'HTTP',
  protocol: 'TCP',
  apiVersion: 'v1',
};

/** Where `actual` differs from `expected` beyond the apiserver's defaults (the first difference's path), or undefined. */
function differenceAt(actual: unknown, expected: unknown, path: string): string | undefined {
  if (Array.isArray(expected)) {
    if (!Array.isArray(actual) || actual.length !== expected.length) return path;
    for (const [i, item] of expected.entries()) {
      const found = differenceAt(actual[i], item, `${path}[${i}]`);
      if (found) return found;
    }
    return undefined;
  }
  if (expected !== null && typeof expected === 'object') {
    if (actual === null || typeof actual !== 'object' || Array.isArray(actual)) return path;
    const want = expected as Record<string, unknown>;
    const got = actual as Record<string, unknown>;
    for (const key of new Set([...Object.keys(want), ...Object.keys(got)])) {
      const at = path === '' ? key : `${path}.${key}`;
      if (!(key in want)) {
        // The pull policy follows the image's tag when the platform set none.
        const defaulted = key in APISERVER_DEFAULTS ? got[key] === APISERVER_DEFAULTS[key] : key === 'imagePullPolicy' && path === '';
        if (!defaulted) return at;
        continue;
      }
      const found = differenceAt(got[key], want[key], at);
      if (found) return found;
    }
    return undefined;
  }
  return actual === expected ? undefined : path;
}

function sidecarDifference(actual: V1Container, expected: V1Container): string | undefined {
  const at = differenceAt(actual, expected, '');
  return at === undefined ? undefined : `its ${at === '' ? 'shape' : at} is not the injector's`;
}

/** The apiserver's terminationGracePeriodSeconds for a Pod that sets none. */
const DEFAULT_GRACE_SECONDS = 30;

/** The grace period and the part of it the proxy's preStop takes (stopPlan). */
interface StopPlan {
  graceSeconds: number;
  preStopSeconds: number;
  /** The flag the preStop part comes from, as the messages name it. */
  preStopPart: '--drain-delay' | '--advertise-failover';
}

/**
 * A Pod's stop, one after the other within terminationGracePeriodSeconds, when the kubelet kills what still
 * runs: the proxy's preStop sleep (--drain-delay, in whole seconds), or, advertising (a leave token), its preStop
 * call, which lasts the Services' failover wait or the drain if longer; the proxy's exit; then certshare's own
 * stop, bounded by --shutdown-timeout (leaving rotation, handing over the Lease, putting back what an edit
 * took from its Secrets).
 */
function stopPlan(spec: V1PodSpec, stop: { drainDelayMs: number; advertiseFailoverMs: number }, advertising: boolean): StopPlan {
  const graceSeconds = spec.terminationGracePeriodSeconds ?? DEFAULT_GRACE_SECONDS;
  if (advertising && stop.advertiseFailoverMs > stop.drainDelayMs)
    return { graceSeconds, preStopSeconds: Math.ceil(stop.advertiseFailoverMs / 1000), preStopPart: '--advertise-failover' };
  return { graceSeconds, preStopSeconds: Math.ceil(stop.drainDelayMs / 1000), preStopPart: '--drain-delay' };
}

/** Both bounds of stopPlan's stop must fit the grace period, or a slow stop ends in SIGKILL. */
function stopProblem(plan: StopPlan, shutdownTimeoutMs: number): string | undefined {
  if (plan.preStopSeconds * 1000 + shutdownTimeoutMs <= plan.graceSeconds * 1000) return undefined;
  const preStop =
    plan.preStopPart === '--advertise-failover'
      ? `--advertise-failover (the wait of the proxy's preStop call to certshare, ${plan.preStopSeconds}s)`
      : `--drain-delay (the proxy's preStop sleep, ${plan.preStopSeconds}s)`;
  return (
    `${preStop} plus --shutdown-timeout (certshare's own stop, ${shutdownTimeoutMs / 1000}s) ` +
    `must fit the Pod's terminationGracePeriodSeconds (${plan.graceSeconds}): the kubelet kills what still runs then`
  );
}

/**
 * What to do with a Pod: leave it (not asked for, or already injected: the webhook may be called again
 * under reinvocationPolicy IfNeeded), or the injected Pod and the patch that makes it.
 * Throws CERTSHARE_BAD_ANNOTATION when the Pod asks for injection with settings that cannot work.
 * @forTests
 */
export function injectionFor(pod: V1Pod, defaults: InjectionDefaults, namespace = pod.metadata?.namespace): Injection {
  const annotations = pod.metadata?.annotations ?? {};
  const inject = annotations[ANNOTATION.inject];
  if (inject === undefined || inject === 'false') return { kind: 'skip', reason: `no ${ANNOTATION.inject}: "true"` };
  if (inject !== 'true') throw bad(ANNOTATION.inject, `"${inject}" is neither "true" nor "false"`);
  if (!pod.spec) throw bad(ANNOTATION.inject, 'the Pod has no spec');
  const spec = withProxyGroupSocket(pod.spec, pod.metadata?.labels ?? {}, annotations[ANNOTATION.socketVolume] ?? defaults.socketVolume, namespace, defaults);
  const initContainers = spec.initContainers ?? [];
  const present = [...initContainers, ...(spec.containers ?? [])].find((c) => c.name === SIDECAR_NAME);
  const asked = withServedCheck(settingsFromAnnotations(annotations, defaults), annotations, spec, present);
  const configFile = configFileTailscaled(spec, asked.socketVolume);
  // An opted-in ProxyGroup Pod keeps its advertisement: the agent, made operator by a hook, only withdraws there.
  const proxyGroup = optedInProxyGroup(namespace, pod.metadata?.labels ?? {}, configFile, defaults.proxyGroupNamespaces ?? []);
  const settings = proxyGroup ? asked : withoutAdvertising(asked, configFile);
  if (present) return alreadyThere(present, spec, settings, defaults);
  checkPodShape(spec, settings);

  // The proxy reads the certificates where certshare writes them: reuse a volume already mounted at
  // the out-dir, or add one and mount it read-only into every container.
  const mountedAtOutDir = certsVolumeOf(spec, settings.outDir);
  const certsVolume = mountedAtOutDir ?? CERTS_VOLUME;
  const addedVolumes: V1Volume[] = mountedAtOutDir ? [] : [{ name: CERTS_VOLUME, emptyDir: { medium: 'Memory', sizeLimit: '16Mi' } }];

  // The token only in certshare's container. A Pod that says nothing gets automount off, and the
  // ServiceAccount plugin's volume (added before webhooks run) is taken back out; a Pod that asks for
  // automount explicitly keeps it.
  const explicitAutomount = spec.automountServiceAccountToken === true;
  const dropAutoToken = !explicitAutomount;
  const volumes = spec.volumes ?? [];
  const keptVolumes = dropAutoToken ? volumes.filter((v) => !AUTO_TOKEN_VOLUME.test(v.name)) : volumes;
  const withoutAutoMounts = (c: V1Container): V1Container =>
    dropAutoToken && c.volumeMounts ? { ...c, volumeMounts: c.volumeMounts.filter((m) => !AUTO_TOKEN_VOLUME.test(m.name)) } : c;
  addedVolumes.push(serviceAccountTokenVolume(TOKEN_VOLUME));
  // Mounted into certshare's container only, like the token: no other container trusts more than before.
  if (defaults.caBundle) addedVolumes.push(caBundleVolume(CA_VOLUME, defaults.caBundle));
  if (defaults.homeKubeconfigSecret) addedVolumes.push(homeKubeconfigVolume(HOME_VOLUME, defaults.homeKubeconfigSecret));

  const sidecar = expectedSidecar(spec, settings, defaults);
  checkMounts(spec, settings, defaults, certsVolume);
  const { drainDelayMs, leaveToken, fitted } = checkStop(spec, sidecar, settings);
  const advertised = envValue(sidecar, envName('advertise-services'));
  const proxyContainers = (spec.containers ?? []).map((c) => {
    const cleaned = withDrain(withoutAutoMounts(c), drainDelayMs, leaveToken);
    if (mountedAtOutDir) return cleaned;
    return { ...cleaned, volumeMounts: [...(cleaned.volumeMounts ?? []), { name: CERTS_VOLUME, mountPath: settings.outDir, readOnly: true }] };
  });
  // The agent gets the proxy's preStop call too: it stays (and tailscaled with it) until certshare withdrew.
  const agent = advertised === undefined ? [] : [withDrain(advertiseAgentContainer({ ...settings, services: advertised }), drainDelayMs, leaveToken)];
  if (advertised !== undefined) addedVolumes.push(...advertiseExchangeVolumes());
  const containers = [...proxyContainers, ...agent];
  const readinessGates = spec.readinessGates ?? [];
  const gates =
    settings.readinessGate && !readinessGates.some((g) => g.conditionType === settings.readinessGate)
      ? [...readinessGates, { conditionType: settings.readinessGate }]
      : readinessGates;

  const injected = {
    ...spec,
    // A projected token needs a named ServiceAccount; the ServiceAccount admission plugin (which runs
    // before webhooks) names "default" where the Pod names none, and so does this where it did not run.
    serviceAccountName: spec.serviceAccountName ?? spec.serviceAccount ?? 'default',
    automountServiceAccountToken: !!explicitAutomount,
    initContainers: [...initContainers.map(withoutAutoMounts), sidecar],
    containers,
    volumes: [...keptVolumes, ...addedVolumes],
    readinessGates: gates,
    // A signal reaches the proxy only when the Pod's containers share one process namespace.
    ...(settings.reloadSignal ? { shareProcessNamespace: true } : {}),
  };
  const granted = wantsOperatorGrant(annotations, advertised !== undefined, defaults.grantTailscaleOperator ?? true)
    ? withOperatorGrant(injected, settings.socketVolume, proxyGroup)
    : { spec: injected, annotations: {} };
  const added: Record<string, string> = { ...granted.annotations, ...(fitted ? { [STOP_FITTED_ANNOTATION]: fitted } : {}) };
  if (configFile)
    added[ADVERTISE_OWNER_ANNOTATION] =
      `config-file: container ${configFile} sets TS_EXPERIMENTAL_VERSIONED_CONFIG_DIR` +
      (proxyGroup && advertised !== undefined ? '; an opted-in ProxyGroup Pod: the advertise agent only withdraws' : '');
  // certshare alone advertises: containerboot's own advertisement of its serve config's Services off.
  return podInjection(pod, advertised === undefined ? granted.spec : withoutAutoAdvertisement(granted.spec, settings.socketVolume), added);
}

/** The injection: the Pod with its new spec and the annotations the injector adds, and the patch that makes it. */
function podInjection(pod: V1Pod, spec: V1PodSpec, added: Record<string, string>): Injection {
  const annotationPatch = Object.entries(added).map(
    ([key, value]): JsonPatchOp => ({ op: 'add', path: `/metadata/annotations/${key.replaceAll('~', '~0').replaceAll('/', '~1')}`, value }),
  );
  const annotations = Object.keys(added).length === 0 ? {} : { metadata: { ...pod.metadata, annotations: { ...pod.metadata?.annotations, ...added } } };
  return { kind: 'inject', pod: { ...pod, ...annotations, spec }, patch: [...specPatch(pod.spec!, spec), ...annotationPatch] };
}

type Settings = ReturnType<typeof settingsFromAnnotations>;

/**
 * A Pod whose tailscaled runs from a config file (configFileTailscaled: the container's name) gets no
 * advertisement: no --advertise-services for certshare, so no agent, operator right or leave token either; the
 * file's owner advertises. certshare still checks what the proxy serves and keeps the readiness gate.
 */
function withoutAdvertising(settings: Settings, configFile: string | undefined): Settings {
  if (configFile === undefined) return settings;
  const advertising = new Set([envName('advertise-services'), envName('advertise-failover'), envName('advertise-bootstrap')]);
  const extraEnv = settings.extraEnv ?? [];
  const asked = extraEnv.find((e) => e.name === envName('advertise-services'));
  // What the Pod asked for, so that certshare says once whose the advertisement is (its uid cannot ask tailscaled).
  const leftToFile = asked?.value ? [{ name: envName('advertise-left-to-file'), value: asked.value }] : [];
  return { ...settings, extraEnv: [...extraEnv.filter((e) => !advertising.has(e.name)), ...leftToFile] };
}

/** The variable holding --served-check. */
const SERVED_CHECK_ENV = envName('served-check');
/** What the injector writes for the proxy's port: loopback only, like a Pod's own --served-check. */
const FILLED_SERVED_CHECK = /^127\.0\.0\.1:(\d{1,5})$/;

/**
 * certshare.io/served-check: `auto` (the default) fills --served-check with 127.0.0.1:<port> of the proxy's
 * TLS port (proxyTlsPort) when neither certshare.io/flags nor the platform's --sidecar-flags set it; `off`
 * fills nothing. On a Pod injected before (`present`), the value filled then is kept, checked, rather than
 * looked for again: a webhook after this one may have added a container since.
 */
function withServedCheck(settings: Settings, annotations: Record<string, string>, spec: V1PodSpec, present: V1Container | undefined): Settings {
  const choice = annotations[ANNOTATION.servedCheck] ?? 'auto';
  if (choice !== 'auto' && choice !== 'off') throw bad(ANNOTATION.servedCheck, `"${choice}" is neither "auto" nor "off"`);
  const podSetsIt = (annotations[ANNOTATION.flags] ?? '').split(/\s+/).some((token) => token.startsWith('--served-check='));
  if (choice === 'off' && podSetsIt) throw bad(ANNOTATION.servedCheck, `"off", while ${ANNOTATION.flags} sets --served-check: keep one of the two`);
  const extraEnv = settings.extraEnv ?? [];
  if (choice === 'off' || extraEnv.some((e) => e.name === SERVED_CHECK_ENV)) return settings;
  const port = present ? filledPort(present) : proxyTlsPort(spec, settings.socketVolume, SIDECAR_NAME);
  if (port === undefined) return settings;
  return { ...settings, extraEnv: [...extraEnv, { name: SERVED_CHECK_ENV, value: `127.0.0.1:${port}` }] };
}

/** The port an injected sidecar's filled --served-check names, if it is one the injector could have written. */
function filledPort(sidecar: V1Container): number | undefined {
  const match = FILLED_SERVED_CHECK.exec(envValue(sidecar, SERVED_CHECK_ENV) ?? '');
  const port = Number(match?.[1]);
  return port >= 1 && port <= 65_535 ? port : undefined;
}

/**
 * Called again (reinvocationPolicy IfNeeded) on a Pod it injected: left as it is. A container of that name
 * that is not the one it would add is the Pod's own: under certshare's accounts it would get their token
 * with any image, command or flags (the admission policy certshare-pods-injected admits their token only in
 * a container named certshare), so it is refused, not left alone.
 */
function alreadyThere(present: V1Container, spec: V1PodSpec, settings: Settings, defaults: InjectionDefaults): Injection {
  const difference = sidecarDifference(present, expectedSidecar(spec, settings, defaults, envValue(present, LEAVE_TOKEN_ENV)));
  if (difference)
    throw bad(
      ANNOTATION.inject,
      `the Pod brings its own container named ${SIDECAR_NAME} (${difference}): the injector adds certshare itself; remove that container`,
    );
  return { kind: 'skip', reason: `the container ${SIDECAR_NAME} the injector adds is already there` };
}

/** What the Pod must have for the sidecar to work: tailscaled's socket volume, and a way for the proxy to be reloaded. */
function checkPodShape(spec: V1PodSpec, settings: Settings): void {
  if (settings.reloadSignal && spec.shareProcessNamespace === false)
    throw bad(ANNOTATION.reloadSignal, 'the Pod sets shareProcessNamespace: false, and a signal reaches the proxy only through a shared process namespace');
  if (!(spec.volumes ?? []).some((v) => v.name === settings.socketVolume)) {
    throw bad(ANNOTATION.socketVolume, `the Pod has no volume "${settings.socketVolume}" for tailscaled's socket (name it with ${ANNOTATION.socketVolume})`);
  }
  // A proxy that reads its certificate at start only waits for certshare's first one (a startup probe on the
  // sidecar), and so does every regular container: tailscaled among them would never give it.
  const waits = settings.reloadSignal ? ANNOTATION.reloadSignal : settings.haproxySocket ? ANNOTATION.haproxySocket : undefined;
  const tailscaled = (spec.containers ?? []).find((c) => c.volumeMounts?.some((m) => m.name === settings.socketVolume));
  if (waits && tailscaled) {
    throw bad(
      waits,
      `the proxy waits for certshare's first certificate, and so would container "${tailscaled.name}", which mounts tailscaled's socket volume ` +
        `"${settings.socketVolume}": run it as a native sidecar (an init container with restartPolicy: Always), which starts before certshare`,
    );
  }
}

/**
 * The out-dir is certshare's to write, and the proxy's files are mounted into its container: none of them one
 * of the directories its container mounts for itself, nor above or below one (the apiserver would refuse
 * the same path twice with a less helpful message).
 */
function checkMounts(spec: V1PodSpec, settings: Settings, defaults: InjectionDefaults, certsVolume: string): void {
  const own = {
    ...settings,
    certsVolume,
    tokenVolume: TOKEN_VOLUME,
    caVolume: defaults.caBundle ? CA_VOLUME : undefined,
    homeVolume: defaults.homeKubeconfigSecret ? HOME_VOLUME : undefined,
  };
  const mounts = certshareContainer(own).volumeMounts ?? [];
  const outDirMount = mounts.findIndex((m) => m.mountPath === settings.outDir && m.name === certsVolume);
  const ownMounts = mounts.filter((_, i) => i !== outDirMount);
  for (const proxyMount of proxyMountsOf(spec, settings)) {
    const overlap = ownMounts.find((m) => isAtOrBelow(m.mountPath, proxyMount.mountPath) || isAtOrBelow(proxyMount.mountPath, m.mountPath));
    if (overlap)
      throw bad(
        proxyMount.annotation,
        `its volume's mount ${proxyMount.mountPath} overlaps ${overlap.mountPath}, which certshare's container mounts for itself`,
      );
  }
  const overlapping = ownMounts.find((m) => isAtOrBelow(m.mountPath, settings.outDir) || isAtOrBelow(settings.outDir, m.mountPath));
  if (overlapping) throw bad(ANNOTATION.outDir, `"${settings.outDir}" overlaps ${overlapping.mountPath}, which certshare's container mounts for itself`);
}

/**
 * The sidecar's settings pass the daemon's validation and its stop fits the grace period (stopProblem); `fitted`:
 * the injector chose its --shutdown-timeout (withFittedStop), said in the Pod's STOP_FITTED_ANNOTATION.
 */
function checkStop(
  spec: V1PodSpec,
  sidecar: V1Container,
  settings: Settings,
): { drainDelayMs: number; leaveToken: string | undefined; fitted: string | undefined } {
  const stop = checkSidecarEnv(sidecar);
  const leaveToken = envValue(sidecar, LEAVE_TOKEN_ENV);
  const plan = stopPlan(spec, stop, leaveToken !== undefined);
  const given = (settings.extraEnv ?? []).some((e) => e.name === SHUTDOWN_TIMEOUT_ENV);
  const problem = stopProblem(plan, stop.shutdownTimeoutMs);
  if (problem)
    throw bad(
      ANNOTATION.flags,
      given
        ? problem
        : `${problem}; certshare's stop, its --shutdown-timeout unset, is fitted into what the preStop part leaves down to ` +
            `${MIN_FITTED_STOP_MS / 1000}s only (leaving rotation, putting back its Secrets, handing over the Lease)`,
    );
  const fitted = given ? undefined : envValue(sidecar, SHUTDOWN_TIMEOUT_ENV);
  const said =
    fitted &&
    `--shutdown-timeout=${fitted}: terminationGracePeriodSeconds ${plan.graceSeconds} less ${plan.preStopSeconds}s of ${plan.preStopPart}, ` +
      `the default ${findFlag(RUN_FLAGS, 'shutdown-timeout')?.default} not fitting`;
  return { drainDelayMs: stop.drainDelayMs, leaveToken, fitted: said || undefined };
}

/** "add" on an existing member replaces it (RFC 6902): whole fields, computed from the Pod as seen. */
function specPatch(spec: V1PodSpec, next: V1PodSpec): JsonPatchOp[] {
  const patchFields = [
    'serviceAccountName',
    'automountServiceAccountToken',
    'initContainers',
    'containers',
    'volumes',
    'readinessGates',
    'shareProcessNamespace',
  ] as const;
  return patchFields
    .filter(
      (field) =>
        JSON.stringify(next[field]) !== JSON.stringify(spec[field]) &&
        !(spec[field] === undefined && Array.isArray(next[field]) && (next[field] as unknown[]).length === 0),
    )
    .map((field) => ({ op: 'add', path: `/spec/${field}`, value: next[field] }));
}

/**
 * The volume holding one of the proxy's files (its pid file, its runtime API socket), as a container of the
 * Pod mounts it (the deepest mount above the file): certshare mounts it read-only at the same path, so the
 * path means the same file in both.
 */
function proxyFileVolume(spec: NonNullable<V1Pod['spec']>, annotation: string, path: string): { name: string; mountPath: string; annotation: string } {
  const mounts = (spec.containers ?? []).flatMap((c) => c.volumeMounts ?? []).filter((m) => isAtOrBelow(path, m.mountPath) && path !== m.mountPath);
  const deepest = mounts.sort((a, b) => b.mountPath.length - a.mountPath.length)[0];
  if (!deepest) {
    throw bad(annotation, `"${path}" lies in no volume a container of the Pod mounts: put it in a volume the proxy shares (e.g. an emptyDir at /run/nginx)`);
  }
  return { name: deepest.name, mountPath: deepest.mountPath, annotation };
}

interface AdmissionReviewIn {
  apiVersion?: string;
  kind?: string;
  request?: { uid?: string; kind?: { kind?: string }; operation?: string; namespace?: string; object?: V1Pod };
}

/** The AdmissionReview answer; throws (the server answers HTTP 400) only when there is no request to answer. */
export function admissionReviewResponse(body: unknown, defaults: InjectionDefaults): object {
  const review = body as AdmissionReviewIn;
  const uid = review?.request?.uid;
  if (typeof uid !== 'string' || uid === '') throw new CertshareError('CERTSHARE_BAD_REQUEST', { why: 'no request.uid' });
  const answer = (response: object) => ({ apiVersion: review.apiVersion ?? 'admission.k8s.io/v1', kind: 'AdmissionReview', response: { uid, ...response } });
  const object = review.request?.object;
  if (review.request?.kind?.kind !== 'Pod' || !object) return answer({ allowed: true });
  try {
    const injection = injectionFor(object, defaults, review.request?.namespace ?? object.metadata?.namespace);
    if (injection.kind === 'skip') return answer({ allowed: true });
    return answer({ allowed: true, patchType: 'JSONPatch', patch: Buffer.from(JSON.stringify(injection.patch)).toString('base64') });
  } catch (err) {
    // A bad annotation is the Pod author's to fix: say what and where, and let everything else through.
    const code = err instanceof CertshareError ? err.code : 'CERTSHARE_BAD_ANNOTATION';
    return answer({ allowed: false, status: { code: 400, message: `certshare injector: ${errorMessage(err)} [${code}]` } });
  }
}
