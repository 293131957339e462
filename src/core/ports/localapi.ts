// The narrow interface the core needs from tailscaled's LocalAPI: tests swap the transport, not the logic.
import { CertshareError } from '../errors.ts';

/** A private key PEM and its certificate chain PEM (leaf first), as returned by CertPair. */
export interface CertPair {
  keyPem: string;
  certPem: string;
}

/** One line of the IPN bus: an ipn.Notify object, Go field names (PascalCase). Only what certshare reads is typed. */
export interface IpnNotify {
  Version?: string;
  State?: number;
  ErrMessage?: string;
  /** Before tailscaled v1.104 only; resent on every change before v1.100. */
  NetMap?: { DNS?: { CertDomains?: string[] } } & Record<string, unknown>;
  SelfChange?: unknown;
  /** ipnstate.Status, in the first Notify when the mask has InitialStatus (v1.100+). */
  InitialStatus?: { CertDomains?: string[] | null } & Record<string, unknown>;
  [key: string]: unknown;
}

/** The part of ipn.Prefs certshare reads and edits (Go field names); the rest is kept as it came. */
export interface IpnPrefs {
  AdvertiseServices?: string[] | null;
  [key: string]: unknown;
}

/** An ipn.MaskedPrefs body: only the fields whose `<Field>Set` is true change. */
export interface MaskedPrefs {
  AdvertiseServicesSet: true;
  AdvertiseServices: string[];
}

export interface CertPairOptions {
  /** Ask tailscaled to renew synchronously when less than this remains (milliseconds; 0 = its own policy). */
  minValidityMs: number;
  signal: AbortSignal;
}

export interface LocalApi {
  /** Where tailscaled is reached, for messages: a socket path or a URL's origin, never credentials. Optional. */
  readonly address?: string;
  /** GET /localapi/v0/cert/<domain>?type=pair. Rejects with LocalApiError. */
  certPair(domain: string, options: CertPairOptions): Promise<CertPair>;
  /** GET /localapi/v0/watch-ipn-bus?mask=N: yields each Notify until the stream ends or errors. */
  watchIpnBus(mask: number, signal: AbortSignal): AsyncIterable<IpnNotify>;
  /** GET /localapi/v0/cert-domains (tailscaled v1.98+). */
  certDomains(signal: AbortSignal): Promise<string[]>;
  /**
   * GET /localapi/v0/status?peers=false: the parsed ipnstate.Status object (top-level `CertDomains` is the
   * cert-domains fallback for tailscaled older than v1.98). Optional: implementations may omit it.
   */
  status?(signal: AbortSignal): Promise<Record<string, unknown>>;
  /**
   * The `Tailscale-Version` header of the latest response (a watch's is known by the time its first Notify
   * is yielded); undefined before any answer. Optional: implementations may omit it.
   */
  tailscaledVersion?(): string | undefined;
  /** GET /localapi/v0/prefs. Optional: implementations may omit it (no Service advertising then). */
  prefs?(signal: AbortSignal): Promise<IpnPrefs>;
  /** PATCH /localapi/v0/prefs with a masked prefs body; resolves with the prefs after the edit. */
  editPrefs?(masked: MaskedPrefs, signal: AbortSignal): Promise<IpnPrefs>;
  /**
   * POST /localapi/v0/reload-config: whether tailscaled runs from a config file (it then puts the file's values
   * back, AdvertiseServices among them, as containerboot does whenever the file changes). Optional.
   */
  reloadConfig?(signal: AbortSignal): Promise<boolean>;
}

type LocalApiCode =
  | 'CERTSHARE_LOCALAPI_UNREACHABLE'
  | 'CERTSHARE_LOCALAPI_TIMEOUT'
  | 'CERTSHARE_LOCALAPI_HTTP'
  | 'CERTSHARE_LOCALAPI_REFUSED'
  | 'CERTSHARE_LOCALAPI_BAD_RESPONSE';

interface LocalApiErrorFields {
  /** Default: what the other fields say (a timeout, no answer, a refusal status, another status). */
  code?: LocalApiCode;
  status?: number;
  body?: string;
  retryAfterMs?: number;
  timedOut?: boolean;
  tailscaledVersion?: string;
  cause?: unknown;
}

/** The code a failed call's fields imply: a timeout, no answer at all, a status retrying cannot change, another status. */
function impliedCode(fields: LocalApiErrorFields): LocalApiCode {
  if (fields.timedOut) return 'CERTSHARE_LOCALAPI_TIMEOUT';
  if (fields.status === undefined) return 'CERTSHARE_LOCALAPI_UNREACHABLE';
  return isRefusalStatus(fields.status) ? 'CERTSHARE_LOCALAPI_REFUSED' : 'CERTSHARE_LOCALAPI_HTTP';
}

/**
 * A failed LocalAPI call, a CertshareError of a CERTSHARE_LOCALAPI_* code. `status` is the HTTP status
 * (undefined when no response arrived: socket error, timeout); `retryAfterMs` comes from a Retry-After
 * header; `body` is the plain-text error body. `message` fills the code's template: every LocalAPI code names the request and how it failed.
 */
export class LocalApiError extends CertshareError<LocalApiCode> {
  readonly status: number | undefined;
  readonly body: string;
  readonly retryAfterMs: number | undefined;
  readonly timedOut: boolean;
  /** The Tailscale-Version header of the failed response, when there was one. */
  readonly tailscaledVersion: string | undefined;
  constructor(message: { request: string; failure: string }, fields: LocalApiErrorFields) {
    super(fields.code ?? impliedCode(fields), message, { cause: fields.cause });
    this.name = 'LocalApiError';
    this.status = fields.status;
    this.body = fields.body ?? '';
    this.retryAfterMs = fields.retryAfterMs;
    this.timedOut = fields.timedOut ?? false;
    this.tailscaledVersion = fields.tailscaledVersion;
  }
}

/**
 * An HTTP status that asking again cannot change: a 4xx other than 408 (Request Timeout) and 429 (Too Many
 * Requests), e.g. a refused IPN-bus mask, access denied, no such endpoint.
 */
export function isRefusalStatus(status: number | undefined): boolean {
  return status !== undefined && status >= 400 && status < 500 && status !== 408 && status !== 429;
}

/** IPN bus mask bits (ipn.NotifyWatchOpt, tailscale.com ipn/backend.go). InitialNetMap and RateLimit are obsolete since v1.104 (400). */
export const NotifyMask = {
  WatchEngineUpdates: 1,
  InitialState: 2,
  InitialPrefs: 4,
  InitialNetMap: 8,
  NoPrivateKeys: 16,
  InitialHealthState: 128,
  RateLimit: 256,
  PeerChanges: 4096,
  NoNetMap: 8192,
  InitialStatus: 16384,
  PeerPatches: 32768,
  InProcessNoDisconnect: 65536,
} as const;

/** ipn.State values. */
export const IpnState = {
  NoState: 0,
  InUseOtherUser: 1,
  NeedsLogin: 2,
  NeedsMachineAuth: 3,
  Stopped: 4,
  Starting: 5,
  Running: 6,
} as const;
