// Scripted failures: what a real tailscaled / Let's Encrypt / node does to a client on a bad day.
// A fault targets the cert endpoint or the IPN bus and applies to the next `count` matching events
// (0 or "always" = until cleared); cert faults can be limited to one domain.
import { parseDuration } from '../core/values/duration.ts';

export const CERT_FAULT_KINDS = [
  'rate_limit_429',
  'acme_rate_limit_500',
  'error_500',
  'access_denied_403',
  'slow',
  'hang',
  'garbage',
  'mismatched',
  'wrong_domain',
  'expired',
  'reset',
  'huge_pair',
] as const;
export const BUS_FAULT_KINDS = ['disconnect', 'malformed_line', 'huge_line'] as const;

type CertFaultKind = (typeof CERT_FAULT_KINDS)[number];
type BusFaultKind = (typeof BUS_FAULT_KINDS)[number];

interface FaultCommon {
  /** How many matching events it applies to: default 1; 0 or "always" = until cleared. */
  count?: number | 'always';
}

export interface CertFault extends FaultCommon {
  target: 'cert';
  kind: CertFaultKind;
  /** Only requests for this domain match (default: any domain). */
  domain?: string;
  /** rate_limit_429: the Retry-After header, in seconds (default 60). */
  retryAfterSeconds?: number;
  /** error_500: the response text (default: an ACME directory timeout). */
  message?: string;
  /** slow: delay before the normal response, in milliseconds (default 3000). */
  delayMs?: number;
  /** huge_pair: the answer's length in bytes, a fresh pair and its issuer repeated (default 1 MiB). */
  bytes?: number;
}

export interface BusFault extends FaultCommon {
  target: 'bus';
  kind: BusFaultKind;
  /** huge_line: the line length in bytes, newline excluded (default 4 MiB). */
  bytes?: number;
  /** disconnect: destroy the sockets instead of ending the streams cleanly. */
  abrupt?: boolean;
}

export type Fault = CertFault | BusFault;

const DEFAULT_RETRY_AFTER_SECONDS = 60;
const DEFAULT_SLOW_MS = 3000;
const DEFAULT_HUGE_LINE_BYTES = 4 * 1024 * 1024;

export const faultDefaults = {
  retryAfterSeconds: DEFAULT_RETRY_AFTER_SECONDS,
  delayMs: DEFAULT_SLOW_MS,
  hugeLineBytes: DEFAULT_HUGE_LINE_BYTES,
  hugePairBytes: 1024 * 1024,
  error500Message: 'acme.GetReg: Get "https://acme-v02.api.letsencrypt.org/directory": dial tcp: lookup acme-v02.api.letsencrypt.org: i/o timeout',
} as const;

function fail(message: string): never {
  throw new Error(message);
}

function parseCount(value: unknown, where: string): number | 'always' {
  if (value === 'always') return 'always';
  const n = typeof value === 'string' && /^\d+$/.test(value) ? Number(value) : value;
  if (typeof n !== 'number' || !Number.isInteger(n) || n < 0) fail(`${where}: count must be a non-negative integer or "always"`);
  return n === 0 ? 'always' : n;
}

function parseBytes(value: string, where: string): number {
  const m = /^(\d+)\s*(b|k|kb|kib|m|mb|mib)?$/i.exec(value.trim());
  if (!m) fail(`${where}: bytes must be a number, optionally with k or m (e.g. 5m)`);
  const unit = (m[2] ?? 'b').toLowerCase();
  const mult = unit.startsWith('k') ? 1024 : unit.startsWith('m') ? 1024 * 1024 : 1;
  return Number(m[1]) * mult;
}

function positiveInt(value: unknown, name: string, where: string): number {
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 0) fail(`${where}: ${name} must be a non-negative number`);
  return Math.round(value);
}

/** Validates a fault given as an object (programmatic or control API JSON) and fills nothing in: defaults apply at use. */
export function normalizeFault(input: unknown): Fault {
  if (typeof input === 'string') return parseFaultSpec(input);
  if (typeof input !== 'object' || input === null) fail('fault must be an object or a spec string like "cert:rate_limit_429"');
  return validateFault(input as Record<string, unknown>, `fault ${JSON.stringify(input)}`);
}

function validateFault(raw: Record<string, unknown>, where: string): Fault {
  const count = raw.count === undefined ? undefined : parseCount(raw.count, where);
  if (raw.target === 'cert') {
    if (!CERT_FAULT_KINDS.includes(raw.kind as CertFaultKind)) {
      fail(`${where}: unknown cert fault kind; want one of ${CERT_FAULT_KINDS.join(', ')}`);
    }
    const fault: CertFault = { target: 'cert', kind: raw.kind as CertFaultKind };
    if (count !== undefined) fault.count = count;
    if (raw.domain !== undefined) {
      if (typeof raw.domain !== 'string' || raw.domain === '') fail(`${where}: domain must be a non-empty string`);
      fault.domain = raw.domain;
    }
    if (raw.retryAfterSeconds !== undefined) fault.retryAfterSeconds = positiveInt(raw.retryAfterSeconds, 'retryAfterSeconds', where);
    if (raw.delayMs !== undefined) fault.delayMs = positiveInt(raw.delayMs, 'delayMs', where);
    if (raw.bytes !== undefined) fault.bytes = positiveInt(raw.bytes, 'bytes', where);
    if (raw.message !== undefined) {
      if (typeof raw.message !== 'string') fail(`${where}: message must be a string`);
      fault.message = raw.message;
    }
    return fault;
  }
  if (raw.target === 'bus') {
    if (!BUS_FAULT_KINDS.includes(raw.kind as BusFaultKind)) {
      fail(`${where}: unknown bus fault kind; want one of ${BUS_FAULT_KINDS.join(', ')}`);
    }
    if (raw.domain !== undefined) fail(`${where}: domain applies only to cert faults`);
    const fault: BusFault = { target: 'bus', kind: raw.kind as BusFaultKind };
    if (count !== undefined) fault.count = count;
    if (raw.bytes !== undefined) fault.bytes = positiveInt(raw.bytes, 'bytes', where);
    if (raw.abrupt !== undefined) {
      if (typeof raw.abrupt !== 'boolean') fail(`${where}: abrupt must be a boolean`);
      fault.abrupt = raw.abrupt;
    }
    return fault;
  }
  fail(`${where}: target must be "cert" or "bus"`);
}

/**
 * Parses the CLI form `target:kind[:key=value...]`, e.g. `cert:rate_limit_429:retry_after=30:count=2`,
 * `cert:slow:delay=10s:domain=a.ts.net`, `bus:huge_line:bytes=8m`, `cert:error_500:message=boom: it broke`.
 * Keys: count (n|always), domain, retry_after (seconds), delay (Go duration), message (takes the rest of
 * the spec, colons included), bytes (n, nk, nm), abrupt (true|false).
 */
export function parseFaultSpec(spec: string): Fault {
  const where = `fault "${spec}"`;
  const parts = spec.split(':');
  const [target, kind] = parts;
  if (!target || !kind) fail(`${where}: want target:kind[:key=value...], e.g. cert:rate_limit_429:retry_after=30`);
  const raw: Record<string, unknown> = { target, kind };
  for (let i = 2; i < parts.length; i++) {
    const part = parts[i]!;
    const eq = part.indexOf('=');
    if (eq <= 0) fail(`${where}: option "${part}" is not key=value`);
    const key = part.slice(0, eq);
    const value = part.slice(eq + 1);
    switch (key) {
      case 'count':
        raw.count = parseCount(value, where);
        break;
      case 'domain':
        raw.domain = value;
        break;
      case 'retry_after':
        if (!/^\d+$/.test(value)) fail(`${where}: retry_after must be whole seconds`);
        raw.retryAfterSeconds = Number(value);
        break;
      case 'delay':
        try {
          raw.delayMs = parseDuration(value);
        } catch {
          fail(`${where}: delay must be a duration like 500ms or 10s`);
        }
        break;
      case 'message':
        raw.message = [value, ...parts.slice(i + 1)].join(':');
        i = parts.length;
        break;
      case 'bytes':
        raw.bytes = parseBytes(value, where);
        break;
      case 'abrupt':
        if (value !== 'true' && value !== 'false') fail(`${where}: abrupt must be true or false`);
        raw.abrupt = value === 'true';
        break;
      default:
        fail(`${where}: unknown option "${key}" (known: count, domain, retry_after, delay, message, bytes, abrupt)`);
    }
  }
  return validateFault(raw, where);
}

export function describeFault(fault: Fault): string {
  return `${fault.target}:${fault.kind}`;
}

interface QueuedFault {
  fault: Fault;
  /** Remaining applications; Infinity = until cleared. */
  remaining: number;
}

/** The pending faults, in injection order. The first matching fault wins for a cert request. */
export class FaultQueue {
  #queue: QueuedFault[] = [];

  add(fault: Fault): void {
    const count = fault.count ?? 1;
    this.#queue.push({ fault, remaining: count === 'always' ? Infinity : count });
  }

  clear(): void {
    this.#queue = [];
  }

  /** Consumes one application of the first cert fault matching the domain. */
  takeCert(domain: string): CertFault | undefined {
    const entry = this.#queue.find((q) => q.fault.target === 'cert' && (q.fault.domain === undefined || q.fault.domain === domain));
    if (!entry) return undefined;
    this.#consume(entry);
    return entry.fault as CertFault;
  }

  /** Consumes one application of every pending bus fault, in order (a new bus stream gets them all). */
  takeAllBus(): BusFault[] {
    const out: BusFault[] = [];
    for (const entry of [...this.#queue]) {
      if (entry.fault.target !== 'bus') continue;
      this.#consume(entry);
      out.push(entry.fault);
    }
    return out;
  }

  /** Consumes one application of this very fault (applied at injection time to the open streams). */
  consume(fault: Fault): void {
    const entry = this.#queue.find((q) => q.fault === fault);
    if (entry) this.#consume(entry);
  }

  pending(): Array<Fault & { remaining: number | 'always' }> {
    return this.#queue.map((q) => ({ ...q.fault, remaining: q.remaining === Infinity ? 'always' : q.remaining }));
  }

  #consume(entry: QueuedFault): void {
    entry.remaining -= 1;
    if (entry.remaining <= 0) this.#queue.splice(this.#queue.indexOf(entry), 1);
  }
}
