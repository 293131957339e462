// The one right advertising Tailscale Services needs from tailscaled: editing its prefs. tailscaled lets root and
// its operator user write prefs (the operator may write everything: PermitWrite), and resolves the operator by
// user name in its own container (osuser.LookupByUsername: /etc/passwd, or getent). So the injector makes the
// advertise agent's uid (sidecar.ts ADVERTISE_AGENT_UID), never certshare's, a user there (a passwd file, from
// a Pod annotation through the downward API) and names it operator through containerboot's TS_EXTRA_ARGS
// (`tailscale up --operator=certshare-advertise`). Pure, like mutate.ts.
import type { V1Container, V1EnvVar, V1PodSpec, V1Volume } from '../kube/transport/client-node.ts';
import { CertshareError } from '../core/errors.ts';
import { ADVERTISE_AGENT_NAME, ADVERTISE_AGENT_UID, SIDECAR_NAME, SOCKET_DIR } from './sidecar.ts';

/** "grant" (the default for a Pod that advertises) or "manual": the Pod grants it itself (docs/tailscale-services.md). @forTests */
export const OPERATOR_ANNOTATION = 'certshare.io/tailscale-operator';
/** The passwd file of tailscaled's container, which the injector writes; the downward API projects it. @forTests */
export const PASSWD_ANNOTATION = 'certshare.io/tailscaled-passwd';
/** @forTests */
export const OPERATOR_USER = 'certshare-advertise';
const PASSWD_VOLUME = 'certshare-tailscaled-passwd';
const EXTRA_ARGS = 'TS_EXTRA_ARGS';
/** Where a TS_EXTRA_ARGS taken from a Secret or ConfigMap goes, so that the operator can be appended to it. */
const EXTRA_ARGS_BASE = 'TS_EXTRA_ARGS_BEFORE_OPERATOR';
const OPERATOR_ARG = `--operator=${OPERATOR_USER}`;

/** root and nobody, as a minimal image has them, and the advertise agent's uid under a name tailscaled can look up. @forTests */
export function tailscaledPasswd(): string {
  const uid = ADVERTISE_AGENT_UID;
  return [
    'root:x:0:0:root:/root:/bin/sh',
    'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin',
    `${OPERATOR_USER}:x:${uid}:${uid}:certshare advertise-agent:/nonexistent:/sbin/nologin`,
    '',
  ].join('\n');
}

function refused(problem: string): CertshareError {
  return new CertshareError('CERTSHARE_BAD_ANNOTATION', {
    annotation: OPERATOR_ANNOTATION,
    problem:
      `${problem}; or set ${OPERATOR_ANNOTATION}: manual and make uid ${ADVERTISE_AGENT_UID} ` +
      `(container ${ADVERTISE_AGENT_NAME}) tailscaled's operator yourself`,
  });
}

/**
 * Written on a Pod whose tailscaled runs from a config file: certshare does not advertise there, the file's owner
 * does (docs/tailscale-services.md). @forTests
 */
export const ADVERTISE_OWNER_ANNOTATION = 'certshare.io/advertise-owner';
/** containerboot starts tailscaled from the file in this directory (`tailscaled --config`), and reloads it on change. */
const CONFIG_DIR_ENV = 'TS_EXPERIMENTAL_VERSIONED_CONFIG_DIR';

/**
 * The container (besides certshare's and the agent's) mounting tailscaled's socket volume that starts tailscaled
 * from a config file: it declares TS_EXPERIMENTAL_VERSIONED_CONFIG_DIR in its env (Tailscale's operator does, for
 * its ProxyGroups). Each reload of that file sets AdvertiseServices to the file's list: any edit of the agent's
 * would be undone, or undo the owner's.
 */
export function configFileTailscaled(spec: V1PodSpec, socketVolume: string): string | undefined {
  const containers = [...(spec.initContainers ?? []), ...(spec.containers ?? [])];
  return containers.find(
    (c) =>
      c.name !== SIDECAR_NAME &&
      c.name !== ADVERTISE_AGENT_NAME &&
      c.volumeMounts?.some((m) => m.name === socketVolume) &&
      c.env?.some((e) => e.name === CONFIG_DIR_ENV),
  )?.name;
}

/** Whether this Pod's sidecar gets the grant: it advertises, the platform allows it, the Pod did not say manual. */
export function wantsOperatorGrant(annotations: Record<string, string>, advertises: boolean, platformGrants: boolean): boolean {
  const choice = annotations[OPERATOR_ANNOTATION];
  if (choice !== undefined && choice !== 'grant' && choice !== 'manual') throw refused(`"${choice}" is neither "grant" nor "manual"`);
  return advertises && platformGrants && choice !== 'manual';
}

/** The one container (regular or native sidecar) other than certshare that mounts tailscaled's socket volume. */
function tailscaledContainer(spec: V1PodSpec, socketVolume: string): { name: string; init: boolean } {
  const mounting = [...(spec.initContainers ?? []).map((c) => ({ c, init: true })), ...(spec.containers ?? []).map((c) => ({ c, init: false }))].filter(
    ({ c }) => c.name !== SIDECAR_NAME && c.name !== ADVERTISE_AGENT_NAME && c.volumeMounts?.some((m) => m.name === socketVolume),
  );
  if (mounting.length !== 1)
    throw refused(
      `tailscaled's container is the one that mounts the socket volume "${socketVolume}", and ${mounting.length} do` +
        (mounting.length ? ` (${mounting.map(({ c }) => c.name).join(', ')})` : ''),
    );
  return { name: mounting[0]!.c.name, init: mounting[0]!.init };
}

/**
 * TS_EXTRA_ARGS with the operator appended. A literal value is extended; one from a Secret or ConfigMap
 * keeps its source under another name and is referenced ($(NAME), expanded by the kubelet). A value that
 * may come from envFrom cannot be seen here: refused rather than replaced, which would drop what it held.
 */
function withOperatorArg(container: V1Container): V1EnvVar[] {
  const env = container.env ?? [];
  const index = env.findIndex((e) => e.name === EXTRA_ARGS);
  const current = env[index];
  if (!current) {
    if (container.envFrom?.length)
      throw refused(`container "${container.name}" takes variables from envFrom, which may hold ${EXTRA_ARGS}: declare ${EXTRA_ARGS} in its env`);
    return [...env, { name: EXTRA_ARGS, value: OPERATOR_ARG }];
  }
  if (current.valueFrom) {
    const base = { name: EXTRA_ARGS_BASE, valueFrom: current.valueFrom };
    return [...env.slice(0, index), base, { name: EXTRA_ARGS, value: `$(${EXTRA_ARGS_BASE}) ${OPERATOR_ARG}` }, ...env.slice(index + 1)];
  }
  const value = current.value ?? '';
  const operator = /(?:^|\s)--operator(?:=(\S*)|\s+(\S+))/.exec(value);
  if (operator) {
    if ((operator[1] ?? operator[2]) === OPERATOR_USER) return env;
    throw refused(`${EXTRA_ARGS} of container "${container.name}" names another operator ("${value}"): tailscaled has one`);
  }
  return env.map((e, i) => (i === index ? { name: EXTRA_ARGS, value: `${value} ${OPERATOR_ARG}`.trim() } : e));
}

function withPasswd(container: V1Container): V1Container {
  const mounts = container.volumeMounts ?? [];
  if (mounts.some((m) => m.mountPath === '/etc/passwd' || m.mountPath === '/etc')) throw refused(`container "${container.name}" mounts its own /etc/passwd`);
  return { ...container, volumeMounts: [...mounts, { name: PASSWD_VOLUME, mountPath: '/etc/passwd', subPath: 'passwd', readOnly: true }] };
}

const passwdVolume: V1Volume = {
  name: PASSWD_VOLUME,
  downwardAPI: { items: [{ path: 'passwd', fieldRef: { fieldPath: `metadata.annotations['${PASSWD_ANNOTATION}']` } }] },
};

/**
 * Tailscale's operator labels its ProxyGroups' Pods so (cmd/k8s-operator proxygroup_specs.go pgLabels). Only a shape
 * check: anyone who may create Pods in a namespace may write them; the platform's namespace list is the boundary.
 */
const PROXY_GROUP_LABELS: Readonly<Record<string, string>> = { 'tailscale.com/managed': 'true', 'tailscale.com/parent-resource-type': 'proxygroup' };

/**
 * Whether the Pod is a ProxyGroup Pod of Tailscale's operator that the platform opted in: in a namespace of the
 * injector's --proxygroup-namespaces (where only the operator creates Pods), labelled as the operator labels them, and
 * its tailscaled run from the operator's config file (`configFile`, configFileTailscaled). Nothing a tenant writes on
 * a Pod of its own namespace makes it one.
 */
export function optedInProxyGroup(
  namespace: string | undefined,
  labels: Record<string, string>,
  configFile: string | undefined,
  namespaces: readonly string[],
): boolean {
  return configFile !== undefined && listedProxyGroup(namespace, labels, namespaces);
}

/** In a namespace of --proxygroup-namespaces and labelled as the operator labels its ProxyGroups' Pods. */
function listedProxyGroup(namespace: string | undefined, labels: Record<string, string>, namespaces: readonly string[]): boolean {
  return namespace !== undefined && namespaces.includes(namespace) && Object.entries(PROXY_GROUP_LABELS).every(([key, value]) => labels[key] === value);
}

/** Where containerboot makes tailscaled's socket (its default is /tmp/tailscaled.sock, in the container's own filesystem). */
const SOCKET_ENV = 'TS_SOCKET';
/** @forTests */
export const PROXY_GROUP_SOCKET = `${SOCKET_DIR}/tailscaled.sock`;

function socketRefused(problem: string): CertshareError {
  return new CertshareError('CERTSHARE_BAD_ANNOTATION', {
    annotation: 'certshare.io/socket-volume',
    problem: `${problem}; certshare reaches tailscaled through a volume mounted at ${SOCKET_DIR} in its container and tailscaled's`,
  });
}

/**
 * Tailscale's operator mounts no volume holding tailscaled's socket in its ProxyGroups' Pods, and a ProxyClass cannot
 * add one. For a Pod of the allow list only (listedProxyGroup) whose one container running tailscaled from a config
 * file mounts no socket volume yet, the spec with one: an emptyDir `socketVolume` mounted at /var/run/tailscale in that
 * container, and TS_SOCKET there (containerboot starts tailscaled with `--socket=$TS_SOCKET`; the path is the CLI's
 * default, so the operator hook and `kubectl exec … tailscale` find it). A TS_SOCKET of the Pod's own at that path is
 * kept; another, a Secret's or ConfigMap's, a mount at or around the directory, or a volume of that name already:
 * refused, never guessed. Any other Pod: unchanged.
 */
export function withProxyGroupSocket(
  spec: V1PodSpec,
  labels: Record<string, string>,
  socketVolume: string,
  namespace: string | undefined,
  platform: { proxyGroupNamespaces?: readonly string[] | undefined },
): V1PodSpec {
  if (!listedProxyGroup(namespace, labels, platform.proxyGroupNamespaces ?? [])) return spec;
  const all = [...(spec.initContainers ?? []), ...(spec.containers ?? [])];
  if (all.some((c) => c.volumeMounts?.some((m) => m.name === socketVolume))) return spec;
  const fromFile = all.filter((c) => c.name !== SIDECAR_NAME && c.name !== ADVERTISE_AGENT_NAME && c.env?.some((e) => e.name === CONFIG_DIR_ENV));
  if (fromFile.length !== 1) return spec;
  const target = fromFile[0]!;
  if ((spec.volumes ?? []).some((v) => v.name === socketVolume))
    throw socketRefused(`the ProxyGroup Pod has a volume "${socketVolume}" that container "${target.name}" (tailscaled) does not mount`);
  const declared = target.env!.find((e) => e.name === SOCKET_ENV);
  if (declared && (declared.valueFrom !== undefined || declared.value !== PROXY_GROUP_SOCKET))
    throw socketRefused(
      `container "${target.name}" sets ${SOCKET_ENV} (${declared.valueFrom ? 'from a Secret or ConfigMap' : `"${declared.value ?? ''}"`}), ` +
        `not ${PROXY_GROUP_SOCKET}`,
    );
  const overlapping = (target.volumeMounts ?? []).find((m) => {
    const path = m.mountPath.replace(/\/+$/, '');
    return path === SOCKET_DIR || SOCKET_DIR.startsWith(`${path}/`) || path.startsWith(`${SOCKET_DIR}/`) || path === '';
  });
  if (overlapping)
    throw socketRefused(`container "${target.name}" mounts volume "${overlapping.name}" at ${overlapping.mountPath}: name it with certshare.io/socket-volume`);
  const withSocket = (c: V1Container): V1Container =>
    c !== target
      ? c
      : {
          ...c,
          env: declared ? c.env : [...(c.env ?? []), { name: SOCKET_ENV, value: PROXY_GROUP_SOCKET }],
          volumeMounts: [...(c.volumeMounts ?? []), { name: socketVolume, mountPath: SOCKET_DIR }],
        };
  return {
    ...spec,
    initContainers: spec.initContainers?.map(withSocket),
    containers: (spec.containers ?? []).map(withSocket),
    volumes: [...(spec.volumes ?? []), { name: socketVolume, emptyDir: {} }],
  };
}

/**
 * The command of the postStart hook that makes the agent's uid tailscaled's operator where containerboot runs it from
 * a config file (and refuses TS_EXTRA_ARGS): run in tailscaled's own container, as its root, through its CLI, retried
 * while tailscaled is not answering yet (at most a minute: the kubelet starts the Pod's later containers after it).
 * A reload of the file keeps it (the operator's file names no OperatorUser). It never fails the container: any other
 * answer (a locked file) ends it at once, and without the right the agent's edits are refused, counted and logged. @forTests
 */
export const OPERATOR_HOOK = [
  '/bin/sh',
  '-c',
  'for i in $(seq 1 60); do ' +
    `out=$(tailscale --socket="\${TS_SOCKET:-/tmp/tailscaled.sock}" set ${OPERATOR_ARG} 2>&1) && exit 0; ` +
    'case "$out" in *"failed to connect to local tailscaled"*) sleep 1;; *) break;; esac; done; ' +
    `echo "certshare: ${OPERATOR_USER} is not tailscaled's operator: $out" >&2; exit 0`,
];

function withOperatorHook(container: V1Container): V1Container {
  if (container.lifecycle?.postStart) throw refused(`container "${container.name}" has a postStart hook of its own`);
  return { ...container, lifecycle: { ...container.lifecycle, postStart: { exec: { command: OPERATOR_HOOK } } } };
}

/**
 * The Pod's spec with tailscaled's container granted, and the annotation its passwd file comes from: the operator
 * named through TS_EXTRA_ARGS, or (`byHook`, tailscaled from a config file) by a postStart hook.
 */
export function withOperatorGrant(spec: V1PodSpec, socketVolume: string, byHook = false): { spec: V1PodSpec; annotations: Record<string, string> } {
  const target = tailscaledContainer(spec, socketVolume);
  const named = (c: V1Container): V1Container => (byHook ? withOperatorHook(c) : { ...c, env: withOperatorArg(c) });
  const grant = (c: V1Container): V1Container => (c.name === target.name ? withPasswd(named(c)) : c);
  return {
    spec: {
      ...spec,
      initContainers: target.init ? (spec.initContainers ?? []).map(grant) : spec.initContainers,
      containers: target.init ? spec.containers : (spec.containers ?? []).map(grant),
      volumes: [...(spec.volumes ?? []), passwdVolume],
    },
    annotations: { [PASSWD_ANNOTATION]: tailscaledPasswd() },
  };
}

/**
 * containerboot advertises every Service of tailscaled's serve config at each netmap change (and whenever its
 * TS_SERVE_CONFIG file changes) unless this is false: it would undo every withdrawal of certshare's within seconds.
 * Tailscale's operator sets it false on its ProxyGroups' Pods, whose config file says what is advertised.
 */
const AUTO_ADVERTISE_ENV = 'TS_EXPERIMENTAL_SERVICE_AUTO_ADVERTISEMENT';
/** What containerboot reads as false (Go's strconv.ParseBool); anything else, an empty value too, leaves it on. */
const FALSE_VALUES = new Set(['0', 'f', 'F', 'false', 'FALSE', 'False']);

/**
 * The Pod's spec with containerboot's own advertisement off in tailscaled's container (every container but
 * certshare's and the agent's that mounts the socket volume), for a Pod whose certshare advertises. A value the Pod
 * gives itself is kept when it says false, and refused otherwise (also from a Secret or ConfigMap, unseen here).
 * A value in envFrom needs nothing: `env` wins over it.
 */
export function withoutAutoAdvertisement(spec: V1PodSpec, socketVolume: string): V1PodSpec {
  const turnOff = (c: V1Container): V1Container => {
    if (c.name === SIDECAR_NAME || c.name === ADVERTISE_AGENT_NAME || !c.volumeMounts?.some((m) => m.name === socketVolume)) return c;
    const env = c.env ?? [];
    const declared = env.find((e) => e.name === AUTO_ADVERTISE_ENV);
    if (!declared) return { ...c, env: [...env, { name: AUTO_ADVERTISE_ENV, value: 'false' }] };
    if (declared.valueFrom === undefined && FALSE_VALUES.has(declared.value ?? '')) return c;
    throw new CertshareError('CERTSHARE_BAD_ANNOTATION', {
      annotation: 'certshare.io/flags',
      problem:
        `--advertise-services, and container "${c.name}" sets ${AUTO_ADVERTISE_ENV} ` +
        `(${declared.valueFrom ? 'from a Secret or ConfigMap' : `"${declared.value ?? ''}"`}): containerboot would advertise ` +
        `its serve config's Services at every netmap change, undoing certshare's withdrawals; remove it or set it to "false"`,
    });
  };
  return { ...spec, initContainers: spec.initContainers?.map(turnOff), containers: (spec.containers ?? []).map(turnOff) };
}
