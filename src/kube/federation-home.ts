// The federation home (docs/federation.md): the group's writer Lease, Secrets of record and ledger on another
// apiserver, reached with a kubeconfig the platform mounts. Built from the one-cluster pieces with a second
// connection: a LeaseElector and a KubeSecretStore at the home beside the local ones. The local writer (the
// local Lease holder, as without a home) campaigns for the home Lease, reads the home's Secret and mirrors it
// into the local one; local readers read the local Secret only and never talk to the home.
import { readFile } from 'node:fs/promises';
import type { Clock } from '../core/ports/clock.ts';
import { defaultTrustAnchors, trustAnchors, type TrustAnchors } from '../core/certificates/trust.ts';
import type { FederationSettings } from '../core/federation/home-settings.ts';
import { doubling } from '../core/issuance/backoff.ts';
import { intentTtl } from '../core/issuance/issuance-policy.ts';
import { CertshareError, errorMessage, errorText } from '../core/errors.ts';
import { formatBreakGlassRecord, homeOutageVerdict, parseBreakGlassRecord, reconcile, type CopyView } from '../core/federation/home-verdicts.ts';
import type { Logger } from '../core/ports/logger.ts';
import type { RenewalPolicy } from '../core/renewal/renewal.ts';
import type { CertStore, IssuanceRole, LoadOptions, RenewAnswer, SaveOptions, StoreRead, StoredCert } from '../core/ports/store.ts';
import { apiErrorText, connectKube, type KubeConnection } from './connection.ts';
import { checkHome, homeLeaseName, isHomeOutage } from './home-check.ts';
import { BreakGlassClaims, type ClaimAnswer } from './break-glass-claim.ts';
import { LeaseElector, leaseIdentity } from './lease-elector.ts';
import { ANNOTATION_BREAK_GLASS } from './secret-codec.ts';
import { KubeSecretStore, type StoreTrust } from './secret-store.ts';
import { type PodEvents, reportOutOfBounds } from './pod-events.ts';
import type { OutOfBoundsReport } from '../core/values/untrusted-values.ts';
import { bestValid, HomeWriterJudge } from './home-writer-judge.ts';
import { HomeWrites } from './home-writes.ts';
import type { KubeMetrics } from './kube-metrics.ts';

interface FederationOptions {
  /** `writes`: how this member's writes to the home fared (home-writes.ts). */
  home: { connection: KubeConnection; store: KubeSecretStore; writes: HomeWrites };
  /** `claims`: the member's break-glass claims, in its own namespace (break-glass-claim.ts). */
  local: { store: KubeSecretStore; role: IssuanceRole; claims: BreakGlassClaims };
  group: string;
  /** `<cluster>/<pod>`: the holder name at the home. */
  identity: string;
  clock: Clock;
  logger: Logger;
  leaseDurationMs: number;
  renewal: Pick<RenewalPolicy, 'renewFraction'>;
  readinessLeadMs: number;
  /** How long an announced CertPair call blocks the others (issuance-policy.ts intentTtl). */
  intentTtlMs: number;
  /** A break-glass certificate was stored locally (an Event and the metric). */
  onBreakGlass(domain: string, serial: string): void;
  onHomeWriterChange?(leader: boolean): void;
  /** The home Lease taken over from a holder that failed by its results (homeWriterVerdict): who, and why. */
  onHomeTakeover?(holder: string, reason: string): void;
  /** The home Lease's duration out of its bound (lease-elector.ts): counted and told. */
  onOutOfBounds?: OutOfBoundsReport;
}

/**
 * The home's copy did not reach the local Secret: the loop is woken to read again soon (`wake`), not left to its
 * next planned look, which a copy not due puts a check interval away.
 */
class MirrorRetry {
  /** Per domain: consecutive failures, and whether a wake is scheduled. */
  readonly #failures = new Map<string, { failures: number; scheduled: boolean }>();
  readonly #stopping = new AbortController();
  readonly #clock: Clock;
  readonly #wake: (domain: string) => void;

  constructor(clock: Clock, wake: (domain: string) => void) {
    this.#clock = clock;
    this.#wake = wake;
  }

  /** A mirror of `domain` failed; `localNotAfter`: the end of the local copy its readers serve meanwhile. */
  failed(domain: string, localNotAfter: number | undefined): void {
    const entry = this.#failures.get(domain) ?? { failures: 0, scheduled: false };
    entry.failures++;
    this.#failures.set(domain, entry);
    if (entry.scheduled || this.#stopping.signal.aborted) return;
    entry.scheduled = true;
    // An expired or missing local copy bounds nothing: the doubling alone paces an apiserver in trouble.
    const timeLeft = (localNotAfter ?? 0) - this.#clock.now();
    const delay = Math.max(MIRROR_RETRY_FLOOR_MS, retryWithin(MIRROR_FIRST_RETRY_MS, MIRROR_RETRY_CAP_MS, entry.failures, timeLeft > 0 ? timeLeft : Infinity));
    this.#clock.sleep(delay, this.#stopping.signal).then(
      () => {
        entry.scheduled = false;
        this.#wake(domain);
      },
      () => {},
    );
  }

  succeeded(domain: string): void {
    this.#failures.delete(domain);
  }

  stop(): void {
    this.#stopping.abort();
  }
}

type Via = 'home' | 'local';

/** A window's break-glass claim as this writer knows it (break-glass-claim.ts). */
interface Claim {
  window: string | null;
  /** The copy's validity (undefined: none). */
  validity: { notBefore: number; notAfter: number } | undefined;
  state: 'pending' | 'failed' | ClaimAnswer;
  failures: number;
  retryAt: number;
}

/**
 * A claim that could not be created is tried again after this, doubling up to the cap (an apiserver in trouble),
 * and never later than a tenth of the copy's time left: a short certificate's break-glass has seconds to land.
 */
const CLAIM_FIRST_RETRY_MS = 5_000;
const CLAIM_RETRY_CAP_MS = 5 * 60_000;

/** Takes the window's break-glass claim (break-glass-claim.ts) into `claim`'s state; a failure logged once, retried later. */
async function claimWindow(o: Pick<FederationOptions, 'local' | 'logger' | 'clock'>, domain: string, claim: Claim): Promise<void> {
  const { local, logger, clock } = o;
  const args = { domain, window: claim.window ?? 'none', claim: local.claims.names(domain, claim.window).first };
  try {
    claim.state = await local.claims.claim(domain, claim.window, claim.validity);
    claim.failures = 0;
  } catch (err) {
    claim.state = 'failed';
    claim.failures++;
    const now = clock.now();
    const timeLeft = Math.max(0, (claim.validity?.notAfter ?? now) - now);
    claim.retryAt = now + retryWithin(CLAIM_FIRST_RETRY_MS, CLAIM_RETRY_CAP_MS, claim.failures, timeLeft);
    if (claim.failures === 1) {
      const code = 'CERTSHARE_BREAK_GLASS_UNCLAIMED';
      logger.error({ code, ...args, err: apiErrorText(err) }, errorText(code, { ...args, cause: apiErrorText(err) }));
    }
    return;
  }
  if (claim.state !== 'claimed') {
    const code = 'CERTSHARE_BREAK_GLASS_SPENT';
    const reason =
      claim.state === 'spent'
        ? `the claim ${args.claim} exists`
        : 'an earlier claim of this member recorded a newer certificate, or it holds no copy after a claim: a pair put back';
    logger.warn({ code, ...args, state: claim.state }, errorText(code, { domain, window: args.window, reason }));
    return;
  }
  logger.info(args, 'break-glass: window claimed');
}

/** A retry's delay: `first` doubling per failure up to `cap`, and never later than a tenth of `timeLeftMs`. */
function retryWithin(first: number, cap: number, failures: number, timeLeftMs: number): number {
  return Math.min(doubling(first, failures, cap), timeLeftMs * 0.1);
}

/**
 * A mirror into the local Secret that did not go through is tried again after this, doubling up to the cap, and
 * never later than a tenth of the local copy's time left: the member's readers serve that copy meanwhile, and the
 * loop's own next read may be a check interval away (found by chaos seed 56).
 */
const MIRROR_FIRST_RETRY_MS = 1_000;
const MIRROR_RETRY_CAP_MS = 5 * 60_000;
const MIRROR_RETRY_FLOOR_MS = 250;

/**
 * The store and the role of a member's replica with a home. The role: the local writer issues while it holds
 * the home Lease and the home answers; while the home does not, it may issue once per window past the
 * safety point (break-glass, core/federation/home-verdicts.ts). The store: a local writer's reads and writes go to the
 * home, and what the home holds is mirrored into the local Secret (the newest valid certificate wins both
 * ways, compare-and-swap on each side's resourceVersion); a reader's go to the local Secret only. Both
 * stores check a pair against the trust anchors (KubeSecretStore `trust`): one that fails is no copy at all
 * here, so it is never mirrored, pushed or served, and the member's own copy is what the loop restores.
 */
class Federation {
  readonly store: CertStore;
  readonly role: IssuanceRole;
  readonly #o: FederationOptions;
  readonly #listeners = new Set<() => void>();
  /** Where each domain's last load() came from: the writes of its turn go there. */
  readonly #via = new Map<string, Via>();
  /** Domains whose last home call failed with an outage. */
  readonly #homeDown = new Set<string>();
  /** The local copy as the last local load() saw it, valid or expired (the break-glass verdict's input). */
  readonly #localCopy = new Map<string, StoredCert>();
  /**
   * Domains the role let issue by break-glass, when, and the window (the serial of the copy held then, null:
   * none): a certificate obtained from tailscaled since then is recorded as that window's (a restore of a
   * certificate held before is not).
   */
  readonly #breakGlass = new Map<string, { at: number; window: string | null }>();
  /**
   * Each domain's claim of the window of its copy, taken as a break-glass call's last step (#claimBeforeCall): no
   * call without it. `failures`: consecutive ones, the next attempt not before `retryAt`.
   */
  readonly #claims = new Map<string, Claim>();
  /** Windows whose break-glass certificate is stored but whose last claim is not taken yet: taken at the next read. */
  readonly #unclosed = new Map<string, { window: string | null; notAfter: number }>();
  readonly #watches = new Set<{ domain: string; listener: () => void; offHome?: (() => void) | undefined }>();
  readonly #mirrorRetry: MirrorRetry;
  /** Whether the home Lease's holder failed the group by its results: this member then takes the Lease over. */
  readonly #judge: HomeWriterJudge;
  #elector: LeaseElector | undefined;
  #stopped = false;
  readonly #offLocal: (() => void) | undefined;

  constructor(options: FederationOptions) {
    this.#o = options;
    this.#judge = new HomeWriterJudge(options);
    this.#mirrorRetry = new MirrorRetry(options.clock, (domain) => {
      for (const w of this.#watches) if (w.domain === domain) w.listener();
    });
    this.store = this.#makeStore();
    this.role = this.#makeRole();
    this.#offLocal = options.local.role.onChange?.(() => this.#localRoleChanged());
  }

  /** Starts campaigning at the home when this replica is the local writer. */
  start(): void {
    this.#localRoleChanged();
  }

  async stop(signal?: AbortSignal): Promise<void> {
    this.#stopped = true;
    this.#mirrorRetry.stop();
    this.#offLocal?.();
    const elector = this.#elector;
    this.#elector = undefined;
    await elector?.stop(signal);
    for (const w of this.#watches) w.offHome?.();
  }

  #localWriter(): boolean {
    return !this.#stopped && this.#o.local.role.canIssue('');
  }

  #localRoleChanged(): void {
    const writer = this.#localWriter();
    if (writer && !this.#elector) {
      const lease = { name: homeLeaseName(this.#o.group), identity: this.#o.identity, leaseDurationMs: this.#o.leaseDurationMs, mustExist: true };
      this.#elector = new LeaseElector(lease, {
        connection: this.#o.home.connection,
        clock: this.#o.clock,
        logger: this.#o.logger.child({ component: 'home-lease' }),
        onLeadershipChange: (leader) => this.#o.onHomeWriterChange?.(leader),
        onOutOfBounds: this.#o.onOutOfBounds,
        failedHolder: () => this.#judge.failedHolder(),
        onTakeOver: (holder, reason) => this.#o.onHomeTakeover?.(holder, reason),
        onWrite: (failed) => this.#o.home.writes.wrote(undefined, failed),
      });
      this.#elector.onChange(() => this.#notify());
      this.#elector.start();
    } else if (!writer && this.#elector) {
      const elector = this.#elector;
      this.#elector = undefined;
      void elector.stop();
    }
    for (const w of this.#watches) this.#syncWatch(w);
    this.#notify();
  }

  #notify(): void {
    for (const listener of this.#listeners) listener();
  }

  /** A local writer follows the home's Secret too (its changes are mirrored); a reader only the local one. */
  #syncWatch(w: { domain: string; listener: () => void; offHome?: (() => void) | undefined }): void {
    const want = this.#localWriter();
    if (want && !w.offHome) w.offHome = this.#o.home.store.watch(w.domain, w.listener);
    else if (!want && w.offHome) {
      w.offHome();
      w.offHome = undefined;
    }
  }

  #makeRole(): IssuanceRole {
    const local = this.#o.local.role;
    return {
      identity: local.identity,
      canIssue: (domain) => {
        if (!this.#localWriter()) return false;
        if (!this.#homeDown.has(domain)) return this.#elector?.canIssue() ?? false;
        const copy = this.#localCopy.get(domain);
        const verdict = homeOutageVerdict({
          held: copy && { ...copy.info, obtainedAt: copy.obtainedAt },
          now: this.#o.clock.now(),
          policy: this.#o.renewal,
          readinessLeadMs: this.#o.readinessLeadMs,
          breakGlass: parseBreakGlassRecord(this.#o.local.store.annotation(domain, ANNOTATION_BREAK_GLASS)),
        });
        // The window is claimed as the last step before the call (#claimBeforeCall), not here: a loop may still wait
        // (a backoff, another writer's intent, the intent's write) and a writer killed meanwhile spends no claim.
        return verdict.kind === 'break_glass' && !this.#spent(domain, copy?.info.serial ?? null);
      },
      canWrite: (domain) => (local.canWrite ? local.canWrite(domain) : local.canIssue(domain)),
      onChange: (listener) => {
        this.#listeners.add(listener);
        return () => this.#listeners.delete(listener);
      },
    };
  }

  /** Whether the window's claim is known spent, or superseded by a newer copy (then no break-glass call in it), or failed and waiting. */
  #spent(domain: string, window: string | null): boolean {
    const claim = this.#claims.get(domain);
    if (claim?.window !== window) return false;
    return claim.state === 'spent' || claim.state === 'superseded' || (claim.state === 'failed' && this.#o.clock.now() < claim.retryAt);
  }

  /**
   * A break-glass call's last step, after its intent is recorded: the window's claim (break-glass-claim.ts). Not
   * taken (spent, superseded, an apiserver error): the intent is withdrawn and the call refused, so a claim
   * always stands for a call that followed it at once.
   */
  async #claimBeforeCall(domain: string, signal: AbortSignal): Promise<void> {
    const copy = this.#localCopy.get(domain);
    const window = copy?.info.serial ?? null;
    let claim = this.#claims.get(domain);
    if (claim?.window !== window || claim.state !== 'claimed') {
      claim = { window, validity: copy?.info, state: 'pending', failures: claim?.window === window ? claim.failures : 0, retryAt: 0 };
      this.#claims.set(domain, claim);
      await claimWindow(this.#o, domain, claim);
    }
    if (claim.state !== 'claimed') {
      await this.#o.local.store.clearIntent(domain, signal).catch(() => {});
      throw new CertshareError('CERTSHARE_BREAK_GLASS_UNCLAIMED', {
        domain,
        window: window ?? 'none',
        claim: this.#o.local.claims.names(domain, window).first,
        cause: `the claim is ${claim.state}`,
      });
    }
    if (this.#breakGlass.get(domain)?.window !== window) this.#breakGlass.set(domain, { at: this.#o.clock.now(), window });
  }

  /**
   * The window's break-glass certificate is stored: its last claim closes it (a successor gets no more call).
   * Not taken yet (an apiserver error): tried again at each read, the error logged once.
   */
  async #close(domain: string, window: string | null, notAfter: number): Promise<void> {
    const { local, logger } = this.#o;
    const again = this.#unclosed.get(domain)?.window === window;
    const entry = { window, notAfter };
    this.#unclosed.set(domain, entry);
    try {
      await local.claims.close(domain, window, notAfter);
      if (this.#unclosed.get(domain) === entry) this.#unclosed.delete(domain);
    } catch (err) {
      if (again) return;
      const code = 'CERTSHARE_BREAK_GLASS_UNCLAIMED';
      const args = { domain, window: window ?? 'none', claim: local.claims.names(domain, window).last, cause: apiErrorText(err) };
      logger.warn({ code, ...args }, `${errorText(code, args)}; taken at the next read`);
    }
  }

  #makeStore(): CertStore {
    const { home, local } = this.#o;
    const via = (domain: string): KubeSecretStore => (this.#via.get(domain) === 'home' ? home.store : local.store);
    return {
      kind: 'kube',
      load: (domain, signal, options) => this.#load(domain, signal, options),
      save: (domain, cert, signal, options) => this.#save(domain, cert, signal, options),
      savePending: (domain, cert, signal) => this.#savePending(domain, cert, signal),
      recordRenewAnswer: (domain: string, answer: RenewAnswer, signal: AbortSignal) => via(domain).recordRenewAnswer(domain, answer, signal),
      recordIntent: async (domain, holder, at, signal) => {
        await via(domain).recordIntent(domain, holder, at, signal);
        if (this.#via.get(domain) !== 'home' && this.#homeDown.has(domain)) await this.#claimBeforeCall(domain, signal);
      },
      clearIntent: (domain, signal) => via(domain).clearIntent(domain, signal),
      recordRateLimit: (domain, until, signal) => via(domain).recordRateLimit(domain, until, signal),
      watch: (domain, listener) => {
        const offLocal = local.store.watch(domain, listener);
        const w: { domain: string; listener: () => void; offHome?: (() => void) | undefined } = { domain, listener };
        this.#watches.add(w);
        this.#syncWatch(w);
        return () => {
          offLocal();
          w.offHome?.();
          this.#watches.delete(w);
        };
      },
    };
  }

  async #load(domain: string, signal: AbortSignal, options?: LoadOptions): Promise<StoreRead> {
    const { home, local, logger, clock } = this.#o;
    const localRead = await local.store.load(domain, signal, options);
    const unclosed = this.#unclosed.get(domain);
    if (unclosed) void this.#close(domain, unclosed.window, unclosed.notAfter);
    // The newest valid pair known, else an expired copy (from a pinned issuer only): it still names the window a
    // break-glass issuance would renew.
    const copy = localRead.state === 'valid' ? localRead.cert : (localRead.lastValid ?? (localRead.state === 'unusable' ? localRead.expired : undefined));
    if (copy) this.#localCopy.set(domain, copy);
    else this.#localCopy.delete(domain);
    if (!this.#localWriter()) {
      this.#via.set(domain, 'local');
      return localRead;
    }
    let homeRead: StoreRead;
    try {
      homeRead = await home.store.load(domain, signal, options);
    } catch (err) {
      if (signal.aborted || !isHomeOutage(err)) throw err;
      logger.debug({ domain }, 'federation home unreachable: local read');
      // Cut off, the outage rules answer (break-glass), not a takeover of a Lease this member cannot reach.
      this.#judge.forget(domain);
      return this.#cutOff(domain, localRead, 'unreachable', errorMessage(err));
    }
    this.#judge.judge(domain, { home: homeRead, local: localRead, localCopy: this.#localCopy.get(domain) }, this.#elector);
    // Answering, but failing this member's writes past the copy's safety point: no one renews there (home-writes.ts).
    if (home.writes.refused(domain, this.#judge.failedWindow(domain))) return this.#cutOff(domain, localRead, 'refusing writes', 'past the safety point');
    if (this.#homeDown.delete(domain)) logger.info({ domain }, 'federation home reachable again');
    this.#breakGlass.delete(domain);
    this.#via.set(domain, 'home');
    const homeCert = bestValid(homeRead, clock.now());
    const localCert = bestValid(localRead, clock.now());
    const plan = reconcile(view(homeCert), view(localCert), clock.now());
    // In sync by the pair the local store last saw, while its Secret lost it (a hand edit): the home's goes back.
    const localHolds = localRead.state === 'valid' ? localRead.cert.info.serial : undefined;
    const lost = plan.kind === 'in_sync' && homeCert !== undefined && localHolds !== homeCert.info.serial;
    try {
      if ((plan.kind === 'mirror_to_local' || lost) && homeCert) {
        await local.store.save(domain, homeCert, signal);
        this.#localCopy.set(domain, homeCert);
      } else if (plan.kind === 'push_to_home' && localCert) {
        logger.info({ domain, serial: localCert.info.serial }, 'the local copy is newer than the home one: writing it to the home');
        await home.store.save(domain, localCert, signal);
        return this.#judge.bounded(domain, await home.store.load(domain, signal));
      }
      if (homeCert && plan.kind !== 'push_to_home') await this.#supersedeBreakGlass(domain, homeCert.info.serial, signal);
      await reconcilePending({ domain, home: home.store, local: local.store, now: clock.now() }, homeRead, localRead, signal);
      this.#mirrorRetry.succeeded(domain);
    } catch (err) {
      // A compare-and-swap lost (someone wrote meanwhile), or the other side failed: a read soon looks again.
      if (signal.aborted) throw err;
      logger.info({ domain, err: errorMessage(err) }, 'federation mirror write did not go through; reading again soon');
      this.#mirrorRetry.failed(domain, this.#localCopy.get(domain)?.info.notAfter);
    }
    return this.#judge.bounded(domain, withLocalCopy(homeRead, localCert, clock.now()));
  }

  /** The home cut off for `domain` (`why`): its readers' copy served, the outage rules answer (break-glass). */
  #cutOff(domain: string, localRead: StoreRead, why: string, err: string): StoreRead {
    if (!this.#homeDown.has(domain)) this.#o.logger.warn({ domain, err }, `federation home ${why}: serving the local copy`);
    this.#homeDown.add(domain);
    this.#via.set(domain, 'local');
    return localRead;
  }

  /**
   * The home is back and the member holds the home's copy: its break-glass record is superseded (removed),
   * whichever certificate the home's is (the member's own break-glass one, adopted everywhere, included).
   */
  async #supersedeBreakGlass(domain: string, homeSerial: string, signal: AbortSignal): Promise<void> {
    const { local, logger } = this.#o;
    const recorded = local.store.annotation(domain, ANNOTATION_BREAK_GLASS);
    if (recorded === undefined || this.#localCopy.get(domain)?.info.serial !== homeSerial) return;
    await local.store.removeAnnotation(domain, ANNOTATION_BREAK_GLASS, signal);
    logger.info({ domain, record: recorded.slice(0, 100), serial: homeSerial }, 'break-glass record superseded: the member holds the home copy');
  }

  /**
   * A pair valid only later: at the home (its writer's successor, in any member, holds it rather than order the
   * renewal again) and beside the local copy (the member's readers and a writer cut off from the home later). Cut
   * off, a break-glass pair is recorded as it is stored: a successor that moves it into tls.crt knows of no call.
   */
  async #savePending(domain: string, cert: StoredCert, signal: AbortSignal): Promise<void> {
    const { home, local, logger } = this.#o;
    if (this.#via.get(domain) === 'home') await home.store.savePending(domain, cert, signal);
    const granted = this.#granted(domain, cert);
    await local.store.savePending(domain, cert, signal, granted && { annotations: granted.record }).catch((err: unknown) => {
      if (signal.aborted || this.#via.get(domain) !== 'home') throw err;
      logger.info({ domain, err: errorMessage(err) }, 'could not store the certificate valid only later locally yet');
    });
    if (granted) this.#brokeGlass(domain, cert, granted.window);
  }

  /** Cut off, the break-glass call `cert` came from (the role let it through in this window), and its record. */
  #granted(domain: string, cert: StoredCert): ReturnType<typeof grantOf> {
    return this.#via.get(domain) === 'home' ? undefined : grantOf(this.#breakGlass.get(domain), cert, this.#localCopy.get(domain));
  }

  /** A break-glass certificate is stored (served, or for later): its window spent and closed, and told. */
  #brokeGlass(domain: string, cert: StoredCert, window: string | null): void {
    this.#breakGlass.delete(domain);
    this.#claims.set(domain, { window, validity: undefined, state: 'spent', failures: 0, retryAt: 0 });
    void this.#close(domain, window, cert.info.notAfter);
    this.#o.logger.warn({ domain, serial: cert.info.serial, window: window ?? 'none' }, 'break-glass: issued without the federation home, recorded locally');
    this.#o.onBreakGlass(domain, cert.info.serial);
  }

  async #save(domain: string, cert: StoredCert, signal: AbortSignal, options?: SaveOptions): Promise<void> {
    const { home, local, logger } = this.#o;
    if (this.#via.get(domain) === 'home') {
      // Not stored at the home (refused, or a newer version there), the member's readers serve it all the same; a read
      // once the home writes again pushes it there if it is the newest (reconcile).
      const refused = await home.store.save(domain, cert, signal, options).then(
        () => undefined,
        (err: unknown) => ({ err }),
      );
      if (refused && signal.aborted) throw refused.err;
      // The local copy follows at once (the next read would mirror it anyway).
      await local.store.save(domain, cert, signal).catch((err: unknown) => {
        if (signal.aborted) throw err;
        logger.info({ domain, err: errorMessage(err) }, 'could not mirror the new certificate locally yet');
        this.#mirrorRetry.failed(domain, this.#localCopy.get(domain)?.info.notAfter);
      });
      if (refused) throw refused.err;
      return;
    }
    // The home is away: a new certificate the role let through is a break-glass one, recorded with it.
    const granted = this.#granted(domain, cert);
    await local.store.save(domain, cert, signal, { ...options, ...(granted ? { annotations: granted.record } : {}) });
    this.#localCopy.set(domain, cert);
    if (granted) this.#brokeGlass(domain, cert, granted.window);
  }
}

/** The window `cert` was issued in if the role let its call through since `granted.at` (a new pair), and its record. */
function grantOf(granted: { at: number; window: string | null } | undefined, cert: StoredCert, known: StoredCert | undefined) {
  if (!granted || cert.obtainedAt === undefined || cert.obtainedAt < granted.at || cert.info.serial === known?.info.serial) return undefined;
  return { window: granted.window, record: { [ANNOTATION_BREAK_GLASS]: formatBreakGlassRecord({ serial: cert.info.serial, window: granted.window }) } };
}

/**
 * The pair valid only later is the newest issuance, wherever it was stored: the home's is mirrored beside the
 * local copy, and a member's own (stored while cut off from the home) goes to the home unless the home holds a
 * pair, served or pending, that ends as late.
 */
async function reconcilePending(
  at: { domain: string; home: KubeSecretStore; local: KubeSecretStore; now: number },
  homeRead: StoreRead,
  localRead: StoreRead,
  signal: AbortSignal,
): Promise<void> {
  const ends = (read: StoreRead): number => Math.max(read.pending?.info.notAfter ?? 0, bestValid(read, at.now)?.info.notAfter ?? 0);
  const [homePending, localPending] = [homeRead.pending, localRead.pending];
  if (homePending && localPending?.info.serial !== homePending.info.serial && ends(localRead) < homePending.info.notAfter)
    await at.local.savePending(at.domain, homePending, signal);
  else if (localPending && homePending?.info.serial !== localPending.info.serial && ends(homeRead) < localPending.info.notAfter)
    await at.home.savePending(at.domain, localPending, signal);
}

/**
 * The home's read, offering the member's own valid copy as `lastValid` when the home holds none as new (garbage,
 * a pair no trust anchor vouches for, a push that lost a race): the loop restores that copy, never issues for it.
 */
function withLocalCopy(read: StoreRead, local: StoredCert | undefined, now: number): StoreRead {
  const home = bestValid(read, now);
  return local && (!home || home.info.notAfter < local.info.notAfter) ? { ...read, lastValid: local } : read;
}

const view = (cert: StoredCert | undefined): CopyView | undefined =>
  cert && { serial: cert.info.serial, notBefore: cert.info.notBefore, notAfter: cert.info.notAfter };

/**
 * --federation-trust-anchors: the file's CA certificates (the pin), else Node's CA store. An unreadable file
 * or one without a certificate is CERTSHARE_BAD_CONFIG, at start.
 */
async function federationAnchors(file: string | undefined): Promise<TrustAnchors> {
  if (file === undefined) return defaultTrustAnchors();
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    throw new CertshareError(
      'CERTSHARE_BAD_CONFIG',
      { source: '--federation-trust-anchors', reason: `cannot read ${file}: ${errorMessage(err)}` },
      { cause: err },
    );
  }
  return trustAnchors([text], file);
}

/** The home's settings (--federation-*) and when a certificate leaves rotation (its break-glass point: home-verdicts.ts). */
export type HomeSettings = FederationSettings & { renewal: RenewalPolicy; readinessLeadMs: number; certTimeoutMs: number };

/** A federation home's pieces and how the backend stops them. */
export interface Federated {
  store: Federation['store'];
  role: Federation['role'];
  connection: KubeConnection;
  start(): void;
  stop(signal: AbortSignal): Promise<void>;
  close(): Promise<void>;
}

/** What a member's federation is given beside its settings. */
interface MemberDeps {
  env: NodeJS.ProcessEnv;
  clock: Clock;
  logger: Logger;
  metrics: KubeMetrics;
  podEvents: PodEvents | undefined;
}

/** The member's local parts the federation joins to the home. */
interface LocalParts {
  store: KubeSecretStore;
  role: IssuanceRole;
  identity: string;
  connection: KubeConnection;
}

/** A member of a federated group, from its start: the trust of its stores, and its join to the home. */
interface FederationMember {
  /** The local store's trust (the pin; an untrusted pair counted and told as an Event): both stores check it. */
  localTrust: StoreTrust;
  /** Once the local store and role are built: the home's connection, start-up check, store and Lease. */
  join(local: LocalParts): Promise<Federated>;
}

/**
 * --federation-*: the member's part of its group, built once. The pin is read first (a start-up check,
 * before the local store exists, which checks its pairs against it too); `join` then reaches the home.
 */
export async function federationMember(settings: HomeSettings, group: string, deps: MemberDeps): Promise<FederationMember> {
  const anchors = await federationAnchors(settings.trustAnchors);
  const { metrics, podEvents } = deps;
  const trust = (where: 'home' | 'local'): StoreTrust => ({
    anchors,
    onUntrusted: (domain, serial) => {
      metrics.untrusted.inc({ domain, store: where });
      podEvents?.untrusted(domain, serial, where);
    },
  });
  return { localTrust: trust('local'), join: (local) => federate({ ...settings, group }, local, { ...deps, trust: trust('home') }) };
}

/**
 * --federation-kubeconfig: a second connection, to the home, with the same store and Lease code as the
 * local ones. Its start-up check refuses an unknown group, missing rights or garbage (CERTSHARE_HOME_UNUSABLE).
 */
async function federate(settings: HomeSettings & { group: string }, local: LocalParts, deps: MemberDeps & { trust: StoreTrust }): Promise<Federated> {
  const { group } = settings;
  const { clock, metrics, podEvents } = deps;
  const connection = await connectKube(deps.env, { kubeconfig: settings.kubeconfig, namespace: settings.namespace });
  const log = deps.logger.child({ component: 'federation', cluster: settings.cluster });
  try {
    await checkHome(connection, group, log, { clock });
  } catch (err) {
    connection.close();
    throw err;
  }
  const writes = new HomeWrites(clock, settings.leaseDurationMs);
  const homeStore = new KubeSecretStore({
    connection,
    clock,
    logger: log.child({ component: 'home-secret-store' }),
    group,
    writer: `${settings.cluster}/${local.identity}`,
    onError: (operation) => metrics.storeErrors.inc({ operation: `home_${operation}` }),
    onWrite: (domain, failed) => writes.wrote(domain, failed),
    trust: deps.trust,
  });
  const outOfBounds = reportOutOfBounds(metrics, podEvents);
  const federation = new Federation({
    home: { connection, store: homeStore, writes },
    local: {
      store: local.store,
      role: local.role,
      claims: new BreakGlassClaims({
        connection: local.connection,
        group,
        identity: `${settings.cluster}/${local.identity}`,
        clock,
        logger: log.child({ component: 'break-glass-claims' }),
        onOutOfBounds: outOfBounds,
      }),
    },
    group,
    identity: leaseIdentity(`${settings.cluster}/${local.identity}`),
    clock,
    logger: log,
    leaseDurationMs: settings.leaseDurationMs,
    renewal: settings.renewal,
    readinessLeadMs: settings.readinessLeadMs,
    intentTtlMs: intentTtl(settings.certTimeoutMs),
    onBreakGlass: (domain, serial) => {
      metrics.breakGlass.inc({ domain });
      podEvents?.breakGlass(domain, serial);
    },
    onHomeWriterChange: (leader) => {
      metrics.homeWriter.set(leader ? 1 : 0);
      podEvents?.writer(leader, 'home');
    },
    onHomeTakeover: (holder, reason) => {
      const code = 'CERTSHARE_HOME_WRITER_FAILED';
      log.warn({ code, holder: holder.slice(0, 253), reason }, errorText(code, { holder: holder.slice(0, 253), reason }));
      metrics.homeTakeovers.inc();
      podEvents?.homeTakeover(holder.slice(0, 253), reason);
    },
    onOutOfBounds: outOfBounds,
  });
  log.info({ home: connection.namespace }, 'federation home configured');
  return {
    store: federation.store,
    role: federation.role,
    connection,
    start: () => federation.start(),
    stop: (signal) => federation.stop(signal),
    async close() {
      await federation.stop();
      await homeStore.stop();
      connection.close();
    },
  };
}
