// The emulator's ACME Renewal Information (RFC 9773), after pebble 2.10.1 (REFERENCE section 5), so the
// fast tier can drive the writer's ARI path:
//   GET /acme/directory                  {"renewalInfo": "http://<host>/acme/renewal-info/", ...}
//   GET /acme/renewal-info/<certID>      the suggested window, Retry-After 21600 (pebble's and Let's Encrypt's 6 h)
// Every certificate the emulator signs is known by its ARI ID. Its default window is pebble's: the 2/3
// point of the lifetime +/- 24 h, clamped to notBefore..notAfter (a short certificate's whole lifetime); a
// revoked certificate gets pebble's one-second window an hour ago; an unknown ID is a 404. The control
// API (control.ts) sets a window or a raw answer for a certificate and revokes one, as pebble's
// management API does (`/set-renewal-info/`) and an ACME revokeCert would.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { ariCertificateId } from '../core/renewal/certificate-id.ts';
import type { Logger } from '../core/ports/logger.ts';
import type { SignedLeaf } from '../pki/ca.ts';
import { sendJson, sendText } from './http-util.ts';
import { iso } from '../core/ports/clock.ts';

export const ACME_PREFIX = '/acme/';
const DIRECTORY_PATH = '/acme/directory';
const RENEWAL_INFO_PATH = '/acme/renewal-info/';
const DEFAULT_ARI_RETRY_AFTER_SECONDS = 21_600;
const DAY = 86_400_000;
const H = 3_600_000;

/** Picks one certificate: by ARI ID, by serial (hex, any case), or the latest one signed for a domain. */
export type AriSelector = { certId: string } | { serial: string } | { domain: string };

/** What the CA answers instead of its default: a window (with a reason page), or any text (pebble allows malformed). */
export type AriOverride = { window: { start: number; end: number }; explanationURL?: string } | { raw: string };

/** A certificate as the emulator's ARI sees it (the control API's GET ari). */
export interface AriCertificateRecord {
  certId: string;
  domain: string;
  /** Upper-case hex. */
  serial: string;
  notBefore: string;
  notAfter: string;
  revokedAt: string | undefined;
  /** The window answered now (RFC 3339), or the raw text when overridden so. */
  answer: { start: string; end: string; explanationURL?: string } | { raw: string };
}

interface Known {
  certId: string;
  domain: string;
  serial: string;
  notBefore: number;
  notAfter: number;
  revokedAt?: number;
  override?: AriOverride;
}

interface AriDeskOptions {
  clock: { now(): number };
  /** Half the default window around the 2/3 point. Default 24 h (pebble). */
  halfWidthMs?: number;
  /** Retry-After on every answer. Default 21600 s. */
  retryAfterSeconds?: number;
  logger: Logger;
  /** Each renewalInfo request answered, with its status (the emulator's `renewalInfo` event). */
  onRequest?(certId: string, status: number): void;
}

export class AriDesk {
  readonly #opts: AriDeskOptions;
  readonly #byId = new Map<string, Known>();
  readonly #latestByDomain = new Map<string, Known>();
  /** renewalInfo requests by outcome status ("200", "404", "400"). */
  readonly requests = new Map<string, number>();

  constructor(options: AriDeskOptions) {
    this.#opts = options;
  }

  /** Records a certificate the emulator just signed. */
  async issued(domain: string, leaf: SignedLeaf): Promise<void> {
    const known: Known = { certId: await ariCertificateId(leaf.leafPem), domain, serial: leaf.serial, notBefore: leaf.notBefore, notAfter: leaf.notAfter };
    this.#byId.set(known.certId, known);
    this.#latestByDomain.set(domain, known);
  }

  /** Sets what the CA answers for a certificate from now on (undefined: its default again). */
  setAnswer(selector: AriSelector, override: AriOverride | undefined): AriCertificateRecord {
    const known = this.#find(selector);
    if (override === undefined) delete known.override;
    else known.override = override;
    this.#opts.logger.info({ certId: known.certId, domain: known.domain, override: override ?? 'default' }, 'ARI answer set');
    return this.#record(known, this.#opts.clock.now());
  }

  /** Revokes a certificate: its window moves an hour into the past (pebble), unless an override says otherwise. */
  revoke(selector: AriSelector): AriCertificateRecord {
    const known = this.#find(selector);
    const now = this.#opts.clock.now();
    known.revokedAt ??= now;
    this.#opts.logger.info({ certId: known.certId, domain: known.domain, serial: known.serial }, 'certificate revoked');
    return this.#record(known, now);
  }

  certificates(): AriCertificateRecord[] {
    const now = this.#opts.clock.now();
    return [...this.#byId.values()].map((k) => this.#record(k, now));
  }

  /** Serves the ACME routes; the directory names renewalInfo under the Host the client used, so it points back here. */
  handle(req: IncomingMessage, res: ServerResponse, url: URL): void {
    const host = req.headers.host ?? url.host;
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      problem(res, 405, 'malformed', 'only GET');
      return;
    }
    if (url.pathname === DIRECTORY_PATH) {
      sendJson(res, 200, JSON.stringify({ renewalInfo: `http://${host}${RENEWAL_INFO_PATH}`, meta: { profiles: {} } }));
      return;
    }
    if (!url.pathname.startsWith(RENEWAL_INFO_PATH)) {
      problem(res, 404, 'malformed', 'no such ACME resource');
      return;
    }
    const certId = url.pathname.slice(RENEWAL_INFO_PATH.length);
    const known = this.#byId.get(certId);
    if (!known) {
      const wellFormed = /^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$/.test(certId);
      this.#problem(res, certId, wellFormed ? 404 : 400, wellFormed ? `no certificate ${certId}` : 'certID is not base64url(keyIdentifier).base64url(serial)');
      return;
    }
    const answer = this.#answer(known, this.#opts.clock.now());
    this.#count(certId, 200);
    res.setHeader('Retry-After', String(this.#opts.retryAfterSeconds ?? DEFAULT_ARI_RETRY_AFTER_SECONDS));
    if ('raw' in answer) sendText(res, 200, answer.raw);
    else sendJson(res, 200, JSON.stringify({ suggestedWindow: { start: answer.start, end: answer.end }, ...pick(answer) }));
  }

  #count(certId: string, status: number): void {
    const key = String(status);
    this.requests.set(key, (this.requests.get(key) ?? 0) + 1);
    this.#opts.onRequest?.(certId, status);
  }

  #problem(res: ServerResponse, certId: string, status: number, detail: string): void {
    this.#count(certId, status);
    problem(res, status, 'malformed', detail);
  }

  #find(selector: AriSelector): Known {
    let known: Known | undefined;
    if ('certId' in selector) known = this.#byId.get(selector.certId);
    else if ('serial' in selector) known = [...this.#byId.values()].find((k) => k.serial === selector.serial.toUpperCase());
    else known = this.#latestByDomain.get(selector.domain);
    if (!known) throw new Error(`no certificate signed by this emulator matches ${JSON.stringify(selector)}`);
    return known;
  }

  #answer(known: Known, now: number): AriCertificateRecord['answer'] {
    const override = known.override;
    if (override && 'raw' in override) return { raw: override.raw };
    if (override) return { start: iso(override.window.start), end: iso(override.window.end), ...pick(override) };
    if (known.revokedAt !== undefined) return { start: iso(now - H), end: iso(now - H + 1000) };
    const mid = known.notBefore + Math.round(((known.notAfter - known.notBefore) * 2) / 3);
    const half = this.#opts.halfWidthMs ?? DAY;
    return { start: iso(Math.max(known.notBefore, mid - half)), end: iso(Math.min(known.notAfter, mid + half)) };
  }

  #record(known: Known, now: number): AriCertificateRecord {
    return {
      certId: known.certId,
      domain: known.domain,
      serial: known.serial,
      notBefore: iso(known.notBefore),
      notAfter: iso(known.notAfter),
      revokedAt: known.revokedAt === undefined ? undefined : iso(known.revokedAt),
      answer: this.#answer(known, now),
    };
  }
}

function pick(from: { explanationURL?: string | undefined }): { explanationURL?: string } {
  return from.explanationURL === undefined ? {} : { explanationURL: from.explanationURL };
}

/** An RFC 8555 problem document, as an ACME server answers errors. */
function problem(res: ServerResponse, status: number, type: string, detail: string): void {
  if (res.headersSent || res.destroyed) return;
  const body = JSON.stringify({ type: `urn:ietf:params:acme:error:${type}`, detail, status });
  res.writeHead(status, { 'Content-Type': 'application/problem+json' });
  res.end(body);
}

/** Reads an AriSelector from a control request's JSON body. */
export function ariSelector(body: Record<string, unknown>): AriSelector {
  for (const key of ['certId', 'serial', 'domain'] as const) {
    const value = body[key];
    if (typeof value === 'string' && value !== '') return { [key]: value } as AriSelector;
  }
  throw new Error('want one of "certId", "serial" or "domain" (a non-empty string)');
}

/** Reads an AriOverride (or undefined for `"reset": true`) from a control request's JSON body. */
export function ariOverride(body: Record<string, unknown>): AriOverride | undefined {
  if (body.reset === true) return undefined;
  if (typeof body.response === 'string') return { raw: body.response };
  const window = body.window as { start?: unknown; end?: unknown } | undefined;
  const start = typeof window?.start === 'string' ? Date.parse(window.start) : Number.NaN;
  const end = typeof window?.end === 'string' ? Date.parse(window.end) : Number.NaN;
  if (Number.isNaN(start) || Number.isNaN(end)) {
    throw new Error('want "window": {"start": RFC 3339, "end": RFC 3339}, "response": TEXT or "reset": true');
  }
  const explanation = body.explanationURL;
  if (explanation !== undefined && typeof explanation !== 'string') throw new Error('"explanationURL" must be a string');
  return { window: { start, end }, ...(explanation === undefined ? {} : { explanationURL: explanation }) };
}
