// The invariants, checked continuously from what the observers report:
//   1 issuances per domain per renewal window <= 1, and issuances = windows passed + 1 (the first);
//     windows are defined from the ledger in ledger.ts; evaluated at the end.
//   2 no replica projects (out-dir files) an expired, not-yet-valid, key-mismatched or missing pair
//     while the Secret holds a valid one;
//   3 the Secret never regresses to a certificate that expires earlier (nor holds a mismatched pair);
//   4 in quiet periods, every replica holds each new certificate of the Secret within the grace, and at
//     the end every replica holds the Secret's certificate; convergence times are measured for every
//     new certificate (from the checker seeing it in the Secret to the slowest replica's files);
//   5 a replica's readiness condition is True only while its files hold a valid pair;
//   6 no CertPair call before a rate-limit retry time recorded in the Secret, or before the Retry-After
//     of a 429 that the same certshare process received (see ledger.ts).
// Continuous conditions (2, 5) are evaluated on a 100 ms tick and recorded as episodes: one violation
// per episode, with its duration. They apply to replicas whose process runs (a dead sidecar cannot act)
// and allow a grace (GRACE_MS, 2 s) counted from the latest of: the replica's process being up
// ("certshare started"), the API being reachable again after an outage or blackout (plus a recovery
// allowance, see runner.ts), and for invariant 2 the Secret holding a valid pair without a break, for
// invariant 5 the condition being True and the files being bad (both at once). Invariant 5 also needs
// the checker's own Pod watch to be connected (otherwise the condition it sees may be stale).
import type { Instance } from './replicas.ts';
import { analyseWindows, checkRateLimits, parseLedgerLine, type CertRequest, type Issuance, type RetryRecord, type WindowAnalysis } from './ledger.ts';
import { isValidAt, viewPair, type CertView, type FilesState, type KubeObject } from './observers.ts';

export const GATE = 'certshare.io/certificates';

export interface CheckerContext {
  domain: string;
  graceMs: number;
  replicaNames: string[];
  /** The live process of a replica, if it runs. */
  running(name: string): Instance | undefined;
  /** "replica/pid" of the process behind an emulator (same name as its replica) at time t. */
  instanceAt(emulator: string, t: number): string | undefined;
  /** True when t lies in a quiet period, past its settling time (no fault active or lingering). */
  quietAt(t: number): boolean;
  /** Whether the admin's Pod view is current (its watch is connected). */
  podsInSync(): boolean;
  /**
   * From when the replicas could reach the API again after an outage or blackout, recovery allowance
   * included (Infinity while unreachable; 0 if it never was).
   */
  reachableSince(now: number): number;
  verbose: (message: string) => void;
}

interface SecretState {
  at: number;
  cert: CertView | undefined;
  retryNotBefore?: number;
  intent?: string;
}

interface Episode {
  invariant: number;
  startedAt: number;
  endedAt?: number;
  text: string;
}

interface Sample {
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

const iso = (t: number): string => new Date(t).toISOString().slice(11, 23);

function percentile(values: number[], p: number): number {
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
}

export class Checker {
  readonly #ctx: CheckerContext;
  readonly #episodes = new Map<string, Episode>();
  readonly #closed: Episode[] = [];
  readonly #point: Array<{ invariant: number; at: number; text: string }> = [];
  readonly #issuances: Issuance[] = [];
  readonly #requests: CertRequest[] = [];
  readonly #retryRecords: RetryRecord[] = [];
  readonly #secretHistory: SecretState[] = [];
  #secret: SecretState | undefined;
  /** Since when the Secret has held a valid certificate without a break (undefined: it does not now). */
  #secretValidSince: number | undefined;
  #maxNotAfter = 0;
  readonly #secretSerials = new Set<string>();
  readonly #files = new Map<string, FilesState>();
  readonly #firstSeen = new Map<string, Map<string, number>>();
  readonly #gate = new Map<string, { status: string; at: number }>();
  readonly #samples: Sample[] = [];

  constructor(ctx: CheckerContext) {
    this.#ctx = ctx;
    for (const name of ctx.replicaNames) this.#firstSeen.set(name, new Map());
  }

  // --- inputs ------------------------------------------------------------------------------------

  secret(obj: KubeObject | undefined, at: number): void {
    const data = obj?.data ?? {};
    const decode = (v: string | undefined): string => (v ? Buffer.from(v, 'base64').toString('utf8') : '');
    const cert = obj ? viewPair(decode(data['tls.crt']), decode(data['tls.key'])) : undefined;
    const annotations = obj?.metadata?.annotations ?? {};
    const retry = Date.parse(annotations['certshare.io/retry-not-before'] ?? '');
    const state: SecretState = { at, cert };
    if (Number.isFinite(retry)) state.retryNotBefore = retry;
    if (annotations['certshare.io/issuing']) state.intent = annotations['certshare.io/issuing'];
    const previous = this.#secret;
    this.#secret = state;
    this.#secretHistory.push(state);
    if (state.retryNotBefore !== undefined && !this.#retryRecords.some((r) => r.until === state.retryNotBefore)) {
      this.#retryRecords.push({ domain: this.#ctx.domain, observedAt: at, until: state.retryNotBefore });
      this.#ctx.verbose(`secret: retry-not-before ${iso(state.retryNotBefore)}`);
    }

    // Invariant 3: never an earlier-expiring (or unusable) certificate than one it already held.
    if (cert) {
      if (!cert.keyMatch) this.#violation(3, at, `inv3 ${iso(at)} the Secret holds a pair whose key does not match (serial ${cert.serial})`);
      if (cert.notAfter < this.#maxNotAfter) {
        this.#violation(
          3,
          at,
          `inv3 ${iso(at)} the Secret regressed to serial ${cert.serial} expiring ${iso(cert.notAfter)}, earlier than ${iso(this.#maxNotAfter)} it held before`,
        );
      }
      this.#maxNotAfter = Math.max(this.#maxNotAfter, cert.notAfter);
    } else if (this.#maxNotAfter > 0) {
      this.#ctx.verbose(`secret: no usable certificate at ${iso(at)} (deleted or emptied)`);
    }

    const validNow = isValidAt(cert, at);
    const wasValid = previous !== undefined && isValidAt(previous.cert, at) && this.#secretValidSince !== undefined;
    this.#secretValidSince = validNow ? (wasValid ? this.#secretValidSince : at) : undefined;

    if (cert && !this.#secretSerials.has(cert.serial)) {
      this.#secretSerials.add(cert.serial);
      this.#ctx.verbose(`secret: new certificate ${cert.serial.slice(0, 8)} notAfter ${iso(cert.notAfter)}`);
      this.#newSample(cert, at);
    }
  }

  pods(name: string, obj: KubeObject | undefined, at: number): void {
    if (!this.#ctx.replicaNames.includes(name)) return;
    const condition = obj?.status?.conditions?.find((c) => c.type === GATE);
    const status = condition?.status ?? 'Unknown';
    const prev = this.#gate.get(name);
    if (prev?.status !== status) this.#gate.set(name, { status, at });
  }

  files(name: string, state: FilesState): void {
    this.#files.set(name, state);
    const cert = state.cert;
    if (!cert) return;
    const seen = this.#firstSeen.get(name)!;
    if (!seen.has(cert.serial)) seen.set(cert.serial, state.at);
    for (const s of this.#samples) {
      if (s.done || s.reached.has(name)) continue;
      if (cert.serial === s.serial) s.reached.set(name, state.at);
    }
  }

  ledger(line: Record<string, unknown>): void {
    const { issuance, request } = parseLedgerLine(line);
    if (issuance && issuance.domain === this.#ctx.domain) {
      this.#issuances.push(issuance);
      this.#ctx.verbose(`ledger: issuance ${issuance.serial.slice(0, 8)} by ${issuance.emulator} (${issuance.trigger})`);
    }
    if (request && request.domain === this.#ctx.domain) {
      this.#requests.push(request);
      if (request.outcome !== '200') this.#ctx.verbose(`ledger: request to ${request.emulator} -> ${request.outcome}`);
    }
  }

  // --- continuous checks ---------------------------------------------------------------------------

  tick(now: number): void {
    const { graceMs } = this.#ctx;
    const secretValid = isValidAt(this.#secret?.cert, now) && this.#secretValidSince !== undefined;
    const reachable = this.#ctx.reachableSince(now);
    for (const name of this.#ctx.replicaNames) {
      const inst = this.#ctx.running(name);
      const up = inst?.readyAt !== undefined && now - inst.readyAt > graceMs;
      const files = this.#files.get(name);
      const badSince = this.#badSince(files, now);

      // Invariant 2: expired or key-mismatched files while the Secret has held a valid pair for the grace.
      const inv2 = up && badSince !== undefined && secretValid && now - Math.max(this.#secretValidSince!, inst!.readyAt!, reachable) > graceMs;
      this.#episode(`2:${name}`, inv2, now, () => {
        const what = files?.cert
          ? files.cert.keyMatch
            ? `expired serial ${files.cert.serial.slice(0, 8)} (notAfter ${iso(files.cert.notAfter)})`
            : `key-mismatched serial ${files.cert.serial.slice(0, 8)}`
          : 'no certificate files';
        const secretSerial = this.#secret!.cert!.serial.slice(0, 8);
        return (
          `inv2 ${iso(now)} ${name} (pid ${inst!.pid}) projects ${what} ` +
          `while the Secret holds valid serial ${secretSerial} since ${iso(this.#secretValidSince!)}`
        );
      });

      // Invariant 5: readiness True only while the replica holds a valid certificate.
      const gate = this.#gate.get(name);
      // The grace runs from when both held: True and bad files (the gate may flip a moment before the files land).
      const inv5 =
        up &&
        this.#ctx.podsInSync() &&
        gate?.status === 'True' &&
        badSince !== undefined &&
        now - Math.max(gate.at, badSince, inst!.readyAt!, reachable) > graceMs;
      this.#episode(
        `5:${name}`,
        inv5,
        now,
        () =>
          `inv5 ${iso(now)} ${name} (pid ${inst!.pid}) has its readiness condition True (since ${iso(gate!.at)}) ` +
          `without a valid certificate (files bad since ${iso(badSince!)})`,
      );
    }

    // Invariant 4: convergence after a new certificate lands, within the grace in quiet periods.
    for (const s of this.#samples) {
      if (s.done) continue;
      const missing = [...s.expected].filter((n) => !s.reached.has(n));
      const superseded = this.#secret?.cert !== undefined && this.#secret.cert.serial !== s.serial && this.#secret.cert.notAfter > s.notAfter;
      if (missing.length === 0) {
        s.done = true;
        continue;
      }
      if (s.quiet && !s.reportedLate && now - s.landedAt > graceMs) {
        s.reportedLate = true;
        this.#violation(
          4,
          now,
          `inv4 ${iso(s.landedAt)} serial ${s.serial.slice(0, 8)} landed in the Secret in a quiet period; ` +
            `after ${graceMs} ms ${missing.join(', ')} did not hold it`,
        );
      }
      if (superseded || now - s.landedAt > 60_000) s.done = true;
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

  #newSample(cert: CertView, at: number): void {
    const expected = new Set(this.#ctx.replicaNames.filter((n) => this.#ctx.running(n)?.readyAt !== undefined));
    const sample: Sample = {
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
      const t = this.#firstSeen.get(name)!.get(cert.serial);
      if (t !== undefined) sample.reached.set(name, t);
    }
    this.#samples.push(sample);
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

  /** Final checks: every replica holds the Secret's certificate (invariant 4 at the end), then all results. */
  finish(now: number, final: { mustHold: boolean }): CheckerResult {
    this.tick(now);
    if (final.mustHold) {
      const serial = this.#secret?.cert?.serial;
      for (const name of this.#ctx.replicaNames) {
        const held = this.#files.get(name)?.cert?.serial;
        if (!serial || held !== serial) {
          this.#violation(
            4,
            now,
            `inv4 ${iso(now)} at the end ${name} holds ${held?.slice(0, 8) ?? 'nothing'} while the Secret holds ${serial?.slice(0, 8) ?? 'nothing'}`,
          );
        }
      }
    }
    for (const ep of this.#episodes.values()) this.#closed.push(ep);
    this.#episodes.clear();

    const windows = analyseWindows(this.#issuances);
    const violations: Array<{ at: number; text: string }> = [];
    for (const x of windows.extras) {
      const extra = x.issuance;
      const cover = x.coveredBy;
      const coverDue = cover.notAfter - (cover.notAfter - cover.notBefore) / 2;
      violations.push({
        at: extra.time,
        text:
          `inv1 ${iso(extra.time)} extra issuance ${extra.serial.slice(0, 8)} by ${extra.emulator} (${extra.trigger}) in window ${x.window}: ` +
          `${cover.serial.slice(0, 8)} (issued ${iso(cover.time)} by ${cover.emulator}) was valid and not due until ${iso(coverDue)}`,
      });
    }
    const rate = checkRateLimits(this.#requests, this.#retryRecords, this.#ctx.instanceAt);
    for (const text of rate.violations) violations.push({ at: 0, text });
    for (const p of this.#point) violations.push({ at: p.at, text: p.text });
    for (const ep of this.#closed) {
      const lasted = ep.endedAt !== undefined ? `lasted ${ep.endedAt - ep.startedAt} ms` : 'until the end';
      violations.push({ at: ep.startedAt, text: `${ep.text} (${lasted})` });
    }
    violations.sort((a, b) => a.at - b.at);

    // Sanity: every certificate the Secret held was issued by one of the emulators.
    const issued = new Set(this.#issuances.map((i) => i.serial));
    for (const serial of this.#secretSerials) {
      if (!issued.has(serial)) violations.push({ at: now, text: `ledger: the Secret held serial ${serial.slice(0, 8)} that no emulator recorded issuing` });
    }

    const quiet = this.#samples.filter((s) => s.quiet && s.expected.size > 0 && [...s.expected].every((n) => s.reached.has(n)));
    const all = this.#samples.filter((s) => s.expected.size > 0 && [...s.expected].every((n) => s.reached.has(n)));
    const latency = (s: Sample): number => Math.max(0, ...[...s.expected].map((n) => s.reached.get(n)! - s.landedAt));
    const quietValues = quiet.map(latency);
    const allValues = all.map(latency);

    return {
      windows,
      violations: violations.map((v) => v.text),
      unsharedRateLimits: rate.unshared,
      convergence: {
        quietSamples: quietValues.length,
        quietP50Ms: percentile(quietValues, 50),
        quietP99Ms: percentile(quietValues, 99),
        quietMaxMs: Math.max(0, ...quietValues),
        allSamples: allValues.length,
        allP99Ms: percentile(allValues, 99),
        allMaxMs: Math.max(0, ...allValues),
      },
      secretCerts: this.#secretSerials.size,
      lostIssuances: [...issued].filter((s) => !this.#secretSerials.has(s)).length,
      secretInvalidMs: this.#secretInvalidMs(now),
      requests: this.#requests.length,
      rateLimitedAnswers: rate.rateLimitedAnswers,
    };
  }

  /** Time, after the first certificate, during which the Secret held no valid certificate. */
  #secretInvalidMs(now: number): number {
    let total = 0;
    const h = this.#secretHistory;
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

  /** For progress lines. */
  snapshot(): { issuances: number; secretSerial: string | undefined; violations: number } {
    return {
      issuances: this.#issuances.length,
      secretSerial: this.#secret?.cert?.serial,
      violations: this.#point.length + this.#closed.length + this.#episodes.size,
    };
  }
}
