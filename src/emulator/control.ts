// The emulator's own control API, on the same listener as the LocalAPI:
//   GET    /certshare-emulator/v0/stats
//   GET    /certshare-emulator/v0/faults            pending faults
//   POST   /certshare-emulator/v0/faults            a fault (object or "target:kind:..." string) or an array
//   DELETE /certshare-emulator/v0/faults
//   POST   /certshare-emulator/v0/domains           {"add":[...],"remove":[...]}
//   POST   /certshare-emulator/v0/bus/drop          end every open bus stream
//   GET    /certshare-emulator/v0/ari               every certificate signed: ARI ID, serial, the answer it gets
//   POST   /certshare-emulator/v0/ari               {"certId"|"serial"|"domain": ..., "window": {"start","end"},
//                                                   "explanationURL"?} or {..., "response": TEXT} or {..., "reset": true}
//   POST   /certshare-emulator/v0/ari/revoke        {"certId"|"serial"|"domain": ...}: the window moves an hour back
import type { IncomingMessage, ServerResponse } from 'node:http';
import { errorMessage } from '../core/errors.ts';
import { normalizeFault, type Fault } from './faults.ts';
import { readBody, sendError, sendJson } from './http-util.ts';
import { type AriCertificateRecord, type AriOverride, type AriSelector, ariOverride, ariSelector } from './ari.ts';

export const CONTROL_PREFIX = '/certshare-emulator/v0/';

export interface ControlTarget {
  stats(): unknown;
  pendingFaults(): unknown;
  injectFault(fault: Fault): void;
  clearFaults(): void;
  addCertDomain(domain: string): void;
  removeCertDomain(domain: string): void;
  certDomains(): string[];
  dropBusConnections(): number;
  setRenewalInfo(selector: AriSelector, override: AriOverride | undefined): AriCertificateRecord;
  revokeCertificate(selector: AriSelector): AriCertificateRecord;
  ariCertificates(): AriCertificateRecord[];
}

async function jsonObject(req: IncomingMessage): Promise<Record<string, unknown>> {
  const body = JSON.parse(await readBody(req, 1 << 20)) as unknown;
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new Error('want a JSON object');
  return body as Record<string, unknown>;
}

function stringList(value: unknown, name: string): string[] {
  if (value === undefined) return [];
  if (!Array.isArray(value) || !value.every((v) => typeof v === 'string' && v !== '')) {
    throw new Error(`${name} must be an array of non-empty strings`);
  }
  return value as string[];
}

export async function handleControl(req: IncomingMessage, res: ServerResponse, url: URL, target: ControlTarget): Promise<void> {
  const route = `${req.method ?? 'GET'} ${url.pathname.slice(CONTROL_PREFIX.length)}`;
  try {
    switch (route) {
      case 'GET stats':
        sendJson(res, 200, JSON.stringify(target.stats()));
        return;
      case 'GET faults':
        sendJson(res, 200, JSON.stringify({ pending: target.pendingFaults() }));
        return;
      case 'POST faults': {
        const body = JSON.parse(await readBody(req, 1 << 20)) as unknown;
        const faults = (Array.isArray(body) ? body : [body]).map((f) => normalizeFault(f));
        for (const f of faults) target.injectFault(f);
        sendJson(res, 200, JSON.stringify({ pending: target.pendingFaults() }));
        return;
      }
      case 'DELETE faults':
        target.clearFaults();
        sendJson(res, 200, JSON.stringify({ pending: [] }));
        return;
      case 'POST domains': {
        const body = JSON.parse(await readBody(req, 1 << 20)) as { add?: unknown; remove?: unknown } | null;
        if (typeof body !== 'object' || body === null) throw new Error('want {"add":[...],"remove":[...]}');
        const add = stringList(body.add, 'add');
        const remove = stringList(body.remove, 'remove');
        for (const d of add) target.addCertDomain(d);
        for (const d of remove) target.removeCertDomain(d);
        sendJson(res, 200, JSON.stringify({ certDomains: target.certDomains() }));
        return;
      }
      case 'GET ari':
        sendJson(res, 200, JSON.stringify({ certificates: target.ariCertificates() }));
        return;
      case 'POST ari': {
        const body = await jsonObject(req);
        sendJson(res, 200, JSON.stringify(target.setRenewalInfo(ariSelector(body), ariOverride(body))));
        return;
      }
      case 'POST ari/revoke':
        sendJson(res, 200, JSON.stringify(target.revokeCertificate(ariSelector(await jsonObject(req)))));
        return;
      case 'POST bus/drop':
        sendJson(res, 200, JSON.stringify({ dropped: target.dropBusConnections() }));
        return;
      default:
        sendError(res, 404, `no such emulator control route: ${route}`);
    }
  } catch (err) {
    sendError(res, 400, errorMessage(err));
  }
}
