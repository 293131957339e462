// The invariants, checked continuously from what the observers report, for every domain of the group
// (each domain has its own Secret, its own files on every replica, its own ledger entries):
//   1 issuances per domain per renewal window <= 1, and issuances = windows passed + 1 (the first);
//     windows are defined from the ledger in ledger.ts; evaluated at the end.
//   2 no replica projects (out-dir files) an expired, not-yet-valid, key-mismatched or missing pair of a
//     domain while that domain's Secret holds a valid one;
//   3 a domain's Secret never regresses to a certificate that expires earlier (nor holds a mismatched
//     pair); garbage the chaos wrote by hand is not a pair at all, and is excused;
//   4 in quiet periods, every replica holds each new certificate of each domain's Secret within the
//     grace, and at the end every replica holds every Secret's certificate; convergence times are
//     measured for every new certificate (from the checker seeing it in the Secret to the slowest
//     replica's files);
//   5 a replica's readiness condition is True only while its files hold a valid pair for every domain;
//   6 no CertPair call before a rate-limit retry time recorded in the domain's Secret, or before the
//     Retry-After of a 429 that the same certshare process received for that domain (see ledger.ts).
// Continuous conditions (2, 5) are evaluated on a 100 ms tick and recorded as episodes: one violation
// per episode (per replica and domain), with its duration. They apply to replicas whose process runs (a
// dead sidecar cannot act) and allow a grace (GRACE_MS, 2 s) counted from the latest of: the replica's
// process being up ("certshare started"), the API being reachable again after an outage or blackout
// (plus a recovery allowance, see runner.ts), and for invariant 2 the Secret holding a valid pair
// without a break and the replica's own requests for Secrets getting through again (the fault proxy sees
// the faults it injects and the API server's own 429s and 5xx alike), for invariant 5 the condition being True and the files being bad (both at once).
// Invariant 5 also needs the checker's own Pod watch to be connected (otherwise the condition it sees
// may be stale). Every violation names its domain (invariant 5: the domain whose files were bad).
// Cost: a tick is O(replicas x domains + open samples); an input touches one domain's state; the final
// analysis groups by domain (ledger.ts), so nothing compares every event with every other.
import type { Instance } from './replicas.ts';
import { analyseWindows, checkRateLimits, iso, parseLedgerLine, type CertRequest, type Issuance, type RetryRecord, type WindowAnalysis } from './ledger.ts';
import { isValidAt, viewPair, type CertView, type FilesState, type KubeObject } from './observers.ts';
import { DEFAULT_REQUEST_TIMEOUT_MS } from '../../src/kube/transport/https-transport.ts';
import { needlessExpiry } from './cross-cluster.ts';
import type { HomeLink } from './home.ts';
import type { ValidElsewhere } from './secret-board.ts';

export const GATE = 'certshare.io/certificates';

export interface CheckerContext {
  /** The group's domains: one Secret each, one files directory each on every replica. */
  domains: string[];
  graceMs: number;
  replicaNames: string[];
  /** The live process of a replica, if it runs. */
  running(name: string): Instance | undefined;
  /** "replica/pid" of the process behind an emulator (same name as its replica) at time t. */
  instanceAt(emulator: string, t: number): string | undefined;
  /**
   * How the certshare process behind an emulator ended if it ended around t (an issuance by that
   * emulator at t): 'SIGKILL', 'SIGTERM', 'crash', or undefined when it lived on. Optional (undefined).
   */
  endedAround?(emulator: string, t: number): 'SIGKILL' | 'SIGTERM' | 'crash' | undefined;
  /**
   * A federated run's certificate stranded in its member: `cover`'s member was cut off from the home from the
   * moment its CA answered (or within the grace after) until `extra`, issued by a writer of another member, so
   * no writer outside it could know of `cover` (how the cut looked, for the report). Optional (never).
   */
  strandedBetween?(cover: Issuance, extra: Issuance): string | undefined;
  /** True when t lies in a quiet period, past its settling time (no fault active or lingering). */
  quietAt(t: number): boolean;
  /** Whether the admin's Pod view is current (its watch is connected). */
  podsInSync(): boolean;
  /**
   * From when the replicas could reach the API again after an outage or blackout, recovery allowance
   * included (Infinity while unreachable; 0 if it never was).
   */
  reachableSince(now: number): number;
  /**
   * From when a replica's own requests for Secrets have got through again after the last that failed (a
   * fault, or the API server's own 429 or 5xx): Infinity while its last one failed, 0 if none ever did.
   * Optional (0: always).
   */
  secretsReachableSince?(name: string): number;
  /**
   * The same for a replica's writes of its Pod's status (its readiness condition): a gate it cannot lower
   * is the API's refusal, which the kubelet's probe of /healthz backs up in a cluster. Optional (0: always).
   */
  statusReachableSince?(name: string): number;
  /**
   * An issuance the window analysis (invariant 1) leaves out: a federated member's break-glass issuance,
   * made on its own past the safety point while the home was away. Optional (none).
   */
  excusedIssuance?(issuance: Issuance): boolean;
  /**
   * A break-glass record (`certshare.io/break-glass: <serial> replacing <window>`) seen in the member's Secret:
   * the issuance it names is break-glass even when its log line was lost (a write that landed, its answer not).
   */
  breakGlassRecorded?(domain: string, serial: string, window: string): void;
  /**
   * Reads a replica's files for a domain at once (DirWatch.readNow), calling files() if they changed. Before an
   * episode about a replica's files opens, the checker looks again: a runner starved of CPU takes its watcher's
   * news of the files late (seed 45: files swapped 1.5 s before a tick still saw the expired ones). Optional.
   */
  refreshFiles?(name: string, domain: string): void;
  /** A federated run's member (cross-cluster.ts): its way to the home, and valid pairs of other clusters' Secrets. */
  federation?: {
    link(): HomeLink;
    /** The member's way to the home at time t. */
    linkAt(t: number): HomeLink;
    /** Since when the member's writer has held its local Lease (undefined: none now). */
    writerSince(): number | undefined;
    /** A valid pair of the home's Secret of record, and of any Secret other than this member's (secret-board.ts). */
    validAt(domain: string, now: number): { home: ValidElsewhere | undefined; elsewhere: ValidElsewhere | undefined };
  };
  verbose: (message: string) => void;
}

interface SecretState {
  at: number;
  cert: CertView | undefined;
  retryNotBefore?: number;
}

interface Episode {
  invariant: number;
  startedAt: number;
  endedAt?: number;
  text: string;
}

interface Sample {
  domain: string;
  serial: string;
  notAfter: number;
  landedAt: number;
  quiet: boolean;
  /** Replicas expected to pick it up (running when it landed) and when each did. */
  expected: Set<string>;
  reached: Map<string, number>;
  done: boolean;
  reportedLate: boolean;
}

/** Everything the checker knows about one domain. */
interface DomainState {
  domain: string;
  secret: SecretState | undefined;
  /** The last Secret data parsed, so that an annotation-only update is not parsed again. */
  lastData: { crt: string; key: string; view: CertView | undefined } | undefined;
  /** Since when the Secret has held a valid certificate without a break (undefined: it does not now). */
  validSince: number | undefined;
  maxNotAfter: number;
  serials: Set<string>;
  history: SecretState[];
  retryUntil: Set<number>;
  /** Per replica: its files for this domain, and when it first held each serial. */
  files: Map<string, FilesState>;
  firstSeen: Map<string, Map<string, number>>;
  /** Samples whose convergence is still followed (the others are in `samples` only). */
  open: Sample[];
  /** Hand edits by the chaos still waiting for the Secret to be valid again. */
  editsPending: number[];
}

const short = (serial: string): string => serial.slice(0, 8);

export function percentile(values: number[], p: number): number {
  if (values.length === 0) return 0;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!;
}

export interface CheckerResult {
  windows: WindowAnalysis;
  violations: string[];
  unsharedRateLimits: string[];
  convergence: { quietSamples: number; quietP50Ms: number; quietP99Ms: number; quietMaxMs: number; allSamples: number; allP99Ms: number; allMaxMs: number };
  secretCerts: number;
  lostIssuances: number;
  secretInvalidMs: number;
  requests: number;
  rateLimitedAnswers: number;
  /** Issuances per domain (every domain of the group, 0 included). */
  issuancesByDomain: Record<string, number>;
  /**
   * Issuances inside a window opened by a certificate that never reached the Secret because the process
   * that obtained it was SIGKILLed (or crashed) before it could store it: no software can keep that one
   * (each replica has its own tailscaled); reported, not counted (a SIGTERM is counted: a graceful stop
   * could have stored it). Federated runs add an issuance inside the window of a certificate stranded in a
   * member cut off from the home from its issuance until then (`strandedBetween`): the others' writer could
   * not have known of it, and waiting for it would have served the expired copy it replaced.
   */
  reissuedAfterLost: string[];
  /** Hand edits of a Secret to garbage, and how long until that Secret held a valid pair again. */
  handEdits: { count: number; repaired: number; repairMaxMs: number; repairP50Ms: number };
}

export class Checker {
  readonly #ctx: CheckerContext;
  readonly #episodes = new Map<string, Episode>();
  readonly #closed: Episode[] = [];
  readonly #point: Array<{ invariant: number; at: number; text: string }> = [];
  readonly #issuances: Issuance[] = [];
  readonly #requests: CertRequest[] = [];
  readonly #retryRecords: RetryRecord[] = [];
  readonly #domains = new Map<string, DomainState>();
  readonly #gate = new Map<string, { status: string; at: number }>();
  readonly #samples: Sample[] = [];
  readonly #repairMs: number[] = [];
  #handEdits = 0;

  constructor(ctx: CheckerContext) {
    this.#ctx = ctx;
    for (const domain of ctx.domains) {
      this.#domains.set(domain, {
        domain,
        secret: undefined,
        lastData: undefined,
        validSince: undefined,
        maxNotAfter: 0,
        serials: new Set(),
        history: [],
        retryUntil: new Set(),
        files: new Map(),
        firstSeen: new Map(ctx.replicaNames.map((n) => [n, new Map<string, number>()])),
        open: [],
        editsPending: [],
      });
    }
  }

  // --- inputs ------------------------------------------------------------------------------------

  /** The domain's Secret as the admin sees it (undefined: deleted or absent). Secrets of other names are ignored. */
  secret(domain: string, obj: KubeObject | undefined, at: number): void {
    const d = this.#domains.get(domain);
    if (!d) return;
    const data = obj?.data ?? {};
    const crt = data['tls.crt'] ?? '';
    const key = data['tls.key'] ?? '';
    let cert: CertView | undefined;
    if (!obj) cert = undefined;
    else if (d.lastData && d.lastData.crt === crt && d.lastData.key === key) cert = d.lastData.view;
    else {
      const decode = (v: string): string => (v ? Buffer.from(v, 'base64').toString('utf8') : '');
      cert = viewPair(decode(crt), decode(key));
      d.lastData = { crt, key, view: cert };
    }
    const annotations = obj?.metadata?.annotations ?? {};
    const record = /^([0-9A-F]+) replacing (\S+)$/i.exec(annotations['certshare.io/break-glass'] ?? '');
    if (record) this.#ctx.breakGlassRecorded?.(domain, record[1]!, record[2]!);
    const retry = Date.parse(annotations['certshare.io/retry-not-before'] ?? '');
    const state: SecretState = { at, cert };
    if (Number.isFinite(retry)) state.retryNotBefore = retry;
    const previous = d.secret;
    d.secret = state;
    // Only changes of the pair matter for the history (annotation-only updates are frequent).
    if (previous?.cert?.serial !== cert?.serial || previous?.cert?.keyMatch !== cert?.keyMatch || d.history.length === 0) d.history.push(state);
    if (state.retryNotBefore !== undefined && !d.retryUntil.has(state.retryNotBefore)) {
      d.retryUntil.add(state.retryNotBefore);
      this.#retryRecords.push({ domain, observedAt: at, until: state.retryNotBefore });
      this.#ctx.verbose(`secret ${domain}: retry-not-before ${iso(state.retryNotBefore)}`);
    }

    // Invariant 3: never an earlier-expiring (or unusable) certificate than one it already held.
    if (cert) {
      if (!cert.keyMatch) this.#violation(3, at, `inv3 ${iso(at)} ${domain}: the Secret holds a pair whose key does not match (serial ${cert.serial})`);
      if (cert.notAfter < d.maxNotAfter) {
        this.#violation(
          3,
          at,
          `inv3 ${iso(at)} ${domain}: the Secret regressed to serial ${cert.serial} expiring ${iso(cert.notAfter)}, ` +
            `earlier than ${iso(d.maxNotAfter)} it held before`,
        );
      }
      d.maxNotAfter = Math.max(d.maxNotAfter, cert.notAfter);
    } else if (d.maxNotAfter > 0 && previous?.cert) {
      this.#ctx.verbose(`secret ${domain}: no usable certificate at ${iso(at)} (deleted, emptied or garbage)`);
    }

    const validNow = isValidAt(cert, at);
    const wasValid = previous !== undefined && isValidAt(previous.cert, at) && d.validSince !== undefined;
    d.validSince = validNow ? (wasValid ? d.validSince : at) : undefined;
    if (validNow && d.editsPending.length > 0) {
      for (const editedAt of d.editsPending) this.#repairMs.push(at - editedAt);
      this.#ctx.verbose(`secret ${domain}: valid again ${at - d.editsPending[0]!} ms after the hand edit`);
      d.editsPending = [];
    }

    if (cert && !d.serials.has(cert.serial)) {
      d.serials.add(cert.serial);
      this.#ctx.verbose(`secret ${domain}: new certificate ${short(cert.serial)} notAfter ${iso(cert.notAfter)}`);
      this.#newSample(d, cert, at);
    }
  }

  /** The chaos wrote garbage into the domain's Secret at `at` (its repair time is measured). */
  handEdited(domain: string, at: number): void {
    const d = this.#domains.get(domain);
    if (!d) return;
    this.#handEdits++;
    d.editsPending.push(at);
  }

  pods(name: string, obj: KubeObject | undefined, at: number): void {
    if (!this.#ctx.replicaNames.includes(name)) return;
    const condition = obj?.status?.conditions?.find((c) => c.type === GATE);
    const status = condition?.status ?? 'Unknown';
    const prev = this.#gate.get(name);
    if (prev?.status !== status) this.#gate.set(name, { status, at });
  }

  /** A replica's files for one domain changed. */
  files(name: string, domain: string, state: FilesState): void {
    const d = this.#domains.get(domain);
    if (!d) return;
    d.files.set(name, state);
    const cert = state.cert;
    if (!cert) return;
    const seen = d.firstSeen.get(name)!;
    if (!seen.has(cert.serial)) seen.set(cert.serial, state.at);
    for (const s of d.open) {
      if (!s.reached.has(name) && cert.serial === s.serial) s.reached.set(name, state.at);
    }
  }

  ledger(line: Record<string, unknown>): void {
    const { issuance, request } = parseLedgerLine(line);
    if (issuance && this.#domains.has(issuance.domain)) {
      this.#issuances.push(issuance);
      this.#ctx.verbose(`ledger: issuance ${issuance.domain} ${short(issuance.serial)} by ${issuance.emulator} (${issuance.trigger})`);
    }
    if (request && this.#domains.has(request.domain)) {
      this.#requests.push(request);
      if (request.outcome !== '200') this.#ctx.verbose(`ledger: request ${request.domain} to ${request.emulator} -> ${request.outcome}`);
    }
  }

  /** cross-cluster.ts: why this member should not hold an expired copy of `domain` any more, if it should not. */
  #needlessExpiry(domain: string, files: CertView, now: number, from: number): string | undefined {
    const federation = this.#ctx.federation!;
    const own = new Set(this.#ctx.replicaNames);
    return needlessExpiry({
      now,
      graceMs: this.#ctx.graceMs,
      files,
      from,
      link: federation.link(),
      writerSince: federation.writerSince(),
      noticeMs: DEFAULT_REQUEST_TIMEOUT_MS,
      ...federation.validAt(domain, now),
      requests: this.#requests.filter((r) => r.domain === domain && own.has(r.emulator)),
      issuances: this.#issuances.filter((i) => i.domain === domain && own.has(i.emulator)),
    });
  }

  // --- continuous checks ---------------------------------------------------------------------------

  tick(now: number): void {
    const { graceMs } = this.#ctx;
    const reachable = this.#ctx.reachableSince(now);
    for (const name of this.#ctx.replicaNames) {
      const inst = this.#ctx.running(name);
      const readsSince = this.#ctx.secretsReachableSince?.(name) ?? 0;
      const up = inst?.readyAt !== undefined && now - inst.readyAt > graceMs;
      // Invariant 5 looks at the domain whose files have been bad the longest.
      let worst: { domain: DomainState; since: number; files: FilesState | undefined } | undefined;
      for (const d of this.#domains.values()) {
        const files = d.files.get(name);
        const badSince = this.#badSince(files, now);
        if (badSince !== undefined && (worst === undefined || badSince < worst.since)) worst = { domain: d, since: badSince, files };

        // Invariant 2: expired or key-mismatched files while the Secret has held a valid pair newer than the
        // files' for the grace. From when such a pair landed, not from when the Secret's validity began: a
        // renewal that lands 0.3 s before the old certificate expires cannot be on every replica at expiry.
        const secretValid = d.validSince !== undefined && isValidAt(d.secret?.cert, now);
        const inv2 =
          up &&
          badSince !== undefined &&
          secretValid &&
          now - Math.max(d.validSince!, newerLandedAt(d.history, files?.cert, now), inst!.readyAt!, reachable, readsSince) > graceMs &&
          this.#stillBad(`2:${name}:${d.domain}`, name, d, files);
        this.#episode(`2:${name}:${d.domain}`, inv2, now, () => {
          const what = files?.cert
            ? files.cert.keyMatch
              ? `expired serial ${short(files.cert.serial)} (notAfter ${iso(files.cert.notAfter)})`
              : `key-mismatched serial ${short(files.cert.serial)}`
            : 'no certificate files';
          return (
            `inv2 ${iso(now)} ${d.domain}: ${name} (pid ${inst!.pid}) projects ${what} ` +
            `while the Secret holds valid serial ${short(d.secret!.cert!.serial)} since ${iso(d.validSince!)}`
          );
        });
        // Across the clusters: expired files while this member's Secret holds nothing valid either.
        const expired = up && files?.cert?.keyMatch === true && now >= files.cert.notAfter && !secretValid;
        const needless =
          expired && this.#ctx.federation
            ? this.#needlessExpiry(d.domain, files!.cert!, now, Math.max(badSince!, inst!.readyAt!, reachable, readsSince))
            : undefined;
        const elsewhere = `2:elsewhere:${name}:${d.domain}`;
        this.#episode(elsewhere, needless !== undefined && this.#stillBad(elsewhere, name, d, files), now, () => {
          return (
            `inv2 ${iso(now)} ${d.domain}: ${name} (pid ${inst!.pid}) projects expired serial ${short(files!.cert!.serial)} ` +
            `(notAfter ${iso(files!.cert!.notAfter)}) ${needless!}`
          );
        });
      }

      // Invariant 5: readiness True only while the replica holds a valid certificate for every domain.
      const gate = this.#gate.get(name);
      // The grace runs from when both held: True and bad files (the gate may flip a moment before the files land).
      const inv5 =
        up &&
        this.#ctx.podsInSync() &&
        gate?.status === 'True' &&
        worst !== undefined &&
        now - Math.max(gate.at, worst.since, inst!.readyAt!, reachable, this.#ctx.statusReachableSince?.(name) ?? 0) > graceMs &&
        this.#stillBad(`5:${name}`, name, worst.domain, worst.files);
      this.#episode(
        `5:${name}`,
        inv5,
        now,
        () =>
          `inv5 ${iso(now)} ${worst!.domain.domain}: ${name} (pid ${inst!.pid}) has its readiness condition True (since ${iso(gate!.at)}) ` +
          `without a valid certificate for this domain (files bad since ${iso(worst!.since)})`,
      );
    }

    // Invariant 4: convergence after a new certificate lands, within the grace in quiet periods.
    for (const d of this.#domains.values()) {
      if (d.open.length === 0) continue;
      for (const s of d.open) {
        const missing = [...s.expected].filter((n) => !s.reached.has(n));
        if (missing.length === 0) {
          s.done = true;
          continue;
        }
        const current = d.secret?.cert;
        const superseded = current !== undefined && current.serial !== s.serial && current.notAfter > s.notAfter;
        if (s.quiet && !s.reportedLate && now - s.landedAt > graceMs) {
          s.reportedLate = true;
          this.#violation(
            4,
            now,
            `inv4 ${iso(s.landedAt)} ${d.domain}: serial ${short(s.serial)} landed in the Secret in a quiet period; ` +
              `after ${graceMs} ms ${missing.join(', ')} did not hold it`,
          );
        }
        if (superseded || now - s.landedAt > 60_000) s.done = true;
      }
      d.open = d.open.filter((s) => !s.done);
    }
  }

  /** When the files became unusable (missing, mismatched or expired), or undefined if they are fine now. */
  #badSince(files: FilesState | undefined, now: number): number | undefined {
    if (!files) return 0;
    const c = files.cert;
    if (!c?.keyMatch) return files.at;
    if (now >= c.notAfter) return Math.max(files.at, c.notAfter);
    if (now < c.notBefore) return files.at;
    return undefined;
  }

  #newSample(d: DomainState, cert: CertView, at: number): void {
    const expected = new Set(this.#ctx.replicaNames.filter((n) => this.#ctx.running(n)?.readyAt !== undefined));
    const sample: Sample = {
      domain: d.domain,
      serial: cert.serial,
      notAfter: cert.notAfter,
      landedAt: at,
      quiet: this.#ctx.quietAt(at),
      expected,
      reached: new Map(),
      done: false,
      reportedLate: false,
    };
    for (const name of this.#ctx.replicaNames) {
      const t = d.firstSeen.get(name)!.get(cert.serial);
      if (t !== undefined) sample.reached.set(name, t);
    }
    this.#samples.push(sample);
    d.open.push(sample);
  }

  /**
   * Whether a replica's files still hold what a judgment found bad (`judged`): an episode under way stands; before one
   * opens they are read again (refreshFiles), and if they changed, files() has recorded them for the next tick to judge.
   */
  #stillBad(key: string, name: string, d: DomainState, judged: FilesState | undefined): boolean {
    if (this.#episodes.has(key)) return true;
    this.#ctx.refreshFiles?.(name, d.domain);
    return d.files.get(name) === judged;
  }

  #episode(key: string, active: boolean, now: number, text: () => string): void {
    const open = this.#episodes.get(key);
    if (active && !open) {
      const ep: Episode = { invariant: Number(key.split(':')[0]), startedAt: now, text: text() };
      this.#episodes.set(key, ep);
      this.#ctx.verbose(`VIOLATION ${ep.text}`);
    } else if (!active && open) {
      open.endedAt = now;
      this.#episodes.delete(key);
      this.#closed.push(open);
    }
  }

  #violation(invariant: number, at: number, text: string): void {
    this.#point.push({ invariant, at, text });
    this.#ctx.verbose(`VIOLATION ${text}`);
  }

  /** Every replica holds every Secret's certificate now (the end condition of invariant 4). */
  converged(): boolean {
    for (const d of this.#domains.values()) {
      const serial = d.secret?.cert?.serial;
      if (!serial) return false;
      for (const name of this.#ctx.replicaNames) if (d.files.get(name)?.cert?.serial !== serial) return false;
    }
    return true;
  }

  /** Convergence of the new certificates seen so far in quiet periods (what the runner measures itself). */
  quietConvergence(): { samples: number; p99Ms: number } {
    const values = this.#samples.filter((s) => s.quiet && reachedAll(s)).map(latency);
    return { samples: values.length, p99Ms: percentile(values, 99) };
  }

  /**
   * When the end-of-run comparison can judge every domain: undefined when every replica holds every
   * Secret's certificate; otherwise the latest "stored at + allowanceMs" of a certificate some replica
   * still lacks (in the past when each such certificate has had its allowance).
   */
  settledBy(allowanceMs: number): number | undefined {
    let by: number | undefined;
    for (const d of this.#domains.values()) {
      const serial = d.secret?.cert?.serial;
      if (!serial || this.#ctx.replicaNames.every((n) => d.files.get(n)?.cert?.serial === serial)) continue;
      const storedAt = d.history.find((s) => s.cert?.serial === serial)?.at ?? d.secret!.at;
      by = Math.max(by ?? -Infinity, storedAt + allowanceMs);
    }
    return by;
  }

  /**
   * Final checks: every replica holds every Secret's certificate (invariant 4 at the end), then all results.
   * `settleMs`: a certificate stored less than this before `now` has not had its time to converge yet, so a
   * replica may still hold the one the Secret held `settleMs` ago (or any stored since).
   */
  finish(now: number, final: { mustHold: boolean; settleMs?: number }): CheckerResult {
    this.tick(now);
    if (final.mustHold) {
      for (const d of this.#domains.values()) {
        const serial = d.secret?.cert?.serial;
        const due = dueSerials(d.history, now - (final.settleMs ?? 0));
        for (const name of this.#ctx.replicaNames) {
          const held = d.files.get(name)?.cert?.serial;
          if (!serial || held === undefined || !due.has(held)) {
            this.#violation(
              4,
              now,
              `inv4 ${iso(now)} ${d.domain}: at the end ${name} holds ${held ? short(held) : 'nothing'} ` +
                `while the Secret holds ${serial ? short(serial) : 'nothing'}`,
            );
          }
        }
      }
    }
    for (const ep of this.#episodes.values()) this.#closed.push(ep);
    this.#episodes.clear();

    const excused = this.#ctx.excusedIssuance;
    const windows = analyseWindows(excused ? this.#issuances.filter((i) => !excused(i)) : this.#issuances);
    const violations: Array<{ at: number; text: string }> = [];
    const reissuedAfterLost: string[] = [];
    for (const x of windows.extras) {
      const extra = x.issuance;
      const cover = x.coveredBy;
      const coverDue = cover.notAfter - (cover.notAfter - cover.notBefore) / 2;
      const stored = this.#domains.get(cover.domain)?.serials.has(cover.serial) ?? false;
      const ended = stored ? undefined : this.#ctx.endedAround?.(cover.emulator, cover.time);
      const lostWithWriter = ended === 'SIGKILL' || ended === 'crash';
      const stranded = lostWithWriter ? undefined : this.#ctx.strandedBetween?.(cover, extra);
      const why = stranded
        ? `, stranded: ${stranded}`
        : stored
          ? ''
          : ended
            ? `, never stored: its writer ended (${ended}) right after obtaining it`
            : ', never stored';
      const text =
        `inv1 ${iso(extra.time)} ${extra.domain}: extra issuance ${short(extra.serial)} by ${extra.emulator} (${extra.trigger}) in window ${x.window}: ` +
        `${short(cover.serial)} (issued ${iso(cover.time)} by ${cover.emulator}${why}) was valid and not due until ${iso(coverDue)}`;
      if (lostWithWriter || stranded) reissuedAfterLost.push(text);
      else violations.push({ at: extra.time, text });
    }
    // A federated member's writer follows the home's coordination while its way there is open: the records of
    // its own Secret (where a tenant of that member may write) bind only its calls once it must know it is cut
    // off (a request timeout into the cut); around a change of the link it may follow either.
    const federation = this.#ctx.federation;
    const recordsBind = (r: CertRequest): boolean => {
      const link = federation?.linkAt(r.time);
      return !link || (!link.open && r.time >= link.since + DEFAULT_REQUEST_TIMEOUT_MS);
    };
    const rate = checkRateLimits(this.#requests, this.#retryRecords, this.#ctx.instanceAt, undefined, recordsBind);
    for (const text of rate.violations) violations.push({ at: 0, text });
    for (const p of this.#point) violations.push({ at: p.at, text: p.text });
    for (const ep of this.#closed) {
      const lasted = ep.endedAt !== undefined ? `lasted ${ep.endedAt - ep.startedAt} ms` : 'until the end';
      violations.push({ at: ep.startedAt, text: `${ep.text} (${lasted})` });
    }
    violations.sort((a, b) => a.at - b.at);

    // Sanity: every certificate a Secret held was issued by one of the emulators, for that domain.
    const issued = new Set(this.#issuances.map((i) => `${i.domain} ${i.serial}`));
    let secretCerts = 0;
    let lost = issued.size;
    for (const d of this.#domains.values()) {
      secretCerts += d.serials.size;
      for (const serial of d.serials) {
        if (issued.has(`${d.domain} ${serial}`)) lost--;
        else violations.push({ at: now, text: `ledger: ${d.domain}: the Secret held serial ${short(serial)} that no emulator recorded issuing for it` });
      }
    }

    const allValues = this.#samples.filter(reachedAll).map(latency);
    const quietValues = this.#samples.filter((s) => s.quiet && reachedAll(s)).map(latency);

    const issuancesByDomain: Record<string, number> = Object.fromEntries(this.#ctx.domains.map((d) => [d, 0]));
    for (const i of this.#issuances) issuancesByDomain[i.domain] = (issuancesByDomain[i.domain] ?? 0) + 1;
    const unrepaired = [...this.#domains.values()].reduce((n, d) => n + d.editsPending.length, 0);

    return {
      windows,
      violations: violations.map((v) => v.text),
      unsharedRateLimits: rate.unshared,
      convergence: {
        quietSamples: quietValues.length,
        quietP50Ms: percentile(quietValues, 50),
        quietP99Ms: percentile(quietValues, 99),
        quietMaxMs: quietValues.reduce((a, b) => Math.max(a, b), 0),
        allSamples: allValues.length,
        allP99Ms: percentile(allValues, 99),
        allMaxMs: allValues.reduce((a, b) => Math.max(a, b), 0),
      },
      secretCerts,
      lostIssuances: lost,
      secretInvalidMs: [...this.#domains.values()].reduce((sum, d) => sum + secretInvalidMs(d.history, now), 0),
      requests: this.#requests.length,
      rateLimitedAnswers: rate.rateLimitedAnswers,
      issuancesByDomain,
      reissuedAfterLost,
      handEdits: {
        count: this.#handEdits,
        repaired: this.#handEdits - unrepaired,
        repairMaxMs: this.#repairMs.reduce((a, b) => Math.max(a, b), 0),
        repairP50Ms: percentile(this.#repairMs, 50),
      },
    };
  }

  /** For progress lines and the runner's waits. */
  snapshot(): { issuances: number; secretSerials: Map<string, string | undefined>; violations: number } {
    return {
      issuances: this.#issuances.length,
      secretSerials: new Map([...this.#domains.values()].map((d) => [d.domain, d.secret?.cert?.serial])),
      violations: this.#point.length + this.#closed.length + this.#episodes.size,
    };
  }
}

const reachedAll = (s: Sample): boolean => s.expected.size > 0 && [...s.expected].every((n) => s.reached.has(n));
const latency = (s: Sample): number => Math.max(0, ...[...s.expected].map((n) => s.reached.get(n)! - s.landedAt));

/** The serials a replica may hold at the end: the Secret's pair at `cutoff` and every one stored after it. */
function dueSerials(history: SecretState[], cutoff: number): Set<string> {
  const due = new Set<string>();
  let atCutoff: SecretState | undefined;
  for (const state of history) {
    if (state.at <= cutoff) atCutoff = state;
    else if (state.cert) due.add(state.cert.serial);
  }
  if (atCutoff?.cert) due.add(atCutoff.cert.serial);
  return due;
}

/** Time, after the first certificate, during which a Secret held no valid certificate (summed over domains by the caller). */
function secretInvalidMs(h: SecretState[], now: number): number {
  let total = 0;
  const first = h.findIndex((s) => s.cert !== undefined);
  if (first < 0) return 0;
  for (let i = first; i < h.length; i++) {
    const from = h[i]!.at;
    const to = i + 1 < h.length ? h[i + 1]!.at : now;
    const c = h[i]!.cert;
    if (!c?.keyMatch) total += to - from;
    else if (c.notAfter < to) total += to - Math.max(from, c.notAfter);
  }
  return total;
}

/**
 * When the Secret first held a pair that is still valid at `now` and expires later than the replica's files
 * (any valid pair when the files hold none or a mismatched one): what the replica could have picked up since.
 */
function newerLandedAt(history: SecretState[], files: CertView | undefined, now: number): number {
  const held = files?.keyMatch ? files.notAfter : -Infinity; // a mismatched pair counts as none
  for (const state of history) {
    if (state.cert?.keyMatch && isValidAt(state.cert, now) && state.cert.notAfter > held) return state.at;
  }
  return now;
}
