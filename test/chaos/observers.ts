// What the checker sees, independently of certshare: the Secret and the Pods through the admin's own
// list+watch straight to kube-apiserver (not through the fault proxy), each replica's projected files
// (fs.watch plus a slow rescan), and the emulators' shared ledger (tailed).
import { X509Certificate, createPrivateKey } from 'node:crypto';
import { watch as fsWatch, readFileSync, realpathSync, type FSWatcher } from 'node:fs';
import { open, realpath } from 'node:fs/promises';
import { request } from 'node:https';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { ControlPlane } from '../harness/control-plane.ts';

export interface CertView {
  serial: string;
  notBefore: number;
  notAfter: number;
  /** The private key belongs to the leaf. */
  keyMatch: boolean;
}

const FIRST_CERT = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/;

/** Parses a pair the way a proxy would load it; undefined when it does not parse at all. */
export function viewPair(certPem: string, keyPem: string): CertView | undefined {
  const block = FIRST_CERT.exec(certPem)?.[0];
  if (!block) return undefined;
  try {
    const leaf = new X509Certificate(block);
    let keyMatch = false;
    try {
      keyMatch = leaf.checkPrivateKey(createPrivateKey(keyPem));
    } catch {
      keyMatch = false;
    }
    return { serial: leaf.serialNumber, notBefore: leaf.validFromDate.getTime(), notAfter: leaf.validToDate.getTime(), keyMatch };
  } catch {
    return undefined;
  }
}

export function isValidAt(view: CertView | undefined, t: number): boolean {
  if (!view) return false;
  return view.keyMatch && t >= view.notBefore && t < view.notAfter;
}

// ---------------------------------------------------------------------------------------------

export interface KubeObject {
  metadata?: { name?: string; resourceVersion?: string; annotations?: Record<string, string> };
  data?: Record<string, string>;
  status?: { conditions?: Array<{ type: string; status: string; reason?: string }> };
}

/**
 * List, then watch from the list's resourceVersion, as the admin (client certificate) directly against
 * kube-apiserver. Relists after any error or 410; calls `onSync` with the full list each time.
 */
export class AdminWatch {
  readonly #cp: ControlPlane;
  readonly #path: string;
  readonly #query: string;
  readonly #onEvent: (type: string, obj: KubeObject, at: number) => void;
  readonly #onSync: (items: KubeObject[], at: number) => void;
  readonly #abort = new AbortController();
  #done: Promise<void> | undefined;
  #current: { destroy(): void } | undefined;
  connected = false;
  /** When the last successful list completed. */
  syncedAt = 0;
  /** When the watch was last lost (0 if never). */
  lostAt = 0;

  constructor(
    cp: ControlPlane,
    path: string,
    query: string,
    onEvent: (type: string, obj: KubeObject, at: number) => void,
    onSync: (items: KubeObject[], at: number) => void,
  ) {
    this.#cp = cp;
    this.#path = path;
    this.#query = query;
    this.#onEvent = onEvent;
    this.#onSync = onSync;
  }

  start(): void {
    this.#done ??= this.#run();
  }

  async stop(): Promise<void> {
    this.#abort.abort();
    this.#current?.destroy();
    await this.#done;
  }

  async #run(): Promise<void> {
    while (!this.#abort.signal.aborted) {
      try {
        const list = await this.#cp.adminRequest('GET', `${this.#path}?${this.#query}`, { timeoutMs: 5000 });
        if (list.status !== 200) throw new Error(`list ${this.#path}: HTTP ${list.status}`);
        const parsed = JSON.parse(list.body) as { items: KubeObject[]; metadata: { resourceVersion: string } };
        const at = Date.now();
        this.syncedAt = at;
        this.connected = true;
        this.#onSync(parsed.items, at);
        let rv = parsed.metadata.resourceVersion;
        for (;;) {
          const outcome = await this.#watchOnce(rv, (next) => (rv = next));
          if (outcome !== 'ended' || this.#abort.signal.aborted) break;
        }
      } catch {
        // fall through to a relist
      }
      if (this.connected) this.lostAt = Date.now();
      this.connected = false;
      if (this.#abort.signal.aborted) return;
      await sleep(200, undefined, { signal: this.#abort.signal }).catch(() => {});
    }
  }

  #watchOnce(rv: string, setRv: (rv: string) => void): Promise<'ended' | 'gone' | 'error'> {
    const cp = this.#cp;
    const url = new URL(`${this.#path}?${this.#query}&watch=1&allowWatchBookmarks=true&timeoutSeconds=60&resourceVersion=${encodeURIComponent(rv)}`, cp.server);
    return new Promise((resolve) => {
      let settled = false;
      let inactivity: NodeJS.Timeout | undefined;
      const finish = (outcome: 'ended' | 'gone' | 'error'): void => {
        if (settled) return;
        settled = true;
        clearTimeout(inactivity);
        this.#current = undefined;
        req.destroy();
        resolve(outcome);
      };
      const bump = (): void => {
        clearTimeout(inactivity);
        inactivity = setTimeout(() => finish('error'), 90_000);
      };
      const req = request(
        url,
        { method: 'GET', ca: cp.caPem, cert: cp.adminCertPem, key: cp.adminKeyPem, agent: false, headers: { Accept: 'application/json' } },
        (res) => {
          if (res.statusCode !== 200) {
            res.resume();
            finish(res.statusCode === 410 ? 'gone' : 'error');
            return;
          }
          bump();
          let partial = '';
          res.setEncoding('utf8');
          res.on('data', (chunk: string) => {
            bump();
            const parts = (partial + chunk).split('\n');
            partial = parts.pop() ?? '';
            for (const line of parts) {
              if (!line.trim()) continue;
              let ev: { type: string; object: KubeObject & { code?: number } };
              try {
                ev = JSON.parse(line) as typeof ev;
              } catch {
                continue;
              }
              if (ev.type === 'ERROR') {
                finish(ev.object?.code === 410 ? 'gone' : 'error');
                return;
              }
              if (ev.object?.metadata?.resourceVersion) setRv(ev.object.metadata.resourceVersion);
              if (ev.type !== 'BOOKMARK') this.#onEvent(ev.type, ev.object, Date.now());
            }
          });
          res.on('end', () => finish('ended'));
          res.on('error', () => finish('error'));
          res.on('aborted', () => finish('error'));
        },
      );
      req.on('error', () => finish('error'));
      req.end();
      this.#current = { destroy: () => finish('error') };
    });
  }
}

// ---------------------------------------------------------------------------------------------

export interface FilesState {
  /** undefined: no files (or not readable as a pair). */
  cert: CertView | undefined;
  at: number;
}

/**
 * Follows `<outDir>/<domain>/tls.{crt,key}` for every domain: reads both through the symlink's target, so
 * never a torn pair. fs.watch names the domain whose link was swapped; a rescan every second catches
 * what it missed, and parses a domain's pair again only when its link points elsewhere (version
 * directories are written once), so many domains cost a readlink each per second.
 */
export class DirWatch {
  readonly #dir: string;
  readonly #domains: ReadonlySet<string>;
  readonly #onChange: (domain: string, state: FilesState) => void;
  #watcher: FSWatcher | undefined;
  #timer: NodeJS.Timeout | undefined;
  readonly #reading = new Set<string>();
  readonly #again = new Set<string>();
  /** Per domain: the link target last read and what it held. */
  readonly #last = new Map<string, { target: string | undefined; key: string }>();
  readonly states = new Map<string, FilesState>();

  constructor(outDir: string, domains: readonly string[], onChange: (domain: string, state: FilesState) => void) {
    this.#dir = outDir;
    this.#domains = new Set(domains);
    this.#onChange = onChange;
  }

  start(): void {
    this.#watcher = fsWatch(this.#dir, (_event, name) => {
      const domain = typeof name === 'string' ? this.#domainOf(name) : undefined;
      if (domain) void this.check(domain);
    });
    this.#watcher.on('error', () => {});
    this.#timer = setInterval(() => void this.checkAll(), 1000);
    void this.checkAll();
  }

  stop(): void {
    this.#watcher?.close();
    clearInterval(this.#timer);
  }

  /** The serial this replica's files hold for a domain, if any. */
  serial(domain: string): string | undefined {
    return this.states.get(domain)?.cert?.serial;
  }

  async checkAll(): Promise<void> {
    await Promise.all([...this.#domains].map((d) => this.check(d)));
  }

  async check(domain: string): Promise<void> {
    if (this.#reading.has(domain)) {
      this.#again.add(domain);
      return;
    }
    this.#reading.add(domain);
    try {
      do {
        this.#again.delete(domain);
        const target = await realpath(join(this.#dir, domain)).catch(() => undefined);
        const last = this.#last.get(domain);
        if (last && target !== undefined && last.target === target) continue;
        this.readNow(domain);
      } while (this.#again.has(domain));
    } finally {
      this.#reading.delete(domain);
    }
  }

  /**
   * The domain's files read at once, synchronously, and reported if they changed: what check() does once the link
   * moved, and what the checker does before it records a violation about them (a starved runner's watch of them lags).
   */
  readNow(domain: string): void {
    const link = join(this.#dir, domain);
    for (let attempt = 0; attempt < 3; attempt++) {
      let target: string;
      try {
        target = realpathSync(link);
      } catch {
        this.#record(domain, undefined, undefined);
        return;
      }
      try {
        this.#record(domain, target, viewPair(readFileSync(join(target, 'tls.crt'), 'utf8'), readFileSync(join(target, 'tls.key'), 'utf8')));
        return;
      } catch (err) {
        // The version directory may have been pruned between realpath and read: look again.
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT' || attempt === 2) {
          this.#record(domain, target, undefined);
          return;
        }
      }
    }
  }

  #record(domain: string, target: string | undefined, view: CertView | undefined): void {
    const last = this.#last.get(domain);
    const key = view ? `${view.serial}|${view.keyMatch}` : 'none';
    this.#last.set(domain, { target: view ? target : undefined, key });
    if (key !== last?.key) {
      const state = { cert: view, at: Date.now() };
      this.states.set(domain, state);
      this.#onChange(domain, state);
    }
  }

  /** The domain an fs.watch name refers to: the link itself, or its temporary `.<domain>.<version>.link`. */
  #domainOf(name: string): string | undefined {
    if (this.#domains.has(name)) return name;
    const m = /^\.(.+)\.[^.]+\.link$/.exec(name);
    return m && this.#domains.has(m[1]!) ? m[1] : undefined;
  }
}

// ---------------------------------------------------------------------------------------------

/** Tails a JSON-lines file by polling (several processes append to it). */
export class LedgerTail {
  readonly #path: string;
  readonly #onLine: (line: Record<string, unknown>) => void;
  #offset = 0;
  #partial = '';
  #timer: NodeJS.Timeout | undefined;
  #busy = false;

  constructor(path: string, onLine: (line: Record<string, unknown>) => void) {
    this.#path = path;
    this.#onLine = onLine;
  }

  start(): void {
    this.#timer = setInterval(() => void this.poll(), 200);
  }

  stop(): void {
    clearInterval(this.#timer);
  }

  async poll(): Promise<void> {
    if (this.#busy) return;
    this.#busy = true;
    try {
      const handle = await open(this.#path, 'r').catch(() => undefined);
      if (!handle) return;
      try {
        const { size } = await handle.stat();
        if (size <= this.#offset) return;
        const buf = Buffer.alloc(size - this.#offset);
        const { bytesRead } = await handle.read(buf, 0, buf.length, this.#offset);
        this.#offset += bytesRead;
        const parts = (this.#partial + buf.subarray(0, bytesRead).toString('utf8')).split('\n');
        this.#partial = parts.pop() ?? '';
        for (const line of parts) {
          if (!line.trim()) continue;
          try {
            this.#onLine(JSON.parse(line) as Record<string, unknown>);
          } catch {
            // a torn line cannot happen with O_APPEND writes; ignore garbage anyway
          }
        }
      } finally {
        await handle.close();
      }
    } finally {
      this.#busy = false;
    }
  }
}
