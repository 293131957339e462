// The run's result: a human-readable summary and one JSON object (the last stdout line with --json).
import { type CheckerResult, percentile } from './checker.ts';
import type { Instance } from './replicas.ts';
import type { HomeChaosStats } from './home.ts';
import type { ChaosStats } from './schedule.ts';

/** The schedule's counters as they are (apiOutageMs summarised as its maximum), and the checker's findings. */
export interface ChaosReport extends Omit<ChaosStats, 'apiOutageMs'>, Partial<HomeChaosStats> {
  minutes: number;
  /** Member clusters (1: no federation home; more: a home and that many members, docs/federation.md). */
  clusters: number;
  /** Issuances per domain and renewal window across every cluster, break-glass issuances left out: 1. */
  issuancesPerWindowMax: number;
  /** Issuances a member made on its own past the safety point while the home was away. */
  breakGlassIssuances: number;
  /** Break-glass issuances of one member for one domain in one window (the copy it replaced), the most: 1. */
  breakGlassPerMemberWindowMax?: number;
  /** Per `<member prefix><domain> replacing <serial>`: how many break-glass issuances. */
  breakGlassWindows?: Record<string, number>;
  /**
   * From each return of the home (an outage ended, a member's partition ended) until every member's Secret
   * held the home's serial: samples, p99 and max (ms), and returns still waiting at the end.
   */
  homeReturnConvergenceP99Ms?: number;
  homeReturnConvergenceMaxMs?: number;
  homeReturnConvergenceSamples?: number;
  homeReturnConvergenceUnfinished?: number;
  /** Returns cut short by another loss of the home before every member agreed (not samples). */
  homeReturnConvergenceInterrupted?: number;
  /**
   * Episodes of a replica projecting an expired certificate while its Secret held a valid one, or (federated)
   * while its own held none valid and another cluster's Secret (the home's included) did: 0.
   */
  expiredServed: number;
  seed: number;
  domainsPerGroup: number;
  timeScale: number;
  /** From starting the replicas until each held the first certificate of every domain. */
  startupMs: number;
  /**
   * From a replica's spawn to its 'certshare started' line, over every start of the run: how starved the machine
   * was. The invariants' grace runs from that line, so a run whose starts took seconds judges a loaded machine too.
   */
  processStartMs?: ProcessStarts;
  /** Issuances per domain over the run: the fewest, the most, and every domain's count. */
  issuancesPerDomainMin: number;
  issuancesPerDomainMax: number;
  issuancesByDomain: Record<string, number>;
  /** Renewal windows passed after the first issuance, per domain: the fewest and the most. */
  windowsPerDomainMin: number;
  windowsPerDomainMax: number;
  /** Extra issuances after a certificate lost with a SIGKILLed writer or stranded in a cut-off member (reported, not counted; see checker.ts). */
  reissuedAfterLost: number;
  reissuedAfterLostDetails: string[];
  /** Hand-edited Secrets valid again (of handEdits), and the slowest repair. */
  handEditsRepaired: number;
  handEditRepairMaxMs: number;
  durationMs: number;
  windows: number;
  issuances: number;
  maxIssuancesPerWindow: number;
  extraIssuances: number;
  violations: number;
  violationDetails: string[];
  apiOutageMaxMs: number;
  proxyFaultsApplied: Record<string, number>;
  convergenceP99Ms: number;
  convergenceP50Ms: number;
  convergenceMaxMs: number;
  convergenceSamples: number;
  convergenceAllP99Ms: number;
  convergenceAllSamples: number;
  secretCertificates: number;
  lostIssuances: number;
  secretInvalidMs: number;
  certRequests: number;
  rateLimitedAnswers: number;
  unsharedRateLimits: number;
  unsharedRateLimitDetails: string[];
  /** The end-of-run comparison: the allowance of a certificate stored at the end, and how long it waited. */
  endSettleAllowanceMs: number;
  endWaitMs: number;
  /** SIGTERMs that did not end in exit code 0 (the graceful stop overran --shutdown-timeout). */
  slowStops: string[];
  runDir?: string;
}

export function buildReport(input: {
  minutes: number;
  seed: number;
  domainsPerGroup: number;
  timeScale: number;
  startupMs: number;
  durationMs: number;
  result: CheckerResult;
  endCheck: { allowanceMs: number; waitedMs: number };
  chaos: ChaosStats;
  proxyApplied: Record<string, number>;
  extraViolations: string[];
  slowStops: string[];
  runDir?: string;
  clusters?: number;
  breakGlassIssuances?: number;
  breakGlassPerMemberWindowMax?: number;
  breakGlassWindows?: Record<string, number>;
  homeReturn?: { samples: number; p99Ms: number; maxMs: number; unfinished: number; interrupted: number };
  home?: HomeChaosStats;
  processStartMs?: ProcessStarts;
}): ChaosReport {
  const { result, chaos } = input;
  const details = [...input.extraViolations, ...result.violations];
  const counts = Object.values(result.issuancesByDomain);
  const windows = Object.keys(result.issuancesByDomain).map((d) => Math.max(0, (result.windows.perWindow[d]?.length ?? 0) - 1));
  return {
    minutes: input.minutes,
    clusters: input.clusters ?? 1,
    issuancesPerWindowMax: result.windows.maxIssuancesPerWindow,
    breakGlassIssuances: input.breakGlassIssuances ?? 0,
    ...(input.breakGlassPerMemberWindowMax === undefined
      ? {}
      : { breakGlassPerMemberWindowMax: input.breakGlassPerMemberWindowMax, breakGlassWindows: input.breakGlassWindows ?? {} }),
    ...(input.homeReturn
      ? {
          homeReturnConvergenceP99Ms: input.homeReturn.p99Ms,
          homeReturnConvergenceMaxMs: input.homeReturn.maxMs,
          homeReturnConvergenceSamples: input.homeReturn.samples,
          homeReturnConvergenceUnfinished: input.homeReturn.unfinished,
          homeReturnConvergenceInterrupted: input.homeReturn.interrupted,
        }
      : {}),
    expiredServed: details.filter((d) => /^inv2 .* projects expired /.test(d)).length,
    ...input.home,
    seed: input.seed,
    domainsPerGroup: input.domainsPerGroup,
    timeScale: input.timeScale,
    startupMs: input.startupMs,
    ...(input.processStartMs ? { processStartMs: input.processStartMs } : {}),
    issuancesPerDomainMin: Math.min(...counts),
    issuancesPerDomainMax: Math.max(...counts),
    issuancesByDomain: result.issuancesByDomain,
    windowsPerDomainMin: Math.min(...windows),
    windowsPerDomainMax: Math.max(...windows),
    reissuedAfterLost: result.reissuedAfterLost.length,
    reissuedAfterLostDetails: result.reissuedAfterLost,
    handEdits: chaos.handEdits,
    handEditsRepaired: result.handEdits.repaired,
    handEditRepairMaxMs: result.handEdits.repairMaxMs,
    massRenewalKills: chaos.massRenewalKills,
    domainRateLimits: chaos.domainRateLimits,
    durationMs: input.durationMs,
    windows: result.windows.windows,
    issuances: result.windows.issuances,
    maxIssuancesPerWindow: result.windows.maxIssuancesPerWindow,
    extraIssuances: result.windows.extras.length,
    violations: details.length,
    violationDetails: details,
    kills: chaos.kills,
    sigkills: chaos.sigkills,
    sigterms: chaos.sigterms,
    writerKills: chaos.writerKills,
    restarts: chaos.restarts,
    apiOutages: chaos.apiOutages,
    apiOutageMaxMs: Math.max(0, ...chaos.apiOutageMs),
    proxyEpisodes: chaos.proxyEpisodes,
    proxyFaultsApplied: input.proxyApplied,
    emulatorFaults: chaos.emulatorFaults,
    busDrops: chaos.busDrops,
    convergenceP99Ms: result.convergence.quietP99Ms,
    convergenceP50Ms: result.convergence.quietP50Ms,
    convergenceMaxMs: result.convergence.quietMaxMs,
    convergenceSamples: result.convergence.quietSamples,
    convergenceAllP99Ms: result.convergence.allP99Ms,
    convergenceAllSamples: result.convergence.allSamples,
    secretCertificates: result.secretCerts,
    lostIssuances: result.lostIssuances,
    secretInvalidMs: result.secretInvalidMs,
    certRequests: result.requests,
    rateLimitedAnswers: result.rateLimitedAnswers,
    unsharedRateLimits: result.unsharedRateLimits.length,
    unsharedRateLimitDetails: result.unsharedRateLimits,
    endSettleAllowanceMs: input.endCheck.allowanceMs,
    endWaitMs: input.endCheck.waitedMs,
    slowStops: input.slowStops,
    ...(input.runDir ? { runDir: input.runDir } : {}),
  };
}

export function summary(r: ChaosReport): string {
  const lines = [
    `certshare chaos: ${r.minutes} min, ${r.domainsPerGroup} domain(s) per group, time scale ${r.timeScale}, seed ${r.seed}, ` +
      `took ${(r.durationMs / 1000).toFixed(0)} s`,
    `  invariants: ${r.violations === 0 ? 'all held' : `${r.violations} violation(s)`}; ` +
      `start-up (every replica holds every first certificate) ${r.startupMs} ms`,
    ...(r.processStartMs
      ? [
          `  process starts (spawn to 'certshare started') ${r.processStartMs.starts}: ` +
            `p50 ${r.processStartMs.p50} ms, p99 ${r.processStartMs.p99} ms, max ${r.processStartMs.max} ms`,
        ]
      : []),
    `  1 issuances ${r.issuances} over ${r.windows} renewal windows after the first ` +
      `(max ${r.maxIssuancesPerWindow} per window per domain, ${r.extraIssuances} extra); ` +
      `${r.lostIssuances} issued but never stored (writer died mid-issuance), ` +
      `${r.reissuedAfterLost} of the extra issued inside the window of one lost with a SIGKILLed writer or stranded in a cut-off member`,
    `    per domain: ${r.issuancesPerDomainMin}-${r.issuancesPerDomainMax} issuances, ` +
      `${r.windowsPerDomainMin}-${r.windowsPerDomainMax} windows after the first`,
    `  4 convergence in quiet periods: p50 ${r.convergenceP50Ms} ms, p99 ${r.convergenceP99Ms} ms, max ${r.convergenceMaxMs} ms ` +
      `over ${r.convergenceSamples} new certificates (all periods: p99 ${r.convergenceAllP99Ms} ms over ${r.convergenceAllSamples}); ` +
      `at the end waited ${r.endWaitMs} ms (allowance ${r.endSettleAllowanceMs} ms for a certificate stored at the end)`,
    `  6 cert requests ${r.certRequests}, 429 answers ${r.rateLimitedAnswers}, rate limits not shared before the next call ${r.unsharedRateLimits}`,
    `  chaos: ${r.kills} kills (${r.sigkills} SIGKILL, ${r.sigterms} SIGTERM, ${r.writerKills} of the writer), ${r.restarts} restarts, ` +
      `${r.apiOutages} API outages (max ${r.apiOutageMaxMs} ms), ${r.busDrops} bus drops`,
    `  many domains: ${r.massRenewalKills} writer kills mid mass renewal, ${r.domainRateLimits} domain rate limits, ` +
      `${r.handEdits} Secrets hand-edited to garbage (${r.handEditsRepaired} valid again, slowest after ${r.handEditRepairMaxMs} ms)`,
    `  proxy episodes ${JSON.stringify(r.proxyEpisodes)}, applied ${JSON.stringify(r.proxyFaultsApplied)}`,
    `  emulator faults ${JSON.stringify(r.emulatorFaults)}`,
    ...(r.clusters > 1
      ? [
          `  federation: ${r.clusters} member clusters and a home; ${r.homeOutages} home outages (max ${r.homeOutageMaxMs} ms), ` +
            `${r.homePartitions} member-home partitions; ${r.breakGlassIssuances} break-glass issuances, ` +
            `max ${r.issuancesPerWindowMax} other issuances per window per domain across the clusters, ${r.expiredServed} expired certificates served`,
          `    ${r.doublePartitions ?? 0} double partitions; break-glass at most ${r.breakGlassPerMemberWindowMax ?? 0} per member per window; ` +
            `from the home's return to every member on its serial: p99 ${r.homeReturnConvergenceP99Ms ?? 0} ms, ` +
            `max ${r.homeReturnConvergenceMaxMs ?? 0} ms over ${r.homeReturnConvergenceSamples ?? 0} ` +
            `(${r.homeReturnConvergenceUnfinished ?? 0} unfinished, ${r.homeReturnConvergenceInterrupted ?? 0} cut short by another loss)`,
        ]
      : []),
    `  the Secrets held ${r.secretCertificates} certificates; without a valid one for ${r.secretInvalidMs} ms in total (summed over domains)`,
  ];
  if (r.violationDetails.length > 0) lines.push('  violations:', ...r.violationDetails.map((v) => `    - ${v}`));
  if (r.unsharedRateLimitDetails.length > 0)
    lines.push('  rate limits not shared (reported, not violations):', ...r.unsharedRateLimitDetails.map((v) => `    - ${v}`));
  if (r.reissuedAfterLostDetails.length > 0)
    lines.push(
      '  issued again after a certificate lost with its SIGKILLed writer or stranded in a cut-off member (reported, not violations):',
      ...r.reissuedAfterLostDetails.map((v) => `    - ${v}`),
    );
  if (r.slowStops.length > 0) lines.push('  graceful stops that overran --shutdown-timeout:', ...r.slowStops.map((v) => `    - ${v}`));
  if (r.runDir) lines.push(`  logs kept in ${r.runDir}`);
  return lines.join('\n');
}

export interface ProcessStarts {
  starts: number;
  p50: number;
  p99: number;
  max: number;
}

/** Spawn to 'certshare started' of every start that got that far. */
export function processStarts(replicas: readonly { instances: readonly Instance[] }[]): ProcessStarts {
  const ms = replicas.flatMap((r) => r.instances).flatMap((i) => (i.readyAt === undefined ? [] : [i.readyAt - i.startedAt]));
  return { starts: ms.length, p50: percentile(ms, 50), p99: percentile(ms, 99), max: Math.max(0, ...ms) };
}
