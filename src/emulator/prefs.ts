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
  /** Called after every edit (control's view of the node follows its prefs: cert domains of its Services). */
  onEdit: (() => void) | undefined;

  constructor(write: PrefsWrite = 'allowed') {
    this.#write = write;
  }

  set write(write: PrefsWrite) {
    this.#write = write;
  }

  get advertiseServices(): string[] {
    return [...((this.#prefs.AdvertiseServices as string[] | null) ?? [])];
  }

  get advertiseTags(): string[] {
    return [...((this.#prefs.AdvertiseTags as string[] | null) ?? [])];
  }

  /** As `tailscale set --advertise-services` would: another client's edit. */
  setAdvertiseServices(services: string[]): void {
    this.#prefs.AdvertiseServices = services.length > 0 ? [...services] : null;
    this.onEdit?.();
  }

  /** As `tailscale up --advertise-tags` would (control accepts them here without a tag owner). */
  setAdvertiseTags(tags: string[]): void {
    this.#prefs.AdvertiseTags = tags.length > 0 ? [...tags] : null;
    this.onEdit?.();
  }

  /**
   * tailscaled's config file (tailscaled --config, as containerboot starts it from the operator's file), or
   * undefined: prefs only. Only AdvertiseServices is kept; the file's value wins at each reload. Without
   * `Locked: false` (tailscaled's default: locked) every prefs edit is refused, as ipnlocal checkPrefsLocked does.
   */
  configFile: { AdvertiseServices?: string[]; Locked?: boolean } | undefined;

  /** As ipnlocal ReloadConfig: the file's AdvertiseServices back in the prefs (unset in the file: none). */
  reloadConfig(): boolean {
    if (!this.configFile) return false;
    this.setAdvertiseServices(this.configFile.AdvertiseServices ?? []);
    return true;
  }

  /** POST /localapi/v0/reload-config (apitype.ReloadConfigResponse). */
  handleReloadConfig(req: IncomingMessage, res: ServerResponse): void {
    if (req.method !== 'POST') sendError(res, 405, 'use POST');
    else if (this.#write === 'denied') sendError(res, 403, 'access denied');
    else sendJson(res, 200, JSON.stringify({ Reloaded: this.reloadConfig() }));
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
    if (this.configFile && this.configFile.Locked !== false) {
      return sendJson(res, 400, JSON.stringify({ Error: "can't reconfigure tailscaled when using a config file; config file is locked" }));
    }
    // Both lists are checked before either changes, as tailscaled decodes the whole MaskedPrefs first.
    const lists = { AdvertiseServices: (v: string[]) => this.setAdvertiseServices(v), AdvertiseTags: (v: string[]) => this.setAdvertiseTags(v) };
    const edits: Array<() => void> = [];
    for (const [field, set] of Object.entries(lists)) {
      if (masked[`${field}Set`] !== true) continue;
      const value = masked[field];
      if (value !== null && value !== undefined && !(Array.isArray(value) && value.every((s) => typeof s === 'string'))) {
        return sendError(res, 400, `json: cannot unmarshal ${field} into Go struct field of type []string`);
      }
      edits.push(() => set((value as string[] | null | undefined) ?? []));
    }
    for (const edit of edits) edit();
    if (edits.length > 0) this.edits += 1;
    sendJson(res, 200, this.#json());
  }

  #json(): string {
    return JSON.stringify(this.#prefs, null, '\t');
  }
}
