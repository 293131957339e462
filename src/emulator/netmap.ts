// JSON bodies shaped like tailscaled's: ipn.Notify lines, the netmap.NetworkMap, the self tailcfg.Node and
// ipnstate.Status. Go field names (PascalCase). ipn.Notify has no json tags on its older pointer fields, so
// Go writes them as `null` when unset; the newer ones are `omitzero`. The emulator writes the same, so a
// client that tests `"NetMap" in notify` instead of `notify.NetMap != null` fails here as it would in production.
import { createHash } from 'node:crypto';
import { iso } from '../core/ports/clock.ts';

/** Stable made-up identity of the emulated node, derived from the emulator id. */
export interface NodeIdentity {
  nodeId: number;
  stableId: string;
  hostName: string;
  tailnetDomain: string;
  dnsName: string;
  ipv4: string;
  ipv6: string;
  nodeKey: string;
  machineKey: string;
  discoKey: string;
  userId: number;
  loginName: string;
  created: string;
  keyExpiry: string;
}

function hexOf(seed: string, bytes = 32): string {
  return createHash('sha256')
    .update(seed)
    .digest('hex')
    .slice(0, bytes * 2)
    .padEnd(bytes * 2, '0');
}

export function makeIdentity(id: string, domains: readonly string[], now: number): NodeIdentity {
  const first = domains[0] ?? 'demo.tailnet-0000.ts.net';
  const dot = first.indexOf('.');
  const hostName = dot > 0 ? first.slice(0, dot) : first;
  const tailnetDomain = dot > 0 ? first.slice(dot + 1) : 'tailnet-0000.ts.net';
  const h = createHash('sha256').update(id).digest();
  const nodeId = 1000 + (h.readUInt32BE(0) % 9_000_000);
  return {
    nodeId,
    stableId: `n${hexOf(`${id}stable`, 5).toUpperCase()}CNTRL`,
    hostName,
    tailnetDomain,
    dnsName: `${hostName}.${tailnetDomain}.`,
    ipv4: `100.${64 + (h[4]! % 64)}.${h[5]!}.${1 + (h[6]! % 254)}`,
    ipv6: `fd7a:115c:a1e0::${h.readUInt16BE(7).toString(16)}:${h.readUInt16BE(9).toString(16)}`,
    nodeKey: `nodekey:${hexOf(`${id}node`)}`,
    machineKey: `mkey:${hexOf(`${id}machine`)}`,
    discoKey: `discokey:${hexOf(`${id}disco`)}`,
    userId: 100 + (h.readUInt16BE(11) % 9000),
    loginName: 'tagged-devices',
    created: iso(now - 30 * 86_400_000),
    keyExpiry: '0001-01-01T00:00:00Z',
  };
}

/** The self tailcfg.Node (SelfNode in the netmap, the payload of a SelfChange notify). */
export function selfNode(ident: NodeIdentity, version: string): Record<string, unknown> {
  return {
    ID: ident.nodeId,
    StableID: ident.stableId,
    Name: ident.dnsName,
    User: ident.userId,
    Key: ident.nodeKey,
    KeyExpiry: ident.keyExpiry,
    Machine: ident.machineKey,
    DiscoKey: ident.discoKey,
    Addresses: [`${ident.ipv4}/32`, `${ident.ipv6}/128`],
    AllowedIPs: [`${ident.ipv4}/32`, `${ident.ipv6}/128`],
    HomeDERP: 1,
    Hostinfo: {
      IPNVersion: version,
      OS: 'linux',
      OSVersion: '6.8.0',
      Container: true,
      Env: 'kn',
      Hostname: ident.hostName,
      Machine: 'x86_64',
      GoArch: 'amd64',
    },
    Created: ident.created,
    Cap: 115,
    Tags: ['tag:k8s'],
    Online: true,
    MachineAuthorized: true,
    CapMap: { 'https://tailscale.com/cap/is-admin': null, https: null },
    ComputedName: ident.hostName,
    ComputedNameWithHost: ident.hostName,
  };
}

function peerNode(ident: NodeIdentity, index: number): Record<string, unknown> {
  const seed = `${ident.stableId}-peer-${index}`;
  const a = 64 + ((index >> 16) & 63);
  const b = (index >> 8) & 255;
  const c = index & 255;
  return {
    ID: ident.nodeId + 1 + index,
    StableID: `n${hexOf(seed, 5).toUpperCase()}CNTRL`,
    Name: `peer-${index}.${ident.tailnetDomain}.`,
    User: ident.userId,
    Key: `nodekey:${hexOf(`${seed}k`)}`,
    KeyExpiry: '2027-01-01T00:00:00Z',
    Machine: `mkey:${hexOf(`${seed}m`)}`,
    DiscoKey: `discokey:${hexOf(`${seed}d`)}`,
    Addresses: [`100.${a}.${b}.${c}/32`, `fd7a:115c:a1e0::${index.toString(16)}/128`],
    AllowedIPs: [`100.${a}.${b}.${c}/32`, `fd7a:115c:a1e0::${index.toString(16)}/128`],
    Endpoints: [`198.51.100.${1 + (index % 254)}:41641`, `10.0.${b}.${c}:41641`],
    HomeDERP: 1 + (index % 20),
    Hostinfo: { OS: 'linux', Hostname: `peer-${index}`, Services: [{ Proto: 'peerapi4', Port: 63042 }] },
    Created: ident.created,
    Tags: ['tag:k8s'],
    Online: index % 3 !== 0,
    MachineAuthorized: true,
    ComputedName: `peer-${index}`,
    ComputedNameWithHost: `peer-${index}`,
  };
}

const peersCache = new Map<string, string>();

/** A JSON array of peers at least `padBytes` long (cached: building megabytes once is enough). */
function peersJson(ident: NodeIdentity, padBytes: number): string {
  if (padBytes <= 0) return '[]';
  const key = `${ident.stableId}/${padBytes}`;
  const cached = peersCache.get(key);
  if (cached !== undefined) return cached;
  const parts: string[] = [];
  let size = 2;
  for (let i = 0; size < padBytes; i++) {
    const json = JSON.stringify(peerNode(ident, i));
    parts.push(json);
    size += json.length + 1;
  }
  const out = `[${parts.join(',')}]`;
  peersCache.clear();
  peersCache.set(key, out);
  return out;
}

/** A netmap.NetworkMap as JSON. `CertDomains` is omitted when empty (omitempty on tailcfg.DNSConfig). */
export function netMapJson(ident: NodeIdentity, version: string, certDomains: readonly string[], padBytes: number): string {
  const dns: Record<string, unknown> = {
    Resolvers: [{ Addr: '100.100.100.100' }],
    Domains: [ident.tailnetDomain],
    Proxied: true,
  };
  if (certDomains.length > 0) dns.CertDomains = [...certDomains];
  const head = {
    SelfNode: selfNode(ident, version),
    NodeKey: ident.nodeKey,
    Expiry: ident.keyExpiry,
    MachineKey: ident.machineKey,
  };
  const tail = {
    DNS: dns,
    PacketFilter: null,
    PacketFilterRules: null,
    SSHPolicy: null,
    CollectServices: false,
    DERPMap: {
      Regions: {
        '1': { RegionID: 1, RegionCode: 'nyc', RegionName: 'New York City', Nodes: [{ Name: '1f', RegionID: 1, HostName: 'derp1f.tailscale.com' }] },
      },
    },
    TKAEnabled: false,
    TKAHead: '',
    Domain: ident.tailnetDomain,
    DomainAuditLogID: hexOf(ident.tailnetDomain, 16),
    UserProfiles: {
      [String(ident.userId)]: { ID: ident.userId, LoginName: ident.loginName, DisplayName: 'Tagged Devices', ProfilePicURL: '' },
    },
  };
  // Peers sits between the head and the tail, as in the Go struct; spliced as a string so megabytes of
  // padding are serialised once.
  const headJson = JSON.stringify(head);
  const tailJson = JSON.stringify(tail);
  return `${headJson.slice(0, -1)},"Peers":${peersJson(ident, padBytes)},${tailJson.slice(1)}`;
}

interface NotifyParts {
  sessionId?: string;
  state?: number;
  selfChangeJson?: string | undefined;
  initialStatusJson?: string;
  netMapJson?: string;
  /** The release's Notify has a NetMap field (before v1.104); default true. */
  netMapField?: boolean;
  healthJson?: string;
}

/** One ipn.Notify line (no trailing newline), Go field order, nulls where Go writes them. */
export function notifyJson(version: string, parts: NotifyParts): string {
  let s = `{"Version":${JSON.stringify(version)}`;
  if (parts.sessionId) s += `,"SessionID":${JSON.stringify(parts.sessionId)}`;
  s += `,"ErrMessage":null,"LoginFinished":null,"State":${parts.state ?? 'null'},"Prefs":null`;
  if (parts.selfChangeJson) s += `,"SelfChange":${parts.selfChangeJson}`;
  if (parts.initialStatusJson) s += `,"InitialStatus":${parts.initialStatusJson}`;
  if (parts.netMapField ?? true) s += `,"NetMap":${parts.netMapJson ?? 'null'}`;
  s += `,"Engine":null,"BrowseToURL":null,"DriveShares":null`;
  if (parts.healthJson) s += `,"Health":${parts.healthJson}`;
  return `${s}}`;
}

/** A valid Notify line of exactly `bytes` bytes (or the smallest possible, if `bytes` is below it): a health update with a long text. */
export function paddedNotifyJson(version: string, bytes: number, netMapField = true): string {
  const build = (text: string): string =>
    notifyJson(version, {
      netMapField,
      healthJson: JSON.stringify({
        Warnings: { 'emulator-padding': { WarnableCode: 'emulator-padding', Severity: 'low', Title: 'padding', Text: text } },
      }),
    });
  const base = build('').length;
  return build('x'.repeat(Math.max(0, bytes - base)));
}

/** A line that is not JSON: a Notify cut short, as a torn write would leave it. */
export function malformedLine(version: string): string {
  return `{"Version":${JSON.stringify(version)},"ErrMessage":null,"LoginFinished":null,"State":6,"NetMap":{"SelfNode":{"ID":`;
}

/** ipnstate.Status, trimmed to the fields a client plausibly reads. */
export function statusJson(ident: NodeIdentity, version: string, certDomains: readonly string[]): string {
  return JSON.stringify({
    Version: version,
    TUN: false,
    BackendState: 'Running',
    HaveNodeKey: true,
    AuthURL: '',
    TailscaleIPs: [ident.ipv4, ident.ipv6],
    Self: {
      ID: ident.stableId,
      PublicKey: ident.nodeKey,
      HostName: ident.hostName,
      DNSName: ident.dnsName,
      OS: 'linux',
      UserID: ident.userId,
      TailscaleIPs: [ident.ipv4, ident.ipv6],
      Online: true,
      Created: ident.created,
      Tags: ['tag:k8s'],
    },
    Health: [],
    MagicDNSSuffix: ident.tailnetDomain,
    CurrentTailnet: { Name: ident.tailnetDomain, MagicDNSSuffix: ident.tailnetDomain, MagicDNSEnabled: true },
    // A nil slice in Go: null when there are none.
    CertDomains: certDomains.length > 0 ? [...certDomains] : null,
    Peer: null,
    User: { [String(ident.userId)]: { ID: ident.userId, LoginName: ident.loginName, DisplayName: 'Tagged Devices' } },
    ClientVersion: null,
  });
}
