// GET /localapi/v0/cert/<domain>?type=pair&min_validity=<Go duration>
// 200 text/plain: the private key PEM, then the chain PEM (leaf, issuing CA). Errors are plain text,
// with tailscaled's wording. A pending cert fault for the domain replaces or delays the normal answer.
import type { EventEmitter } from 'node:events';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { randomBytes } from 'node:crypto';
import { parseDuration } from '../core/values/duration.ts';
import { errorMessage } from '../core/errors.ts';
import type { Logger } from '../core/ports/logger.ts';
import type { SignedLeaf } from '../pki/ca.ts';
import { AcmeRateLimited, acmeRetryTime } from './acme-limits.ts';
import { faultDefaults, type CertFault } from './faults.ts';
import { goQuoteList, sendError, sendText } from './http-util.ts';
import type { Issuer } from './issuer.ts';

export const CERT_PATH_PREFIX = '/localapi/v0/cert/';

const ACME_RATE_LIMIT_TEXT =
  '429 urn:ietf:params:acme:error:rateLimited: too many certificates (5) already issued for this exact set of domains in the last 168h0m0s';

export interface CertEndpointDeps {
  issuer: Issuer;
  takeFault: (domain: string) => CertFault | undefined;
  visibleDomains: () => readonly string[];
  clock: { now(): number };
  certLifetimeMs: number;
  /** Aborted when the emulator closes: slow and hanging requests end then. */
  closing: AbortSignal;
  /** Counts per outcome: an HTTP status, "reset" or "hang". */
  countResponse: (domain: string, outcome: string) => void;
  onFaultApplied: (fault: CertFault, domain: string) => void;
  /** The serial of the pair a 200 answer carries (the ledger's request lines). */
  onServed?: (serial: string) => void;
  logger: Logger;
  events: EventEmitter;
}

export async function handleCert(req: IncomingMessage, res: ServerResponse, url: URL, deps: CertEndpointDeps): Promise<void> {
  let domain: string;
  try {
    domain = decodeURIComponent(url.pathname.slice(CERT_PATH_PREFIX.length));
  } catch {
    sendError(res, 400, 'invalid domain');
    return;
  }
  const type = url.searchParams.get('type') ?? '';
  const minValidityText = url.searchParams.get('min_validity') ?? '';
  deps.events.emit('certRequest', { domain, type, minValidity: minValidityText });

  const reply = (status: number, body: string, headers: Record<string, string> = {}): void => {
    deps.countResponse(domain, String(status));
    deps.events.emit('certResponse', { domain, status });
    if (status === 200) sendText(res, 200, body);
    else sendError(res, status, body, headers);
  };

  if (type !== 'pair' && type !== 'cert' && type !== 'key') {
    reply(400, 'invalid type; want "cert", "key", or "pair"');
    return;
  }
  let minValidityMs = 0;
  if (minValidityText !== '') {
    try {
      minValidityMs = parseDuration(minValidityText);
    } catch {
      // ipn/localapi/cert.go: fmt.Sprintf("invalid validity parameter: %v", err) of time.ParseDuration's error.
      reply(400, `invalid validity parameter: time: invalid duration ${JSON.stringify(minValidityText)}`);
      return;
    }
  }
  const format = (leaf: Pick<SignedLeaf, 'keyPem' | 'chainPem'>): string =>
    type === 'pair' ? leaf.keyPem + leaf.chainPem : type === 'cert' ? leaf.chainPem : leaf.keyPem;

  const fault = deps.takeFault(domain);
  if (fault) {
    deps.onFaultApplied(fault, domain);
    const handled = await applyFault(fault, domain, req, res, deps, reply, format);
    if (handled) return;
  }

  const visible = deps.visibleDomains();
  if (visible.length === 0) {
    reply(500, 'your Tailscale account does not support getting TLS certs');
    return;
  }
  if (!visible.includes(domain)) {
    reply(500, `invalid domain ${JSON.stringify(domain)}; must be one of ${goQuoteList(visible)}`);
    return;
  }
  try {
    const leaf = await deps.issuer.getPair(domain, minValidityMs);
    if (res.destroyed) return;
    deps.onServed?.(leaf.serial);
    reply(200, format(leaf));
  } catch (err) {
    if (err instanceof AcmeRateLimited) {
      // tailscaled 1.102+ passes the CA's rate limit through as a 429 with Retry-After.
      reply(429, err.message, { 'Retry-After': String(err.retryAfterSeconds) });
      return;
    }
    deps.logger.error({ domain, err: errorMessage(err) }, 'issuance failed');
    reply(500, `getCertPEM: ${errorMessage(err)}`);
  }
}

/** Returns true when the fault produced the whole answer; false when the normal answer follows (slow). */
async function applyFault(
  fault: CertFault,
  domain: string,
  req: IncomingMessage,
  res: ServerResponse,
  deps: CertEndpointDeps,
  reply: (status: number, body: string, headers?: Record<string, string>) => void,
  format: (leaf: Pick<SignedLeaf, 'keyPem' | 'chainPem'>) => string,
): Promise<boolean> {
  const now = deps.clock.now();
  switch (fault.kind) {
    case 'rate_limit_429': {
      const seconds = fault.retryAfterSeconds ?? faultDefaults.retryAfterSeconds;
      const retryAt = acmeRetryTime(now + seconds * 1000);
      reply(429, `${ACME_RATE_LIMIT_TEXT}, retry after ${retryAt}: see https://letsencrypt.org/docs/rate-limits/#new-certificates-per-exact-set-of-hostnames`, {
        'Retry-After': String(seconds),
      });
      return true;
    }
    case 'acme_rate_limit_500':
      reply(500, ACME_RATE_LIMIT_TEXT);
      return true;
    case 'error_500':
      reply(500, fault.message ?? faultDefaults.error500Message);
      return true;
    case 'access_denied_403':
      reply(403, 'cert access denied');
      return true;
    case 'slow': {
      const finished = await waitUnlessGone(res, deps.closing, fault.delayMs ?? faultDefaults.delayMs);
      if (!finished) {
        if (!res.destroyed) res.socket?.destroy();
        return true;
      }
      return false;
    }
    case 'hang':
      deps.countResponse(domain, 'hang');
      deps.events.emit('certResponse', { domain, status: 'hang' });
      await waitUnlessGone(res, deps.closing, Infinity);
      if (!res.destroyed) res.socket?.destroy();
      return true;
    case 'garbage':
      reply(200, `<html><head><title>502 Bad Gateway</title></head>\n${randomBytes(96).toString('base64')}\n`);
      return true;
    case 'mismatched':
    case 'wrong_domain':
    case 'expired':
    case 'huge_pair':
      reply(200, await refusablePair(fault.kind, fault, domain, deps, format));
      return true;
    case 'reset':
      deps.countResponse(domain, 'reset');
      deps.events.emit('certResponse', { domain, status: 'reset' });
      req.socket.destroy();
      return true;
  }
}

/** The answer of a fault serving a pair certshare must refuse: the wrong key, the wrong domain, expired, or too long. */
async function refusablePair(
  kind: 'mismatched' | 'wrong_domain' | 'expired' | 'huge_pair',
  fault: CertFault,
  domain: string,
  deps: CertEndpointDeps,
  format: (leaf: Pick<SignedLeaf, 'keyPem' | 'chainPem'>) => string,
): Promise<string> {
  switch (kind) {
    case 'mismatched': {
      const window = deps.issuer.freshWindow();
      const leaf = await deps.issuer.signDetached(domain, window.notBefore, window.notAfter);
      const strayKey = await deps.issuer.ca().then((ca) => ca.strayKeyPem());
      return format({ keyPem: strayKey, chainPem: leaf.chainPem });
    }
    case 'wrong_domain': {
      const window = deps.issuer.freshWindow();
      const leaf = await deps.issuer.signDetached(`wrong-${domain}`, window.notBefore, window.notAfter);
      return format(leaf);
    }
    case 'expired': {
      const lifetime = deps.certLifetimeMs;
      const now = deps.clock.now();
      const leaf = await deps.issuer.signDetached(domain, now - lifetime - 3_600_000, now - 3_600_000);
      return format(leaf);
    }
    case 'huge_pair': {
      // A fresh pair whose chain goes on: its issuer repeated until the answer holds `bytes`.
      const window = deps.issuer.freshWindow();
      const leaf = await deps.issuer.signDetached(domain, window.notBefore, window.notAfter);
      const bytes = fault.bytes ?? faultDefaults.hugePairBytes;
      const issuer = leaf.chainPem.slice(leaf.chainPem.indexOf('-----BEGIN CERTIFICATE-----', 1));
      const pair = format(leaf);
      return pair + issuer.repeat(Math.max(0, Math.ceil((bytes - pair.length) / issuer.length)));
    }
  }
}

/** Resolves true after `ms`, false as soon as the client goes away or the emulator closes. */
function waitUnlessGone(res: ServerResponse, closing: AbortSignal, ms: number): Promise<boolean> {
  return new Promise<boolean>((resolve) => {
    if (closing.aborted || res.destroyed) return resolve(false);
    const timer = Number.isFinite(ms) ? setTimeout(() => finish(true), ms) : undefined;
    const onGone = (): void => finish(false);
    function finish(ok: boolean): void {
      if (timer) clearTimeout(timer);
      closing.removeEventListener('abort', onGone);
      res.off('close', onGone);
      resolve(ok);
    }
    closing.addEventListener('abort', onGone, { once: true });
    res.once('close', onGone);
  });
}
