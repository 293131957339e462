// The chaos monkey: seeded, event-driven. Kills replicas (the writer more often; SIGKILL or SIGTERM)
// and restarts them after a short delay, turns fault-proxy profiles on and off, stops kube-apiserver
// for a few seconds, and makes the emulators answer 429 / rate-limit 500 / errors / resets / hangs or
// drop their IPN buses. With many domains per group it also kills the writer in the middle of a mass
// renewal (after it stored some of the domains renewing together), writes garbage into one domain's
// Secret by hand, and rate-limits a few domains on every emulator as Let's Encrypt does (the 429 and
// the "too many certificates" 500 tailscaled relays). Proportions keep the promise reachable: one
// pending cert fault per emulator and domain, API outages of about 3-5 s (restart included) against
// 10 s renewal windows, fault episodes of 2-6 s.
import { setTimeout as sleep } from 'node:timers/promises';
import { leaseHolderPod } from '../support/kube.ts';
import type { ControlPlane } from '../harness/control-plane.ts';
import type { FaultProxy, ProxyFaults } from './fault-proxy.ts';
import type { Replica } from './replicas.ts';
import type { Rng } from './rng.ts';

export interface ChaosStats {
  kills: number;
  sigkills: number;
  sigterms: number;
  writerKills: number;
  restarts: number;
  apiOutages: number;
  apiOutageMs: number[];
  proxyEpisodes: Record<string, number>;
  emulatorFaults: Record<string, number>;
  busDrops: number;
  /** Writer kills timed inside a mass renewal (after it stored some, not all, of the renewing domains). */
  massRenewalKills: number;
  /** Secrets overwritten with garbage by hand. */
  handEdits: number;
  /** Domains rate-limited on every emulator (one count per domain and episode). */
  domainRateLimits: number;
}

export interface ChaosTuning {
  /** Mean time between kills (ms). */
  killEveryMs: number;
  /** Probability that a kill targets the current writer. */
  writerBias: number;
  restartDelayMs: [number, number];
  proxyEpisodeMs: [number, number];
  proxyPauseMeanMs: number;
  emulatorFaultEveryMs: number;
  apiOutageEveryMs: number;
  apiDownMs: [number, number];
  /** Mean time between arming a writer kill for the next mass renewal. */
  massKillEveryMs: number;
  /** Mean time between garbage hand edits of a Secret. */
  handEditEveryMs: number;
  /** Mean time between per-domain rate-limit episodes. */
  domainRateLimitEveryMs: number;
}

export const DEFAULT_TUNING: ChaosTuning = {
  killEveryMs: 6500,
  writerBias: 0.6,
  restartDelayMs: [300, 3000],
  proxyEpisodeMs: [2000, 6000],
  proxyPauseMeanMs: 6000,
  emulatorFaultEveryMs: 7000,
  apiOutageEveryMs: 80_000,
  apiDownMs: [100, 500],
  massKillEveryMs: 35_000,
  handEditEveryMs: 25_000,
  domainRateLimitEveryMs: 15_000,
};

/** A rate limit on chosen domains, on every emulator: Let's Encrypt refuses the domain, whoever asks. */
const DOMAIN_RATE_LIMITS: ReadonlyArray<readonly [string, number]> = [
  ['rate_limit_429', 2],
  ['acme_rate_limit_500', 1],
];

/** What the chaos writes into a Secret by hand: a pair that parses as nothing. */
export const GARBAGE = { 'tls.crt': Buffer.from('garbage, not a PEM\n').toString('base64'), 'tls.key': Buffer.from('garbage\n').toString('base64') };

const PROXY_PROFILES: ReadonlyArray<readonly [string, number, ProxyFaults]> = [
  ['resets', 2, { resetBefore: 0.15, resetAfter: 0.1 }],
  ['errors5xx', 2, { error5xx: 0.3 }],
  ['throttle429', 2, { throttle429: 0.3 }],
  ['latency', 2, { latencyMs: [50, 400] }],
  ['stallWatches', 2, { stallWatch: 1, stallMs: [1000, 4000] }],
  ['endWatches', 2, { endWatchEarly: 1, endAfterMs: [200, 2000] }],
  ['blackout', 1, { blackout: true }],
  // Every connection to the API drops at once, with all the watches it carries (many domains: many watches).
  ['dropConnections', 2, { dropConnectionsAfterMs: 500 }],
  ['mixed', 2, { resetBefore: 0.05, resetAfter: 0.05, error5xx: 0.1, throttle429: 0.1, latencyMs: [0, 200], endWatchEarly: 0.3, endAfterMs: [500, 3000] }],
];

const EMULATOR_FAULTS: ReadonlyArray<readonly [string, number]> = [
  ['cert:rate_limit_429:retry_after=3', 3],
  ['cert:acme_rate_limit_500', 2],
  ['cert:error_500', 2],
  ['cert:reset', 1],
  ['cert:slow:delay=1s', 1],
  ['cert:hang', 1],
  ['bus/drop', 2],
];

export class Chaos {
  readonly stats: ChaosStats = {
    kills: 0,
    sigkills: 0,
    sigterms: 0,
    writerKills: 0,
    restarts: 0,
    apiOutages: 0,
    apiOutageMs: [],
    proxyEpisodes: {},
    emulatorFaults: {},
    busDrops: 0,
    massRenewalKills: 0,
    handEdits: 0,
    domainRateLimits: 0,
  };
  /** [start, end) of each time the API was unreachable: server stopped, or a proxy blackout (end undefined while it lasts). */
  readonly unreachable: Array<[number, number | undefined]> = [];
  readonly #rng: Rng;
  readonly #replicas: Replica[];
  readonly #proxy: FaultProxy;
  readonly #cp: ControlPlane;
  readonly #namespace: string;
  readonly #tuning: ChaosTuning;
  readonly #log: (message: string) => void;
  readonly #busy = new Set<string>();
  readonly #inflight = new Set<Promise<void>>();
  /** Writer by the replicas' own logs, a fallback while the Lease cannot be read. */
  readonly #writerByLog = new Map<string, boolean>();
  readonly #domains: string[];
  readonly #onHandEdit: (domain: string, at: number) => void;
  /** A writer kill waiting for a mass renewal: fired after this many more stored renewals by one replica. */
  #massKill: { remaining: number } | undefined;
  /** Accepting chaos actions (between run() and its end). */
  #active = false;

  constructor(options: {
    rng: Rng;
    replicas: Replica[];
    proxy: FaultProxy;
    cp: ControlPlane;
    namespace: string;
    tuning: ChaosTuning;
    log: (message: string) => void;
    domains: string[];
    onHandEdit?: (domain: string, at: number) => void;
  }) {
    this.#domains = options.domains;
    this.#onHandEdit = options.onHandEdit ?? (() => {});
    this.#rng = options.rng;
    this.#replicas = options.replicas;
    this.#proxy = options.proxy;
    this.#cp = options.cp;
    this.#namespace = options.namespace;
    this.#tuning = options.tuning;
    this.#log = options.log;
  }

  /** Fed from the replicas' log lines. */
  observeLog(replica: string, line: Record<string, unknown>): void {
    if (line.msg === 'became the writer') this.#writerByLog.set(replica, true);
    if (line.msg === 'no longer the writer' || line.msg === 'certshare started') this.#writerByLog.set(replica, false);
    // A renewal stored by the writer: with many domains they come in bursts (every domain was issued at
    // start, so they fall due together). The armed kill hits the writer in the middle of such a burst.
    if (line.msg === 'certificate issued and stored' && this.#massKill && this.#active) {
      if (--this.#massKill.remaining > 0) return;
      this.#massKill = undefined;
      const target = this.#replicas.find((r) => r.name === replica);
      if (!target?.running || this.#busy.has(replica)) return;
      if (this.#replicas.filter((r) => !r.running || this.#busy.has(r.name)).length >= 2) return;
      this.stats.massRenewalKills++;
      this.#killReplica(target, this.#rng.chance(0.75) ? 'SIGKILL' : 'SIGTERM', true, 'mid mass renewal');
    }
  }

  /** When the API became reachable again after the last outage or blackout (Infinity while unreachable, 0 if never). */
  reachableSince(now: number): number {
    let since = 0;
    for (const [s, e] of this.unreachable) {
      if (s > now) continue;
      if (e === undefined || e > now) return Number.POSITIVE_INFINITY;
      since = Math.max(since, e);
    }
    return since;
  }

  /** Chaos until `until` (epoch ms). Returns once every action it started has finished. */
  async run(until: number): Promise<void> {
    const rng = this.#rng;
    const t = this.#tuning;
    let now = Date.now();
    let nextKill = now + rng.exponential(t.killEveryMs);
    let nextProxy = now + rng.between(500, 3000);
    let proxyEnds: number | undefined;
    let blackout: [number, number | undefined] | undefined;
    let nextEmu = now + rng.exponential(t.emulatorFaultEveryMs);
    let nextApi = now + rng.between(10_000, Math.min(t.apiOutageEveryMs, Math.max(11_000, until - now - 8000)));
    let nextMassKill = now + rng.exponential(t.massKillEveryMs);
    let nextHandEdit = now + rng.exponential(t.handEditEveryMs);
    let nextDomainLimit = now + rng.exponential(t.domainRateLimitEveryMs);
    this.#active = true;
    for (now = Date.now(); now < until; now = Date.now()) {
      if (now >= nextMassKill) {
        nextMassKill = now + rng.exponential(t.massKillEveryMs);
        // Some, not all, of the renewing domains stored before the kill.
        if (!this.#massKill) this.#massKill = { remaining: rng.int(1, Math.max(1, Math.floor(this.#domains.length / 2))) };
      }
      if (now >= nextHandEdit) {
        nextHandEdit = now + rng.exponential(t.handEditEveryMs);
        this.#background(this.#handEdit());
      }
      if (now >= nextDomainLimit) {
        nextDomainLimit = now + rng.exponential(t.domainRateLimitEveryMs);
        await this.#domainRateLimit();
      }
      if (now >= nextKill) {
        nextKill = now + rng.exponential(t.killEveryMs);
        await this.#kill();
      }
      if (proxyEnds !== undefined && now >= proxyEnds) {
        this.#proxy.clear();
        proxyEnds = undefined;
        if (blackout) blackout[1] = now;
        blackout = undefined;
        nextProxy = now + rng.exponential(t.proxyPauseMeanMs);
        this.#log('proxy: faults off');
      } else if (proxyEnds === undefined && now >= nextProxy) {
        const name = rng.weighted(PROXY_PROFILES.map(([n, w]) => [n, w] as const));
        const faults = PROXY_PROFILES.find(([n]) => n === name)![2];
        const h2 = this.#proxy.http2Sessions;
        this.#proxy.setFaults(faults);
        let open = '';
        if (name === 'stallWatches') open = `, ${this.#proxy.stallOpenWatches(faults.stallMs ?? [1000, 4000])} open watches stalled`;
        if (name === 'endWatches') open = `, ${this.#proxy.endOpenWatches()} open watches ended`;
        if (name === 'dropConnections') open = `, ${this.#proxy.applied.get('dropConnection') ?? 0} connections dropped so far (${h2} HTTP/2 now)`;
        const ms = name === 'blackout' ? rng.between(1000, 3000) : rng.between(...t.proxyEpisodeMs);
        if (name === 'blackout') {
          blackout = [now, undefined];
          this.unreachable.push(blackout);
        }
        proxyEnds = now + ms;
        this.stats.proxyEpisodes[name] = (this.stats.proxyEpisodes[name] ?? 0) + 1;
        this.#log(`proxy: ${name} for ${Math.round(ms)} ms${open}`);
      }
      if (now >= nextEmu) {
        nextEmu = now + rng.exponential(t.emulatorFaultEveryMs);
        await this.#emulatorFault();
      }
      if (now >= nextApi && until - now > 8000) {
        nextApi = now + rng.exponential(t.apiOutageEveryMs);
        this.#background(this.#apiOutage());
      }
      await sleep(100);
    }
    this.#active = false;
    this.#massKill = undefined;
    this.#proxy.clear();
    if (blackout) blackout[1] = Date.now();
    await this.settle();
  }

  /** Waits for in-flight actions, clears every fault and restarts every dead replica. */
  async settle(): Promise<void> {
    while (this.#inflight.size > 0) await Promise.all([...this.#inflight]);
    this.#proxy.clear();
    if (!this.#cp.apiServerRunning) await this.#cp.startApiServer();
    for (const r of this.#replicas) {
      await r.control('DELETE', 'faults').catch(() => {});
      if (!r.running) {
        r.start();
        this.stats.restarts++;
      }
    }
    // Until every process is up again (bounded).
    const deadline = Date.now() + 20_000;
    while (Date.now() < deadline && this.#replicas.some((r) => r.current?.readyAt === undefined)) await sleep(100);
  }

  async writer(): Promise<string | undefined> {
    if (this.#cp.apiServerRunning) {
      try {
        const res = await this.#cp.adminRequest('GET', `/apis/coordination.k8s.io/v1/namespaces/${this.#namespace}/leases/certshare-proxy`, {
          timeoutMs: 1000,
        });
        if (res.status === 200) {
          const holder = (JSON.parse(res.body) as { spec?: { holderIdentity?: string } }).spec?.holderIdentity;
          if (holder) return leaseHolderPod(holder);
        }
      } catch {
        // fall back to the logs
      }
    }
    return [...this.#writerByLog].find(([, w]) => w)?.[0];
  }

  #background(p: Promise<void>): void {
    const tracked = p.catch((err: unknown) => this.#log(`chaos action failed: ${(err as Error).message}`)).finally(() => this.#inflight.delete(tracked));
    this.#inflight.add(tracked);
  }

  async #kill(): Promise<void> {
    const rng = this.#rng;
    const candidates = this.#replicas.filter((r) => r.running && !this.#busy.has(r.name));
    const down = this.#replicas.filter((r) => !r.running || this.#busy.has(r.name)).length;
    if (candidates.length === 0 || down >= 2) return;
    const writer = await this.writer();
    const writerReplica = candidates.find((r) => r.name === writer);
    const target = writerReplica && rng.chance(this.#tuning.writerBias) ? writerReplica : rng.pick(candidates);
    this.#killReplica(target, rng.chance(0.5) ? 'SIGKILL' : 'SIGTERM', target.name === writer);
  }

  /** Kills a replica now and restarts it after the tuned delay (in the background). */
  #killReplica(target: Replica, signal: NodeJS.Signals, isWriter: boolean, why = ''): void {
    const delay = this.#rng.between(...this.#tuning.restartDelayMs);
    this.stats.kills++;
    if (signal === 'SIGKILL') this.stats.sigkills++;
    else this.stats.sigterms++;
    if (isWriter) this.stats.writerKills++;
    this.#busy.add(target.name);
    this.#log(
      `kill: ${signal} ${target.name}${isWriter ? ' (writer)' : ''}${why ? ` ${why}` : ''} pid ${target.current?.pid}, restart in ${Math.round(delay)} ms`,
    );
    this.#background(
      (async () => {
        try {
          await target.kill(signal);
          await sleep(delay);
          if (!target.running) {
            const inst = target.start();
            this.stats.restarts++;
            this.#log(`restart: ${target.name} pid ${inst.pid}`);
          }
        } finally {
          this.#busy.delete(target.name);
        }
      })(),
    );
  }

  /** Garbage in one domain's Secret, as a careless `kubectl edit` leaves it; the other domains' Secrets are untouched. */
  async #handEdit(): Promise<void> {
    if (!this.#cp.apiServerRunning) return;
    const domain = this.#rng.pick(this.#domains);
    const path = `/api/v1/namespaces/${this.#namespace}/secrets/${domain}`;
    const got = await this.#cp.adminRequest('GET', path, { timeoutMs: 2000 });
    if (got.status !== 200) return;
    const secret = JSON.parse(got.body) as { data?: Record<string, string> };
    secret.data = { ...secret.data, ...GARBAGE };
    // Compare-and-swap on the resourceVersion read: a conflict (certshare wrote meanwhile) skips this edit.
    const put = await this.#cp.adminRequest('PUT', path, { timeoutMs: 2000, body: secret });
    if (put.status !== 200) {
      this.#log(`hand edit of ${domain}: HTTP ${put.status}, skipped`);
      return;
    }
    this.stats.handEdits++;
    this.#onHandEdit(domain, Date.now());
    this.#log(`hand edit: garbage written into the Secret ${domain}`);
  }

  /** One to three domains refused on every emulator for their next two requests (Retry-After 3 s for the 429). */
  async #domainRateLimit(): Promise<void> {
    const rng = this.#rng;
    const count = rng.int(1, Math.min(3, this.#domains.length));
    const chosen = new Set<string>();
    while (chosen.size < count) chosen.add(rng.pick(this.#domains));
    for (const domain of chosen) {
      const kind = rng.weighted(DOMAIN_RATE_LIMITS);
      const fault = { target: 'cert', kind, domain, count: 2, ...(kind === 'rate_limit_429' ? { retryAfterSeconds: 3 } : {}) };
      let injected = 0;
      for (const r of this.#replicas) {
        try {
          const pending = await r.control('GET', 'faults');
          const list = (pending.json as { pending?: Array<{ target: string; domain?: string }> }).pending ?? [];
          if (list.some((f) => f.target === 'cert' && f.domain === domain)) continue;
          const res = await r.control('POST', 'faults', fault);
          if (res.status === 200) injected++;
        } catch (err) {
          this.#log(`emulator ${r.name}: could not rate-limit ${domain}: ${(err as Error).message}`);
        }
      }
      if (injected === 0) continue;
      this.stats.domainRateLimits++;
      const key = `domain:${kind}`;
      this.stats.emulatorFaults[key] = (this.stats.emulatorFaults[key] ?? 0) + 1;
      this.#log(`rate limit: ${domain} ${kind} on ${injected} emulator(s), next 2 requests`);
    }
  }

  async #emulatorFault(): Promise<void> {
    const rng = this.#rng;
    const writer = await this.writer();
    const target = this.#replicas.find((r) => r.name === writer && rng.chance(0.7)) ?? rng.pick(this.#replicas);
    const kind = rng.weighted(EMULATOR_FAULTS);
    try {
      if (kind === 'bus/drop') {
        await target.control('POST', 'bus/drop');
        this.stats.busDrops++;
        this.#log(`emulator ${target.name}: bus dropped`);
        return;
      }
      const pending = await target.control('GET', 'faults');
      const list = (pending.json as { pending?: Array<{ target: string; domain?: string }> }).pending ?? [];
      // One pending domain-less cert fault per emulator at most (domain rate limits are counted apart).
      if (list.some((f) => f.target === 'cert' && f.domain === undefined)) return;
      const res = await target.control('POST', 'faults', kind);
      if (res.status !== 200) throw new Error(`HTTP ${res.status} ${JSON.stringify(res.json)}`);
      this.stats.emulatorFaults[kind] = (this.stats.emulatorFaults[kind] ?? 0) + 1;
      this.#log(`emulator ${target.name}: fault ${kind}`);
    } catch (err) {
      this.#log(`emulator ${target.name}: could not inject ${kind}: ${(err as Error).message}`);
    }
  }

  async #apiOutage(): Promise<void> {
    const rng = this.#rng;
    // Mostly a crash (connections reset at once); sometimes a graceful stop (watches end cleanly),
    // SIGKILLed after 1 s. The restart itself takes 2.5 to 4.5 s (more under load): outages of 3 to 6 s.
    const signal = rng.chance(0.75) ? 'SIGKILL' : 'SIGTERM';
    const pause = rng.between(...this.#tuning.apiDownMs);
    const entry: [number, number | undefined] = [Date.now(), undefined];
    this.unreachable.push(entry);
    this.#log(`api: stopping kube-apiserver (${signal}), down ${Math.round(pause)} ms + restart`);
    await this.#cp.stopApiServer({ signal });
    const stopped = Date.now();
    await sleep(pause);
    const starting = Date.now();
    await this.#cp.startApiServer();
    entry[1] = Date.now();
    this.stats.apiOutages++;
    this.stats.apiOutageMs.push(entry[1] - entry[0]);
    this.#log(`api: kube-apiserver back after ${entry[1] - entry[0]} ms (stop ${stopped - entry[0]} ms, start ${entry[1] - starting} ms)`);
  }
}
