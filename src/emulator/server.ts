// The LocalAPI emulator: an HTTP/1.1 server on a unix socket or TCP port that answers like tailscaled's
// LocalAPI for what certshare uses (IPN bus, cert-domains, status, cert pairs), issues real certificates
// from an in-memory CA with tailscaled's caching policy, and fails on demand (scripted faults).
import { EventEmitter } from 'node:events';
import { createServer } from 'node:http';
import { randomBytes } from 'node:crypto';
import { errorMessage } from '../core/errors.ts';
import { silentLogger, type Logger } from '../core/ports/logger.ts';
import { IpnBus, type NetmapStyle } from './bus.ts';
import { CertDomains } from './cert-domains.ts';
import type { CertEndpointDeps } from './cert-endpoint.ts';
import type { ControlTarget } from './control.ts';
import { ACME_PREFIX, AriDesk, type AriCertificateRecord, type AriOverride, type AriSelector } from './ari.ts';
import { describeFault, FaultQueue, normalizeFault, type Fault } from './faults.ts';
import { sendError } from './http-util.ts';
import { loadRegisteredDomainRule } from '../core/issuance/registered-domain.ts';
import type { AcmeLimits } from './acme-limits.ts';
import { Issuer, type IssuerOptions } from './issuer.ts';
import { increment, type LocalApiContext, RequestCounts, routeLocalApi, serveAcme } from './localapi-routes.ts';
import { listenOn, parseListen } from './listen.ts';
import { makeIdentity, type NodeIdentity } from './netmap.ts';
import { EmulatedPrefs, type PrefsWrite } from './prefs.ts';
import { parseTailscaledVersion, releaseFeatures, type ReleaseFeatures } from '../localapi/releases.ts';

export type { NetmapStyle } from './bus.ts';

export const DEFAULT_DOMAIN = 'demo.tailnet-0000.ts.net';
const DEFAULT_CERT_LIFETIME_MS = 90 * 86_400_000;
/** The release emulated by default: the current one. */
export const DEFAULT_TAILSCALED_VERSION = '1.104.5';
/** The release emulated for a style when only the style is given: the current one, or one that resends the netmap. */
export const DEFAULT_VERSIONS: Record<NetmapStyle, string> = { selfchange: DEFAULT_TAILSCALED_VERSION, resend: '1.96.4' };

export interface EmulatorOptions {
  /** Unix socket path, or HOST:PORT for TCP (port 0 = a free port). Default ./tailscaled.sock. */
  listen?: string;
  /** Cert domains of the emulated node. Default [demo.tailnet-0000.ts.net]. */
  domains?: string[];
  /** The domains become visible (bus, cert-domains, status, cert endpoint) only after this delay. Default 0. */
  domainDelayMs?: number;
  /** Leaf lifetime. Default 90 days. */
  certLifetimeMs?: number;
  /** Backdate notBefore by this much, leaves valid for certLifetimeMs from issuance (see Issuer). Default: 1m within the lifetime. */
  certBackdateMs?: number;
  /** The CA's clock minus the emulator's, either sign. Default 0. */
  clockSkewMs?: number;
  /**
   * The CA to sign with, as PEM (its certificate and PKCS#8 key): one CA behind several emulators, as Let's
   * Encrypt is behind every tailscaled, so a client trusts them all with one anchor. Default: a CA of its own.
   */
  ca?: { certPem: string; keyPem: string };
  /** Hand out less validity than min_validity asks for, by this much. Default: never. */
  certShortByMs?: number;
  /**
   * 'resend' (before v1.100: a full NetMap per change) or 'selfchange' (v1.100+). Follows from
   * tailscaledVersion; alone, it picks DEFAULT_VERSIONS[style]; contradicting the version is an error.
   */
  netmapStyle?: NetmapStyle;
  /** Pad every NetMap with a Peers array to at least this many bytes (big-line tests). Default 0. */
  netmapPadBytes?: number;
  /**
   * tailscaled sends one initial Notify carrying Version, SessionID+State (InitialState) and NetMap
   * (InitialNetMap). true splits it into three lines (Version; State; NetMap) to test clients that must
   * not assume either shape. Default false.
   */
  splitInitialNotify?: boolean;
  /**
   * The emulated release (x.y.z): what the IPN bus accepts and sends, which endpoints exist; reported in
   * Tailscale-Version and Notify.Version. Default 1.104.5 (or DEFAULT_VERSIONS[netmapStyle]).
   */
  tailscaledVersion?: string;
  /** Time source for issuance and the cache (tests move it). Default Date.now. */
  clock?: { now(): number };
  /** The CA's own clock, where notBefore/notAfter are stamped (plus clockSkewMs): a test's CA off tailscaled's. Default `clock`. */
  caClock?: { now(): number };
  /** Append one JSON line per real issuance to this file (shared by several emulators). */
  ledgerPath?: string;
  /** Also append one `{"kind":"request"}` line per cert request to the ledger (see ledger.ts). Default false. */
  ledgerRequests?: boolean;
  /** Names this emulator in the ledger, logs and stats. Default emu-<random>. */
  id?: string;
  /** Faults injected at start (objects or "target:kind:key=value" specs). */
  faults?: Array<Fault | string>;
  /**
   * Past 2/3 of the lifetime with min_validity=0, tailscaled returns the cached pair and renews in the
   * background (true, the default); false renews synchronously instead.
   */
  asyncRenewal?: boolean;
  /** Let's Encrypt's limits on new orders (new certificates per registered domain, orders per account). Default: none. */
  limits?: AcmeLimits;
  /**
   * Also serve the ACME routes (directory, renewalInfo: ari.ts) on this TCP HOST:PORT (port 0 = a free one),
   * for an emulator whose LocalAPI is a unix socket. A TCP emulator serves them on its own listener too.
   */
  acmeListen?: string;
  /** The default ARI window: the 2/3 point of the lifetime +/- this. Default 24 h (pebble). */
  ariHalfWidthMs?: number;
  /** Retry-After on renewalInfo answers, seconds. Default 21600 (pebble, Let's Encrypt). */
  ariRetryAfterSeconds?: number;
  /**
   * Whether the client may edit prefs (PATCH /localapi/v0/prefs): 'denied' answers 403 as tailscaled does to a
   * uid that is neither root nor its operator. Default 'allowed'.
   */
  prefsWrite?: PrefsWrite;
  /**
   * Control's rule for Tailscale Services: each of these domains (`<label>.<tailnet>.ts.net`) is a cert domain
   * only while the prefs advertise `svc:<label>` and, when `tags` is not empty, AdvertiseTags hold one of them
   * (Tailscale issue #20716: `tailscale cert` refuses a Service's domain on a node that does not host it).
   */
  serviceHosts?: { domains: string[]; tags?: string[] };
  logger?: Logger;
}

interface EmulatorStats {
  id: string;
  version: string;
  netmapStyle: NetmapStyle;
  address: string;
  certDomains: string[];
  /** Real issuances (newly signed leaves) per domain. Faulted or failed requests never count. */
  issuances: Record<string, number>;
  issuancesTotal: number;
  /** Every request to the cert endpoint, per requested domain. */
  certRequests: Record<string, number>;
  /** Per domain, per outcome ("200", "429", "500", "reset", "hang"...). */
  certResponses: Record<string, Record<string, number>>;
  /** Applications per fault ("cert:rate_limit_429": 2). */
  faultsApplied: Record<string, number>;
  pendingFaults: Array<Fault & { remaining: number | 'always' }>;
  /** Bus streams open now. */
  busConnections: number;
  busConnectionsTotal: number;
  /** LocalAPI requests per path (cert requests under /localapi/v0/cert/), answered or refused; control API not counted. */
  requests: Record<string, number>;
  /** watch-ipn-bus requests refused (400 on the mask). */
  busRefusals: number;
  /** New orders the CA's limits refused (--limit-new-certs, --limit-orders). */
  rateLimitRefusals: { newCerts: number; orders: number };
  /** renewalInfo requests by status ("200", "404", "400"). */
  ariRequests: Record<string, number>;
}

/**
 * Events on `emulator.events`: `certRequest` {domain,type,minValidity}, `certResponse` {domain,status},
 * `issued` {domain,serial,notBefore,notAfter,trigger}, `fault` {fault,domain?}, `busConnect` {mask},
 * `busDisconnect` {mask}, `certDomains` {domains}, `renewalInfo` {certId,status} (an ARI request answered).
 * @forTests
 */
export interface Emulator {
  readonly id: string;
  /** The socket path, or http://HOST:PORT. */
  readonly address: string;
  readonly socketPath: string | undefined;
  readonly port: number | undefined;
  readonly version: string;
  readonly events: EventEmitter;
  stats(): EmulatorStats;
  certDomains(): string[];
  addCertDomain(domain: string): void;
  removeCertDomain(domain: string): void;
  injectFault(fault: Fault | string): void;
  clearFaults(): void;
  /** Ends every open bus stream now; returns how many. */
  dropBusConnections(): number;
  /** tailscaled's prefs as /localapi/v0/prefs serves them (AdvertiseServices, who may edit them). */
  readonly prefs: EmulatedPrefs;
  /** The ACME directory URL (http://HOST:PORT/acme/directory) when ARI is reachable over TCP, else undefined. */
  readonly acmeDirectoryUrl: string | undefined;
  /** Sets the CA's ARI answer for a certificate (undefined: the default window again). */
  setRenewalInfo(selector: AriSelector, override: AriOverride | undefined): AriCertificateRecord;
  /** Revokes a certificate: its ARI window moves an hour into the past, as pebble answers. */
  revokeCertificate(selector: AriSelector): AriCertificateRecord;
  /** Every certificate signed, with its ARI ID and the answer it gets now. */
  ariCertificates(): AriCertificateRecord[];
  /** The CA certificate PEM (the chain's last element), for clients that want to trust it. */
  caCertPem(): Promise<string>;
  /** Resolves when no issuance is in flight (background renewals included). */
  idle(): Promise<void>;
  /** Stops listening and ends everything: bus streams, slow and hanging requests, idle connections. */
  close(): Promise<void>;
}

/** A broken rule of EmulatorOptions, worded for the caller of startEmulator and for the command line. */
interface OptionsProblem {
  api: string;
  /** With the flags' names (src/emulator/options.ts). */
  /** The flag of `certshare emulator` and the rule it breaks. */
  cli: { flag: string; rule: string };
}

/**
 * Every rule of EmulatorOptions that the type does not hold, checked in one place before anything starts
 * (by startEmulator, and by the command line before it): the first broken one, or undefined.
 */
export function emulatorOptionsProblem(options: EmulatorOptions): OptionsProblem | undefined {
  const listenProblem = (value: string, flag: string): OptionsProblem | undefined => {
    try {
      parseListen(value);
      return undefined;
    } catch (err) {
      return { api: errorMessage(err), cli: { flag: `--${flag}`, rule: `${errorMessage(err)}` } };
    }
  };
  const listen = listenProblem(options.listen ?? './tailscaled.sock', 'listen');
  if (listen) return listen;
  const asked = options.netmapStyle;
  if (asked !== undefined && asked !== 'resend' && asked !== 'selfchange') {
    return {
      api: `netmapStyle must be "resend" or "selfchange", not "${String(asked)}"`,
      cli: { flag: '--netmap-style', rule: `want selfchange or resend, not "${asked}"` },
    };
  }
  const version = options.tailscaledVersion;
  if (version !== undefined) {
    const parsed = parseTailscaledVersion(version);
    if (!parsed) {
      return {
        api: `tailscaledVersion must look like 1.104.5, not "${version}"`,
        cli: { flag: '--tailscaled-version', rule: `want a release like ${DEFAULT_TAILSCALED_VERSION}, not "${version}"` },
      };
    }
    const style = releaseFeatures(parsed).resendsNetMap ? 'resend' : 'selfchange';
    if (asked !== undefined && asked !== style) {
      return {
        api: `netmapStyle "${asked}" contradicts tailscaled ${version}, whose style is "${style}" (v1.100 stopped resending the netmap)`,
        cli: { flag: '--netmap-style', rule: `${asked} contradicts --tailscaled-version ${version} (style ${style})` },
      };
    }
  }
  if (options.certLifetimeMs !== undefined && !(options.certLifetimeMs >= 1000)) {
    return { api: 'certLifetimeMs must be at least 1000 (one second)', cli: { flag: '--cert-lifetime', rule: 'must be at least 1s' } };
  }
  if (options.acmeListen !== undefined) {
    const acme = listenProblem(options.acmeListen, 'acme-listen');
    if (acme) return acme;
    if (parseListen(options.acmeListen).kind !== 'tcp') {
      return {
        api: `acmeListen must be HOST:PORT, not "${options.acmeListen}"`,
        cli: { flag: '--acme-listen', rule: `want HOST:PORT (TCP), not "${options.acmeListen}"` },
      };
    }
  }
  if (options.ledgerRequests && options.ledgerPath === undefined)
    return { api: 'ledgerRequests needs ledgerPath', cli: { flag: '--ledger-requests', rule: 'needs --ledger' } };
  return undefined;
}

export async function startEmulator(options: EmulatorOptions = {}): Promise<Emulator> {
  const problem = emulatorOptionsProblem(options);
  if (problem) throw new Error(problem.api);
  const id = options.id ?? `emu-${randomBytes(3).toString('hex')}`;
  const release = releaseOf(options);
  const { version, style } = release;
  const clock = options.clock ?? { now: () => Date.now() };
  const logger = (options.logger ?? silentLogger).child({ emulator: id });
  const events = new EventEmitter();
  const configured = [...new Set(options.domains ?? [DEFAULT_DOMAIN])];
  const certLifetimeMs = options.certLifetimeMs ?? DEFAULT_CERT_LIFETIME_MS;
  const identity = makeIdentity(id, configured, Date.now());
  const faults = new FaultQueue();
  const counts = new RequestCounts();
  const closing = new AbortController();
  const ari = ariDeskFor(options, clock, logger, events);
  const issuer = await issuerFor(options, { id, certLifetimeMs, clock, logger, events, onLeaf: (domain, leaf) => ari.issued(domain, leaf) });
  const onFaultApplied = faultReporter(counts, logger, events);
  const prefs = new EmulatedPrefs(options.prefsWrite);
  const domains = new CertDomains(logger, events, () => bus.announceCertDomains());
  const bus = ipnBusFor(options, { release, identity, domains, faults, onFaultApplied, logger, events });
  const injectFault = faultInjector(faults, bus, logger);
  let address = '';
  const { features } = release;
  const stats = (): EmulatorStats => statsOf({ id, version, style, address, certDomains: domains.sorted(), issuer, ari, counts, faults, bus });
  const control = controlOf({ stats, faults, injectFault, domains, bus, ari });
  const cert: CertEndpointDeps = {
    ...{ issuer, clock, certLifetimeMs, logger, events, closing: closing.signal },
    takeFault: (domain) => faults.takeCert(domain),
    visibleDomains: () => domains.sorted(),
    countResponse: (domain, outcome) => counts.certResponse(domain, outcome),
    onFaultApplied: (fault, domain) => onFaultApplied(fault, domain),
  };
  const ledger = options.ledgerPath && options.ledgerRequests ? { path: options.ledgerPath, emulator: id } : undefined;
  const context: LocalApiContext = { version, features, identity, closing: closing.signal, control, ari, bus, counts, prefs, cert, ledger, logger };
  const listening = await listen(options, context);
  address = listening.bound.address;
  for (const f of options.faults ?? []) injectFault(f);
  const serviceDomains = new Set(options.serviceHosts?.domains ?? []);
  prefs.onEdit = () => grantServiceDomains(options.serviceHosts, prefs, domains);
  domains.show(
    configured.filter((d) => !serviceDomains.has(d)),
    options.domainDelayMs ?? 0,
  );
  grantServiceDomains(options.serviceHosts, prefs, domains);
  logger.info(
    { address, version, netmapStyle: style, certDomains: configured, domainDelayMs: options.domainDelayMs ?? 0, certLifetimeMs },
    'emulator listening',
  );
  let closed: Promise<void> | undefined;
  const close = (): Promise<void> => {
    closed ??= (async () => {
      domains.stop();
      closing.abort();
      await listening.close(() => bus.dropAll());
      await issuer.idle();
      logger.info({}, 'emulator closed');
    })();
    return closed;
  };
  return {
    ...control,
    stats,
    id,
    address,
    socketPath: listening.bound.socketPath,
    port: listening.bound.port,
    version,
    events,
    injectFault,
    prefs,
    acmeDirectoryUrl: listening.acmeDirectoryUrl,
    caCertPem: async () => (await issuer.ca()).certPem,
    idle: () => issuer.idle(),
    close,
  };
}

/** Each Service domain a cert domain while the node hosts the Service (EmulatorOptions.serviceHosts). */
function grantServiceDomains(hosts: EmulatorOptions['serviceHosts'], prefs: EmulatedPrefs, domains: CertDomains): void {
  if (!hosts) return;
  const advertised = new Set(prefs.advertiseServices);
  const wanted = hosts.tags ?? [];
  const tagged = wanted.length === 0 || prefs.advertiseTags.some((t) => wanted.includes(t));
  for (const domain of hosts.domains) {
    if (tagged && advertised.has(`svc:${domain.split('.')[0]}`)) domains.add(domain);
    else domains.remove(domain);
  }
}

/** The control API's view of the emulator (control.ts), also part of what startEmulator returns. */
function controlOf(parts: {
  stats: () => EmulatorStats;
  faults: FaultQueue;
  injectFault: (fault: Fault) => void;
  domains: CertDomains;
  bus: IpnBus;
  ari: AriDesk;
}): ControlTarget {
  const { faults, domains, bus, ari } = parts;
  return {
    stats: parts.stats,
    pendingFaults: () => faults.pending(),
    injectFault: parts.injectFault,
    clearFaults: () => faults.clear(),
    addCertDomain: (domain) => domains.add(domain),
    removeCertDomain: (domain) => domains.remove(domain),
    certDomains: () => domains.sorted(),
    dropBusConnections: () => bus.dropAll(),
    setRenewalInfo: (selector, override) => ari.setAnswer(selector, override),
    revokeCertificate: (selector) => ari.revoke(selector),
    ariCertificates: () => ari.certificates(),
  };
}

/** Counts, logs and announces a fault as it is applied (to a domain's cert request, or to the IPN bus). */
/** The IPN bus of the emulated release, announcing `domains` and applying the bus faults queued. */
function ipnBusFor(
  options: EmulatorOptions,
  parts: {
    release: ReturnType<typeof releaseOf>;
    identity: NodeIdentity;
    domains: CertDomains;
    faults: FaultQueue;
    onFaultApplied: (fault: Fault) => void;
    logger: Logger;
    events: EventEmitter;
  },
): IpnBus {
  const { release, domains, faults, onFaultApplied } = parts;
  return new IpnBus({
    ...release,
    padBytes: options.netmapPadBytes ?? 0,
    splitInitialNotify: options.splitInitialNotify ?? false,
    identity: parts.identity,
    certDomains: () => domains.sorted(),
    takeFaults: () => faults.takeAllBus(),
    onFaultApplied: (fault) => onFaultApplied(fault),
    logger: parts.logger,
    events: parts.events,
  });
}

/** Emulator.injectFault: queues the fault; a bus fault hits the open streams at once (one application), what remains waits for new streams. */
function faultInjector(faults: FaultQueue, bus: IpnBus, logger: Logger): (input: Fault | string) => void {
  return (input) => {
    const fault = normalizeFault(input);
    faults.add(fault);
    logger.info({ fault: describeFault(fault), count: fault.count ?? 1 }, 'fault injected');
    if (fault.target === 'bus' && bus.applyNow(fault)) faults.consume(fault);
  };
}

function faultReporter(counts: RequestCounts, logger: Logger, events: EventEmitter): (fault: Fault, domain?: string) => void {
  return (fault, domain) => {
    increment(counts.faultsApplied, describeFault(fault));
    logger.info({ fault: describeFault(fault), ...(domain ? { domain } : {}) }, 'fault applied');
    events.emit('fault', { fault, ...(domain ? { domain } : {}) });
  };
}

/** The CA's ACME Renewal Information desk. */
function ariDeskFor(options: EmulatorOptions, clock: { now(): number }, logger: Logger, events: EventEmitter): AriDesk {
  return new AriDesk({
    clock,
    halfWidthMs: options.ariHalfWidthMs,
    retryAfterSeconds: options.ariRetryAfterSeconds,
    logger,
    onRequest: (certId, status) => events.emit('renewalInfo', { certId, status }),
  });
}

/** The stats the control API and the tests read. */
function statsOf(parts: {
  id: string;
  version: string;
  style: NetmapStyle;
  address: string;
  certDomains: string[];
  issuer: Issuer;
  ari: AriDesk;
  counts: RequestCounts;
  faults: FaultQueue;
  bus: IpnBus;
}): EmulatorStats {
  const { issuer, counts, bus } = parts;
  return {
    id: parts.id,
    version: parts.version,
    netmapStyle: parts.style,
    address: parts.address,
    certDomains: parts.certDomains,
    issuances: Object.fromEntries(issuer.issuances),
    issuancesTotal: [...issuer.issuances.values()].reduce((a, b) => a + b, 0),
    rateLimitRefusals: { ...issuer.limiter.refusals },
    ariRequests: Object.fromEntries(parts.ari.requests),
    certRequests: Object.fromEntries(counts.certRequests),
    certResponses: Object.fromEntries([...counts.certResponses].map(([d, m]) => [d, Object.fromEntries(m)])),
    faultsApplied: Object.fromEntries(counts.faultsApplied),
    pendingFaults: parts.faults.pending(),
    busConnections: bus.openStreams,
    busConnectionsTotal: bus.total,
    requests: Object.fromEntries(counts.requests),
    busRefusals: counts.busRefusals,
  };
}

/** The release emulated: asked for, or the default of the netmap style asked for; and what it does. */
function releaseOf(options: EmulatorOptions): { version: string; features: ReleaseFeatures; style: NetmapStyle } {
  const version = options.tailscaledVersion ?? DEFAULT_VERSIONS[options.netmapStyle ?? 'selfchange'];
  const features = releaseFeatures(parseTailscaledVersion(version)!);
  return { version, features, style: features.resendsNetMap ? 'resend' : 'selfchange' };
}

/** The emulator's CA and cert endpoint's issuance, as the options shape them. */
async function issuerFor(
  options: EmulatorOptions,
  own: { id: string; certLifetimeMs: number; clock: { now(): number }; logger: Logger; events: EventEmitter; onLeaf: IssuerOptions['onLeaf'] },
): Promise<Issuer> {
  return new Issuer({
    ...own,
    certBackdateMs: options.certBackdateMs,
    clockSkewMs: options.clockSkewMs,
    caClock: options.caClock,
    certShortByMs: options.certShortByMs,
    ca: options.ca,
    ledgerPath: options.ledgerPath,
    ledgerKinds: options.ledgerRequests ?? false,
    asyncRenewal: options.asyncRenewal ?? true,
    limits: options.limits,
    registeredDomain: options.limits?.newCertsPerRegisteredDomain ? await loadRegisteredDomainRule() : undefined,
  });
}

/** The LocalAPI's listener, and the ACME side's own one when asked for (a LocalAPI on a unix socket: fetch speaks TCP only). */
async function listen(options: EmulatorOptions, context: LocalApiContext) {
  const server = createServer({ keepAliveTimeout: 5000 }, (req, res) => {
    routeLocalApi(req, res, context).catch((err: unknown) => {
      context.logger.error({ url: req.url, err: errorMessage(err) }, 'request failed');
      sendError(res, 500, errorMessage(err));
    });
  });
  // A hanging request must not be cut by Node's default request timeout (5 minutes).
  server.requestTimeout = 0;
  server.headersTimeout = 60_000;
  const bound = await listenOn(server, parseListen(options.listen ?? './tailscaled.sock'));
  const acmeTarget = options.acmeListen === undefined ? undefined : parseListen(options.acmeListen);
  const acmeServer = acmeTarget ? createServer({ keepAliveTimeout: 5000 }, (req, res) => serveAcme(req, res, context.ari)) : undefined;
  let acmeDirectoryUrl = bound.port === undefined ? undefined : `${bound.address}${ACME_PREFIX}directory`;
  if (acmeServer && acmeTarget) {
    try {
      acmeDirectoryUrl = `${(await listenOn(acmeServer, acmeTarget)).address}${ACME_PREFIX}directory`;
    } catch (err) {
      await new Promise<void>((resolve) => server.close(() => resolve()));
      throw err;
    }
  }
  /** Closes both, cutting whatever is still open; `dropStreams` ends the IPN bus streams first. */
  const close = async (dropStreams: () => void): Promise<void> => {
    const stopped = new Promise<void>((resolve) => server.close(() => resolve()));
    const acmeStopped = new Promise<void>((resolve) => (acmeServer?.listening ? acmeServer.close(() => resolve()) : resolve()));
    acmeServer?.closeAllConnections();
    dropStreams();
    server.closeIdleConnections();
    // Whatever is still open (hanging or slow requests, bus streams mid-write) is cut now.
    setImmediate(() => server.closeAllConnections());
    await stopped;
    await acmeStopped;
  };
  return { bound, acmeDirectoryUrl, close };
}
