// Short chaos runs as tests: every invariant holds for every domain and the run did enough to mean
// something. One cluster: 75 s plus start-up, 5 domains per group. Federated (--clusters 2): 60 s plus
// start-up, a home and two members. Longer and larger runs: `npm run chaos`. The seed is fixed for
// reproducible schedules (CHAOS_SEED overrides it); the report and, on failure, the run directory with
// every log are printed.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { join } from 'node:path';
import { test, type TestContext } from 'node:test';
import type { ChaosReport } from './report.ts';

const MAIN = join(import.meta.dirname, 'main.ts');

const DOMAINS = 5;

/** main.ts with `args`, --json and the seed; its report (it bounds itself, this is the test's own bound). */
async function chaos(t: TestContext, args: string[]): Promise<{ report: ChaosReport; code: number | null }> {
  const seed = process.env.CHAOS_SEED ?? '20261122';
  const child = spawn(process.execPath, [MAIN, ...args, '--json', '--seed', seed], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.setEncoding('utf8').on('data', (c: string) => (stdout += c));
  child.stderr.setEncoding('utf8').on('data', (c: string) => (stderr += c));
  const timer = setTimeout(() => child.kill('SIGTERM'), 8 * 60_000);
  // 'close', not 'exit': the report may still be in the pipe when the process has exited.
  const [code] = (await once(child, 'close')) as [number | null];
  clearTimeout(timer);
  const lines = stdout.trim().split('\n');
  let report: ChaosReport;
  try {
    report = JSON.parse(lines.at(-1) ?? '') as ChaosReport;
  } catch {
    assert.fail(`no JSON report (exit ${code}).\nstdout:\n${stdout}\nstderr:\n${stderr.slice(-4000)}`);
  }
  t.diagnostic(lines.slice(0, -1).join('\n'));
  assert.equal(report.violations, 0, `violations:\n${report.violationDetails.join('\n')}\n(logs in ${report.runDir})`);
  assert.equal(code, 0);
  return { report, code };
}

test(`chaos: 3 replicas, ${DOMAINS} domains, kills, API and LocalAPI faults for 75 s; every invariant holds`, { timeout: 9 * 60_000 }, async (t) => {
  const { report } = await chaos(t, ['--minutes', '1.25', '--domains-per-group', String(DOMAINS)]);
  assert.equal(report.domainsPerGroup, DOMAINS);
  // One first issuance per domain, then one per renewal window; an extra one only where a certificate was
  // lost with a SIGKILLed writer (reported, not a violation).
  assert.equal(report.extraIssuances, report.reissuedAfterLost, report.reissuedAfterLostDetails.join('\n'));
  assert.equal(report.issuances, report.windows + DOMAINS + report.extraIssuances);
  assert.ok(report.windowsPerDomainMin >= 3, `a domain passed only ${report.windowsPerDomainMin} renewal windows`);
  assert.ok(report.kills >= 3, `only ${report.kills} kills`);
  // Every start is measured: the first three and one per restart that reached 'certshare started'.
  assert.ok(report.processStartMs!.starts >= 3 && report.processStartMs!.max >= report.processStartMs!.p50);
  assert.ok(report.convergenceSamples >= 1, 'no convergence measured in a quiet period');
  assert.ok(report.convergenceP99Ms <= 2000);
});

test('chaos: a federation home and 2 member clusters, kills, API faults, home outages and partitions for 60 s; every invariant holds', {
  timeout: 9 * 60_000,
}, async (t) => {
  const { report } = await chaos(t, ['--minutes', '1', '--clusters', '2']);
  assert.equal(report.clusters, 2);
  // One issuance per renewal window across both clusters (a break-glass issuance is counted apart; a
  // certificate lost with a SIGKILLed writer, or stranded in a member cut off from the home, excuses one more,
  // reported), no expired certificate served.
  assert.equal(report.extraIssuances, report.reissuedAfterLost, report.reissuedAfterLostDetails.join('\n'));
  assert.equal(report.issuances, report.windows + 1 + report.extraIssuances);
  assert.ok(report.reissuedAfterLost > 0 || report.issuancesPerWindowMax === 1, `${report.issuancesPerWindowMax} issuances in one window`);
  assert.equal(report.expiredServed, 0);
  assert.ok(report.windows >= 2, `only ${report.windows} renewal windows`);
  // Each member's replicas were killed and its API faulted; the home went away and a member was cut off.
  assert.ok(report.kills >= 2, `only ${report.kills} kills`);
  assert.ok((report.homeOutages ?? 0) >= 1, 'no home outage');
  assert.ok((report.homePartitions ?? 0) >= 1, 'no partition from the home');
});
