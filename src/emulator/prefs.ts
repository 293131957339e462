// tailscaled's /localapi/v0/prefs (ipn/localapi/localapi.go servePrefs): GET the prefs, PATCH a masked
// edit (ipn.MaskedPrefs: only the fields whose `<Field>Set` is true change). The emulator keeps the
// fields a client may edit through it (AdvertiseServices) beside a few fixed ones, so clients see a
// whole prefs object and a read-modify-write can be checked for what it leaves alone.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { readBody, sendError, sendJson } from './http-util.ts';

/** Who may edit prefs: root and the operator user on a real tailscaled; a uid without that gets 403. */
export type PrefsWrite = 'allowed' | 'denied';

export class EmulatedPrefs {
  #prefs: Record<string, unknown> = {
    ControlURL: 'https://controlplane.tailscale.com',
    RouteAll: false,
    WantRunning: true,
    Hostname: '',
    AdvertiseTags: null,
    AdvertiseRoutes: null,
    AdvertiseServices: null,
    OperatorUser: '',
  };
  #write: PrefsWrite;
  /** PATCH requests that changed something. */
  edits = 0;

  constructor(write: PrefsWrite = 'allowed') {
    this.#write = write;
  }

  set write(write: PrefsWrite) {
    this.#write = write;
  }

  get advertiseServices(): string[] {
    return [...((this.#prefs.AdvertiseServices as string[] | null) ?? [])];
  }

  /** As `tailscale set --advertise-services` would: another client's edit. */
  setAdvertiseServices(services: string[]): void {
    this.#prefs.AdvertiseServices = services.length > 0 ? [...services] : null;
  }

  async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    if (req.method === 'GET' || req.method === 'HEAD') return sendJson(res, 200, this.#json());
    if (req.method !== 'PATCH') return sendError(res, 405, 'unsupported method');
    if (this.#write === 'denied') return sendError(res, 403, 'prefs write access denied');
    let masked: Record<string, unknown>;
    try {
      const body = await readBody(req, 1 << 20);
      masked = JSON.parse(body) as Record<string, unknown>;
      if (masked === null || typeof masked !== 'object' || Array.isArray(masked))
        throw new Error('json: cannot unmarshal into Go value of type ipn.MaskedPrefs');
    } catch (err) {
      return sendError(res, 400, (err as Error).message);
    }
    if (masked.AdvertiseServicesSet === true) {
      const services = masked.AdvertiseServices;
      if (services !== null && services !== undefined && !(Array.isArray(services) && services.every((s) => typeof s === 'string'))) {
        return sendError(res, 400, 'json: cannot unmarshal AdvertiseServices into Go struct field of type []string');
      }
      this.setAdvertiseServices((services as string[] | null | undefined) ?? []);
      this.edits += 1;
    }
    sendJson(res, 200, this.#json());
  }

  #json(): string {
    return JSON.stringify(this.#prefs, null, '\t');
  }
}
