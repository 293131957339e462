// Stable error codes for everything a user can see in a log line, a health reason or an exit message,
// each declared once with what it means, how its message reads and what the process exits with when it
// ends the process (fastify's lib/errors.js does the same). A site picks a code and fills the template's
// named slots; the type of a code's arguments is its template's slots, so tsc refuses a site that misses one
// or adds one. A slot holding a phrase the site writes (a rule, a reason) is said so in the code's `open`.
// test/unit/errors.test.ts keeps the table honest: every code declared is used, every code used is declared,
// no template is a bare sentence.

interface CodeSpec {
  /** What the code means, for a person reading a log line. */
  means: string;
  /** The message, `{slot}`s filled by the site. */
  message: string;
  /** Why a slot of the template is a phrase the site writes, when one is. */
  open?: string;
  /** The process's exit status when an error of this code ends it. */
  exit: 1 | 2;
}

export const ERROR_CODES = {
  CERTSHARE_BAD_FLAG: {
    means: 'a flag or environment value is malformed or breaks a rule of the configuration',
    message: '{flag}: {rule}',
    open: 'each flag, variable or argument has a rule of its own: {rule} states it as its help does, with the value given',
    exit: 2,
  },
  CERTSHARE_BAD_CONFIG: {
    means: 'a configuration source is unusable: a ServeConfig, a kubeconfig, a store directory, a TLS source, an object a flag names',
    message: '{source}: {reason}',
    open: 'each source (a file, an object, an address) fails in its own way: {reason} says how, in the words of the part that read it',
    exit: 1,
  },
  CERTSHARE_KUBECONFIG_REFUSED: {
    means:
      'a kubeconfig the daemon or the injector loads from a file holds more than a server, its CA and an inline token or client ' +
      'certificate (an exec plugin, an auth provider, a file path, any other field): refused at start, before any request',
    message: 'kubeconfig {path} refused: {problem}',
    exit: 1,
  },
  CERTSHARE_BAD_DOMAIN: {
    means: 'a name is not a fully qualified domain name and never becomes a file, Secret or request path',
    message: '"{name}" is not a fully qualified domain name: {rule}',
    exit: 1,
  },
  CERTSHARE_BAD_ANNOTATION: {
    means: "an injected Pod's certshare.io/* annotation is invalid (the admission is refused)",
    message: '{annotation}: {problem}',
    open: 'each annotation has a rule of its own: {problem} states it, with the value given, as docs/install.md does',
    exit: 1,
  },
  CERTSHARE_BAD_REQUEST: {
    means: "a request to the injector's webhook is not an AdmissionReview it can answer (HTTP 400)",
    message: 'not an AdmissionReview request ({why})',
    exit: 1,
  },
  CERTSHARE_CERT_INVALID: {
    means: 'a certificate pair failed validation (parse, key match, SAN, validity, chain) and was not used',
    message: '{certificate} rejected: {reason}',
    exit: 1,
  },
  CERTSHARE_CERT_UNTRUSTED: {
    means:
      "a certificate's chain does not verify up to a trust anchor (a self-signed or forged pair, another CA's): never mirrored, " +
      'served or written to the federation home',
    message: 'certificate for {domain} not trusted: {problem}',
    exit: 1,
  },
  CERTSHARE_CERT_STALE: {
    means: 'tailscaled returned a certificate that is no newer than the one held',
    message: 'tailscaled returned {returned}, not a newer certificate ({detail})',
    exit: 1,
  },
  CERTSHARE_CERT_TOO_SHORT: {
    means: 'a freshly issued certificate is already due for renewal by the rule (issuer backdates, shortens or is skewed)',
    message: 'certificate from the issuer too short: {why}',
    exit: 1,
  },
  CERTSHARE_LOCALAPI_UNREACHABLE: {
    means: "tailscaled's LocalAPI socket or address cannot be reached",
    message: 'tailscaled LocalAPI unreachable for {request}: {failure}',
    exit: 1,
  },
  CERTSHARE_LOCALAPI_TIMEOUT: { means: 'a LocalAPI call took longer than its timeout', message: 'tailscaled LocalAPI {request}: {failure}', exit: 1 },
  CERTSHARE_LOCALAPI_HTTP: {
    means: 'the LocalAPI answered with a server error (5xx) or a rate limit',
    message: 'tailscaled LocalAPI {request}: {failure}',
    exit: 1,
  },
  CERTSHARE_LOCALAPI_REFUSED: {
    means: 'a 4xx other than 408/429: an answer that retrying cannot change (refused mask, access denied, no endpoint)',
    message: 'tailscaled LocalAPI refused {request}: {failure}',
    exit: 1,
  },
  CERTSHARE_LOCALAPI_BAD_RESPONSE: {
    means: 'the LocalAPI answered with something that is not what the protocol says',
    message: 'tailscaled LocalAPI {request}: {failure}',
    exit: 1,
  },
  CERTSHARE_SERVICE_DOMAIN_NOT_GRANTED: {
    means:
      "a Tailscale Service's domain is not among the node's cert domains: control grants it only to the Service's hosts " +
      '(a node advertising the Service, with the tags the Service wants)',
    message: '{domain}: waiting for control to grant this node the domain of {service} ({why})',
    exit: 1,
  },
  CERTSHARE_ADVERTISE_CONFIG_FILE: {
    means:
      "tailscaled runs from a config file (containerboot's TS_EXPERIMENTAL_VERSIONED_CONFIG_DIR): the file owns AdvertiseServices, " +
      'certshare never adds to it; with the right to edit prefs it withdraws a Service this replica must not serve, and puts the list back',
    message: "tailscaled runs from a config file, whose AdvertiseServices wins at every reload: {services} left to the file's owner{how}",
    exit: 1,
  },
  CERTSHARE_ADVERTISE_UNWATCHED: {
    means:
      "tailscaled's config file advertises Tailscale Services that are not certshare's --advertise-services (Tailscale's operator " +
      "names an HA Ingress's Service svc:<the Ingress's first TLS host label>): certshare never withdraws them",
    message: "tailscaled's config file advertises {services}, not in --advertise-services ({managed}): certshare never withdraws them",
    exit: 1,
  },
  CERTSHARE_BUS_LINE_TOO_LONG: {
    means: 'an IPN bus line exceeded the line bound; the stream is reopened',
    message: "IPN bus line longer than {max} bytes (got at least {length}); raise the bus line limit if the tailnet's netmap is that large",
    exit: 1,
  },
  CERTSHARE_BUS_BAD_LINE: { means: 'an IPN bus line was not valid Notify JSON and was skipped', message: 'IPN bus {what} skipped: {flaw}', exit: 1 },
  CERTSHARE_STORE_UNAVAILABLE: {
    means: 'the store could not be read or written (API outage, 403): never taken as "no certificate"',
    message: 'cannot {action} {object}: {cause}',
    exit: 1,
  },
  CERTSHARE_HOME_UNUSABLE: {
    means:
      'the federation home answers, but not as the home of this group: an unknown group (no Lease there), garbage, or a ' +
      'kubeconfig without the rights; nothing is issued on its account (no break-glass either)',
    message: 'federation home {where}: {problem}',
    exit: 1,
  },
  CERTSHARE_HOME_WRITER_FAILED: {
    means:
      "the holder of a group's Lease at the federation home let the group's newest copy pass its safety point without " +
      'renewing it (a writer whose CA failed for half the renewal margin, or a stolen federation credential holding the ' +
      'Lease): this member took the Lease over, whatever its renewTime said, to renew the copy itself',
    message: 'federation home: took the Lease over from {holder}: {reason}',
    exit: 1,
  },
  CERTSHARE_BREAK_GLASS_SPENT: {
    means:
      "a member cut off from its federation home found this window's break-glass claim taken (an issuance in it already, " +
      'its record in the Secret erased or not), or an earlier claim recording a newer certificate than its copy (a pair ' +
      'put back), or, holding no copy, a claim at all (a Secret emptied): no break-glass issuance; it serves its copy ' +
      'until the home answers',
    message: 'break-glass for {domain} replacing {window}: spent ({reason})',
    open: '{reason} says which: the claim exists, or an earlier claim recorded a newer certificate',
    exit: 1,
  },
  CERTSHARE_BREAK_GLASS_UNCLAIMED: {
    means:
      "a member cut off from its federation home could not create this window's break-glass claim (refused, timed out, " +
      'an apiserver error): no break-glass issuance without it; tried again at the next turn',
    message: 'break-glass for {domain} replacing {window}: cannot create the claim {claim}: {cause}',
    exit: 1,
  },
  CERTSHARE_STORE_CONFLICT: {
    means: "a compare-and-swap write lost to another writer's change; the state is read again",
    message: '{object} changed meanwhile: {detail}',
    exit: 1,
  },
  CERTSHARE_STORE_CORRUPT: {
    means: 'a stored object is damaged, emptied or edited by hand; it is restored without issuing',
    message: '{object} is damaged ({damage}): {consequence}',
    exit: 1,
  },
  CERTSHARE_RENEW_RESERVE: {
    means:
      "a renew request was refused: it would leave fewer than the reserve of the CA's limit for this exact name " +
      '(--name-limit) to the ordinary renewals of the window; ask again after the time given',
    message: 'renew request {id} for {domain} refused: fewer than {reserve} issuances of the name limit would be left for renewals; ask again after {until}',
    exit: 1,
  },
  CERTSHARE_NAME_LIMIT_PASSED: {
    means:
      "a renewal went ahead past the CA's limit for its exact name as the issuance ledger counts it (--name-limit): waiting for the " +
      "window would have held it past its certificate's safety point, which issuances do only for certificates living less than the " +
      'window: the ledger may hold entries no issuance accounts for (someone else writes it)',
    message: "{domain}: the name's limit would hold this renewal until {until}, past its certificate's safety point; renewing, counted",
    exit: 1,
  },
  CERTSHARE_UNTRUSTED_VALUE: {
    means:
      "a time read from an object a credential can write (a Secret's certshare.io/* annotation, an issuance ledger entry, a " +
      "break-glass claim, a Lease's duration) is out of its bound (in the future, past the retry cap, not what the ledger's " +
      "rules write, over twice the replica's own): ignored or taken at the bound, reported",
    message: '{field} of {where} ignored ({value}): {why}',
    exit: 1,
  },
  CERTSHARE_RENEW_REFUSED: {
    means: 'a renew request (certshare renew, or the annotation) was refused: the minimum interval or the issuance budget says no; ask again later',
    message: 'renew request {id} for {domain} refused ({reason}): {why}',
    exit: 1,
  },
  CERTSHARE_RELOAD_FAILED: {
    means: 'the reload command or reload signal failed or timed out (logged and counted, never fatal; tried again)',
    message: 'reload signal, pid file {pidFile}: {failure}',
    exit: 1,
  },
  CERTSHARE_HAPROXY_API: {
    means: "HAProxy's runtime API could not be reached, timed out or refused the new certificate (logged and counted; tried again)",
    message: 'HAProxy runtime API: "{command}" on {socket}: {failure}',
    exit: 1,
  },
  CERTSHARE_KUBE_HTTP: { means: 'the Kubernetes API answered with an error status', message: '{what}: HTTP {status} {body}', exit: 1 },
  CERTSHARE_KUBE_BAD_RESPONSE: {
    means: 'the Kubernetes API answered with something that is not what its protocol says (a watch event that is not JSON)',
    message: 'watch {path}: malformed event line ({bytes} bytes)',
    exit: 1,
  },
  CERTSHARE_KUBE_CONNECTION_LOST: {
    means: 'the connection to the Kubernetes API ended before its answer did (a stream reset, a closed connection)',
    message: 'Kubernetes API {channel} closed {when}',
    exit: 1,
  },
  CERTSHARE_KUBE_RESPONSE_TOO_LARGE: {
    means: 'a Kubernetes API response or watch line exceeded its bound',
    message: 'Kubernetes API {what} longer than {max} bytes (got at least {length})',
    exit: 1,
  },
  CERTSHARE_KUBE_TIMEOUT: {
    means: 'a Kubernetes API call took longer than its deadline',
    message: '{request}: no answer from the Kubernetes API within {within}',
    exit: 1,
  },
  CERTSHARE_ARI_UNSUPPORTED: {
    means: 'ACME Renewal Information cannot be asked: the directory names no renewalInfo, or the certificate has no Authority Key Identifier',
    message: 'no ACME Renewal Information for {subject}: {lack}',
    exit: 1,
  },
  CERTSHARE_ARI_NOT_FOUND: {
    means: "the CA's renewalInfo endpoint knows no such certificate (404): not issued by this CA, or a wrong --acme-directory",
    message: 'ACME {request} {url} {failure}: the CA knows no such certificate',
    exit: 1,
  },
  CERTSHARE_ARI_UNAVAILABLE: {
    means: 'the ACME directory or the renewalInfo endpoint could not be reached or answered an error status',
    message: 'ACME {request} {url} {failure}',
    exit: 1,
  },
  CERTSHARE_ARI_TIMEOUT: {
    means: 'an ACME directory or renewalInfo request took longer than its timeout',
    message: 'ACME {request} {url} took longer than {timeoutMs} ms',
    exit: 1,
  },
  CERTSHARE_ARI_BAD_RESPONSE: {
    means: 'an ACME directory or renewalInfo answer is not what RFC 9773 says (malformed JSON, a missing field, an inverted window, a window after expiry)',
    message: 'ACME {request} {url} {flaw}',
    exit: 1,
  },
  CERTSHARE_BAD_EXCHANGE: {
    means:
      'a file between certshare and its advertise agent is not what the other side writes (garbage, too large, not a regular file): the agent ' +
      'withdraws its Services, certshare retries',
    message: '{what}: {problem}',
    open: '{what} names the exchange file and {problem} how it differs from what the other side writes (garbage, size, file type)',
    exit: 1,
  },
  CERTSHARE_NOT_TERMINATING: {
    means: 'GET /leave-rotation was refused (409) because the Pod is not being deleted: nothing changed',
    message: 'GET /leave-rotation refused: {problem}',
    exit: 1,
  },
  CERTSHARE_SNAPSHOT_UNUSABLE: {
    means: "the image's start-up snapshot could not be built or started by this Node, or cannot hand a command to dist/cli/main.js",
    message: 'start-up snapshot {blob}: {failure}',
    exit: 1,
  },
  CERTSHARE_INTERNAL: {
    means: 'certshare reached code its build leaves out: a bug, whatever the configuration',
    message: 'internal: {problem}',
    open: 'a bug: {problem} names the code the build left out, which no user acts on but to report it',
    exit: 1,
  },
  CERTSHARE_FATAL: { means: 'an unexpected error ended the process; the message says what', message: 'unexpected error: {message}', exit: 1 },
} as const satisfies Record<`CERTSHARE_${string}`, CodeSpec>;

export type ErrorCode = keyof typeof ERROR_CODES;

type Slots<T extends string> = T extends `${string}{${infer Slot}}${infer Rest}` ? Slot | Slots<Rest> : never;
type SlotsOf<C extends ErrorCode> = Slots<(typeof ERROR_CODES)[C]['message']>;

/** What a site gives for a code: the sentence itself when the template's one slot is {problem}, else each slot by name. */
type MessageArgs<C extends ErrorCode> = [SlotsOf<C>] extends ['problem'] ? string : { [Slot in SlotsOf<C>]: string | number };

/** The message of `code` with its template's slots filled. */
export function errorText<C extends ErrorCode>(code: C, args: MessageArgs<C>): string {
  const slots: Record<string, string | number> = typeof args === 'string' ? { problem: args } : args;
  return ERROR_CODES[code].message.replace(/\{(\w+)\}/g, (_, slot: string) => String(slots[slot]));
}

/** An error of the family. C, the code a site gives, types the message's slots; `code` reads as any ErrorCode. */
export class CertshareError<C extends ErrorCode = ErrorCode> extends Error {
  readonly code: ErrorCode;
  /**
   * The server refused the caller (401, 403): asking again cannot succeed until someone changes the
   * credentials or the RBAC. Loops still retry on their backoff (a Role may be fixed); a deadline-bound
   * step such as the verification at stop gives up at once rather than spend the shutdown budget.
   */
  readonly refused: boolean;
  constructor(code: C, args: MessageArgs<C>, options?: { cause?: unknown; refused?: boolean }) {
    super(errorText(code, args), options);
    this.name = 'CertshareError';
    this.code = code;
    this.refused = options?.refused ?? false;
  }
}

/** True when `err` is a refusal of the caller (CertshareError.refused). */
export function isRefusal(err: unknown): boolean {
  return err instanceof CertshareError && err.refused;
}

export function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
