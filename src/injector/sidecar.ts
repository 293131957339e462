// The one description of certshare's sidecar container: the injector adds it to Pods, and the example
// StatefulSet is checked against it (test/unit/injector/sidecar.test.ts), so the two cannot drift apart.
import type { V1Container, V1ResourceRequirements, V1SecurityContext, V1Volume, V1VolumeMount } from '../kube/transport/client-node.ts';
import { REQUEST_DIR, STATUS_DIR } from '../served/advertise-paths.ts';
import type { ShareMode } from '../core/ports/store.ts';
import type { CaBundleSource } from '../config/injection-defaults.ts';
import { ADVERTISE_AGENT_SCRIPT } from '../config/snapshot-files.ts';

export const SIDECAR_NAME = 'certshare';
/**
 * What every Kubernetes workload of the image runs: the bundle's entry, dist/cli/main.js, with the image's Node
 * flags. The image's own entry starts the standalone daemon from its start-up snapshot and hands every other
 * command to this script, keeping the snapshot's heap it has no use for (docs/performance.md); the sidecar, the
 * advertise agent and the injector (manifests/injector, the chart) name it instead. The policy
 * certshare-sidecar-as-injected admits this command only (sidecarForm records it); test/repo/entry-commands.test.ts
 * holds it to the Dockerfile's ENTRYPOINT. @forTests
 */
export const DIST_COMMAND = ['/nodejs/bin/node', '--max-semi-space-size=1', 'dist/cli/main.js'];
export const HEALTH_PORT = 9002;
/**
 * How long the proxy may wait for a first certificate before the kubelet restarts certshare (each failed
 * startup probe one second): an issuance with tailscaled's ACME order takes seconds to a minute.
 */
const STARTUP_PROBE_SECONDS = 600;
/** tailscaled's socket directory, shared with certshare through a volume. @forTests */
export const SOCKET_DIR = '/var/run/tailscale';
/** Where client libraries (client-node's loadFromCluster included) look for the ServiceAccount token. @forTests */
export const TOKEN_DIR = '/var/run/secrets/kubernetes.io/serviceaccount';
/** Where the platform's CA bundle (the injector's --sidecar-ca-configmap) is mounted, and its one file. @forTests */
export const CA_DIR = '/etc/certshare/ca';
/** @forTests */
export const CA_FILE = `${CA_DIR}/ca.crt`;
/** Where the federation home's kubeconfig (the injector's --sidecar-home-kubeconfig-secret) is mounted, and its file. @forTests */
export const HOME_DIR = '/etc/certshare/federation';
/** @forTests */
export const HOME_KUBECONFIG = `${HOME_DIR}/kubeconfig`;

export interface SidecarSettings {
  image: string;
  /** Always, IfNotPresent or Never; undefined leaves the cluster's default (by the image's tag). */
  imagePullPolicy?: string | undefined;
  domains: string[];
  mode: ShareMode;
  outDir: string;
  /** Pod condition type kept True while certificates are valid; undefined for none. */
  readinessGate: string | undefined;
  /** Volume holding tailscaled's socket. */
  socketVolume: string;
  /** Volume certshare projects the certificates into (shared with the proxy). */
  certsVolume: string;
  /** A volume with certshare's own ServiceAccount token, when the Pod does not mount one everywhere. */
  tokenVolume?: string | undefined;
  /** A volume holding CA_FILE, certificates the sidecar trusts besides the system's (a private ACME CA's). */
  caVolume?: string | undefined;
  /** A volume holding HOME_KUBECONFIG, the federation home's kubeconfig (docs/federation.md). */
  homeVolume?: string | undefined;
  /** Further CERTSHARE_* settings (routing check, drain delay...), after the ones above. */
  extraEnv?: { name: string; value: string }[];
  /** The platform's requests and limits (the injector's --sidecar-resources); SIDECAR_RESOURCES when undefined. */
  resources?: V1ResourceRequirements | undefined;
  /** --reload-signal and --reload-pidfile: a signal to the proxy's master (a shared process namespace). */
  reloadSignal?: { signal: string; pidFile: string } | undefined;
  /** --haproxy-socket: HAProxy's runtime API; the combined PEMs go to HAPROXY_SUBDIR of the out-dir. */
  haproxySocket?: string | undefined;
  /** Volumes of the proxy's (its pid file's, its runtime API socket's), mounted read-only at the same paths. */
  proxyMounts?: { name: string; mountPath: string }[];
}

/**
 * The sidecar's requests and limits unless the platform sets others (--sidecar-resources). Memory: the
 * first row of docs/performance.md's "Resources by domain count" (one domain), whose request is the writer's idle RSS
 * there with a quarter of headroom, rounded up to 16 Mi (test/unit/sidecar-resources.test.ts holds the two
 * to that rule); larger groups take the rows below it. CPU: idle it uses ~0, but a Pod's start (the
 * certificate, the routing check, the readiness patch) competes with every container starting on the
 * node, where CPU goes by cgroup weight, which the request sets (10m is weight 1, 100m weight 4;
 * docs/performance.md gives what that changed on the real-cluster tier).
 * @forTests
 */
export const SIDECAR_RESOURCES: V1ResourceRequirements = { requests: { cpu: '100m', memory: '112Mi' }, limits: { memory: '192Mi' } };

/** The C library's settings of certshare's container (certshareContainer). */
const SIDECAR_GLIBC_TUNABLES = 'glibc.malloc.mmap_threshold=32768';

/** Where, under the out-dir, the HAProxy PEMs are written (`crt <out-dir>/haproxy/` in haproxy.cfg). */
const HAPROXY_SUBDIR = 'haproxy';

/**
 * certshare advertise-agent (src/served/advertise-agent.ts), a container of its own next to certshare in a Pod
 * that advertises Tailscale Services: its uid, not certshare's, is tailscaled's operator.
 */
export const ADVERTISE_AGENT_NAME = 'certshare-advertise';
export const ADVERTISE_AGENT_UID = 65533;
/** The exchange directory: certshare's request volume and the agent's status volume under it, each read-only to the other. */
export const ADVERTISE_DIR = '/run/certshare-advertise';
const ADVERTISE_REQUEST_VOLUME = 'certshare-advertise-request';
const ADVERTISE_STATUS_VOLUME = 'certshare-advertise-status';
/**
 * What the advertise agent runs: its own script (scripts/build.ts buildAdvertiseAgent), not dist/cli/main.js, whose
 * bundle it does not use, with the image's Node flag and V8 without its compilers (--jitless: less memory, and an
 * agent that reads a file now and then has no hot code; docs/performance.md, the advertise agent, has the figures
 * and the flags that did not help). No policy holds the agent's container to a form: it has no token. @forTests
 */
export const ADVERTISE_AGENT_COMMAND = ['/nodejs/bin/node', '--max-semi-space-size=1', '--jitless', `dist/${ADVERTISE_AGENT_SCRIPT}`];
/**
 * The agent idle (its RSS in docs/performance.md, the advertise agent) with a quarter of headroom, rounded up to
 * 16 Mi, as the sidecar's request is; the limit leaves room above that for the largest IPN bus line it accepts
 * parsed (LOCALAPI_ANSWER_BOUNDS). It does nothing but a prefs read and edit now and then: a small CPU request.
 */
const ADVERTISE_AGENT_RESOURCES: V1ResourceRequirements = { requests: { cpu: '10m', memory: '64Mi' }, limits: { memory: '112Mi' } };

/** Non-root (the distroless image's nonroot user), read-only root, no privilege, no capability. @forTests */
export const SIDECAR_SECURITY_CONTEXT: V1SecurityContext = {
  runAsNonRoot: true,
  runAsUser: 65532,
  runAsGroup: 65532,
  readOnlyRootFilesystem: true,
  allowPrivilegeEscalation: false,
  capabilities: { drop: ['ALL'] },
  seccompProfile: { type: 'RuntimeDefault' },
};

const fieldEnv = (name: string, fieldPath: string) => ({ name, valueFrom: { fieldRef: { fieldPath } } });

/** certshare as a native sidecar: an init container with restartPolicy Always, started before the proxy and stopped after it. */
export function certshareContainer(s: SidecarSettings): V1Container {
  return {
    name: SIDECAR_NAME,
    image: s.image,
    ...(s.imagePullPolicy ? { imagePullPolicy: s.imagePullPolicy } : {}),
    restartPolicy: 'Always',
    command: [...DIST_COMMAND],
    args: ['run'],
    env: [
      fieldEnv('POD_NAME', 'metadata.name'),
      fieldEnv('POD_NAMESPACE', 'metadata.namespace'),
      // The Events about the Pod carry its uid: `kubectl describe pod` selects them by it.
      fieldEnv('POD_UID', 'metadata.uid'),
      fieldEnv('POD_IPS', 'status.podIPs'),
      { name: 'CERTSHARE_DOMAIN', value: s.domains.join(',') },
      { name: 'CERTSHARE_MODE', value: s.mode },
      { name: 'CERTSHARE_STORE', value: 'kube' },
      { name: 'CERTSHARE_OUT_DIR', value: s.outDir },
      ...(s.readinessGate ? [{ name: 'CERTSHARE_READINESS_GATE', value: s.readinessGate }] : []),
      { name: 'CERTSHARE_LOCALAPI', value: `${SOCKET_DIR}/tailscaled.sock` },
      { name: 'CERTSHARE_LISTEN', value: `[::]:${HEALTH_PORT}` },
      // glibc maps blocks of 32 KiB and more on their own and returns them when freed, as the injector's Deployment
      // has it: V8's compilers take their working memory in such blocks (the kubelet's probes make /healthz hot
      // enough for TurboFan within hours), which the C heap otherwise keeps resident (docs/performance.md).
      { name: 'GLIBC_TUNABLES', value: SIDECAR_GLIBC_TUNABLES },
      // Read by Node once, at start, for every TLS connection it verifies against the system's CAs (the
      // ACME directory and renewalInfo, an https routing check); a missing file would only be warned about.
      ...(s.caVolume ? [{ name: 'NODE_EXTRA_CA_CERTS', value: CA_FILE }] : []),
      ...(s.homeVolume ? [{ name: 'CERTSHARE_FEDERATION_KUBECONFIG', value: HOME_KUBECONFIG }] : []),
      ...(s.reloadSignal
        ? [
            { name: 'CERTSHARE_RELOAD_SIGNAL', value: s.reloadSignal.signal },
            { name: 'CERTSHARE_RELOAD_PIDFILE', value: s.reloadSignal.pidFile },
          ]
        : []),
      ...(s.haproxySocket
        ? [
            { name: 'CERTSHARE_HAPROXY_CRT_DIR', value: `${s.outDir.replace(/\/+$/, '')}/${HAPROXY_SUBDIR}` },
            { name: 'CERTSHARE_HAPROXY_SOCKET', value: s.haproxySocket },
          ]
        : []),
      ...(s.extraEnv ?? []),
    ],
    ports: [{ name: 'certshare', containerPort: HEALTH_PORT }],
    // Ready only with a valid certificate (GET /healthz answers 503 otherwise).
    readinessProbe: { httpGet: { path: '/healthz', port: HEALTH_PORT }, periodSeconds: 10, failureThreshold: 3 },
    // A proxy that reads its certificate at start only (stock nginx, HAProxy) would fail to start, and be
    // restarted, without the files: the kubelet starts the Pod's containers once this probe has passed.
    ...(s.reloadSignal || s.haproxySocket
      ? { startupProbe: { httpGet: { path: '/healthz', port: HEALTH_PORT }, periodSeconds: 1, failureThreshold: STARTUP_PROBE_SECONDS } }
      : {}),
    // Alive while it answers at all: restarting cannot fix a missing certificate, it only adds issuance attempts.
    livenessProbe: { tcpSocket: { port: HEALTH_PORT }, initialDelaySeconds: 10, periodSeconds: 20, failureThreshold: 3 },
    resources: s.resources ?? SIDECAR_RESOURCES,
    securityContext: SIDECAR_SECURITY_CONTEXT,
    volumeMounts: [
      { name: s.certsVolume, mountPath: s.outDir },
      { name: s.socketVolume, mountPath: SOCKET_DIR },
      ...(s.tokenVolume ? [{ name: s.tokenVolume, mountPath: TOKEN_DIR, readOnly: true }] : []),
      ...(s.caVolume ? [{ name: s.caVolume, mountPath: CA_DIR, readOnly: true }] : []),
      ...(s.homeVolume ? [{ name: s.homeVolume, mountPath: HOME_DIR, readOnly: true }] : []),
      ...(s.proxyMounts ?? []).map((m) => ({ name: m.name, mountPath: m.mountPath, readOnly: true })),
    ],
  };
}

/** certshare's own side of the exchange: where it writes its request, and reads the agent's status. */
export function advertiseExchangeMounts(writes: 'request' | 'status'): V1VolumeMount[] {
  return [
    { name: ADVERTISE_REQUEST_VOLUME, mountPath: `${ADVERTISE_DIR}/${REQUEST_DIR}`, ...(writes === 'request' ? {} : { readOnly: true }) },
    { name: ADVERTISE_STATUS_VOLUME, mountPath: `${ADVERTISE_DIR}/${STATUS_DIR}`, ...(writes === 'status' ? {} : { readOnly: true }) },
  ];
}

export function advertiseExchangeVolumes(): V1Volume[] {
  return [ADVERTISE_REQUEST_VOLUME, ADVERTISE_STATUS_VOLUME].map((name) => ({ name, emptyDir: { medium: 'Memory', sizeLimit: '1Mi' } }));
}

/**
 * The advertise agent: the same image, `certshare advertise-agent`, allowed the Services certshare advertises
 * and nothing else; no token, no port, tailscaled's socket and the exchange volumes only.
 */
export function advertiseAgentContainer(s: { image: string; imagePullPolicy?: string | undefined; services: string; socketVolume: string }): V1Container {
  return {
    name: ADVERTISE_AGENT_NAME,
    image: s.image,
    ...(s.imagePullPolicy ? { imagePullPolicy: s.imagePullPolicy } : {}),
    command: [...ADVERTISE_AGENT_COMMAND],
    env: [
      { name: 'CERTSHARE_ADVERTISE_SERVICES', value: s.services },
      { name: 'CERTSHARE_EXCHANGE', value: ADVERTISE_DIR },
      { name: 'CERTSHARE_LOCALAPI', value: `${SOCKET_DIR}/tailscaled.sock` },
    ],
    resources: ADVERTISE_AGENT_RESOURCES,
    securityContext: { ...SIDECAR_SECURITY_CONTEXT, runAsUser: ADVERTISE_AGENT_UID, runAsGroup: ADVERTISE_AGENT_UID },
    volumeMounts: [{ name: s.socketVolume, mountPath: SOCKET_DIR }, ...advertiseExchangeMounts('status')],
  };
}

/**
 * What kube-api-access-* volumes hold (token, cluster CA, namespace), for certshare's container only:
 * the proxy next to it gets no Kubernetes credentials it does not need.
 */
export function serviceAccountTokenVolume(name: string): V1Volume {
  return {
    name,
    projected: {
      defaultMode: 0o444,
      sources: [
        // 3600, not kube-api-access's 3607: the apiserver extends 3607-second tokens to a year for legacy clients
        // (--service-account-extend-token-expiration); client-node rereads the file, so an hour is enough.
        { serviceAccountToken: { path: 'token', expirationSeconds: 3600 } },
        { configMap: { name: 'kube-root-ca.crt', items: [{ key: 'ca.crt', path: 'ca.crt' }] } },
        { downwardAPI: { items: [{ path: 'namespace', fieldRef: { apiVersion: 'v1', fieldPath: 'metadata.namespace' } }] } },
      ],
    },
  };
}

/**
 * The CA bundle's one key as CA_FILE. A ConfigMap of the Pod's own namespace (a volume can name no other:
 * trust-manager or the platform puts one in each opted-in namespace, as kube-controller-manager does
 * kube-root-ca.crt), not a Secret: CA certificates are public. Not optional: a missing ConfigMap or key
 * keeps the Pod from starting with a FailedMount event naming it, where an optional volume would start
 * certshare trusting nothing more, its every ARI check failing.
 */
/**
 * The federation home's kubeconfig: key `kubeconfig` of a Secret of the Pod's namespace, which the platform
 * creates (a kubeconfig for the home's certshare-federation account). Not optional: without it a sidecar
 * would start as a cluster of its own, a second issuer for a federated name.
 */
export function homeKubeconfigVolume(name: string, secretName: string): V1Volume {
  return { name, secret: { secretName, items: [{ key: 'kubeconfig', path: HOME_KUBECONFIG.slice(HOME_DIR.length + 1) }], optional: false } };
}

export function caBundleVolume(name: string, source: CaBundleSource): V1Volume {
  return { name, configMap: { name: source.configMap, items: [{ key: source.key, path: CA_FILE.slice(CA_DIR.length + 1) }], optional: false } };
}
