// The federation home of a multi-cluster chaos run (--clusters N > 1, docs/federation.md): one more
// kube-apiserver holding the group's writer Lease, Secrets of record and ledger, set up as
// manifests/federation says (the federation account, its Role by name, the admission policy), and reached
// by each member cluster through its own fault-injecting proxy. The home's chaos: outages of the home
// apiserver (every member loses it at once) and partitions (one member loses the home, the others keep it).
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import type { ControlPlane } from '../harness/control-plane.ts';
import { GROUP, must } from '../support/kube.ts';
import type { FaultProxy } from './fault-proxy.ts';
import type { Rng } from './rng.ts';

const FEDERATION = fileURLToPath(new URL('../../manifests/federation', import.meta.url));
export const HOME_NAMESPACE = 'certshare-home';
export const FEDERATION_ACCOUNT = 'certshare-federation';

/**
 * The home namespace with manifests/federation applied; with more than its one domain, the Role names
 * every domain's Secret and the platform creates each (empty) Secret of record, as objects.yaml does.
 */
export async function homeNamespace(home: ControlPlane, domains: string[]): Promise<string> {
  await must(home.kubectl(['create', 'namespace', HOME_NAMESPACE]));
  await must(home.kubectl(['apply', '-k', FEDERATION, '-n', HOME_NAMESPACE]));
  if (domains.length > 1) {
    // rbac.yaml's rule 1 is the Secrets' (its comment: keep the order).
    const patch = [
      { op: 'test', path: '/rules/1/resources', value: ['secrets'] },
      { op: 'replace', path: '/rules/1/resourceNames', value: domains },
    ];
    await must(home.kubectl(['-n', HOME_NAMESPACE, 'patch', 'role', FEDERATION_ACCOUNT, '--type', 'json', '-p', JSON.stringify(patch)]));
    for (const name of domains.slice(1)) {
      const secret = {
        apiVersion: 'v1',
        kind: 'Secret',
        metadata: { name, labels: { 'app.kubernetes.io/managed-by': 'certshare', 'certshare.io/group': GROUP } },
        type: 'kubernetes.io/tls',
        data: { 'tls.crt': '', 'tls.key': '' },
      };
      await must(home.kubectl(['-n', HOME_NAMESPACE, 'create', '-f', '-'], { input: JSON.stringify(secret) }));
    }
  }
  return HOME_NAMESPACE;
}

export interface HomeChaosStats {
  homeOutages: number;
  homeOutageMaxMs: number;
  homePartitions: number;
  /**
   * Issue 40's pattern: one member cut off across a renewal point and a safety point, reconnected long
   * enough for its certificate to be adopted everywhere, then cut off again across that certificate's.
   */
  doublePartitions: number;
}

/** A member's way to the home at a moment: open (and since when without a break) or cut (since when). */
export interface HomeLink {
  open: boolean;
  since: number;
}

export interface HomeTuning {
  /** Mean time between home outages, and between partitions of one member from the home (ms). */
  outageEveryMs: number;
  partitionEveryMs: number;
  /** How long the home apiserver stays stopped (restart time comes on top), and a partition lasts. */
  outageDownMs: [number, number];
  partitionMs: [number, number];
  /** Mean time between double partitions (issue 40's pattern); 0: none. */
  doublePartitionEveryMs: number;
  /**
   * Its phases: cut off, reconnected, cut off again. Each cut lasts longer than a certificate's way from
   * its renewal point past its safety point; the reconnection covers the writer's capped retry of the
   * home and the push of its break-glass certificate.
   */
  doublePartitionMs: [number, number, number];
  /**
   * Each phase of a double partition drawn from its length times 1 - this to 1 (0: the lengths as they are), so
   * the cuts end on either side of a window's boundaries: the home's renewal, the break-glass safety point. Never
   * longer: the whole pattern must fit in a chaos segment, as it does at its lengths when it starts early in one.
   */
  doublePartitionJitter: number;
}

export const DEFAULT_HOME_TUNING: HomeTuning = {
  outageEveryMs: 30_000,
  partitionEveryMs: 15_000,
  outageDownMs: [500, 4000],
  partitionMs: [2000, 8000],
  // Against the run's 20 s certificates (renewal point at 10 s, safety point at 14.5 s, expiry at 20 s): the
  // first cut covers the copy's safety point wherever it starts in its life, the second a whole life more.
  doublePartitionEveryMs: 90_000,
  doublePartitionMs: [16_000, 8000, 22_000],
  doublePartitionJitter: 0,
};

const sum = (values: number[]): number => values.reduce((a, b) => a + b, 0);

export class HomeChaos {
  readonly stats: HomeChaosStats = { homeOutages: 0, homeOutageMaxMs: 0, homePartitions: 0, doublePartitions: 0 };
  readonly #home: ControlPlane;
  /** One proxy per member, in the member's order: the member's only way to the home. */
  readonly #links: FaultProxy[];
  readonly #rng: Rng;
  readonly #tuning: HomeTuning;
  readonly #log: (message: string) => void;
  /** The home is back: for every member (`member` undefined: an outage ended) or for one (a partition ended). */
  readonly #onReturn: (at: number, member: number | undefined, what: string) => void;
  readonly #onLoss: () => void;
  /** Per member: cut off from the home since (partitioned), or open since. */
  readonly #cutSince: Array<number | undefined>;
  readonly #openSince: number[];
  /** The home's apiserver stopped since (an outage under way). */
  #outageSince: number | undefined;
  /** Every cut of one member (`member`) or of all (an outage of the home: none), `to` unset while it lasts. */
  readonly #cuts: Array<{ member: number | undefined; from: number; to: number | undefined }> = [];

  constructor(options: {
    home: ControlPlane;
    links: FaultProxy[];
    rng: Rng;
    tuning: HomeTuning;
    log: (message: string) => void;
    onReturn?: (at: number, member: number | undefined, what: string) => void;
    /** A member lost the home (a partition began, or the home's outage). */
    onLoss?: () => void;
  }) {
    this.#home = options.home;
    this.#links = options.links;
    this.#rng = options.rng;
    this.#tuning = options.tuning;
    this.#log = options.log;
    this.#onReturn = options.onReturn ?? (() => {});
    this.#onLoss = options.onLoss ?? (() => {});
    this.#cutSince = options.links.map(() => undefined);
    this.#openSince = options.links.map(() => 0);
  }

  /** Member `i`'s way to the home at time `t` (epoch ms), from every cut and outage so far. */
  linkAt(i: number, t: number): HomeLink {
    const mine = this.#cuts.filter((c) => c.member === undefined || c.member === i);
    const cutThen = mine.filter((c) => c.from <= t && t < (c.to ?? Infinity));
    if (cutThen.length > 0) return { open: false, since: Math.min(...cutThen.map((c) => c.from)) };
    return { open: true, since: Math.max(0, ...mine.map((c) => c.to ?? 0).filter((to) => to <= t)) };
  }

  /** Member `i`'s way to the home now: cut by its partition or the home's outage, else open since when. */
  link(i: number): HomeLink {
    const cut = this.#cutSince[i];
    if (cut !== undefined || this.#outageSince !== undefined) return { open: false, since: Math.min(cut ?? Infinity, this.#outageSince ?? Infinity) };
    return { open: true, since: this.#openSince[i]! };
  }

  #cut(i: number, now: number): void {
    this.#links[i]!.setFaults({ blackout: true });
    this.#cutSince[i] = now;
    this.#cuts.push({ member: i, from: now, to: undefined });
    this.#onLoss();
  }

  /** Chaos at the home until `until` (epoch ms); the home is up and every link clear when it returns. */
  async run(until: number): Promise<void> {
    const rng = this.#rng;
    const t = this.#tuning;
    // The first of each early in the segment (as the API outages of schedule.ts): a short run has both.
    const start = Date.now();
    let nextOutage = start + rng.between(3000, Math.max(3001, Math.min(t.outageEveryMs, until - start - 12_000)));
    let nextPartition = start + rng.between(1000, Math.max(1001, Math.min(t.partitionEveryMs, until - start - 10_000)));
    const doubleMs = sum(t.doublePartitionMs);
    // No draw without jitter: a seed's schedule stays the one it was.
    const phase = (ms: number): number => (t.doublePartitionJitter > 0 ? ms * rng.between(1 - t.doublePartitionJitter, 1) : ms);
    // The first one early in the segment when the segment can hold it.
    let nextDouble =
      t.doublePartitionEveryMs > 0 ? start + rng.between(500, Math.max(501, Math.min(t.doublePartitionEveryMs, until - start - doubleMs))) : Infinity;
    const cut = new Map<number, number>();
    /** Members in a double partition, and when its second cut begins and how long it lasts (undefined: under way). */
    const second = new Map<number, [number, number] | undefined>();
    for (let now = Date.now(); now < until; now = Date.now()) {
      for (const [i, ends] of cut) {
        if (now < ends) continue;
        this.#links[i]!.clear();
        cut.delete(i);
        this.#cutSince[i] = undefined;
        this.#openSince[i] = now;
        this.#endCuts(i, now);
        this.#log(`home: member ${i + 1} reconnected`);
        this.#onReturn(now, i, `member ${i + 1} reconnected`);
        if (second.has(i) && second.get(i) === undefined) second.delete(i);
      }
      for (const [i, next] of second) {
        if (next === undefined || now < next[0]) continue;
        this.#cut(i, now);
        cut.set(i, now + next[1]);
        second.set(i, undefined);
        this.#log(`home: member ${i + 1} partitioned from the home again for ${Math.round(next[1])} ms (double partition)`);
      }
      if (now >= nextDouble && until - now > doubleMs) {
        nextDouble = now + rng.exponential(t.doublePartitionEveryMs);
        const i = rng.int(0, this.#links.length - 1);
        if (!cut.has(i) && !second.has(i)) {
          const [firstCutMs, reconnectMs, secondCutMs] = t.doublePartitionMs.map(phase) as [number, number, number];
          this.#cut(i, now);
          cut.set(i, now + firstCutMs);
          second.set(i, [now + firstCutMs + reconnectMs, secondCutMs]);
          this.stats.doublePartitions++;
          const [a, b, c] = [firstCutMs, reconnectMs, secondCutMs].map(Math.round);
          this.#log(`home: member ${i + 1} partitioned from the home for ${a} ms, back ${b} ms, then ${c} ms (double partition)`);
        }
      }
      if (now >= nextPartition) {
        nextPartition = now + rng.exponential(t.partitionEveryMs);
        const i = rng.int(0, this.#links.length - 1);
        if (!cut.has(i) && !second.has(i)) {
          const ms = rng.between(...t.partitionMs);
          this.#cut(i, now);
          cut.set(i, now + ms);
          this.stats.homePartitions++;
          this.#log(`home: member ${i + 1} partitioned from the home for ${Math.round(ms)} ms`);
        }
      }
      // An outage runs to its end here (not in the background): the links' schedule resumes after it.
      // Not during a double partition: the pattern is one member cut off while the home renews for the others.
      if (now >= nextOutage && until - now > 10_000 && second.size === 0) {
        nextOutage = now + rng.exponential(t.outageEveryMs);
        await this.#outage();
      }
      await sleep(100);
    }
    await this.settle();
  }

  /** The home up and every link clear. */
  async settle(): Promise<void> {
    for (const link of this.#links) link.clear();
    if (!this.#home.apiServerRunning) await this.#home.startApiServer();
    const now = Date.now();
    this.#outageSince = undefined;
    for (let i = 0; i < this.#links.length; i++) if (this.#cutSince[i] !== undefined) [this.#cutSince[i], this.#openSince[i]] = [undefined, now];
    for (const c of this.#cuts) c.to ??= now;
  }

  /** Ends the cuts under way of member `i` (undefined: the home's outage) at `now`. */
  #endCuts(member: number | undefined, now: number): void {
    for (const c of this.#cuts) if (c.member === member && c.to === undefined) c.to = now;
  }

  async #outage(): Promise<void> {
    const signal = this.#rng.chance(0.75) ? 'SIGKILL' : 'SIGTERM';
    const down = this.#rng.between(...this.#tuning.outageDownMs);
    const started = Date.now();
    this.#log(`home: stopping the home's kube-apiserver (${signal}), down ${Math.round(down)} ms + restart`);
    this.#outageSince = started;
    this.#cuts.push({ member: undefined, from: started, to: undefined });
    this.#onLoss();
    await this.#home.stopApiServer({ signal });
    await sleep(down);
    await this.#home.startApiServer();
    this.#outageSince = undefined;
    this.#endCuts(undefined, Date.now());
    const ms = Date.now() - started;
    for (let i = 0; i < this.#openSince.length; i++) this.#openSince[i] = Date.now();
    this.stats.homeOutages++;
    this.stats.homeOutageMaxMs = Math.max(this.stats.homeOutageMaxMs, ms);
    this.#log(`home: back after ${ms} ms`);
    this.#onReturn(Date.now(), undefined, `home back after ${ms} ms`);
  }
}
