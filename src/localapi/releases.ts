import { NotifyMask } from '../core/ports/localapi.ts';

// What each tailscaled release does on the LocalAPI surface certshare uses, and the one decision that
// follows from it: which IPN-bus mask to ask for. Every threshold below was read in the tailscale.com
// Go module source (`go mod download tailscale.com@vX`), file paths relative to the module root:
//
// | release | what changed (source)                                                                        |
// |---------|----------------------------------------------------------------------------------------------|
// | 1.96    | Notify.NetMap resent to every watcher on each netmap change; no SelfChange, no cert-domains   |
// |         | route; ipnstate.Status.CertDomains exists (ipn/backend.go, ipn/ipnstate/ipnstate.go)          |
// | 1.98    | Notify.SelfChange (ipn/backend.go:130) sent together with the resent NetMap                   |
// |         | (ipn/ipnlocal/local.go:1918); GET /localapi/v0/cert-domains (ipn/localapi/localapi.go:75)      |
// | 1.100   | NotifyInitialStatus = 1<<14 and Notify.InitialStatus (ipn/backend.go:143,200); on Linux the    |
// |         | netmap is no longer resent, only SelfChange (ipn/ipnlocal/bus.go goosGetsLegacyNetmapNotify);  |
// |         | masks are not validated                                                                      |
// | 1.102   | ValidateNotifyWatchOpt: 400 "NotifyRateLimit is incompatible with new-style IPN bus           |
// |         | subscription bits <bits>" when 1<<8 is combined with PeerChanges|NoNetMap|InitialStatus|      |
// |         | PeerPatches; 400 on 1<<16 (ipn/backend.go:283, ipn/localapi/localapi.go:905-912)              |
// | 1.104   | 1<<3 and 1<<8 are obsolete: 400 "the NotifyRateLimit IPN bus subscription bit is no longer    |
// |         | supported" / "the NotifyInitialNetMap IPN bus subscription bit is no longer supported; seed   |
// |         | from NotifyInitialStatus instead" (ipn/backend.go:293-301); Notify.NetMap is gone            |
//
// Releases before a feature ignore mask bits they do not know (no validation before 1.102), so
// InitialState|NoPrivateKeys|InitialStatus is accepted by every release from 1.96 on; only releases
// without InitialStatus need the netmap bits to learn the domains from the bus.

interface TailscaledVersion {
  major: number;
  minor: number;
  patch: number;
  /** As reported (`Tailscale-Version` header or Notify.Version), e.g. "1.104.5-t0a1b2c3d4-g5e6f7". */
  text: string;
}

/** Parses version.Long()'s forms ("x.y.z-hash", "x.y.z-devYYYYMMDD-thash", "x.y.z-ERR-BuildInfo"); undefined otherwise. */
export function parseTailscaledVersion(text: string | undefined): TailscaledVersion | undefined {
  if (text === undefined) return undefined;
  const m = /^\s*v?(\d+)\.(\d+)\.(\d+)(?:[-+][\w.+-]*)?\s*$/.exec(text);
  if (!m) return undefined;
  return { major: Number(m[1]), minor: Number(m[2]), patch: Number(m[3]), text: text.trim() };
}

function atLeast(v: TailscaledVersion, major: number, minor: number): boolean {
  return v.major > major || (v.major === major && v.minor >= minor);
}

/** The LocalAPI behaviour of one release, as far as certshare (and its emulator) care. */
export interface ReleaseFeatures {
  /** Notify.SelfChange on netmap changes (1.98+). */
  selfChange: boolean;
  /** GET /localapi/v0/cert-domains exists (1.98+); before, it is a 404 and Status.CertDomains is the source. */
  certDomainsEndpoint: boolean;
  /** NotifyInitialStatus / Notify.InitialStatus (1.100+). */
  initialStatus: boolean;
  /** The full NetMap is resent on every change (before 1.100; later only on Windows/macOS/iOS). */
  resendsNetMap: boolean;
  /** Notify has a NetMap field at all (before 1.104). */
  netMapField: boolean;
  /** 400 when RateLimit is combined with the new-style bits; 400 on InProcessNoDisconnect (1.102+). */
  validatesMask: boolean;
  /** 400 on the obsolete bits InitialNetMap (1<<3) and RateLimit (1<<8) (1.104+). */
  refusesObsoleteBits: boolean;
  /** tailcfg.CurrentCapabilityVersion (tailcfg/tailcfg.go), sent as the `Tailscale-Cap` response header. */
  capabilityVersion: number;
}

// tailcfg.CurrentCapabilityVersion of each stable release line (the same for every patch release read).
const CAPABILITY_VERSIONS: ReadonlyArray<[minor: number, cap: number]> = [
  [104, 148],
  [102, 142],
  [100, 141],
  [98, 138],
  [96, 133],
];

/** Features of a release; an unknown or unparsable version is taken as the newest release. */
export function releaseFeatures(version: TailscaledVersion | undefined): ReleaseFeatures {
  const v = version ?? { major: 1, minor: Number.MAX_SAFE_INTEGER, patch: 0, text: '' };
  return {
    selfChange: atLeast(v, 1, 98),
    certDomainsEndpoint: atLeast(v, 1, 98),
    initialStatus: atLeast(v, 1, 100),
    resendsNetMap: !atLeast(v, 1, 100),
    netMapField: !atLeast(v, 1, 104),
    validatesMask: atLeast(v, 1, 102),
    refusesObsoleteBits: atLeast(v, 1, 104),
    capabilityVersion: (CAPABILITY_VERSIONS.find(([minor]) => atLeast(v, 1, minor)) ?? CAPABILITY_VERSIONS.at(-1)!)[1],
  };
}

/** The mask on releases with InitialStatus: its first Notify carries InitialStatus.CertDomains. @forTests */
export const STATUS_WATCH_MASK = NotifyMask.InitialState | NotifyMask.NoPrivateKeys | NotifyMask.InitialStatus;
/** The mask on releases without it: the first Notify carries the NetMap, later NetMaps rate-limited. @forTests */
export const NETMAP_WATCH_MASK = NotifyMask.InitialState | NotifyMask.InitialNetMap | NotifyMask.NoPrivateKeys | NotifyMask.RateLimit;

export interface WatchPlan {
  mask: number;
  /** Where the first Notify carries the domains: InitialStatus, or NetMap (releases without InitialStatus). */
  initialDomains: 'InitialStatus' | 'NetMap';
  /** Why this mask (for the log line). */
  reason: string;
}

/**
 * The IPN-bus mask for a release. `version` is the last one tailscaled reported (undefined before the
 * first answer); `refusedBits` are bits a 400 from this tailscaled named. Unknown versions get the
 * InitialStatus mask, which every release accepts; releases without InitialStatus get the netmap bits.
 */
export function planWatch(version: TailscaledVersion | undefined, refusedBits = 0): WatchPlan {
  const features = releaseFeatures(version);
  const named = version ? `tailscaled ${version.text}` : 'tailscaled of unknown version';
  if (features.initialStatus || (refusedBits & NotifyMask.InitialNetMap) !== 0) {
    return { mask: STATUS_WATCH_MASK, initialDomains: 'InitialStatus', reason: `${named}: initial status, then SelfChange` };
  }
  const mask = NETMAP_WATCH_MASK & ~refusedBits;
  return { mask, initialDomains: 'NetMap', reason: `${named} has no InitialStatus: initial netmap, then resent netmaps` };
}

/** Mask bits that a watch-ipn-bus 400 body says this release refuses (the two obsolete bits; 0 when none is named). */
export function refusedBitsIn(body: string): number {
  let bits = 0;
  // 1.102: "NotifyRateLimit is incompatible with ..."; 1.104: "the NotifyRateLimit ... bit is no longer supported".
  if (/\bNotifyRateLimit\b/.test(body)) bits |= NotifyMask.RateLimit;
  if (/\bNotifyInitialNetMap\b/.test(body)) bits |= NotifyMask.InitialNetMap;
  return bits;
}
