// Test helpers: plain node:http requests to the emulator (unix socket or TCP) and a line reader for the IPN bus.
import { request, type IncomingHttpHeaders, type IncomingMessage } from 'node:http';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { X509Certificate } from 'node:crypto';
import { startEmulator, type Emulator, type EmulatorOptions } from '../../src/emulator/server.ts';

export interface Resp {
  status: number;
  headers: IncomingHttpHeaders;
  body: string;
}

export interface ReqOptions {
  method?: string;
  headers?: Record<string, string>;
  body?: string;
  signal?: AbortSignal;
}

function target(address: string): { socketPath: string } | { host: string; port: number } {
  if (address.startsWith('http://')) {
    const u = new URL(address);
    return { host: u.hostname.replace(/^\[|\]$/g, ''), port: Number(u.port) };
  }
  return { socketPath: address };
}

export function openRequest(address: string, path: string, options: ReqOptions = {}): Promise<IncomingMessage> {
  return new Promise((resolve, reject) => {
    const req = request(
      {
        ...target(address),
        path,
        method: options.method ?? 'GET',
        headers: { Host: 'local-tailscaled.sock', 'Tailscale-Cap': '115', ...options.headers },
        agent: false,
        ...(options.signal ? { signal: options.signal } : {}),
      },
      resolve,
    );
    req.once('error', reject);
    req.end(options.body);
  });
}

export async function get(address: string, path: string, options: ReqOptions = {}): Promise<Resp> {
  const res = await openRequest(address, path, options);
  res.setEncoding('utf8');
  let body = '';
  for await (const chunk of res) body += chunk as string;
  return { status: res.statusCode ?? 0, headers: res.headers, body };
}

/** POST to the emulator's control API (over its LocalAPI socket), as a test harness or an operator would. */
export function control(address: string, path: string, body: unknown): Promise<Resp> {
  return get(address, `/certshare-emulator/v0/${path}`, { method: 'POST', body: JSON.stringify(body), headers: { 'content-type': 'application/json' } });
}

export async function getJson<T = unknown>(address: string, path: string, options: ReqOptions = {}): Promise<T> {
  const r = await get(address, path, options);
  if (r.status !== 200) throw new Error(`${path}: ${r.status} ${r.body}`);
  return JSON.parse(r.body) as T;
}

export function certPath(domain: string, minValidity = '0s', type = 'pair'): string {
  return `/localapi/v0/cert/${encodeURIComponent(domain)}?type=${type}&min_validity=${minValidity}`;
}

/** Splits a type=pair body at the first certificate, like a careful client. */
export function splitPair(body: string): { keyPem: string; certPem: string; certs: X509Certificate[] } {
  const i = body.indexOf('-----BEGIN CERTIFICATE-----');
  if (i < 0) throw new Error('no certificate in body');
  const keyPem = body.slice(0, i);
  const certPem = body.slice(i);
  const certs = [...certPem.matchAll(/-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----\n?/g)].map((m) => new X509Certificate(m[0]));
  return { keyPem, certPem, certs };
}

/** Reads the IPN bus line by line. */
export class BusReader {
  readonly res: IncomingMessage;
  readonly #lines: string[] = [];
  readonly #waiters: Array<{ resolve: (line: string) => void; reject: (err: Error) => void }> = [];
  #buffer = '';
  #ended = false;
  readonly ended: Promise<void>;

  private constructor(res: IncomingMessage) {
    this.res = res;
    res.setEncoding('utf8');
    let endedResolve!: () => void;
    this.ended = new Promise((r) => (endedResolve = r));
    res.on('data', (chunk: string) => {
      this.#buffer += chunk;
      for (let nl = this.#buffer.indexOf('\n'); nl >= 0; nl = this.#buffer.indexOf('\n')) {
        const line = this.#buffer.slice(0, nl);
        this.#buffer = this.#buffer.slice(nl + 1);
        const w = this.#waiters.shift();
        if (w) w.resolve(line);
        else this.#lines.push(line);
      }
    });
    const finish = (): void => {
      if (this.#ended) return;
      this.#ended = true;
      for (const w of this.#waiters.splice(0)) w.reject(new Error('bus stream ended'));
      endedResolve();
    };
    res.on('end', finish);
    res.on('close', finish);
    res.on('error', finish);
  }

  static async open(address: string, mask: number | string): Promise<BusReader> {
    const res = await openRequest(address, `/localapi/v0/watch-ipn-bus?mask=${mask}`);
    if (res.statusCode !== 200) throw new Error(`watch-ipn-bus: ${res.statusCode}`);
    return new BusReader(res);
  }

  get isEnded(): boolean {
    return this.#ended;
  }

  next(): Promise<string> {
    const line = this.#lines.shift();
    if (line !== undefined) return Promise.resolve(line);
    if (this.#ended) return Promise.reject(new Error('bus stream ended'));
    return new Promise((resolve, reject) => this.#waiters.push({ resolve, reject }));
  }

  async nextJson(): Promise<Record<string, any>> {
    return JSON.parse(await this.next()) as Record<string, any>;
  }

  close(): void {
    this.res.destroy();
  }
}

export interface FakeClock {
  now(): number;
  set(ms: number): void;
  advance(ms: number): void;
}

export function fakeClock(start = Date.UTC(2030, 0, 1, 12, 0, 0)): FakeClock {
  let t = start;
  return {
    now: () => t,
    set: (ms) => {
      t = ms;
    },
    advance: (ms) => {
      t += ms;
    },
  };
}

export interface TestEnv {
  dir: string;
  socket: string;
  emulators: Emulator[];
  start(options?: EmulatorOptions): Promise<Emulator>;
  cleanup(): Promise<void>;
}

/** A temporary directory with a socket path; every emulator started through it is closed by cleanup(). */
export async function testEnv(): Promise<TestEnv> {
  const dir = await mkdtemp(join(tmpdir(), 'emu-'));
  const env: TestEnv = {
    dir,
    socket: join(dir, 'ts.sock'),
    emulators: [],
    async start(options = {}) {
      const em = await startEmulator({ listen: join(dir, `ts-${env.emulators.length}.sock`), ...options });
      env.emulators.push(em);
      return em;
    },
    async cleanup() {
      await Promise.all(env.emulators.map((e) => e.close()));
      await rm(dir, { recursive: true, force: true });
    },
  };
  return env;
}

/** Resolves with the first event `name` whose payload satisfies `pred`. */
export function waitEvent<T = any>(em: Emulator, name: string, pred: (payload: T) => boolean = () => true): Promise<T> {
  return new Promise((resolve) => {
    const on = (payload: T): void => {
      if (!pred(payload)) return;
      em.events.off(name, on);
      resolve(payload);
    };
    em.events.on(name, on);
  });
}
