// The two files between certshare and its advertise agent (certshare advertise-agent), each in a volume only its
// writer mounts read-write: certshare's request (the Services it wants advertised now) and the agent's status
// (the Services tailscaled's prefs advertise after the agent applied a request). certshare, the process that
// faces the network, thus never holds tailscaled's operator right; the agent, which does, reads at most
// MAX_EXCHANGE_BYTES of a file it checks before believing, and advertises only what its own flags allow.
import { constants } from 'node:fs';
import { open } from 'node:fs/promises';
import { join } from 'node:path';
import { isServiceName } from '../core/served/advertisement.ts';
import type { Clock } from '../core/ports/clock.ts';
import { CertshareError } from '../core/errors.ts';
import type { IpnPrefs, MaskedPrefs } from '../core/ports/localapi.ts';
import { LocalApiError } from '../core/ports/localapi.ts';
import { writeFileAtomically } from '../store/atomic-file.ts';
import type { PrefsApi } from './advertiser.ts';
import { REQUEST_DIR, STATUS_DIR } from './advertise-paths.ts';

/** certshare's request: `<dir>/request/advertise.json`; the agent's status: `<dir>/status/advertised.json`. */
const REQUEST_FILE = 'advertise.json';
const STATUS_FILE = 'advertised.json';
/** As many Services as a ServeConfig may list (serve-config.ts), each a name of at most 67 characters. */
export const MAX_EXCHANGE_SERVICES = 64;
/** 64 quoted names of 67 characters, their commas and the rest of the object fit in 5 KiB; 8 KiB leaves room. @forTests */
export const MAX_EXCHANGE_BYTES = 8192;
/** How often certshare looks at the status while it waits for the agent to apply a request. */
const ANSWER_POLL_MS = 100;

/** What certshare asks: the Services to advertise now (others of the agent's allow list are withdrawn). */
export interface AdvertiseRequest {
  /** Changes with every request; the agent's status echoes the one it applied. */
  seq: number;
  advertise: string[];
}

/** What the agent did: the request it applied last, and what the prefs advertise of its Services since. */
interface AdvertiseStatus {
  seq: number | undefined;
  advertised: string[];
  /** The agent withdrew its Services and stopped (SIGTERM): nobody to ask any more. */
  stopped: boolean;
  /**
   * tailscaled runs from a config file whose owner advertises: the agent only withdraws from the file's list and
   * puts it back (advertise-agent.ts), and certshare asks it to withdraw only what it must not serve.
   */
  fromFile?: boolean;
}

function refused(what: string, problem: string): CertshareError {
  return new CertshareError('CERTSHARE_BAD_EXCHANGE', { what, problem });
}

/**
 * The file's text, or undefined when there is none. Only a regular file (a symlink, a FIFO or a device is
 * refused without being followed or blocked on) of at most MAX_EXCHANGE_BYTES is read.
 */
export async function readExchangeFile(path: string, what: string): Promise<string | undefined> {
  let handle: Awaited<ReturnType<typeof open>>;
  try {
    handle = await open(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw refused(what, `cannot open ${path}: ${(err as NodeJS.ErrnoException).code ?? String(err)}`);
  }
  try {
    const stat = await handle.stat();
    if (!stat.isFile()) throw refused(what, `${path} is not a regular file`);
    if (stat.size > MAX_EXCHANGE_BYTES) throw refused(what, `${path} holds ${stat.size} bytes, over ${MAX_EXCHANGE_BYTES}`);
    const buffer = Buffer.alloc(MAX_EXCHANGE_BYTES + 1);
    const { bytesRead } = await handle.read(buffer, 0, buffer.length, 0);
    if (bytesRead > MAX_EXCHANGE_BYTES) throw refused(what, `${path} grew over ${MAX_EXCHANGE_BYTES} bytes while read`);
    return buffer.subarray(0, bytesRead).toString('utf8');
  } finally {
    await handle.close();
  }
}

function serviceList(value: unknown, what: string): string[] {
  if (!Array.isArray(value) || value.length > MAX_EXCHANGE_SERVICES) throw refused(what, `not a list of at most ${MAX_EXCHANGE_SERVICES} Services`);
  for (const name of value) if (typeof name !== 'string' || !isServiceName(name)) throw refused(what, `${JSON.stringify(name)} is not a Service name`);
  return [...new Set(value as string[])];
}

function parsed(text: string, what: string): Record<string, unknown> {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw refused(what, 'not JSON');
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value)) throw refused(what, 'not a JSON object');
  return value as Record<string, unknown>;
}

function sequence(value: unknown, what: string): number {
  if (!Number.isSafeInteger(value) || (value as number) < 0) throw refused(what, 'seq is not a non-negative integer');
  return value as number;
}

/** certshare's request as the agent reads it: anything but this exact shape is refused (the agent then withdraws). */
export function parseRequest(text: string): AdvertiseRequest {
  const what = 'advertise request';
  const value = parsed(text, what);
  const extra = Object.keys(value).filter((k) => k !== 'seq' && k !== 'advertise');
  if (extra.length > 0) throw refused(what, `unknown fields ${extra.join(', ')}`);
  return { seq: sequence(value.seq, what), advertise: serviceList(value.advertise, what) };
}

/** The agent's status as certshare reads it. */
function parseStatus(text: string): AdvertiseStatus {
  const what = 'advertise status';
  const value = parsed(text, what);
  return {
    seq: value.seq === undefined ? undefined : sequence(value.seq, what),
    advertised: serviceList(value.advertised, what),
    stopped: value.stopped === true,
    fromFile: value.fromFile === true,
  };
}

export function requestPath(dir: string): string {
  return join(dir, REQUEST_DIR, REQUEST_FILE);
}

export async function writeStatus(dir: string, status: AdvertiseStatus): Promise<void> {
  await writeFileAtomically(join(dir, STATUS_DIR), STATUS_FILE, `${JSON.stringify(status)}\n`, 0o644);
}

async function readStatus(dir: string): Promise<AdvertiseStatus> {
  const text = await readExchangeFile(join(dir, STATUS_DIR, STATUS_FILE), 'advertise status');
  return text === undefined ? { seq: undefined, advertised: [], stopped: false } : parseStatus(text);
}

/** The agent is gone (its stop said so): what a tailscaled that is not listening is to the Advertiser. */
function agentStopped(): LocalApiError {
  const cause = Object.assign(new Error('the advertise agent stopped'), { code: 'ECONNREFUSED' });
  return new LocalApiError(
    { request: 'the prefs, through the advertise agent', failure: 'the agent stopped (its status says so): nobody advertises through it' },
    { cause },
  );
}

/**
 * tailscaled's prefs as certshare sees them through the agent: a read is the agent's status, an edit writes a
 * request and waits (within `answerTimeoutMs`, polling) until the status names it. A read while a request is
 * unanswered waits for that answer too: the status before it says what the prefs were, not what they are (a
 * stop that read it would find nothing to withdraw while the agent applies the request). Only
 * AdvertiseServices travels; the agent keeps every other pref and Service as tailscaled has them.
 */
export class AgentPrefs implements PrefsApi {
  readonly #dir: string;
  readonly #clock: Clock;
  readonly #answerTimeoutMs: number;
  #seq: number;
  /** The last request written, until the status names it. */
  #unanswered: number | undefined;
  #fromFile = false;

  constructor(dir: string, clock: Clock, answerTimeoutMs: number) {
    this.#dir = dir;
    this.#clock = clock;
    this.#answerTimeoutMs = answerTimeoutMs;
    this.#seq = Math.floor(clock.now());
  }

  /** The agent's last status said tailscaled runs from a config file. */
  fromFile(): boolean {
    return this.#fromFile;
  }

  async prefs(signal: AbortSignal): Promise<IpnPrefs> {
    const within = AbortSignal.any([signal, AbortSignal.timeout(this.#answerTimeoutMs)]);
    for (;;) {
      const status = await readStatus(this.#dir);
      if (this.#unanswered === undefined || status.seq === this.#unanswered || status.stopped) {
        this.#unanswered = undefined;
        return this.#asPrefs(status);
      }
      if (within.aborted)
        throw new LocalApiError({ request: `request ${this.#unanswered} to the advertise agent`, failure: 'not applied in time' }, { timedOut: true });
      await this.#clock.sleep(ANSWER_POLL_MS, within).catch(() => {});
    }
  }

  async editPrefs(masked: MaskedPrefs, signal: AbortSignal): Promise<IpnPrefs> {
    const request: AdvertiseRequest = { seq: ++this.#seq, advertise: masked.AdvertiseServices ?? [] };
    await writeFileAtomically(join(this.#dir, REQUEST_DIR), REQUEST_FILE, `${JSON.stringify(request)}\n`, 0o644);
    this.#unanswered = request.seq;
    return this.prefs(signal);
  }

  #asPrefs(status: AdvertiseStatus): IpnPrefs {
    if (status.stopped) throw agentStopped();
    this.#fromFile = status.fromFile === true;
    return { AdvertiseServices: status.advertised };
  }
}
