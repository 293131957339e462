// Every Secret of every cluster of a federated chaos run (the home's of record and each member's), as the
// admin sees them: what invariant 2 compares a replica's files against across the clusters (issue 40: both
// replicas of a member cut off held an expired certificate while the home and the other members held a
// valid one, their own Secret expired too), and how long every member takes to reach the home's serial
// once the home is back (after an outage of the home, or a member's partition from it).
import { isValidAt, viewPair, type CertView, type KubeObject } from './observers.ts';

interface Held {
  cert: CertView | undefined;
  /** Since when this Secret has held a valid pair without a break (undefined: it does not now). */
  validSince: number | undefined;
  crt: string;
  key: string;
}

/** A valid pair some Secret holds: where, which, since when. */
export interface ValidElsewhere {
  where: string;
  serial: string;
  since: number;
}

const percentile = (sorted: number[], p: number): number =>
  sorted.length === 0 ? 0 : sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!;

export class SecretBoard {
  /** `home` and the members' names, in that order: per domain, what each holds. */
  readonly #held = new Map<string, Map<string, Held>>();
  readonly #members: string[];
  /** Returns of the home still waiting for every member to hold the home's serial (per domain). */
  readonly #open: Array<{ at: number; domain: string; what: string }> = [];
  readonly #convergedMs: number[] = [];
  /** Returns a later loss of the home cut short before every member agreed: not a convergence time. */
  #interrupted = 0;
  readonly #log: (message: string) => void;
  /** Per Secret ('home' or a member) and domain: the serials of the pairs it held valid, in order (the last 8). */
  readonly #heldSerials = new Map<string, string[]>();

  constructor(members: string[], log: (message: string) => void) {
    this.#members = members;
    this.#log = log;
  }

  /** The Secret `domain` at `where` ('home' or a member) changed (undefined: absent or deleted). */
  update(where: string, domain: string, obj: KubeObject | undefined, at: number): void {
    const byWhere = this.#held.get(domain) ?? new Map<string, Held>();
    this.#held.set(domain, byWhere);
    const crt = obj?.data?.['tls.crt'] ?? '';
    const key = obj?.data?.['tls.key'] ?? '';
    const before = byWhere.get(where);
    let cert = before?.cert;
    if (!obj) cert = undefined;
    else if (!before || before.crt !== crt || before.key !== key) {
      const decode = (v: string): string => (v ? Buffer.from(v, 'base64').toString('utf8') : '');
      cert = viewPair(decode(crt), decode(key));
    }
    const valid = isValidAt(cert, at);
    const validSince = valid ? (before?.validSince !== undefined && isValidAt(before.cert, at) ? before.validSince : at) : undefined;
    byWhere.set(where, { cert, validSince, crt, key });
    const serials = this.#heldSerials.get(`${where}\u0000${domain}`) ?? [];
    if (valid && serials.at(-1) !== cert!.serial) this.#heldSerials.set(`${where}\u0000${domain}`, [...serials.slice(-7), cert!.serial]);
    this.#settle(at);
  }

  /**
   * The serial of the last pair `where`'s Secret of `domain` held valid before `serial` (a break-glass record's
   * "none" names no window; the break-glass pair itself may have landed before its log line is read).
   */
  lastHeldBefore(where: string, domain: string, serial: string): string | undefined {
    const serials = this.#heldSerials.get(`${where}\u0000${domain}`) ?? [];
    const at = serials.lastIndexOf(serial.toUpperCase());
    return at < 0 ? serials.at(-1) : serials[at - 1];
  }

  /**
   * A valid pair some Secret other than `except`'s (`only`: that one's) holds now, the longest-held one: what a
   * replica of `except` projecting an expired pair meanwhile could have had (cross-cluster.ts).
   */
  validElsewhere(domain: string, except: string, now: number, only?: string): ValidElsewhere | undefined {
    let best: ValidElsewhere | undefined;
    for (const [where, held] of this.#held.get(domain) ?? []) {
      if (where === except || (only !== undefined && where !== only) || held.validSince === undefined || !isValidAt(held.cert, now)) continue;
      if (!best || held.validSince < best.since) best = { where, serial: held.cert!.serial, since: held.validSince };
    }
    return best;
  }

  /** The home is back for every member (an outage ended) or for one (a partition ended): time until all agree. */
  homeReturned(at: number, what: string, domains: string[]): void {
    for (const domain of domains) this.#open.push({ at, domain, what });
    this.#settle(at);
  }

  /**
   * A member lost the home again (a partition, or the home's outage) before the returns still open converged:
   * what they would measure from then on is that loss, not convergence; they are counted apart.
   */
  homeLost(): void {
    this.#interrupted += this.#open.length;
    this.#open.length = 0;
  }

  /** Closes the returns whose domain now has the home's serial in every member's Secret. */
  #settle(now: number): void {
    for (let i = this.#open.length - 1; i >= 0; i--) {
      const open = this.#open[i]!;
      const byWhere = this.#held.get(open.domain);
      const home = byWhere?.get('home')?.cert;
      if (!home || !isValidAt(home, now)) continue;
      if (!this.#members.every((m) => byWhere!.get(m)?.cert?.serial === home.serial)) continue;
      const ms = now - open.at;
      this.#convergedMs.push(ms);
      this.#open.splice(i, 1);
      this.#log(`home return (${open.what}): every member holds the home's serial ${home.serial.slice(0, 8)} of ${open.domain} after ${ms} ms`);
    }
  }

  /** From a return of the home until every member's Secret held the home's serial: samples, p99, max. */
  convergence(): { samples: number; p99Ms: number; maxMs: number; unfinished: number; interrupted: number } {
    const sorted = [...this.#convergedMs].sort((a, b) => a - b);
    return { samples: sorted.length, p99Ms: percentile(sorted, 99), maxMs: sorted.at(-1) ?? 0, unfinished: this.#open.length, interrupted: this.#interrupted };
  }
}
