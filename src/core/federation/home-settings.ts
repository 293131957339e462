// What the federation home is reached with: the flags' values, declared beside the federation's rules so that
// the configuration and the adapter (kube/federation-home.ts) both name them without depending on each other.

/** --federation-*: the settings of the federation home, and only those (docs/federation.md). */
export interface FederationSettings {
  kubeconfig: string;
  namespace: string;
  cluster: string;
  leaseDurationMs: number;
  /** --federation-trust-anchors: a PEM file; undefined: Node's CA store (core/certificates/trust.ts defaultTrustAnchors). */
  trustAnchors: string | undefined;
}
