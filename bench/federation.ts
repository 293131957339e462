// `--federation`: what a federation home (docs/federation.md) costs at rest. A home kube-apiserver (audit log on,
// manifests/federation applied for G groups of one domain each, the federation account's token) and a member
// kube-apiserver; per group a writer and a reader in the member, each with its own emulated tailscaled, on the
// production bundle with --federation-*.
//  1. Requests at the home: once every replica has its first certificate, a window at rest per home Lease
//     duration (--federation-lease-duration); the home's audit log gives every request of the federation account
//     by verb, resource and object. The Lease's requests are counted per lease period (its holder renews every
//     third of it, so the count per period does not depend on the duration: two durations show it), the
//     watches apart (open at the window's end, each renewed at its server-side timeout), and everything else per
//     hour; their sum is the cost per group-hour at the default duration, 1h.
//  2. Sidecar memory with a home: the same writer and reader idle after their certificate, without and with
//     --federation-* (the default duration), in turn: RSS, and the V8 heap used after a collection (the memory
//     probe of bench/memory.ts, preloaded into both).
import { mkdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import type { ControlPlane } from '../test/harness/control-plane.ts';
import { FEDERATION_ACCOUNT, HOME_NAMESPACE } from '../test/chaos/home.ts';
import { writeSharedCa } from '../test/support/certs.ts';
import { GROUP, KUBE_DOMAIN, must } from '../test/support/kube.ts';
import { longestSilenceS, readAudit, watchRenewalsPerHour, watchSecret, type AuditEvent } from './lib/apiserver.ts';
import { CertFileWatch, startEmulator, type EmulatorProc } from './lib/certshare.ts';
import { idleRss, type MemStatus, type Proc } from './lib/proc.ts';
import { type BenchSize, settle } from './lib/size.ts';
import { median, progress, round, type Target, verdictOf } from './lib/stats.ts';
import { spawnKubeDaemon, startReplica, type KubeReplica } from './kube.ts';
import { dumpProbe, PROBE_ARGS } from './memory.ts';

const FEDERATION = fileURLToPath(new URL('../manifests/federation', import.meta.url));
const MEMBER_NAMESPACE = 'proxies';
const MEMBER_CLUSTER = 'west';
/** --federation-lease-duration's default (src/config/run-options.ts), in seconds. */
const DEFAULT_LEASE_S = 3600;
/** src/kube/secret-watch.ts inactivityMs: a watch that hears nothing for this long is reopened. */
const WATCH_INACTIVITY_S = 900;

/** The goals of issue 34, per member cluster at rest. */
export const FEDERATION_TARGETS: Record<string, Target> = {
  homeRequestsPerGroupHour: { op: '<=', limit: 10 },
  homeWatchesPerMemberGroup: { op: '<=', limit: 1 },
  sidecarRssDeltaWriterMB: { op: '<=', limit: 3 },
  sidecarRssDeltaReaderMB: { op: '<=', limit: 3 },
};

export interface FederationOptions {
  groups: number;
  /** Home Lease durations measured at rest, in seconds. */
  leaseDurationsS: number[];
  /** Seconds at rest per duration. */
  windowS: number;
  /** Pairs of sidecars (without, with a home) for the memory figures. */
  samples: number;
  size: BenchSize;
}

interface FederatedGroup {
  group: string;
  domain: string;
}

/** The example's group and domain first, then proxy-2, proxy-3...: objects.yaml's names with `proxy` replaced. */
function groupsOf(n: number): FederatedGroup[] {
  return Array.from({ length: n }, (_, i) =>
    i === 0 ? { group: GROUP, domain: KUBE_DOMAIN } : { group: `${GROUP}-${i + 1}`, domain: `${GROUP}-${i + 1}.tailnet-0000.ts.net` },
  );
}

export interface LeaseRun {
  leaseDurationS: number;
  windowS: number;
  /** Requests completed in the window by verb and resource (watches: those started), all groups. */
  requests: Record<string, number>;
  perGroup: Array<{
    group: string;
    leaseRequests: number;
    leaseUpdates: number;
    /** Mean time between the Lease's updates (s), NaN with fewer than two. */
    renewEveryS: number;
    /** Lease requests per lease period: per update, times the updates a period holds at the measured pace. */
    leaseRequestsPerPeriod: number;
    /** Requests on anything else (the Secret of record, the ledger) but watches. */
    otherRequests: number;
    /** Watches started in the window (their pace per hour is the open watches' timeouts: not counted again here). */
    watchesStarted: number;
    openWatches: number;
  }>;
  /** Watches of the federation account open at the window's end, and the renewals per hour their timeoutSeconds imply. */
  openWatches: number;
  watchRenewalsPerHour: number;
  /** An admin watch of a Secret of record at the home over the window: bookmarks, and the longest silence (s). */
  probeBookmarks: number;
  probeMaxGapS: number;
}

export interface SidecarMemory {
  mem: MemStatus;
  heapUsedMB: number;
}

export interface MemoryPair {
  plain: { writer: SidecarMemory; reader: SidecarMemory };
  home: { writer: SidecarMemory; reader: SidecarMemory };
}

export interface FederationRun {
  groups: number;
  runs: LeaseRun[];
  pairs: MemoryPair[];
}

/**
 * The home namespace as manifests/federation makes it, for `groups`: the kustomization (the first group's
 * objects, the account, its Role, the admission policy), then objects.yaml again per further group with its
 * names, each named in the Role.
 */
async function federationHome(home: ControlPlane, groups: FederatedGroup[]): Promise<void> {
  await must(home.kubectl(['create', 'namespace', HOME_NAMESPACE]));
  await must(home.kubectl(['apply', '-k', FEDERATION, '-n', HOME_NAMESPACE]));
  const objects = await readFile(join(FEDERATION, 'objects.yaml'), 'utf8');
  // rbac.yaml's rules, in its order: the Lease, the Secrets of record, the ledger.
  const patch: object[] = ['leases', 'secrets', 'configmaps'].map((resource, i) => ({ op: 'test', path: `/rules/${i}/resources`, value: [resource] }));
  for (const { group, domain } of groups.slice(1)) {
    await must(home.kubectl(['-n', HOME_NAMESPACE, 'apply', '-f', '-'], { input: objects.replaceAll(/\bproxy\b/g, group) }));
    for (const [i, name] of [`certshare-${group}`, domain, `certshare-${group}-ledger`].entries()) {
      patch.push({ op: 'add', path: `/rules/${i}/resourceNames/-`, value: name });
    }
  }
  await must(home.kubectl(['-n', HOME_NAMESPACE, 'patch', 'role', FEDERATION_ACCOUNT, '--type', 'json', '-p', JSON.stringify(patch)]));
}

export async function federationPhase(home: ControlPlane, auditLog: string, member: ControlPlane, dir: string, o: FederationOptions): Promise<FederationRun> {
  const groups = groupsOf(o.groups);
  progress(`federation: the home namespace for ${groups.length} group(s), the member's namespace`);
  await federationHome(home, groups);
  await must(member.kubectl(['create', 'namespace', MEMBER_NAMESPACE]));
  const homeKubeconfig = await home.kubeconfigFor(HOME_NAMESPACE, FEDERATION_ACCOUNT);
  // One CA behind every emulator, trusted the documented way (NODE_EXTRA_CA_CERTS, in both variants): a member
  // refuses what no trust anchor vouches for, and pays for Node's default store as a real one does.
  await mkdir(dir, { recursive: true });
  const ca = await writeSharedCa(dir, 'certshare bench CA');
  const trust: Trust = { emulatorArgs: ['--ca', ca.caFile], env: { NODE_EXTRA_CA_CERTS: ca.anchorsFile } };
  const federationFlags = (leaseS: number | undefined): string[] => [
    ...['--federation-kubeconfig', homeKubeconfig, '--federation-namespace', HOME_NAMESPACE, '--federation-cluster', MEMBER_CLUSTER],
    ...(leaseS === undefined ? [] : ['--federation-lease-duration', `${leaseS}s`]),
  ];
  const runs: LeaseRun[] = [];
  for (const leaseS of o.leaseDurationsS) {
    runs.push(await restAtHome(home, auditLog, member, join(dir, `lease-${leaseS}s`), groups, leaseS, federationFlags(leaseS), trust, o));
  }
  const pairs: MemoryPair[] = [];
  const emulators = await Promise.all(
    ['writer', 'reader'].map((n) => startEmulator(join(dir, 'memory'), `memory-${n}`, ['--domain', groups[0]!.domain, ...trust.emulatorArgs])),
  );
  try {
    for (let i = 0; i < o.samples; i++) {
      progress(`federation: sidecar memory, pair ${i + 1} of ${o.samples} (without and with a home, in alternating order)`);
      // Alternating which of the two goes first: a drift of the machine over the pair falls on each side alike.
      const order = i % 2 === 0 ? (['plain', 'home'] as const) : (['home', 'plain'] as const);
      const pair: Partial<MemoryPair> = {};
      for (const variant of order) {
        pair[variant] = await idleSidecars(
          member,
          join(dir, 'memory', `${i}-${variant}`),
          groups[0]!,
          emulators,
          variant === 'home' ? federationFlags(undefined) : [],
          trust,
          o.size,
        );
      }
      pairs.push(pair as MemoryPair);
    }
  } finally {
    await Promise.all(emulators.map((e) => e.proc.stop()));
  }
  return { groups: groups.length, runs, pairs };
}

/** The emulators' shared CA (their flags) and how the daemons trust it (their environment). */
interface Trust {
  emulatorArgs: string[];
  env: Record<string, string>;
}

/** Per group a writer and a reader with the home, each with its first certificate; then `o.windowS` at rest, counted at the home. */
async function restAtHome(
  home: ControlPlane,
  auditLog: string,
  member: ControlPlane,
  dir: string,
  groups: FederatedGroup[],
  leaseS: number,
  flags: string[],
  trust: Trust,
  o: FederationOptions,
): Promise<LeaseRun> {
  progress(`federation: --federation-lease-duration ${leaseS}s: ${groups.length} group(s), a writer and a reader each`);
  const runStart = Date.now();
  const replicas: KubeReplica[] = [];
  try {
    // In the member, as its admin: what is measured is the home's side (the example's RBAC names one group only).
    for (const { group, domain } of groups) {
      for (const [i, mode] of (['rw', 'ro'] as const).entries()) {
        replicas.push(await startReplica(MEMBER_NAMESPACE, member.adminKubeconfigPath, dir, `${group}-${i}`, mode, { group, domain, flags, ...trust }));
      }
    }
    await Promise.all(replicas.map((r) => r.files.next(60_000, 0)));
    // The start-up requests (the home check, the first list and watch, the Lease taken) are over before the window.
    await sleep(settle(o.size, 5000));
    progress(`federation: at rest for ${o.windowS} s, counting the member's requests at the home`);
    const probe = await watchSecret(home, HOME_NAMESPACE, groups[0]!.domain);
    const t1 = Date.now();
    await sleep(o.windowS * 1000);
    const t2 = Date.now();
    probe.close();
    const user = `system:serviceaccount:${HOME_NAMESPACE}:${FEDERATION_ACCOUNT}`;
    const audit = (await readAudit(auditLog)).filter((e) => e.user.username === user && Date.parse(e.stageTimestamp) >= runStart);
    if (audit.length === 0) throw new Error(`the home's audit log ${auditLog} holds no request of ${user}: is auditing on?`);
    return {
      leaseDurationS: leaseS,
      ...countAtHome(audit, groups, leaseS, t1, t2),
      probeBookmarks: probe.events.filter((e) => e.type === 'BOOKMARK').length,
      probeMaxGapS: longestSilenceS(probe),
    };
  } finally {
    await Promise.all(replicas.map((r) => r.stop()));
  }
}

/** The federation account's requests between t1 and t2 (ms since epoch), by group. */
function countAtHome(
  audit: AuditEvent[],
  groups: FederatedGroup[],
  leaseS: number,
  t1: number,
  t2: number,
): Omit<LeaseRun, 'leaseDurationS' | 'probeBookmarks' | 'probeMaxGapS'> {
  const at = (e: AuditEvent): number => Date.parse(e.stageTimestamp);
  const windowS = (t2 - t1) / 1000;
  // A request is counted once: when it completes, or for a watch when it starts (it completes when it ends).
  const counted = audit.filter((e) => at(e) >= t1 && at(e) <= t2 && (e.verb === 'watch' ? e.stage === 'ResponseStarted' : e.stage === 'ResponseComplete'));
  const ended = new Set(audit.filter((e) => e.stage === 'ResponseComplete' && at(e) <= t2).map((e) => e.auditID));
  const open = audit.filter((e) => e.stage === 'ResponseStarted' && e.verb === 'watch' && at(e) <= t2 && !ended.has(e.auditID));
  const requests: Record<string, number> = {};
  for (const e of counted) {
    const key = `${e.verb} ${e.objectRef?.resource ?? '-'}${e.objectRef?.subresource ? `/${e.objectRef.subresource}` : ''}`;
    requests[key] = (requests[key] ?? 0) + 1;
  }
  const perGroup = groups.map(({ group, domain }) => {
    const names = new Set([`certshare-${group}`, domain, `certshare-${group}-ledger`]);
    const mine = counted.filter((e) => names.has(e.objectRef?.name ?? ''));
    const lease = mine.filter((e) => e.objectRef?.resource === 'leases');
    const updates = lease.filter((e) => e.verb === 'update').map(at);
    const renewEveryS = updates.length >= 2 ? (updates.at(-1)! - updates[0]!) / 1000 / (updates.length - 1) : NaN;
    // The pace of the renewals, not the window's phase: per update, times the updates one lease period holds.
    const leaseRequestsPerPeriod = Number.isFinite(renewEveryS) ? (lease.length / updates.length) * (leaseS / renewEveryS) : lease.length * (leaseS / windowS);
    return {
      group,
      leaseRequests: lease.length,
      leaseUpdates: updates.length,
      renewEveryS,
      leaseRequestsPerPeriod,
      otherRequests: mine.filter((e) => e.objectRef?.resource !== 'leases' && e.verb !== 'watch').length,
      watchesStarted: mine.filter((e) => e.verb === 'watch').length,
      openWatches: open.filter((e) => e.objectRef?.name === domain).length,
    };
  });
  return { windowS, requests, perGroup, openWatches: open.length, watchRenewalsPerHour: watchRenewalsPerHour(open.map((e) => e.requestURI)) };
}

/** A writer and a reader of `g` (`flags`: with a home or not) idle after their certificate: RSS, then the heap after a collection. */
async function idleSidecars(
  member: ControlPlane,
  dir: string,
  g: FederatedGroup,
  emulators: EmulatorProc[],
  flags: string[],
  trust: Trust,
  size: BenchSize,
): Promise<{ writer: SidecarMemory; reader: SidecarMemory }> {
  const roles = [
    { name: `${g.group}-0`, mode: 'rw' as const },
    { name: `${g.group}-1`, mode: 'ro' as const },
  ];
  const files: CertFileWatch[] = [];
  const daemons: Proc[] = [];
  try {
    for (const [i, { name, mode }] of roles.entries()) {
      const outDir = join(dir, name, 'certs');
      files.push(await CertFileWatch.start(outDir, g.domain));
      daemons.push(
        spawnKubeDaemon(MEMBER_NAMESPACE, member.adminKubeconfigPath, name, mode, emulators[i]!.socket, outDir, {
          group: g.group,
          flags: ['--domain', g.domain, ...flags],
          nodeArgs: ['--expose-gc', ...PROBE_ARGS],
          env: { BENCH_MEMPROBE_OUT: join(dir, `${name}.probe.json`), ...trust.env },
        }),
      );
    }
    await Promise.all(files.map((f) => f.next(60_000, 0)));
    // Long enough for the home's Lease to be taken and its watch opened: the sidecar as it spends its life.
    await sleep(settle(size, 10_000));
    const mems = await idleRss(
      daemons.map((d) => d.pid),
      size.idle,
    );
    const heaps = [];
    for (const [i, d] of daemons.entries()) heaps.push((await dumpProbe(d, join(dir, `${roles[i]!.name}.probe.json`), d.name)).heapUsedMB);
    return { writer: { mem: mems[0]!, heapUsedMB: heaps[0]! }, reader: { mem: mems[1]!, heapUsedMB: heaps[1]! } };
  } finally {
    for (const f of files) f.close();
    await Promise.all(daemons.map((d) => d.stop()));
  }
}

// --- report ---------------------------------------------------------------------------------------

/** The table lines and the JSON object of a `--federation` run; without verdicts for a --tiny one. */
export function federationReport(r: FederationRun, withVerdicts = true): { lines: string[]; json: Record<string, unknown> } {
  const verdict = (t: Target | undefined, v: number | null | undefined): ReturnType<typeof verdictOf> => (withVerdicts ? verdictOf(t, v) : '-');
  const mean = (xs: number[]): number => xs.reduce((a, b) => a + b, 0) / xs.length;
  const perPeriod = r.runs.map((run) => mean(run.perGroup.map((g) => g.leaseRequestsPerPeriod)));
  // At the default duration a lease period is an hour; the other requests and the watches' renewals go by the clock.
  const leasePerGroupHour = mean(perPeriod) * (3600 / DEFAULT_LEASE_S);
  const otherPerGroupHour = mean(r.runs.map((run) => (mean(run.perGroup.map((g) => g.otherRequests)) * 3600) / run.windowS));
  const watchRenewalsPerGroupHour = mean(r.runs.map((run) => run.watchRenewalsPerHour / r.groups));
  // Each watch is reopened at its server-side timeout, or after WATCH_INACTIVITY_S without a byte: the probe's
  // bookmarks say which. Without any, at most 3600 / WATCH_INACTIVITY_S per watch and hour.
  const bookmarked = r.runs.every((run) => run.probeBookmarks > 0 && run.probeMaxGapS < WATCH_INACTIVITY_S);
  const watchesPerGroup = mean(r.runs.map((run) => run.openWatches / r.groups));
  // Its server-side timeout (30 minutes or more) comes later than the silence: one reopening per silence.
  const worstWatchPerGroupHour = watchesPerGroup * (3600 / WATCH_INACTIVITY_S);
  const delta = (pick: (p: MemoryPair['plain']) => number): number[] => r.pairs.map((p) => pick(p.home) - pick(p.plain));
  const deltas = {
    writerRss: delta((s) => s.writer.mem.rss),
    readerRss: delta((s) => s.reader.mem.rss),
    writerHeap: delta((s) => s.writer.heapUsedMB),
    readerHeap: delta((s) => s.reader.heapUsedMB),
  };
  const figures: Record<string, number | null> = {
    homeRequestsPerGroupHour: round(leasePerGroupHour + otherPerGroupHour + (bookmarked ? watchRenewalsPerGroupHour : worstWatchPerGroupHour), 1),
    homeRequestsPerGroupHourNoBookmarks: round(leasePerGroupHour + otherPerGroupHour + worstWatchPerGroupHour, 1),
    homeLeaseRequestsPerPeriod: round(mean(perPeriod), 2),
    homeWatchesPerMember: Math.max(...r.runs.map((run) => run.openWatches)),
    homeWatchesPerMemberGroup: round(Math.max(...r.runs.map((run) => run.openWatches)) / r.groups, 2),
    sidecarRssDeltaWriterMB: r.pairs.length ? round(median(deltas.writerRss)) : null,
    sidecarRssDeltaReaderMB: r.pairs.length ? round(median(deltas.readerRss)) : null,
    sidecarHeapDeltaWriterMB: r.pairs.length ? round(median(deltas.writerHeap), 2) : null,
    sidecarHeapDeltaReaderMB: r.pairs.length ? round(median(deltas.readerHeap), 2) : null,
  };
  const lines = [
    `Federation home at rest: one member cluster, ${r.groups} group(s) of one domain, a writer and a reader each ` +
      "(requests of the federation account, the home's audit log):",
    `  ${['lease', 'window', 'renew every', 'Lease req/period', 'other req', 'open watches', 'watch renewals/h']
      .concat(['probe bookmarks, longest silence', 'by verb'])
      .join('  ')}`,
  ];
  for (const [i, run] of r.runs.entries()) {
    lines.push(
      `  ${[
        `${run.leaseDurationS} s`,
        `${round(run.windowS, 0)} s`,
        run.perGroup.map((g) => (Number.isFinite(g.renewEveryS) ? `${round(g.renewEveryS, 1)} s` : '-')).join('/'),
        `${round(perPeriod[i]!, 2)} (${run.perGroup.map((g) => `${g.leaseRequests} in ${g.leaseUpdates} renewals`).join(', ')})`,
        run.perGroup.map((g) => g.otherRequests).join('/'),
        String(run.openWatches),
        String(round(run.watchRenewalsPerHour, 2)),
        `${run.probeBookmarks}, ${round(run.probeMaxGapS, 0)} s`,
        Object.entries(run.requests)
          .map(([k, v]) => `${k} ${v}`)
          .join(', ') || 'none',
      ].join('  ')}`,
    );
  }
  lines.push(
    `  per group-hour at the default ${DEFAULT_LEASE_S / 3600}h lease: Lease ${round(leasePerGroupHour, 2)} + other ${round(otherPerGroupHour, 2)} + ` +
      `watch renewals ${round(bookmarked ? watchRenewalsPerGroupHour : worstWatchPerGroupHour, 2)} ` +
      `(${bookmarked ? 'at their server-side timeouts: bookmarks kept them alive' : `no bookmarks seen: one per ${WATCH_INACTIVITY_S} s of silence`}; ` +
      `without bookmarks at most ${round(worstWatchPerGroupHour, 2)})`,
  );
  if (r.pairs.length) {
    const list = (xs: number[]): string => xs.map((x) => round(x, 1)).join(', ');
    lines.push(
      `Sidecar memory with a home (${r.pairs.length} pairs, idle after the certificate; home - without, MB): ` +
        `writer RSS ${list(deltas.writerRss)}, heap ${list(deltas.writerHeap)}; reader RSS ${list(deltas.readerRss)}, heap ${list(deltas.readerHeap)}`,
      `  without a home: writer RSS ${list(r.pairs.map((p) => p.plain.writer.mem.rss))}, reader ${list(r.pairs.map((p) => p.plain.reader.mem.rss))}`,
    );
  }
  lines.push('', 'Figures (issue 34 targets):');
  for (const [k, v] of Object.entries(figures)) {
    const t = FEDERATION_TARGETS[k];
    lines.push(`  ${k.padEnd(38)} ${String(v ?? 'n/a').padStart(8)}  ${t ? `${t.op} ${t.limit}` : 'no target'}  ${verdict(t, v)}`.trimEnd());
  }
  const targets = Object.fromEntries(Object.entries(FEDERATION_TARGETS).map(([k, t]) => [k, { ...t, value: figures[k], verdict: verdict(t, figures[k]) }]));
  const json = {
    ...figures,
    targets,
    federation: {
      groups: r.groups,
      watchesKeptAliveByBookmarks: bookmarked,
      perGroupHour: { lease: round(leasePerGroupHour, 2), other: round(otherPerGroupHour, 2), watchRenewals: round(watchRenewalsPerGroupHour, 2) },
      runs: r.runs.map((run) => ({
        ...run,
        windowS: round(run.windowS, 1),
        watchRenewalsPerHour: round(run.watchRenewalsPerHour, 2),
        probeMaxGapS: round(run.probeMaxGapS, 1),
        perGroup: run.perGroup.map((g) => ({ ...g, renewEveryS: round(g.renewEveryS, 2), leaseRequestsPerPeriod: round(g.leaseRequestsPerPeriod, 2) })),
      })),
      memoryPairs: r.pairs.map((p) => ({
        plain: sidecarJson(p.plain),
        home: sidecarJson(p.home),
      })),
    },
  };
  return { lines, json };
}

const sidecarJson = (s: MemoryPair['plain']): Record<string, number> => ({
  writerRssMB: round(s.writer.mem.rss),
  writerAnonMB: round(s.writer.mem.anon),
  writerHeapUsedMB: round(s.writer.heapUsedMB, 2),
  readerRssMB: round(s.reader.mem.rss),
  readerAnonMB: round(s.reader.mem.anon),
  readerHeapUsedMB: round(s.reader.heapUsedMB, 2),
});
