// What a routing check asks of the proofs of routing (the readiness gate's check: kube/routing-check.ts), and
// the header a proof travels in; the proofs themselves are kept and checked where calls arrive
// (http/routing-proof.ts), so the check and the server share this and not each other.

/** The request header a routing check's calls carry (lower case, as node:http reports it). */
export const ROUTING_PROOF_HEADER = 'certshare-routing-proof';

/** What a routing check needs of the proofs: sign its own calls, hear of calls that reached this Pod. */
export interface RoutingProofSource {
  /** The header value for a call to `url`, or undefined while no certificate key is held. */
  sign(url: string): string | undefined;
  /** Calls `listener` each time a call to `url` carrying a valid proof reaches this Pod, until the returned function runs. */
  onProof(url: string, listener: () => void): () => void;
}
