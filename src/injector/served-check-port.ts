// Where the injector points the served check of a Pod that names none: the proxy's TLS port, taken from
// the Pod's spec only when the spec says it without doubt (docs/tailscale-services.md, "In a Pod").
import type { V1PodSpec } from '../kube/transport/client-node.ts';

/** The conventional name of a TLS listener's port (IANA's service name for HTTP over TLS). */
const TLS_PORT_NAME = 'https';

/**
 * The one TCP containerPort named `https` among the containers that may be the proxy: the Pod's regular
 * containers and native sidecars (init containers with restartPolicy Always), less certshare's own and any
 * container mounting tailscaled's socket volume. Undefined when there is none, or more than one (two
 * proxies, or a proxy and some other TLS server: which one clients reach is not in the spec), or the port
 * is no port number (the apiserver's validation, which runs after the webhook, refuses that Pod anyway).
 * No port of another name is taken: a plain HTTP listener probed for TLS would never confirm the
 * certificate, and a Service advertised only once it is confirmed would silently stay withdrawn.
 */
export function proxyTlsPort(spec: V1PodSpec, socketVolume: string, sidecarName: string): number | undefined {
  const candidates = [...(spec.containers ?? []), ...(spec.initContainers ?? []).filter((c) => c.restartPolicy === 'Always')].filter(
    (c) => c.name !== sidecarName && !(c.volumeMounts ?? []).some((m) => m.name === socketVolume),
  );
  const ports = candidates.flatMap((c) => c.ports ?? []).filter((p) => p.name === TLS_PORT_NAME && (p.protocol ?? 'TCP') === 'TCP');
  if (ports.length !== 1) return undefined;
  const port = ports[0]?.containerPort;
  return Number.isInteger(port) && (port as number) >= 1 && (port as number) <= 65_535 ? port : undefined;
}
