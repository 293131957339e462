// What the injector gives every sidecar it adds unless a Pod's annotation says otherwise: the values of its
// --sidecar-* and --default-* flags (src/config/injector-options.ts), declared here so that the configuration and
// the injection (src/injector/mutate.ts, sidecar.ts) both name them without the configuration depending on the injector.
import type { ShareMode } from '../core/ports/store.ts';

/** --sidecar-image's default: the certshare release this injector belongs to. */
export const DEFAULT_IMAGE = 'ghcr.io/certshare/certshare:0.1.0';

/** --default-readiness-gate's default condition type. */
export const DEFAULT_READINESS_GATE = 'certshare.io/certificates';

/** A ConfigMap key holding PEM certificates: the injector's --sidecar-ca-configmap. */
export interface CaBundleSource {
  configMap: string;
  key: string;
}

/** A container's requests and limits, resource name to quantity (a `resources` of the Kubernetes API). */
export interface SidecarResources {
  requests?: Record<string, string>;
  limits?: Record<string, string>;
}

/** The injector's defaults, each overridable per Pod by the annotation of the same name. */
export interface InjectionDefaults {
  image: string;
  /** --sidecar-image-pull-policy; undefined for the cluster's default. */
  imagePullPolicy?: string | undefined;
  mode: ShareMode;
  outDir: string;
  /** Condition type, or undefined for no gate. */
  readinessGate: string | undefined;
  socketVolume: string;
  /** The platform's `certshare run` flags for every sidecar (--sidecar-flags), `--name=value` separated by white space. */
  sidecarFlags?: string;
  /**
   * CA certificates every sidecar trusts besides the system's (--sidecar-ca-configmap), or undefined. The
   * platform's alone, like --sidecar-flags: no annotation names or overrides it (a Pod that chose what its
   * writer trusts could answer its ARI checks).
   */
  caBundle?: CaBundleSource | undefined;
  /** The Secret holding the federation home's kubeconfig (--sidecar-home-kubeconfig-secret), or undefined. The platform's alone. */
  homeKubeconfigSecret?: string | undefined;
  /** The sidecar's requests and limits (--sidecar-resources); undefined for SIDECAR_RESOURCES. The platform's alone. */
  resources?: SidecarResources | undefined;
  /**
   * --grant-tailscale-operator: a Pod whose sidecar advertises Tailscale Services gets tailscaled's operator
   * right for the advertise agent's uid (src/injector/tailscale-operator.ts) unless it says manual. Default true.
   */
  grantTailscaleOperator?: boolean | undefined;
  /**
   * --proxygroup-namespaces: where Tailscale's operator runs its ProxyGroups. A Pod there labelled as one, its
   * tailscaled run from the operator's config file, keeps its advertisement: the agent, made tailscaled's operator by
   * a postStart hook, only withdraws (src/injector/tailscale-operator.ts optedInProxyGroup). The platform's alone.
   */
  proxyGroupNamespaces?: readonly string[] | undefined;
}
