// The one right advertising Tailscale Services needs from tailscaled: editing its prefs. tailscaled lets root and
// its operator user write prefs (the operator may write everything: PermitWrite), and resolves the operator by
// user name in its own container (osuser.LookupByUsername: /etc/passwd, or getent). So the injector makes the
// advertise agent's uid (sidecar.ts ADVERTISE_AGENT_UID), never certshare's, a user there (a passwd file, from
// a Pod annotation through the downward API) and names it operator through containerboot's TS_EXTRA_ARGS
// (`tailscale up --operator=certshare-advertise`). Pure, like mutate.ts.
import type { V1Container, V1EnvVar, V1PodSpec, V1Volume } from '../kube/transport/client-node.ts';
import { CertshareError } from '../core/errors.ts';
import { ADVERTISE_AGENT_NAME, ADVERTISE_AGENT_UID, SIDECAR_NAME } from './sidecar.ts';

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

/** The Pod's spec with tailscaled's container granted, and the annotation its passwd file comes from. */
export function withOperatorGrant(spec: V1PodSpec, socketVolume: string): { spec: V1PodSpec; annotations: Record<string, string> } {
  const target = tailscaledContainer(spec, socketVolume);
  const grant = (c: V1Container): V1Container => (c.name === target.name ? withPasswd({ ...c, env: withOperatorArg(c) }) : c);
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
