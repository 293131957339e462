// `--domains N[,N...]`: one group serving N domains, a writer and 2 readers (kube mode, --out-dir) on the
// real test control plane, each with its own emulated tailscaled serving the same N cert domains. Per N:
// RSS and TCP connections to the apiserver per replica (idle, after every certificate is on every
// reader's disk), the time from start (and from the writer's last Secret write) until then, API requests
// per replica-hour at rest (audit log), and a mass renewal: certificates short enough that all N come
// due in one burst after the rest window, timed from each Secret update to every reader's files.
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { ControlPlane } from '../test/harness/control-plane.ts';
import { exampleNamespace, GROUP } from '../test/support/kube.ts';
import { generatedDomains } from '../src/emulator/options.ts';
import { X509Certificate } from 'node:crypto';
import { readAudit, watchRenewalsPerHour, type AuditEvent } from './lib/apiserver.ts';
import { CertTreeWatch, startEmulator, type EmulatorProc } from './lib/certshare.ts';
import { idleRss, memStatus, tcpConnectionsTo, type MemStatus, type Proc } from './lib/proc.ts';
import type { BenchSize } from './lib/size.ts';
import { linearFit, percentile, progress, round, type Target, verdictOf } from './lib/stats.ts';
import { spawnKubeDaemon } from './kube.ts';

export interface DomainsOptions {
  /** Seconds of the at-rest window (shortened if the mass renewal would fall into it). */
  windowS: number;
  /** Extra `certshare run` flags for every replica (e.g. `--watch-scope group` once it exists). */
  replicaFlags: string[];
  /** Certificate lifetime in seconds; default: long enough for start-up and the rest window to end before renewal at half of it. */
  lifetimeS?: number;
  size: BenchSize;
}

export interface ReplicaFigures {
  name: string;
  mode: 'rw' | 'ro';
  mem: MemStatus;
  /** Established TCP connections to the apiserver's port (the most seen over the idle samples). */
  tcpConns: number;
  /** RSS at the end of the rest window (V8 had that long to give memory back), when there was one. */
  memAfterRest: MemStatus | undefined;
}

export interface DomainsRun {
  n: number;
  certLifetimeS: number;
  replicas: ReplicaFigures[];
  /** From spawning the replicas until every reader had every certificate on disk. */
  startToAllReadersMs: number;
  /** From spawning the replicas until the writer's last first write of a certificate (as an admin watch saw it). */
  startToLastStoredMs: number;
  /** From that last write until every reader had every certificate on disk. */
  afterLastStoredMs: number;
  /** Undefined when the renewal came too soon for a window. */
  rest:
    | {
        windowS: number;
        /** Requests of the replicas' ServiceAccount completed in the window (audit log). */
        completed: number;
        watchesStarted: number;
        /** Watches open at the window's end, and the renewals per hour their timeoutSeconds imply. */
        openWatches: number;
        watchRenewalsPerHour: number;
        perReplicaHour: number;
        /** Certificates the writer stored in the window (0 when the group is really at rest). */
        certificatesStored: number;
      }
    | undefined;
  renewal: {
    /** Per domain: from the renewed Secret's write to the last reader's files holding it (ms). */
    samplesMs: number[];
    missed: number;
    p50Ms: number;
    p99Ms: number;
    maxMs: number;
    /** From the first renewal stored to the last reader file written. */
    spanMs: number;
    /** Domains whose writer stored more than two certificates in the run (one issuance and one renewal expected). */
    extraWrites: number;
    /** Why not every renewal was seen (a timeout). */
    error: string | undefined;
  };
}

const RENEWAL_READERS = ['proxy-1', 'proxy-2'];

/** The leaf's serial as certshare logs it (CertInfo.serial). */
function serialOf(pem: string): string {
  return new X509Certificate(pem).serialNumber;
}

/** RBAC for N domains: the example's Roles name every domain Secret; `--watch-scope group` also needs list/watch on Secrets. */
export async function grantDomains(cp: ControlPlane, ns: string, domains: string[], groupWatch: boolean): Promise<void> {
  const patch = async (role: string, rule: number): Promise<void> => {
    const res = await cp.adminRequest('PATCH', `/apis/rbac.authorization.k8s.io/v1/namespaces/${ns}/roles/${role}`, {
      headers: { 'Content-Type': 'application/json-patch+json' },
      body: [
        { op: 'test', path: `/rules/${rule}/resources`, value: ['secrets'] },
        { op: 'replace', path: `/rules/${rule}/resourceNames`, value: domains },
      ],
    });
    if (res.status !== 200) throw new Error(`patching Role ${role}: HTTP ${res.status} ${res.body.slice(0, 300)}`);
  };
  await patch('certshare-reader', 0);
  await patch('certshare-writer', 1);
  if (!groupWatch) return;
  const create = async (path: string, body: unknown): Promise<void> => {
    const res = await cp.adminRequest('POST', path, { body });
    if (res.status !== 201) throw new Error(`POST ${path}: HTTP ${res.status} ${res.body.slice(0, 300)}`);
  };
  const rbac = `/apis/rbac.authorization.k8s.io/v1/namespaces/${ns}`;
  await create(`${rbac}/roles`, {
    metadata: { name: 'certshare-group-watch' },
    rules: [{ apiGroups: [''], resources: ['secrets'], verbs: ['list', 'watch'] }],
  });
  await create(`${rbac}/rolebindings`, {
    metadata: { name: 'certshare-group-watch' },
    roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'certshare-group-watch' },
    subjects: ['certshare', 'certshare-reader'].map((name) => ({ kind: 'ServiceAccount', name, namespace: ns })),
  });
}

/** One N: see the file's head. */
export async function domainsPhase(cp: ControlPlane, dir: string, auditLog: string, n: number, o: DomainsOptions): Promise<DomainsRun> {
  const domains = generatedDomains(n);
  const ns = await exampleNamespace(cp, 'bench');
  const joined = o.replicaFlags.join(' ');
  await grantDomains(cp, ns, domains, /--watch-scope[ =]group/.test(joined));
  const kubeconfig = await cp.kubeconfigFor(ns, 'certshare');
  // Renewal comes at half the lifetime (under 10 days): after start-up (estimated), idle sampling and the window.
  const lifetimeS = o.lifetimeS ?? Math.round(2 * (30 + 0.5 * n + o.windowS + 30));
  progress(`domains ${n} (${ns}): writer + 2 readers, ${lifetimeS} s certificates${joined ? `, flags ${joined}` : ''}`);

  // Every certificate the writer stored per domain, in order, with when (its log line's time, on performance.now()'s scale).
  const stored = new Map<string, Array<{ at: number; serial: string }>>(domains.map((d) => [d, []]));
  let storedDuringRest = 0;
  let resting = false;
  const onWriterLine = (line: string): void => {
    if (!line.includes('certificate issued and stored')) return;
    try {
      const e = JSON.parse(line) as { domain?: string; serial?: string; time?: string };
      const seen = stored.get(e.domain ?? '');
      if (seen && e.serial && e.time) seen.push({ at: Date.parse(e.time) - performance.timeOrigin, serial: e.serial });
      if (resting) storedDuringRest++;
    } catch {
      // not a log line
    }
  };
  const emulators: EmulatorProc[] = [];
  const daemons: Proc[] = [];
  const trees: CertTreeWatch[] = [];
  try {
    const names = ['proxy-0', ...RENEWAL_READERS];
    const outDirs = names.map((name) => join(dir, `n${n}`, name, 'certs'));
    for (const name of names) {
      emulators.push(await startEmulator(join(dir, `n${n}`, name), name, ['--domain-count', String(n), '--cert-lifetime', `${lifetimeS}s`]));
    }
    for (const outDir of outDirs.slice(1)) trees.push(await CertTreeWatch.start(outDir, domains));
    const env = { CERTSHARE_DOMAIN: domains.join(',') };
    const t0 = performance.now();
    names.forEach((name, i) => {
      // The writer logs at info: its 'certificate issued and stored' lines time every Secret write.
      const flags = [...(i === 0 ? [] : ['--log-level', 'warn']), ...o.replicaFlags];
      daemons.push(spawnKubeDaemon(ns, kubeconfig, name, i === 0 ? 'rw' : 'ro', emulators[i]!.socket, outDirs[i]!, { flags, env }));
    });
    daemons[0]!.onLine(onWriterLine);
    const allOn = (t: CertTreeWatch, count: number): boolean => domains.every((d) => t.changes.get(d)!.length >= count);
    const missing = (t: CertTreeWatch, count: number) => (): string => {
      const lacking = domains.filter((d) => t.changes.get(d)!.length < count);
      return `${lacking.length} of ${n} domains lack certificate #${count} (e.g. ${lacking.slice(0, 3).join(', ')})`;
    };
    // A replica that exits ends the bench at once (lib/proc.ts failOnUnexpectedExit): no waiting for it here.
    await Promise.all(trees.map((t) => t.until(() => allOn(t, 1), 60_000 + 500 * n, missing(t, 1))));
    const tAll = Math.max(...trees.flatMap((t) => domains.map((d) => t.changes.get(d)![0]!.at)));
    // Domains whose first write the writer did not log (it restored one, or a log line was lost) are left out.
    const firstStored = domains.map((d) => stored.get(d)![0]?.at).filter((at) => at !== undefined);
    const lastStored = Math.max(...firstStored);
    progress(`domains ${n}: every reader has every certificate ${Math.round(tAll - t0)} ms after start; idle RSS and connections`);

    let tcp = daemons.map(() => 0);
    const sampleTcp = async (): Promise<void> => {
      const now = await Promise.all(daemons.map((d) => tcpConnectionsTo(d.pid, cp.port)));
      tcp = tcp.map((c, i) => Math.max(c, now[i]!));
    };
    const [mems] = await Promise.all([
      idleRss(
        daemons.map((d) => d.pid),
        o.size.idle,
      ),
      (async () => {
        // 4 samples over the idle RSS sampling's span (1.5 s apart at full size).
        for (let i = 0; i < 4; i++, await sleep((o.size.idle.idleMs + o.size.idle.spanMs) / 4)) await sampleTcp();
      })(),
    ]);

    // The rest window ends well before the first certificate comes due.
    const firstDue = Math.min(...firstStored) + (lifetimeS * 1000) / 2;
    const windowS = Math.min(o.windowS, (firstDue - performance.now()) / 1000 - 15);
    let rest: DomainsRun['rest'] | undefined;
    let afterRest: MemStatus[] | undefined;
    if (windowS < 10) progress(`domains ${n}: renewal due too soon for a rest window (${round(windowS, 0)} s): none (give a longer --renewal-lifetime)`);
    else {
      progress(`domains ${n}: API requests at rest over ${round(windowS, 0)} s`);
      resting = true;
      const t1 = Date.now();
      await sleep(windowS * 1000);
      const t2 = Date.now();
      resting = false;
      rest = { ...(await restFigures(auditLog, `system:serviceaccount:${ns}:certshare`, t1, t2, names.length)), certificatesStored: storedDuringRest };
      afterRest = await Promise.all(daemons.map((d) => memStatus(d.pid)));
    }

    progress(`domains ${n}: waiting for the mass renewal (due from ${round((firstDue - performance.now()) / 1000, 0)} s on)`);
    const renewalTimeout = firstDue - performance.now() + (lastStored - Math.min(...firstStored)) + 120_000 + 200 * n;
    // A renewal that does not reach every reader in time is reported (missed), not fatal: the figures above stand.
    let renewalError: string | undefined;
    await Promise.all(trees.map((t) => t.until(() => allOn(t, 2), renewalTimeout, missing(t, 2)))).catch((err: unknown) => {
      renewalError = (err as Error).message.split('\n')[0];
      progress(`domains ${n}: ${renewalError}`);
    });
    progress(`domains ${n}: mass renewal over`);
    const samplesMs: number[] = [];
    let missed = 0;
    let extraWrites = 0;
    let spanEnd = 0;
    // Per domain: each reader's first renewed file (its second certificate), timed from the writer's store of that
    // same certificate (the writer may have stored more than one meanwhile); the slower reader counts.
    let renewalStart = Infinity;
    for (const d of domains) {
      const writes = stored.get(d)!;
      const delays = trees.map((t) => {
        const change = t.changes.get(d)![1];
        const write = change && writes.find((w) => w.serial === serialOf(change.pem));
        if (!change || !write) return undefined;
        renewalStart = Math.min(renewalStart, write.at);
        spanEnd = Math.max(spanEnd, change.at);
        return change.at - write.at;
      });
      if (writes.length > 2) extraWrites++;
      if (delays.some((ms) => ms === undefined)) missed++;
      else samplesMs.push(Math.max(...(delays as number[])));
    }
    return {
      n,
      certLifetimeS: lifetimeS,
      replicas: names.map((name, i) => ({ name, mode: i === 0 ? 'rw' : 'ro', mem: mems[i]!, tcpConns: tcp[i]!, memAfterRest: afterRest?.[i] })),
      startToAllReadersMs: tAll - t0,
      startToLastStoredMs: lastStored - t0,
      afterLastStoredMs: tAll - lastStored,
      rest,
      renewal: {
        samplesMs,
        missed,
        p50Ms: percentile(samplesMs, 50),
        p99Ms: percentile(samplesMs, 99),
        maxMs: samplesMs.length ? Math.max(...samplesMs) : NaN,
        spanMs: spanEnd - renewalStart,
        extraWrites,
        error: renewalError,
      },
    };
  } finally {
    for (const t of trees) t.close();
    await Promise.all(daemons.map((d) => d.stop()));
    await Promise.all(emulators.map((e) => e.proc.stop()));
  }
}

/** API requests of `user` at rest between t1 and t2 (ms since epoch), per replica-hour, with the watch renewals beyond the window. */
async function restFigures(
  auditLog: string,
  user: string,
  t1: number,
  t2: number,
  replicas: number,
): Promise<Omit<NonNullable<DomainsRun['rest']>, 'certificatesStored'>> {
  const audit = (await readAudit(auditLog)).filter((e) => e.user.username === user);
  if (audit.length === 0) throw new Error(`the audit log ${auditLog} holds no request of ${user}: is auditing on?`);
  const at = (e: AuditEvent): number => Date.parse(e.stageTimestamp);
  const completed = audit.filter((e) => e.stage === 'ResponseComplete' && at(e) >= t1 && at(e) <= t2);
  const watchesStarted = audit.filter((e) => e.stage === 'ResponseStarted' && e.verb === 'watch' && at(e) >= t1 && at(e) <= t2).length;
  const ended = new Set(audit.filter((e) => e.stage === 'ResponseComplete' && at(e) <= t2).map((e) => e.auditID));
  const open = audit.filter((e) => e.stage === 'ResponseStarted' && e.verb === 'watch' && at(e) <= t2 && !ended.has(e.auditID)).map((e) => e.requestURI);
  const windowS = (t2 - t1) / 1000;
  const renewals = watchRenewalsPerHour(open);
  return {
    windowS,
    completed: completed.length,
    watchesStarted,
    openWatches: open.length,
    watchRenewalsPerHour: renewals,
    perReplicaHour: (completed.length * (3600 / windowS) + renewals) / replicas,
  };
}

// --- report ---------------------------------------------------------------------------------------

/** Targets of issue 11, for the largest N (500 in the JSON); `oneDomain*` hold the existing bench's 1-domain figures. */
export const DOMAIN_TARGETS: Record<string, Target> = {
  tcpConnsPerReplica: { op: '<=', limit: 2 },
  rssMaxMB: { op: '<=', limit: 150 },
  rssSlopeMBPerDomain: { op: '<=', limit: 0.1 },
  afterLastStoredMs: { op: '<=', limit: 5000 },
  massRenewalP99Ms: { op: '<=', limit: 2000 },
  apiRequestsPerReplicaHour: { op: '<=', limit: 10 },
  oneDomainRssReaderMB: { op: '<=', limit: 100 },
  oneDomainApiRequestsPerReplicaHour: { op: '<=', limit: 10 },
};

/** The table lines and the JSON object of a `--domains` run; without verdicts for a --tiny one. */
export function domainsReport(runs: DomainsRun[], replicaFlags: string[], withVerdicts = true): { lines: string[]; json: Record<string, unknown> } {
  const verdict = (t: Target, v: number | null | undefined): ReturnType<typeof verdictOf> => (withVerdicts ? verdictOf(t, v) : '-');
  const byN = [...runs].sort((a, b) => a.n - b.n);
  const largest = byN.at(-1)!;
  const one = byN.find((r) => r.n === 1);
  const rssMax = (r: DomainsRun): number => Math.max(...r.replicas.map((x) => x.mem.rss));
  // Slope per role (writer; the larger reader), the steeper of the two.
  const fit = (pick: (r: DomainsRun) => number): number => linearFit(byN.map((r) => ({ x: r.n, y: pick(r) }))).slope;
  const slopes = {
    writer: fit((r) => r.replicas[0]!.mem.rss),
    reader: fit((r) => Math.max(...r.replicas.slice(1).map((x) => x.mem.rss))),
  };
  const figures: Record<string, number | null> = {
    tcpConnsPerReplica: Math.max(...largest.replicas.map((r) => r.tcpConns)),
    rssMaxMB: round(rssMax(largest)),
    rssSlopeMBPerDomain: byN.length >= 2 ? round(Math.max(slopes.writer, slopes.reader), 3) : null,
    afterLastStoredMs: Math.round(largest.afterLastStoredMs),
    massRenewalP99Ms: Math.round(largest.renewal.p99Ms),
    apiRequestsPerReplicaHour: largest.rest ? round(largest.rest.perReplicaHour, 1) : null,
    oneDomainRssReaderMB: one ? round(Math.max(...one.replicas.slice(1).map((x) => x.mem.rss))) : null,
    oneDomainApiRequestsPerReplicaHour: one?.rest ? round(one.rest.perReplicaHour, 1) : null,
  };
  const lines = [
    `Domains per group (writer + 2 readers, kube mode, --out-dir${replicaFlags.length ? `, ${replicaFlags.join(' ')}` : ''}):`,
    `  ${['   N', 'RSS w/r1/r2 MB', 'after rest', 'TCP w/r1/r2', 'start->all', 'stored->all', 'renew p50/p99/max']
      .concat(['missed/extra', 'API/repl/h', 'watches', 'stored at rest'])
      .join('  ')}`,
  ];
  for (const r of byN) {
    lines.push(
      `  ${[
        String(r.n).padStart(4),
        r.replicas.map((x) => round(x.mem.rss, 0)).join('/'),
        r.replicas.map((x) => (x.memAfterRest ? round(x.memAfterRest.rss, 0) : '-')).join('/'),
        r.replicas.map((x) => x.tcpConns).join('/'),
        `${Math.round(r.startToAllReadersMs)} ms`,
        `${Math.round(r.afterLastStoredMs)} ms`,
        `${Math.round(r.renewal.p50Ms)}/${Math.round(r.renewal.p99Ms)}/${Math.round(r.renewal.maxMs)} ms`,
        `${r.renewal.missed}/${r.renewal.extraWrites}`,
        r.rest ? String(round(r.rest.perReplicaHour, 1)) : 'n/a',
        r.rest ? `${r.rest.openWatches} open` : 'n/a',
        r.rest ? String(r.rest.certificatesStored) : 'n/a',
      ].join('  ')}`,
    );
  }
  lines.push(
    `  RSS slope: writer ${round(slopes.writer, 3)}, reader ${round(slopes.reader, 3)} MB/domain`,
    '',
    `Targets (at N = ${largest.n}; oneDomain* at N = 1):`,
  );
  for (const [k, t] of Object.entries(DOMAIN_TARGETS))
    lines.push(`  ${k.padEnd(36)} ${String(figures[k] ?? 'n/a').padStart(8)}  ${t.op} ${t.limit}  ${verdict(t, figures[k])}`);
  const targets = Object.fromEntries(
    Object.entries(DOMAIN_TARGETS).map(([k, t]) => [
      k,
      { ...t, value: figures[k], verdict: verdict(t, figures[k]), atN: k.startsWith('oneDomain') ? 1 : largest.n },
    ]),
  );
  const json = {
    domains: byN.map((r) => ({
      n: r.n,
      certLifetimeS: r.certLifetimeS,
      replicas: r.replicas.map((x) => ({
        name: x.name,
        mode: x.mode,
        rssMB: round(x.mem.rss),
        anonMB: round(x.mem.anon),
        fileMB: round(x.mem.file),
        tcpConns: x.tcpConns,
        rssAfterRestMB: x.memAfterRest ? round(x.memAfterRest.rss) : null,
      })),
      startToAllReadersMs: Math.round(r.startToAllReadersMs),
      startToLastStoredMs: Math.round(r.startToLastStoredMs),
      afterLastStoredMs: Math.round(r.afterLastStoredMs),
      apiRequestsPerReplicaHour: r.rest ? round(r.rest.perReplicaHour, 1) : null,
      rest: r.rest && {
        ...r.rest,
        windowS: round(r.rest.windowS, 1),
        watchRenewalsPerHour: round(r.rest.watchRenewalsPerHour, 1),
        perReplicaHour: round(r.rest.perReplicaHour, 1),
      },
      massRenewal: {
        p50Ms: Math.round(r.renewal.p50Ms),
        p99Ms: Math.round(r.renewal.p99Ms),
        maxMs: Math.round(r.renewal.maxMs),
        spanMs: Math.round(r.renewal.spanMs),
        missed: r.renewal.missed,
        extraWrites: r.renewal.extraWrites,
        samples: r.renewal.samplesMs.length,
        ...(r.renewal.error ? { error: r.renewal.error } : {}),
      },
    })),
    rssSlopeMBPerDomain: { writer: round(slopes.writer, 4), reader: round(slopes.reader, 4) },
    replicaFlags,
    group: GROUP,
    ...figures,
    targets,
  };
  return { lines, json };
}
