// The IPN bus: GET /localapi/v0/watch-ipn-bus?mask=N streams newline-delimited ipn.Notify objects,
// chunked, one flushed write per message, and never ends by itself.
// Like tailscaled, the first Notify (only when the mask asks for initial state) carries Version plus
// whatever was asked: SessionID and State for InitialState, the full NetMap for InitialNetMap.
// Later cert-domain changes arrive, depending on `style`, as a full NetMap (older tailscaled) or as a
// SelfChange after which clients fetch /localapi/v0/cert-domains (tailscaled v1.100+ on Linux).
import { randomBytes } from 'node:crypto';
import type { EventEmitter } from 'node:events';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { IpnState, NotifyMask } from '../core/localapi.ts';
import type { Logger } from '../core/logger.ts';
import { faultDefaults, type BusFault } from './faults.ts';
import { malformedLine, netMapJson, notifyJson, paddedNotifyJson, selfNode, type NodeIdentity } from './netmap.ts';

export type NetmapStyle = 'resend' | 'selfchange';

const INITIAL_BITS = NotifyMask.InitialState | NotifyMask.InitialPrefs | NotifyMask.InitialNetMap | 32; /* InitialDriveShares */
const RATE_LIMIT_INCOMPATIBLE = NotifyMask.PeerChanges | NotifyMask.NoNetMap | NotifyMask.InitialStatus | 32768; /* PeerPatches */

export interface BusOptions {
  version: string;
  style: NetmapStyle;
  padBytes: number;
  /** Send Version, State and NetMap as three initial lines instead of tailscaled's one combined Notify. */
  splitInitialNotify: boolean;
  identity: NodeIdentity;
  certDomains: () => readonly string[];
  /** Pending bus faults for a new stream (each consumed once). */
  takeFaults: () => BusFault[];
  onFaultApplied: (fault: BusFault, streams: number) => void;
  logger: Logger;
  events: EventEmitter;
}

interface BusStream {
  res: ServerResponse;
  mask: number;
}

export type MaskResult = { ok: true; mask: number } | { ok: false; status: number; message: string };

/** Parses the mask query value as tailscaled does (decimal uint64; empty = 0). */
export function parseMask(value: string | null): MaskResult {
  if (value === null || value === '') return { ok: true, mask: 0 };
  if (!/^\d+$/.test(value) || !Number.isSafeInteger(Number(value))) return { ok: false, status: 400, message: 'bad mask' };
  const mask = Number(value);
  if ((mask & NotifyMask.RateLimit) !== 0 && (mask & RATE_LIMIT_INCOMPATIBLE) !== 0) {
    return {
      ok: false,
      status: 400,
      message: `NotifyRateLimit is incompatible with new-style IPN bus subscription bits ${mask & RATE_LIMIT_INCOMPATIBLE}`,
    };
  }
  return { ok: true, mask };
}

export class IpnBus {
  readonly #opts: BusOptions;
  readonly #streams = new Set<BusStream>();
  total = 0;

  constructor(options: BusOptions) {
    this.#opts = options;
  }

  get openStreams(): number {
    return this.#streams.size;
  }

  /** Takes over the response: writes the headers, the initial Notify, then any pending bus faults. */
  open(req: IncomingMessage, res: ServerResponse, mask: number): void {
    const stream: BusStream = { res, mask };
    this.#streams.add(stream);
    this.total += 1;
    res.once('close', () => {
      if (this.#streams.delete(stream)) this.#opts.events.emit('busDisconnect', { mask });
    });
    req.socket.setNoDelay(true);
    res.writeHead(200, { 'Content-Type': 'application/json' });
    res.flushHeaders();
    if ((mask & INITIAL_BITS) !== 0) {
      const state = (mask & NotifyMask.InitialState) !== 0 ? { sessionId: randomBytes(8).toString('hex'), state: IpnState.Running } : undefined;
      const netMap = (mask & NotifyMask.InitialNetMap) !== 0 ? { netMapJson: this.#netMap() } : undefined;
      if (this.#opts.splitInitialNotify) {
        this.#write(stream, notifyJson(this.#opts.version, {}));
        if (state) this.#write(stream, notifyJson(this.#opts.version, state));
        if (netMap) this.#write(stream, notifyJson(this.#opts.version, netMap));
      } else {
        this.#write(stream, notifyJson(this.#opts.version, { ...state, ...netMap }));
      }
    }
    this.#opts.logger.debug({ mask, streams: this.#streams.size }, 'bus watcher connected');
    this.#opts.events.emit('busConnect', { mask });
    for (const fault of this.#opts.takeFaults()) {
      if (!this.#streams.has(stream)) break;
      this.#apply(fault, [stream]);
    }
  }

  /** Tells every watcher that the cert domains changed, in the configured style. */
  announceCertDomains(): void {
    if (this.#streams.size === 0) return;
    if (this.#opts.style === 'resend') {
      const line = notifyJson(this.#opts.version, { netMapJson: this.#netMap() });
      for (const s of this.#streams) {
        if ((s.mask & NotifyMask.NoNetMap) === 0) this.#write(s, line);
      }
    } else {
      const line = notifyJson(this.#opts.version, {
        selfChangeJson: JSON.stringify(selfNode(this.#opts.identity, this.#opts.version)),
      });
      for (const s of this.#streams) this.#write(s, line);
    }
  }

  /** Applies a bus fault to the open streams now. Returns false when there are none. */
  applyNow(fault: BusFault): boolean {
    if (this.#streams.size === 0) return false;
    this.#apply(fault, [...this.#streams]);
    return true;
  }

  /** Ends every stream (clients see the end of the response and must reconnect). */
  dropAll(abrupt = false): number {
    const streams = [...this.#streams];
    for (const s of streams) this.#end(s, abrupt);
    return streams.length;
  }

  #apply(fault: BusFault, streams: BusStream[]): void {
    this.#opts.onFaultApplied(fault, streams.length);
    switch (fault.kind) {
      case 'disconnect':
        for (const s of streams) this.#end(s, fault.abrupt ?? false);
        break;
      case 'malformed_line': {
        const line = malformedLine(this.#opts.version);
        for (const s of streams) this.#write(s, line);
        break;
      }
      case 'huge_line': {
        const line = paddedNotifyJson(this.#opts.version, fault.bytes ?? faultDefaults.hugeLineBytes);
        for (const s of streams) this.#write(s, line);
        break;
      }
    }
  }

  #end(stream: BusStream, abrupt: boolean): void {
    this.#streams.delete(stream);
    this.#opts.events.emit('busDisconnect', { mask: stream.mask });
    if (abrupt) stream.res.socket?.destroy();
    else stream.res.end();
  }

  #write(stream: BusStream, line: string): void {
    if (stream.res.writableEnded || stream.res.destroyed) return;
    stream.res.write(line + '\n');
  }

  #netMap(): string {
    return netMapJson(this.#opts.identity, this.#opts.version, this.#opts.certDomains(), this.#opts.padBytes);
  }
}
