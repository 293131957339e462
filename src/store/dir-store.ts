import { watch as watchDir, type FSWatcher } from 'node:fs';
import { mkdir, readFile, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { iso, type Clock } from '../core/ports/clock.ts';
import { inspectCertPair } from '../core/certificates/certificate.ts';
import { pendingRenewRequest } from '../core/renewal/renew-request.ts';
import type { CertStore, Coordination, RenewAnswer, SaveOptions, StoreRead, StoredCert } from '../core/ports/store.ts';
import { reportFilesWrite, safeName, type CertDirectory, type FilesHealth } from './cert-directory.ts';
import { writeFileAtomically } from './atomic-file.ts';

/**
 * The renew request of a domain standalone (`certshare renew <domain> --store dir:PATH`): the file
 * `.state/<domain>.renew` holding the request id; the answer is kept in `.state/<domain>.json`.
 */
function renewMarkerPath(root: string, domain: string): string {
  return join(root, '.state', `${safeName(domain)}.renew`);
}

/**
 * The standalone store: the certificate directory is both the store and what the proxy reads. A rate
 * limit and when the current pair was obtained are kept in `.state/<domain>.json`, so that a restart
 * neither retries before the CA allows nor measures the renewal window differently (renewal.ts). So is
 * the answer to the last renew request (`.state/<domain>.renew`, see renewMarkerPath), written with when
 * the pair that served it was obtained, before the files: a crash in between leaves the request answered
 * (at most one issuance per request), and tailscaled holds the pair for the next call.
 */
export class DirStore implements CertStore {
  readonly kind = 'dir';
  readonly #dir: CertDirectory;
  readonly #clock: Clock;
  readonly #onWritten: (domain: string, path: string) => void;
  readonly #health: FilesHealth | undefined;

  /** `health`: unhealthy while a domain's files could not be written (the loop holds a pair the proxy does not serve). */
  constructor(dir: CertDirectory, clock: Clock, onWritten: (domain: string, path: string) => void, health?: FilesHealth) {
    this.#dir = dir;
    this.#clock = clock;
    this.#onWritten = onWritten;
    this.#health = health;
  }

  async load(domain: string): Promise<StoreRead> {
    const now = this.#clock.now();
    const [read, state, requested, pending] = await Promise.all([
      this.#dir.read(domain, now),
      this.#readState(domain),
      this.#readMarker(domain),
      this.#readPending(domain, now),
    ]);
    // When the pair on disk was obtained, trusted only for the serial it was written with (a pair put
    // there by hand starts from its notBefore, which renews earlier, never later).
    if (read.state === 'valid' && state.obtained?.serial === read.cert.info.serial) read.cert.obtainedAt = state.obtained.at;
    const coordination: Coordination = state.retryNotBefore === undefined ? {} : { retryNotBefore: state.retryNotBefore };
    const renew = pendingRenewRequest(requested, state.renew?.id);
    if (renew !== undefined) coordination.renewRequest = renew;
    return { ...read, coordination, ...(pending ? { pending } : {}) };
  }

  /**
   * A pair valid only later (StoreRead.pending) in `.state/<domain>.pending.json` (0600, written atomically), where
   * the proxy reads nothing: the files it serves change only when the pair is taken into use (save).
   */
  async savePending(domain: string, cert: StoredCert): Promise<void> {
    await mkdir(this.#stateDir, { recursive: true, mode: 0o700 });
    const json = JSON.stringify({ certPem: cert.pair.certPem, keyPem: cert.pair.keyPem });
    await writeFileAtomically(this.#stateDir, pendingName(domain), `${json}\n`, 0o600);
  }

  /** The pair stored for later, if whole, for `domain` and not expired; anything else is none. */
  async #readPending(domain: string, now: number): Promise<StoredCert | undefined> {
    try {
      const { certPem, keyPem } = JSON.parse(await readFile(join(this.#stateDir, pendingName(domain)), 'utf8')) as { certPem?: unknown; keyPem?: unknown };
      if (typeof certPem !== 'string' || typeof keyPem !== 'string') return undefined;
      const pair = { certPem, keyPem };
      const info = inspectCertPair(pair, domain);
      return now < info.notAfter ? { pair, info } : undefined;
    } catch {
      return undefined;
    }
  }

  get #stateDir(): string {
    return join(this.#dir.root, '.state');
  }

  async save(domain: string, cert: StoredCert, _signal?: AbortSignal, options?: SaveOptions): Promise<void> {
    if (cert.obtainedAt !== undefined || options?.renewAnswer) {
      // Before the files: a crash in between leaves a record for another serial, which is ignored.
      const state = await this.#readState(domain);
      if (cert.obtainedAt !== undefined) state.obtained = { serial: cert.info.serial, at: cert.obtainedAt };
      if (options?.renewAnswer) state.renew = options.renewAnswer;
      await this.#writeState(domain, state);
    }
    let written: boolean;
    try {
      written = await this.#dir.write(domain, cert.pair);
    } catch (err) {
      if (this.#health) reportFilesWrite(this.#health, domain, err);
      throw err;
    }
    if (this.#health) reportFilesWrite(this.#health, domain);
    // A pair for later that ends no later than the one now served is done with (kept otherwise: the newest issuance).
    const pending = await this.#readPending(domain, Number.NEGATIVE_INFINITY);
    if (pending && pending.info.notAfter <= cert.info.notAfter) await rm(join(this.#stateDir, pendingName(domain)), { force: true });
    if (written) this.#onWritten(domain, this.#dir.pathOf(domain));
  }

  async recordRenewAnswer(domain: string, answer: RenewAnswer): Promise<void> {
    await this.#writeState(domain, { ...(await this.#readState(domain)), renew: answer });
  }

  /** A renew request written (the marker file created or replaced) wakes the domain's loop. */
  watch(domain: string, listener: () => void): () => void {
    const name = `${safeName(domain)}.renew`;
    const dir = join(this.#dir.root, '.state');
    let watcher: FSWatcher | undefined;
    let closed = false;
    void mkdir(dir, { recursive: true, mode: 0o700 }).then(
      () => {
        if (closed) return;
        watcher = watchDir(dir, (_event, file) => {
          if (file === null || file === name) listener();
        });
        // A watcher that fails (the directory removed) only loses the wake-up: the next check still reads it.
        watcher.on('error', () => watcher?.close());
      },
      () => {},
    );
    return () => {
      closed = true;
      watcher?.close();
    };
  }

  async #readMarker(domain: string): Promise<string | undefined> {
    return readFile(renewMarkerPath(this.#dir.root, domain), 'utf8').catch(() => undefined);
  }

  async recordRateLimit(domain: string, until: number): Promise<void> {
    await this.#writeState(domain, { ...(await this.#readState(domain)), retryNotBefore: until });
  }

  /** `.state/<domain>.json`, durable: a crash right after must not let a restart call CertPair early. */
  async #writeState(domain: string, state: DomainState): Promise<void> {
    const name = `${safeName(domain)}.json`; // before anything is written: a refused name writes nothing
    const dir = join(this.#dir.root, '.state');
    await mkdir(dir, { recursive: true, mode: 0o700 });
    const json: Record<string, unknown> = {};
    if (state.retryNotBefore !== undefined) json.retryNotBefore = iso(state.retryNotBefore);
    if (state.obtained) json.obtained = { serial: state.obtained.serial, at: iso(state.obtained.at) };
    if (state.renew) json.renew = state.renew;
    await writeFileAtomically(dir, name, `${JSON.stringify(json)}\n`, 0o600);
  }

  #readState(domain: string): Promise<DomainState> {
    return readDomainState(this.#dir.root, domain);
  }
}

/** The file of a pair valid only later in `.state/`. */
const pendingName = (domain: string): string => `${safeName(domain)}.pending.json`;

/** What `.state/<domain>.json` remembers across restarts. */
interface DomainState {
  retryNotBefore?: number;
  obtained?: { serial: string; at: number };
  /** The last renew request answered, and what became of it. */
  renew?: RenewAnswer;
}

/** `.state/<domain>.json` of the store at `root`; missing or garbled: empty. */
async function readDomainState(root: string, domain: string): Promise<DomainState> {
  const path = join(root, '.state', `${safeName(domain)}.json`);
  let raw: { retryNotBefore?: unknown; obtained?: { serial?: unknown; at?: unknown }; renew?: { id?: unknown; outcome?: unknown } };
  try {
    raw = JSON.parse(await readFile(path, 'utf8'));
  } catch {
    // Missing or garbled state only loses a remembered rate limit (the CA would refuse again anyway) and
    // when the pair was obtained (the renewal rule then measures from notBefore), and the last renew
    // answer (a request still marked would be served again).
    return {};
  }
  const state: DomainState = {};
  const until = typeof raw?.retryNotBefore === 'string' ? Date.parse(raw.retryNotBefore) : Number.NaN;
  if (Number.isFinite(until)) state.retryNotBefore = until;
  const at = typeof raw?.obtained?.at === 'string' ? Date.parse(raw.obtained.at) : Number.NaN;
  if (typeof raw?.obtained?.serial === 'string' && Number.isFinite(at)) state.obtained = { serial: raw.obtained.serial, at };
  if (typeof raw?.renew?.id === 'string' && typeof raw.renew.outcome === 'string') state.renew = { id: raw.renew.id, outcome: raw.renew.outcome };
  return state;
}

/**
 * `certshare renew <domain> --store dir:PATH`: writes the request marker unless a request is pending (its
 * id differs from the last one answered): then that one stands. The daemon's watch of `.state/` wakes the
 * domain's loop. (Two operators at the same instant may both write; the last id written is the request.)
 */
export async function requestRenewalInDir(root: string, domain: string, id: string): Promise<{ kind: 'requested' | 'pending'; id: string }> {
  const marker = renewMarkerPath(root, domain);
  const [requested, state] = await Promise.all([readFile(marker, 'utf8').catch(() => undefined), readDomainState(root, domain)]);
  const pending = pendingRenewRequest(requested, state.renew?.id);
  if (pending !== undefined) return { kind: 'pending', id: pending };
  const dir = join(root, '.state');
  await mkdir(dir, { recursive: true, mode: 0o700 });
  await writeFileAtomically(dir, `${safeName(domain)}.renew`, `${id}\n`, 0o600);
  return { kind: 'requested', id };
}

/** The last renew answer recorded for `domain` in the store at `root` (for `certshare renew --wait`). */
export async function renewAnswerInDir(root: string, domain: string): Promise<{ id?: string; outcome?: string }> {
  const { renew } = await readDomainState(root, domain);
  return renew ? { id: renew.id, outcome: renew.outcome } : {};
}
