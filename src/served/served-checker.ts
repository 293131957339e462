// The served check: after every change of certificate and at a steady interval, a TLS handshake with the
// proxy (SNI per domain) tells which certificate clients really get, compared with what certshare holds.
// What it establishes keeps the replica in rotation or takes it out (readiness, Service advertisement);
// a check that cannot run changes nothing (served-certificate.ts).
import type { Clock } from '../core/ports/clock.ts';
import { errorMessage } from '../core/errors.ts';
import type { Logger } from '../core/ports/logger.ts';
import type { LoopObserver } from '../core/ports/observer.ts';
import type { HeldValidity } from '../core/renewal/renewal.ts';
import type { IssuanceDecision } from '../core/issuance/issuance-policy.ts';
import { REPLACED_NOW_MAX } from '../core/values/untrusted-values.ts';
import {
  classifyServed,
  holdLeaf,
  nextServedState,
  replaceNowFrom,
  serialKey,
  servedVerdict,
  servedVerdictEdge,
  type HeldLeaves,
  type ServedLeaf,
  type ServedOutcome,
  type ServedProbe,
  type ServedState,
  type ServedVerdict,
} from '../core/served/served-certificate.ts';
import type { StoredCert } from '../core/ports/store.ts';

/** After a change, the first look again, doubling until the proxy serves the new leaf or the interval is reached. */
const FIRST_RECHECK_MS = 250;
/** Domains probed at once: a renewal of many domains does not open hundreds of connections to the proxy. */
const PROBES_AT_ONCE = 4;

interface ServedCheckerOptions {
  /** One handshake for `domain` (SNI); rejects only when `signal` aborts. */
  probe(domain: string, signal: AbortSignal): Promise<ServedProbe>;
  clock: Clock;
  logger: Logger;
  /** The steady interval between checks of a domain that serves its current certificate. */
  intervalMs: number;
  /** A previous certificate still served this long after certshare took a new one: a warning (`stale`). */
  staleAfterMs: number;
  /** Where a served certificate stops counting (the readiness lead before its notAfter). */
  end: (held: HeldValidity) => number;
  /** Each check's outcome (metrics). */
  onChecked?(domain: string, outcome: ServedOutcome, probe: ServedProbe): void;
  /** The verdict or the stale warning of a domain changed (health, advertisement, Events, logs). */
  onChange?(domain: string, report: ServedReport): void;
}

export interface ServedReport {
  outcome: ServedOutcome;
  verdict: ServedVerdict;
  /** A previous certificate served past staleAfterMs after the renewal. */
  stale: boolean;
  /** The served leaf is one the CA asked to replace now (it counts bad once the reload window has passed). */
  replacedNow: boolean;
  /** The leaf seen last (absent before any TLS answer). */
  serial?: string;
  notAfter?: number;
  /** For messages: why the last check could not run. */
  detail?: string;
}

interface DomainCheck {
  held: HeldLeaves;
  /** The serial of the current leaf (serialKey). */
  serial?: string;
  /** Serials the CA asked to replace now (ARI: a revocation, an incident), newest first, at most REPLACED_NOW_MAX. */
  replacedNow: string[];
  /** When certshare took its current certificate. */
  heldSince: number;
  /**
   * When each previous leaf (its fingerprint) stopped being the current one: a leaf the CA asked to replace now gets
   * one reload window from then, however many certificates follow it.
   */
  replacedAt: Map<string, number>;
  state?: ServedState;
  dueAt: number;
  /** Rechecks since the change that did not find the current leaf served. */
  rechecks: number;
  reported?: ServedReport;
  detail?: string;
}

export class ServedChecker implements LoopObserver {
  readonly #o: ServedCheckerOptions;
  readonly #domains = new Map<string, DomainCheck>();
  readonly #stop = new AbortController();
  /** certshare's reloads of the proxy under way, and a count of their starts and ends. */
  readonly #reloads = { running: 0, generation: 0 };
  #wake = new AbortController();
  #done: Promise<void> | undefined;

  constructor(options: ServedCheckerOptions) {
    this.#o = options;
  }

  certificate(domain: string, cert: StoredCert | undefined): void {
    const now = this.#o.clock.now();
    const entry = this.#domains.get(domain);
    const fingerprint = cert?.info.fingerprint256;
    const serial = cert && serialKey(cert.info.serial);
    if (!entry) {
      if (!fingerprint) return;
      const held = holdLeaf({ current: undefined, previous: [] }, fingerprint);
      this.#domains.set(domain, { held, serial, replacedNow: [], heldSince: now, replacedAt: new Map(), dueAt: now, rechecks: 0 });
    } else {
      const held = holdLeaf(entry.held, fingerprint);
      if (held === entry.held) return;
      const was = entry.held.current?.fingerprint256;
      if (was !== undefined && !entry.replacedAt.has(was)) entry.replacedAt.set(was, now);
      for (const f of entry.replacedAt.keys()) if (!held.previous.includes(f)) entry.replacedAt.delete(f);
      Object.assign(entry, { held, serial, heldSince: now, dueAt: now, rechecks: 0 });
    }
    this.#wake.abort();
  }

  /** The writer decided to replace the current leaf because the CA asked for it now: that leaf is one not to serve. */
  decided(domain: string, decision: IssuanceDecision): void {
    const serial = this.#domains.get(domain)?.serial;
    if (decision.action === 'issue' && decision.reason === 'ca_requested_now' && serial) this.replacedNow(domain, [serial]);
  }

  /**
   * Leaves of `domain` the CA asked to replace now (this replica's writer saw the reason, or the domain's record
   * names them): served past the reload window, they take the replica out. Only a leaf held before and replaced
   * counts (replaceNowFrom), so naming the current serial changes nothing.
   */
  replacedNow(domain: string, serials: readonly string[]): void {
    const d = this.#domains.get(domain);
    if (!d) return;
    const named = serials.map(serialKey);
    const next = [...new Set([...named, ...d.replacedNow])].slice(0, REPLACED_NOW_MAX);
    if (next.length === d.replacedNow.length && next.every((s, i) => s === d.replacedNow[i])) return;
    d.replacedNow = next;
    this.#wake.abort();
  }

  /**
   * certshare's own reload of the proxy began: until it ends, what a handshake gets proves nothing (nginx's old
   * workers keep accepting beside the new ones for a moment and serve the replaced certificate), so a check that
   * overlaps it counts for nothing.
   */
  reloading(): void {
    this.#reloads.running++;
    this.#reloads.generation++;
  }

  /**
   * certshare's own reload of the proxy ended (`delivered`: it ran, and did not fail): what it serves may have changed
   * without a certificate change (a proxy put right by the reload), so every domain is checked now rather than at its
   * next recheck.
   */
  reloaded(delivered = true): void {
    this.#reloads.running = Math.max(0, this.#reloads.running - 1);
    this.#reloads.generation++;
    if (!delivered) return;
    const now = this.#o.clock.now();
    for (const d of this.#domains.values()) Object.assign(d, { dueAt: now, rechecks: 0 });
    this.#wake.abort();
  }

  stopped(domain: string): void {
    this.#domains.delete(domain);
  }

  /** What the checks of `domain` established, judged at `now`. */
  verdict(domain: string, now: number): ServedVerdict {
    const d = this.#domains.get(domain);
    return servedVerdict(d?.state, now, this.#o.end, d && this.#replaceNowFrom(d));
  }

  /** When verdict(domain) may change by time alone, or undefined. */
  verdictEdge(domain: string, now: number): number | undefined {
    const d = this.#domains.get(domain);
    return servedVerdictEdge(d?.state, now, this.#o.end, d && this.#replaceNowFrom(d));
  }

  /** When the served leaf, one the CA asked to replace now, counts bad: the end of its reload window, from when it was replaced. */
  #replaceNowFrom(d: DomainCheck): number | undefined {
    const known = d.state?.known;
    return known && replaceNowFrom(d.state, new Set(d.replacedNow), this.#windowEnd(d.replacedAt.get(known.leaf.fingerprint256) ?? d.heldSince, known.leaf));
  }

  report(domain: string): ServedReport | undefined {
    return this.#domains.get(domain)?.reported;
  }

  start(): void {
    this.#done ??= this.#run();
  }

  async stop(): Promise<void> {
    this.#stop.abort();
    await this.#done;
  }

  async #run(): Promise<void> {
    const { clock, logger } = this.#o;
    while (!this.#stop.signal.aborted) {
      try {
        await this.#checkDue();
      } catch (err) {
        if (this.#stop.signal.aborted) break;
        logger.warn({ err: errorMessage(err) }, 'served check failed');
      }
      const now = clock.now();
      this.#evaluate(now);
      const waitMs = Math.max(0, this.#nextWake(now) - now);
      await clock.sleep(waitMs, AbortSignal.any([this.#stop.signal, this.#wake.signal])).catch(() => {});
      if (this.#wake.signal.aborted) this.#wake = new AbortController();
    }
  }

  async #checkDue(): Promise<void> {
    const now = this.#o.clock.now();
    const due = [...this.#domains].filter(([, d]) => d.dueAt <= now);
    for (let i = 0; i < due.length; i += PROBES_AT_ONCE) {
      await Promise.all(due.slice(i, i + PROBES_AT_ONCE).map(([domain, d]) => this.#check(domain, d)));
      if (this.#stop.signal.aborted) return;
    }
  }

  async #check(domain: string, d: DomainCheck): Promise<void> {
    const generation = this.#reloads.generation;
    const probe = await this.#o.probe(domain, this.#stop.signal);
    const now = this.#o.clock.now();
    // The certificate may have changed during the handshake: compare with what is held now.
    const entry = this.#domains.get(domain);
    if (entry !== d) return;
    // A reload ran during the handshake: looked at again once it ended (reloaded), or soon.
    if (this.#reloads.running > 0 || generation !== this.#reloads.generation) {
      d.dueAt = now + FIRST_RECHECK_MS;
      return;
    }
    const outcome = classifyServed(probe, d.held, now);
    d.state = nextServedState(d.state, probe, outcome);
    d.detail = 'failure' in probe ? probe.detail : undefined;
    this.#o.onChecked?.(domain, outcome, probe);
    if (outcome === 'current') {
      d.rechecks = 0;
      d.dueAt = now + this.#o.intervalMs;
    } else {
      d.dueAt = now + Math.min(this.#o.intervalMs, FIRST_RECHECK_MS * 2 ** d.rechecks);
      d.rechecks = Math.min(d.rechecks + 1, 30);
    }
  }

  #evaluate(now: number): void {
    for (const [domain, d] of this.#domains) {
      if (!d.state) continue;
      const known = d.state.known;
      const replaceFrom = this.#replaceNowFrom(d);
      const report: ServedReport = {
        outcome: d.state.outcome,
        verdict: servedVerdict(d.state, now, this.#o.end, replaceFrom),
        stale: known?.outcome === 'previous' && now >= this.#staleAt(d, known.leaf),
        replacedNow: replaceFrom !== undefined,
        ...(known ? { serial: known.leaf.serial, notAfter: known.leaf.notAfter } : {}),
        ...(d.detail ? { detail: d.detail } : {}),
      };
      const last = d.reported;
      d.reported = report;
      if (
        last &&
        last.outcome === report.outcome &&
        last.verdict.verdict === report.verdict.verdict &&
        last.stale === report.stale &&
        last.replacedNow === report.replacedNow &&
        last.serial === report.serial
      )
        continue;
      this.#o.onChange?.(domain, report);
    }
  }

  /**
   * When a previous leaf still served turns stale: staleAfterMs after certshare took the new certificate, but
   * at most halfway to that leaf's end, so a short-lived certificate warns before it takes the replica out.
   */
  #staleAt(d: DomainCheck, leaf: ServedLeaf): number {
    return this.#windowEnd(d.heldSince, leaf);
  }

  /** staleAfterMs from `from`, but at most halfway to the leaf's end. */
  #windowEnd(from: number, leaf: ServedLeaf): number {
    const end = this.#o.end({ notBefore: leaf.notBefore, notAfter: leaf.notAfter });
    return from + Math.min(this.#o.staleAfterMs, Math.max(0, Math.floor((end - from) / 2)));
  }

  /** The next check due, a served certificate reaching its end, or a previous one turning stale. */
  #nextWake(now: number): number {
    let next = now + this.#o.intervalMs;
    for (const d of this.#domains.values()) {
      next = Math.min(next, d.dueAt);
      const edge = servedVerdictEdge(d.state, now, this.#o.end, this.#replaceNowFrom(d));
      if (edge !== undefined) next = Math.min(next, edge);
      const known = d.state?.known;
      const staleAt = known?.outcome === 'previous' ? this.#staleAt(d, known.leaf) : undefined;
      if (staleAt !== undefined && staleAt > now) next = Math.min(next, staleAt);
    }
    return next;
  }
}
