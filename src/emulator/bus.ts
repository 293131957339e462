// The IPN bus: GET /localapi/v0/watch-ipn-bus?mask=N streams newline-delimited ipn.Notify objects,
// chunked, one flushed write per message, and never ends by itself. What a release accepts and sends
// follows tailscale.com's source (see src/localapi/releases.ts for the table and file references):
// the first Notify (only when the mask asks for initial state) carries Version plus whatever was asked:
// SessionID and State for InitialState, the full NetMap for InitialNetMap (before v1.104),
// InitialStatus for InitialStatus (v1.100+). Later cert-domain changes arrive as a full NetMap before
// v1.100 (with a SelfChange beside it from v1.98), and as a SelfChange alone from v1.100 (Linux), after
// which clients fetch /localapi/v0/cert-domains.
import { randomBytes } from 'node:crypto';
import type { EventEmitter } from 'node:events';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { IpnState, NotifyMask } from '../core/ports/localapi.ts';
import type { Logger } from '../core/ports/logger.ts';
import type { ReleaseFeatures } from '../localapi/releases.ts';
import { faultDefaults, type BusFault } from './faults.ts';
import { malformedLine, netMapJson, notifyJson, paddedNotifyJson, selfNode, statusJson, type NodeIdentity } from './netmap.ts';

export type NetmapStyle = 'resend' | 'selfchange';

// ipnlocal.WatchNotificationsAs's initialBits (InitialDriveShares = 1<<5; InitialStatus only where it exists).
const INITIAL_BITS = NotifyMask.InitialState | NotifyMask.InitialPrefs | NotifyMask.InitialNetMap | 32;
// ipn.NotifyRateLimitIncompatibleBits (v1.102), in the order ipn.NotifyWatchOpt.String() names them.
const RATE_LIMIT_INCOMPATIBLE: ReadonlyArray<[number, string]> = [
  [NotifyMask.PeerChanges, 'NotifyPeerChanges'],
  [NotifyMask.NoNetMap, 'NotifyNoNetMap'],
  [NotifyMask.InitialStatus, 'NotifyInitialStatus'],
  [NotifyMask.PeerPatches, 'NotifyPeerPatches'],
];

interface BusOptions {
  version: string;
  style: NetmapStyle;
  features: ReleaseFeatures;
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

type MaskResult = { ok: true; mask: number } | { ok: false; status: number; message: string };

/**
 * Parses and validates the mask as the release does (ipn/localapi/localapi.go serveWatchIPNBus and
 * ipn.ValidateNotifyWatchOpt in ipn/backend.go): decimal uint64, empty = 0; from v1.102 the
 * in-process-only bit and RateLimit with new-style bits are refused; from v1.104 the obsolete bits.
 */
export function parseMask(value: string | null, features: ReleaseFeatures): MaskResult {
  if (value === null || value === '') return { ok: true, mask: 0 };
  if (!/^\d+$/.test(value) || !Number.isSafeInteger(Number(value))) return { ok: false, status: 400, message: 'bad mask' };
  const mask = Number(value);
  const refuse = (message: string): MaskResult => ({ ok: false, status: 400, message });
  if (features.validatesMask && (mask & NotifyMask.InProcessNoDisconnect) !== 0) {
    return refuse('NotifyInProcessNoDisconnect is only valid for in-process IPN bus subscribers');
  }
  if (features.refusesObsoleteBits) {
    if ((mask & NotifyMask.RateLimit) !== 0) return refuse('the NotifyRateLimit IPN bus subscription bit is no longer supported');
    if ((mask & NotifyMask.InitialNetMap) !== 0) {
      return refuse('the NotifyInitialNetMap IPN bus subscription bit is no longer supported; seed from NotifyInitialStatus instead');
    }
  } else if (features.validatesMask && (mask & NotifyMask.RateLimit) !== 0) {
    const bad = RATE_LIMIT_INCOMPATIBLE.filter(([bit]) => (mask & bit) !== 0).map(([, name]) => `ipn.${name}`);
    // Go's %v of a NotifyWatchOpt: one name, or "(a | b)" for several.
    if (bad.length > 0) {
      return refuse(`NotifyRateLimit is incompatible with new-style IPN bus subscription bits ${bad.length === 1 ? bad[0] : `(${bad.join(' | ')})`}`);
    }
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
    const { features, version } = this.#opts;
    const initialBits = INITIAL_BITS | (features.initialStatus ? NotifyMask.InitialStatus : 0);
    if ((mask & initialBits) !== 0) {
      const state = (mask & NotifyMask.InitialState) !== 0 ? { sessionId: randomBytes(8).toString('hex'), state: IpnState.Running } : undefined;
      const netMap =
        (mask & NotifyMask.InitialNetMap) !== 0 && features.netMapField
          ? {
              netMapJson: this.#netMap(),
              // v1.100+ puts the self node beside the initial NetMap (ipn/ipnlocal/local.go WatchNotificationsAs).
              ...(features.initialStatus ? { selfChangeJson: JSON.stringify(selfNode(this.#opts.identity, version)) } : {}),
            }
          : undefined;
      const status =
        (mask & NotifyMask.InitialStatus) !== 0 && features.initialStatus
          ? { initialStatusJson: statusJson(this.#opts.identity, version, this.#opts.certDomains()) }
          : undefined;
      const fields = { netMapField: features.netMapField };
      if (this.#opts.splitInitialNotify) {
        this.#write(stream, notifyJson(version, fields));
        if (state) this.#write(stream, notifyJson(version, { ...fields, ...state }));
        if (netMap) this.#write(stream, notifyJson(version, { ...fields, ...netMap }));
        if (status) this.#write(stream, notifyJson(version, { ...fields, ...status }));
      } else {
        this.#write(stream, notifyJson(version, { ...fields, ...state, ...netMap, ...status }));
      }
    }
    this.#opts.logger.debug({ mask, streams: this.#streams.size }, 'bus watcher connected');
    this.#opts.events.emit('busConnect', { mask });
    for (const fault of this.#opts.takeFaults()) {
      if (!this.#streams.has(stream)) break;
      this.#apply(fault, [stream]);
    }
  }

  /** Tells every watcher that the cert domains changed, as the release does. */
  announceCertDomains(): void {
    if (this.#streams.size === 0) return;
    const { features, version } = this.#opts;
    const selfChangeJson = features.selfChange ? JSON.stringify(selfNode(this.#opts.identity, version)) : undefined;
    if (this.#opts.style === 'resend') {
      // Before v1.100: the NetMap to every watcher (from v1.98 with SelfChange beside it), except that
      // v1.98's PeerChanges watchers get it stripped (ipn/ipnlocal/local.go sendToLocked).
      const withNetMap = notifyJson(version, { netMapField: true, netMapJson: this.#netMap(), selfChangeJson });
      const without = notifyJson(version, { netMapField: true, selfChangeJson });
      for (const s of this.#streams) this.#write(s, (s.mask & NotifyMask.PeerChanges) !== 0 && features.selfChange ? without : withNetMap);
    } else {
      const line = notifyJson(version, { netMapField: features.netMapField, selfChangeJson });
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
        const line = paddedNotifyJson(this.#opts.version, fault.bytes ?? faultDefaults.hugeLineBytes, this.#opts.features.netMapField);
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
    stream.res.write(`${line}\n`);
  }

  #netMap(): string {
    return netMapJson(this.#opts.identity, this.#opts.version, this.#opts.certDomains(), this.#opts.padBytes);
  }
}
