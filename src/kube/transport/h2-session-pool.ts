// HTTP/2 sessions to one Kubernetes API server endpoint, shared by every request and watch of a
// connection (one KubeConfig): one TLS connection carries them all, as client-go does, where HTTP/1.1
// needs a socket per concurrent watch. See https-transport.ts for how requests use it.
import { connect as h2Connect, constants, type ClientHttp2Session, type ClientHttp2Stream, type OutgoingHttpHeaders } from 'node:http2';
import { isIP } from 'node:net';
import { connect as tlsConnect, type ConnectionOptions, type TLSSocket } from 'node:tls';
import { doubling, jitter } from '../../core/issuance/backoff.ts';
import { CertshareError } from '../../core/errors.ts';

/** The TLS part of client-node's applyToHTTPSOptions: what a session is keyed on besides its origin. */
export type TlsIdentity = Pick<ConnectionOptions, 'ca' | 'cert' | 'key' | 'pfx' | 'passphrase' | 'rejectUnauthorized' | 'servername'>;

/** How a session notices that its connection is dead, and how long an unused one stays open. */
export interface SessionLiveness {
  /** No byte received for this long: send a PING (client-go's ReadIdleTimeout). */
  readIdleMs: number;
  /** A PING unanswered for this long ends the session and every stream on it (client-go's PingTimeout). */
  pingTimeoutMs: number;
  /** A session without streams for this long is closed (client-go's IdleConnTimeout). */
  idleCloseMs: number;
  /** Bound on TCP connect + TLS handshake + the server's first SETTINGS. */
  connectTimeoutMs: number;
  /** The wait after a failed connect before the next, doubling with each failure up to RECONNECT_CAP_MS or this. */
  reconnectFirstMs: number;
}

export const DEFAULT_LIVENESS: SessionLiveness = {
  readIdleMs: 30_000,
  pingTimeoutMs: 15_000,
  idleCloseMs: 90_000,
  connectTimeoutMs: 10_000,
  reconnectFirstMs: 100,
};

/** Waits after consecutive failed connects: doubling from the first (SessionLiveness), jittered, up to the cap. */
const RECONNECT_CAP_MS = 2000;
/**
 * Receive windows: 1 MiB per stream lets a large list arrive without a WINDOW_UPDATE round trip per
 * 64 KiB (Go's client uses 4 MiB); the connection's window covers a 16 MiB answer.
 */
const STREAM_WINDOW_BYTES = 1024 * 1024;
const SESSION_WINDOW_BYTES = 16 * 1024 * 1024;

/** A stream on a session that was refused before the server looked at it: safe to send again. */
export function refusedBeforeProcessing(err: unknown, stream: ClientHttp2Stream | undefined): boolean {
  const code = (err as { code?: unknown })?.code;
  if (code === 'ERR_HTTP2_GOAWAY_SESSION' || code === 'ERR_HTTP2_INVALID_SESSION') return stream === undefined;
  return stream?.rstCode === constants.NGHTTP2_REFUSED_STREAM;
}

/** One HTTP/2 connection and the streams open on it. */
export class H2Session {
  readonly h2: ClientHttp2Session;
  /** Streams open or reserved. */
  active = 0;
  /** Of those, watches: they stay open for tens of minutes, where a request ends within its deadline. */
  longLived = 0;
  /** The server sent GOAWAY: streams already open may finish, no new ones. */
  goneAway = false;
  #open = true;
  readonly #socket: TLSSocket;
  readonly #liveness: SessionLiveness;
  readonly #onGoaway = new Set<() => void>();
  #lastBytesRead = 0;
  #lastReadAt = performance.now();
  #idleSince = performance.now();
  #pinging = false;
  readonly #timer: NodeJS.Timeout;
  readonly #onRelease: () => void;

  constructor(h2: ClientHttp2Session, socket: TLSSocket, liveness: SessionLiveness, onRelease: () => void = () => {}) {
    this.h2 = h2;
    this.#onRelease = onRelease;
    this.#socket = socket;
    this.#liveness = liveness;
    h2.on('goaway', () => {
      // Node closes the session itself (NO_ERROR: existing streams may finish) or destroys it.
      this.goneAway = true;
      for (const listener of [...this.#onGoaway]) listener();
    });
    h2.on('error', () => {}); // reported to each stream; the session just goes
    h2.on('close', () => {
      clearInterval(this.#timer);
    });
    // One check per third of the read-idle time: liveness is per connection, not per watch.
    this.#timer = setInterval(() => this.#check(), Math.max(10, Math.floor(liveness.readIdleMs / 3)));
    this.#timer.unref();
    h2.unref();
  }

  /** Takes new streams: not after GOAWAY, nor while a PING checks it, nor once closing or destroyed. */
  get open(): boolean {
    return this.#open && !this.goneAway && !this.h2.closed && !this.h2.destroyed;
  }

  /**
   * SETTINGS_MAX_CONCURRENT_STREAMS from the server. kube-apiserver's default is 100 (k8s.io/apiserver
   * secure_serving.go, since the HTTP/2 rapid-reset fixes; 250 before), --http2-max-streams-per-connection
   * overrides it: 200 watches take 2 connections there. Beyond it the server refuses streams or
   * nghttp2 queues them unsent, so a full session is not used.
   */
  get capacity(): number {
    return this.h2.remoteSettings.maxConcurrentStreams ?? 100;
  }

  get bytesRead(): number {
    return this.#socket.bytesRead;
  }

  /**
   * Holds a place for one stream (synchronously: callers that waited for the same connect must not all
   * count the same free places); the process stays alive while any is held.
   */
  reserve(longLived = false): void {
    this.active++;
    if (longLived) this.longLived++;
    if (this.active === 1) this.h2.ref();
  }

  /** Opens a stream on a place reserve() held; the place is given back when the stream closes. */
  request(headers: OutgoingHttpHeaders, endStream: boolean, longLived = false): ClientHttp2Stream {
    let stream: ClientHttp2Stream;
    try {
      stream = this.h2.request(headers, { endStream });
    } catch (err) {
      this.#release(longLived);
      throw err;
    }
    stream.once('close', () => this.#release(longLived));
    return stream;
  }

  #release(longLived: boolean): void {
    this.active--;
    if (longLived) this.longLived--;
    this.#onRelease();
    if (this.active === 0) {
      this.#idleSince = performance.now();
      if (!this.h2.destroyed) this.h2.unref();
    }
  }

  /** Calls `listener` when the server sends GOAWAY (at once if it has); returns the unsubscribe. */
  onGoaway(listener: () => void): () => void {
    if (this.goneAway) {
      listener();
      return () => {};
    }
    this.#onGoaway.add(listener);
    return () => this.#onGoaway.delete(listener);
  }

  /**
   * A request on this session outlived its deadline with no byte received meanwhile: no new streams
   * here until a PING shows the connection alive (a dead one is destroyed, ending its streams).
   */
  suspect(): void {
    if (this.h2.destroyed) return;
    this.#open = false;
    this.#ping(true);
  }

  close(): void {
    this.#open = false;
    clearInterval(this.#timer);
    if (!this.h2.closed) this.h2.close();
    // Streams still open after a moment are cut: stopping must not wait for a watch's 30 minutes.
    setTimeout(() => this.h2.destroy(), 1000).unref();
  }

  #check(): void {
    if (this.h2.destroyed || this.h2.closed) return;
    const now = performance.now();
    const read = this.bytesRead;
    if (read !== this.#lastBytesRead) {
      this.#lastBytesRead = read;
      this.#lastReadAt = now;
    }
    if (this.active === 0 && this.open && now - this.#idleSince >= this.#liveness.idleCloseMs) {
      this.close();
      return;
    }
    if (this.active > 0 && now - this.#lastReadAt >= this.#liveness.readIdleMs) this.#ping(false);
  }

  #ping(reopen: boolean): void {
    if (this.#pinging) return;
    this.#pinging = true;
    const timer = setTimeout(() => {
      this.h2.destroy(
        new CertshareError('CERTSHARE_KUBE_TIMEOUT', { request: 'HTTP/2 PING (the connection is dead)', within: `${this.#liveness.pingTimeoutMs} ms` }),
      );
    }, this.#liveness.pingTimeoutMs);
    timer.unref();
    const sent = this.h2.ping((err) => {
      clearTimeout(timer);
      this.#pinging = false;
      if (err) {
        this.h2.destroy(err);
        return;
      }
      this.#lastReadAt = performance.now();
      if (reopen) this.#open = true;
    });
    if (!sent) {
      clearTimeout(timer);
      this.#pinging = false;
    }
  }
}

interface ConnectAttempt {
  promise: Promise<void>;
  waiters: number;
  settled: boolean;
  abandon(): void;
}

/** The error a cancelled exchange rejects with, as node:http's own for an aborted request (name AbortError). */
export const abortError = (signal: AbortSignal): Error =>
  Object.assign(new Error('The operation was aborted', { cause: signal.reason }), { name: 'AbortError', code: 'ABORT_ERR' });

/**
 * The sessions to one origin with one TLS identity. A session takes streams up to the server's
 * SETTINGS_MAX_CONCURRENT_STREAMS; past that a second one opens. A server that does not offer h2 in
 * ALPN marks the pool HTTP/1.1-only, remembered. Failed connects back off (doubling, jittered): callers
 * in that window fail at once with the last connect error instead of each opening a connection.
 */
export class H2SessionPool {
  readonly #url: URL;
  readonly #tls: TlsIdentity;
  readonly #liveness: SessionLiveness;
  readonly #sessions = new Set<H2Session>();
  /** Requests waiting for a free stream on a full session. */
  readonly #slotWaiters = new Set<() => void>();
  #connecting: ConnectAttempt | undefined;
  #failures = 0;
  #retryAt = 0;
  #lastError: unknown;
  #closed = false;
  /** The server answered ALPN without h2: this origin speaks HTTP/1.1 only. */
  http1Only = false;
  /** Connections opened (for tests and diagnostics). */
  connects = 0;

  constructor(origin: string, tls: TlsIdentity, liveness: SessionLiveness = DEFAULT_LIVENESS) {
    this.#url = new URL(origin);
    this.#tls = tls;
    this.#liveness = liveness;
  }

  get sessions(): number {
    return this.#sessions.size;
  }

  /**
   * A session with room for one more stream, its place reserved (use it with request() at once),
   * connecting one if needed; 'http1' when the server has no h2.
   */
  async acquire(signal: AbortSignal, longLived = false): Promise<H2Session | 'http1'> {
    for (;;) {
      if (signal.aborted) throw abortError(signal);
      if (this.#closed) throw new CertshareError('CERTSHARE_KUBE_CONNECTION_LOST', { channel: 'connection', when: 'before the request was sent' });
      if (this.http1Only) return 'http1';
      for (const session of this.#sessions) {
        if (session.open && session.active < session.capacity) {
          session.reserve(longLived);
          return session;
        }
      }
      // Every session is full. A request waits for one of the requests under way to end (each ends within
      // its deadline, and so does this wait) rather than opening a connection that would idle for a minute
      // and a half after the burst: a writer storing hundreds of certificates at once stays on its
      // connections. Only watches, which hold their stream for tens of minutes, need another one.
      if (!longLived && [...this.#sessions].some((s) => s.open && s.active > s.longLived)) {
        await this.#slotFreed(signal);
        continue;
      }
      if (this.#connecting === undefined && performance.now() < this.#retryAt) throw this.#lastError;
      await this.#join(signal);
    }
  }

  /** Resolves when any session gives a stream's place back (or rejects when `signal` aborts). */
  #slotFreed(signal: AbortSignal): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const onAbort = (): void => {
        this.#slotWaiters.delete(onFree);
        reject(abortError(signal));
      };
      const onFree = (): void => {
        signal.removeEventListener('abort', onAbort);
        resolve();
      };
      this.#slotWaiters.add(onFree);
      signal.addEventListener('abort', onAbort, { once: true });
    });
  }

  #slotReleased(): void {
    const waiters = [...this.#slotWaiters];
    this.#slotWaiters.clear();
    for (const wake of waiters) wake();
  }

  /** Closes every session; streams still open end within a second. */
  close(): void {
    this.#closed = true;
    this.#connecting?.abandon();
    for (const session of this.#sessions) session.close();
  }

  async #join(signal: AbortSignal): Promise<void> {
    this.#connecting ??= this.#connect();
    const attempt = this.#connecting;
    attempt.waiters++;
    let onAbort: (() => void) | undefined;
    try {
      await Promise.race([
        attempt.promise,
        new Promise<never>((_, reject) => {
          onAbort = () => reject(abortError(signal));
          signal.addEventListener('abort', onAbort, { once: true });
        }),
      ]);
    } finally {
      signal.removeEventListener('abort', onAbort!);
      attempt.waiters--;
      // Nobody waits for a connect that has not finished (e.g. a handshake black-holed): drop it, so the
      // next caller starts afresh instead of joining a connection that may never come.
      if (attempt.waiters === 0 && !attempt.settled) attempt.abandon();
    }
  }

  #connect(): ConnectAttempt {
    const url = this.#url;
    const host = url.hostname.replace(/^\[|\]$/g, '');
    const servername = this.#tls.servername ?? (isIP(host) ? undefined : host);
    this.connects++;
    const socket = tlsConnect({
      ...this.#tls,
      host,
      port: Number(url.port || 443),
      ALPNProtocols: ['h2', 'http/1.1'],
      ...(servername ? { servername } : {}),
    });
    let session: ClientHttp2Session | undefined;
    let fail: (err: unknown) => void = () => {};
    const attempt: ConnectAttempt = {
      waiters: 0,
      settled: false,
      abandon: () => fail(Object.assign(new Error('connect abandoned'), { abandoned: true })),
      promise: new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => {
          const within = this.#liveness.connectTimeoutMs;
          fail(new CertshareError('CERTSHARE_KUBE_TIMEOUT', { request: `connect to ${url.host}`, within: `${within} ms` }));
        }, this.#liveness.connectTimeoutMs);
        timer.unref();
        const settle = (): boolean => {
          if (attempt.settled) return false;
          attempt.settled = true;
          clearTimeout(timer);
          if (this.#connecting === attempt) this.#connecting = undefined;
          return true;
        };
        fail = (err) => {
          if (!settle()) return;
          socket.destroy();
          session?.destroy();
          if (!(err as { abandoned?: boolean }).abandoned) {
            this.#failures++;
            const first = this.#liveness.reconnectFirstMs;
            this.#retryAt = performance.now() + jitter(doubling(first, this.#failures, Math.max(first, RECONNECT_CAP_MS)));
            this.#lastError = err;
          }
          reject(err);
        };
        socket.once('error', fail);
        socket.once('secureConnect', () => {
          if (attempt.settled) return;
          if (socket.alpnProtocol !== 'h2') {
            settle();
            this.http1Only = true;
            socket.destroy();
            resolve();
            return;
          }
          const h2 = h2Connect(url.origin, {
            createConnection: () => socket,
            settings: { enablePush: false, initialWindowSize: STREAM_WINDOW_BYTES },
          });
          session = h2;
          h2.once('error', fail);
          h2.once('close', () => fail(new Error('Kubernetes API connection closed during set-up')));
          h2.once('remoteSettings', () => {
            if (!settle()) return;
            h2.removeListener('error', fail);
            h2.removeAllListeners('close');
            h2.setLocalWindowSize(SESSION_WINDOW_BYTES);
            this.#failures = 0;
            const entry = new H2Session(h2, socket, this.#liveness, () => this.#slotReleased());
            this.#sessions.add(entry);
            h2.once('close', () => this.#sessions.delete(entry));
            if (this.#closed) entry.close();
            resolve();
          });
        });
      }),
    };
    attempt.promise.catch(() => {});
    return attempt;
  }
}
