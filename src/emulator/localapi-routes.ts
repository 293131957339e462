// The emulator's HTTP routes: tailscaled's LocalAPI (the IPN bus, status, cert-domains, dns-config, the
// cert endpoint with its optional ledger line per request), its control API and the CA's ACME side.
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from '../core/ports/logger.ts';
import type { ReleaseFeatures } from '../localapi/releases.ts';
import { ACME_PREFIX, type AriDesk } from './ari.ts';
import { type IpnBus, parseMask } from './bus.ts';
import { CERT_PATH_PREFIX, type CertEndpointDeps, handleCert } from './cert-endpoint.ts';
import { CONTROL_PREFIX, type ControlTarget, handleControl } from './control.ts';
import { sendError, sendJson } from './http-util.ts';
import { appendLedger, type LedgerRequest } from './ledger.ts';
import { type NodeIdentity, statusJson } from './netmap.ts';
import type { EmulatedPrefs } from './prefs.ts';
import { iso } from '../core/ports/clock.ts';

const LOCALAPI_CSP = "default-src 'none'; frame-ancestors 'none'; script-src 'none'; script-src-elem 'none'; script-src-attr 'none'";

/** What the emulator counts for its stats: requests per path, cert requests and answers per domain, faults, refusals. */
export class RequestCounts {
  readonly requests = new Map<string, number>();
  readonly certRequests = new Map<string, number>();
  readonly certResponses = new Map<string, Map<string, number>>();
  readonly faultsApplied = new Map<string, number>();
  busRefusals = 0;

  /** A cert answer per outcome: an HTTP status, "reset" or "hang". */
  certResponse(domain: string, outcome: string): void {
    const outcomes = this.certResponses.get(domain) ?? new Map<string, number>();
    this.certResponses.set(domain, outcomes);
    increment(outcomes, outcome);
  }
}

export interface LocalApiContext {
  version: string;
  features: ReleaseFeatures;
  identity: NodeIdentity;
  closing: AbortSignal;
  control: ControlTarget;
  ari: AriDesk;
  bus: IpnBus;
  counts: RequestCounts;
  prefs: EmulatedPrefs;
  cert: CertEndpointDeps;
  /** With --ledger and --ledger-requests: a line per cert request. */
  ledger: { path: string; emulator: string } | undefined;
  logger: Logger;
}

export function increment(map: Map<string, number>, key: string, by = 1): void {
  map.set(key, (map.get(key) ?? 0) + by);
}

export async function routeLocalApi(req: IncomingMessage, res: ServerResponse, ctx: LocalApiContext): Promise<void> {
  // tailscaled refuses anything a browser could send (DNS rebinding, CSRF), before it sets its headers
  // (ipn/localapi/localapi.go ServeHTTP).
  if (req.headers.referer !== undefined || req.headers.origin !== undefined) {
    sendError(res, 403, 'invalid localapi request');
    return;
  }
  res.setHeader('Tailscale-Version', ctx.version);
  res.setHeader('Tailscale-Cap', String(ctx.features.capabilityVersion));
  res.setHeader('Content-Security-Policy', LOCALAPI_CSP);
  res.setHeader('X-Frame-Options', 'DENY');
  res.setHeader('X-Content-Type-Options', 'nosniff');
  if (ctx.closing.aborted) {
    sendError(res, 503, 'emulator shutting down');
    return;
  }
  const url = new URL(req.url ?? '/', 'http://local-tailscaled.sock');
  const path = url.pathname;
  if (path.startsWith(CONTROL_PREFIX)) return handleControl(req, res, url, ctx.control);
  if (path.startsWith(ACME_PREFIX)) return ctx.ari.handle(req, res, url);
  increment(ctx.counts.requests, path.startsWith(CERT_PATH_PREFIX) ? CERT_PATH_PREFIX : path);
  if (path.startsWith(CERT_PATH_PREFIX)) {
    const domain = safeDecode(path.slice(CERT_PATH_PREFIX.length));
    increment(ctx.counts.certRequests, domain);
    if (!ctx.ledger) return handleCert(req, res, url, ctx.cert);
    return handleLedgeredCert(req, res, url, domain, ctx);
  }
  return routeNode(req, res, url, ctx);
}

/** The node's own endpoints: the IPN bus, status, cert-domains and dns-config (v1.98+). */
async function routeNode(req: IncomingMessage, res: ServerResponse, url: URL, ctx: LocalApiContext): Promise<void> {
  const { features } = ctx;
  switch (url.pathname) {
    case '/localapi/v0/watch-ipn-bus': {
      const mask = parseMask(url.searchParams.get('mask'), features);
      if (!mask.ok) {
        ctx.counts.busRefusals += 1;
        ctx.logger.info({ mask: url.searchParams.get('mask'), refused: mask.message }, 'bus watch refused');
        return sendError(res, mask.status, mask.message);
      }
      ctx.bus.open(req, res, mask.mask);
      return;
    }
    case '/localapi/v0/prefs':
      return ctx.prefs.handle(req, res);
    case '/localapi/v0/reload-config':
      return ctx.prefs.handleReloadConfig(req, res);
    case '/localapi/v0/status':
      return sendJson(res, 200, statusJson(ctx.identity, ctx.version, ctx.control.certDomains()));
    case '/localapi/v0/cert-domains': {
      // Added in tailscaled v1.98 (ipn/localapi/localapi.go serveCertDomains). A nil slice when there
      // are none: `null`, not [].
      if (!features.certDomainsEndpoint) return sendError(res, 404, '404 page not found');
      const domains = ctx.control.certDomains();
      return sendJson(res, 200, domains.length > 0 ? JSON.stringify(domains) : 'null');
    }
    case '/localapi/v0/dns-config': {
      if (!features.certDomainsEndpoint) return sendError(res, 404, '404 page not found');
      const domains = ctx.control.certDomains();
      const config = { Resolvers: [{ Addr: '100.100.100.100' }], Domains: [ctx.identity.tailnetDomain], Proxied: true };
      return sendJson(res, 200, JSON.stringify({ ...config, ...(domains.length > 0 ? { CertDomains: domains } : {}) }));
    }
    default:
      return sendError(res, 404, '404 page not found');
  }
}

/**
 * A cert request with its ledger line, written once it was answered (or reset, or given up on). `end` is when the
 * answer was given, stamped then: a process starved of CPU may run the rest of the handler much later, while
 * the caller has had the answer since (a chaos run's Retry-After counts from it).
 */
async function handleLedgeredCert(req: IncomingMessage, res: ServerResponse, url: URL, domain: string, ctx: LocalApiContext): Promise<void> {
  const { cert, ledger } = ctx;
  const time = iso(cert.clock.now());
  let outcome = 'aborted';
  let answeredAt: number | undefined;
  let serial: string | undefined;
  try {
    await handleCert(req, res, url, {
      ...cert,
      countResponse: (d: string, o: string) => {
        outcome = o;
        // A hang answers nothing: its end is when it was given up on.
        if (o !== 'hang') answeredAt = cert.clock.now();
        cert.countResponse(d, o);
      },
      onServed: (s: string) => {
        serial = s;
      },
    });
  } finally {
    const line: LedgerRequest = {
      kind: 'request',
      time,
      end: iso(answeredAt ?? cert.clock.now()),
      emulator: ledger!.emulator,
      domain,
      minValidity: url.searchParams.get('min_validity') ?? '',
      outcome,
    };
    const retryAfter = Number(res.getHeader('Retry-After'));
    if (outcome === '429' && Number.isFinite(retryAfter)) line.retryAfterSeconds = retryAfter;
    if (outcome === '200' && serial !== undefined) line.serial = serial;
    await appendLedger(ledger!.path, line, ctx.logger);
  }
}

/** The CA's ACME side on a listener of its own. */
export function serveAcme(req: IncomingMessage, res: ServerResponse, ari: AriDesk): void {
  const url = new URL(req.url ?? '/', 'http://acme.invalid');
  if (url.pathname.startsWith(ACME_PREFIX)) ari.handle(req, res, url);
  else sendError(res, 404, '404 page not found');
}

function safeDecode(s: string): string {
  try {
    return decodeURIComponent(s);
  } catch {
    return s;
  }
}
