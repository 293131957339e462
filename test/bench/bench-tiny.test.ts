// `npm run bench` must never break silently again (issue 19): every phase of it (standalone, kube at rest,
// propagation, injector, --memory, --domains; and --federation, a run of its own) runs here at a tiny size
// (`--tiny`, seconds each) against a real control plane, and any phase error fails this test. Figures are only checked to exist: speed is
// what a full `npm run bench` measures, never a timed test.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';

const BENCH = fileURLToPath(new URL('../../bench/main.ts', import.meta.url));

/** The JSON line `--json` ends its stdout with. */
function lastJsonLine(stdout: string): Record<string, unknown> {
  const line = stdout.trimEnd().split('\n').at(-1) ?? '';
  assert.ok(line.startsWith('{'), `no JSON line at the end of stdout:\n${stdout.slice(-2000)}`);
  return JSON.parse(line) as Record<string, unknown>;
}

function assertFigures(where: string, object: Record<string, unknown> | undefined, keys: string[]): void {
  assert.ok(object, `${where}: missing`);
  for (const key of keys) assert.ok(Number.isFinite(object[key]), `${where}.${key}: ${JSON.stringify(object[key])}`);
}

/** Runs the bench with `args` to its end; its stdout, once it exited 0. */
async function runBench(args: string[]): Promise<string> {
  // A bench that starts a control plane: `'--tiny'` marks this file as the bench tier's (test/repo/tiers.test.ts).
  const child = spawn(process.execPath, [BENCH, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d));
  child.stderr.on('data', (d: Buffer) => (stderr += d));
  try {
    const [code] = (await once(child, 'close')) as [number | null];
    assert.equal(code, 0, `the bench failed:\n${stderr.slice(-4000)}`);
  } finally {
    if (child.exitCode === null) child.kill('SIGTERM');
  }
  return stdout;
}

describe('npm run bench -- --tiny', () => {
  it('runs every phase to its figures and exits 0', { timeout: 240_000 }, async () => {
    const stdout = await runBench(['--tiny', '--json']);
    const report = lastJsonLine(stdout);
    assertFigures('standalone', report, [
      'rssBareNodeMB',
      'rssStandaloneMB',
      'rssFastifyHelloMB',
      'startupToHealthyMs',
      'startupCpuMs',
      'startupFastifyHelloCpuMs',
      'startupFastifyHelloMs',
      'startupCpuOverFastifyMs',
      'domainToCertMs',
      'healthzRps',
      'healthzVsBareFastify',
      'healthzCpuUsPerRequest',
      'healthzCpuVsBareFastify',
      'bareFastifyTwinVsBareFastify',
    ]);
    assertFigures('advertise agent', report, ['rssAdvertiseAgentMB', 'rssNodeHttpFsMB', 'advertiseAgentStartupCpuMs', 'advertiseAgentRestCpuMsPerHour']);
    assertFigures('kube at rest', report, ['rssKubeReaderMB', 'rssKubeWriterMB', 'apiRequestsPerReplicaHour']);
    assertFigures('propagation', report, ['propagationP50Ms', 'propagationP99Ms']);
    assertFigures('injector', report, ['rssInjectorMB', 'rssInjectorPackagesMB', 'injectorAdmissionP99Ms', 'injectorCpuMsPerAdmission']);
    const details = report.details as { memory?: Record<string, Array<Record<string, unknown>>>; domains?: Record<string, unknown> };
    const memory = details.memory;
    assert.ok(memory, '--memory phase: no figures');
    for (const part of ['importChain', 'daemons', 'standaloneFlags', 'kubeReaderFlags']) {
      assert.ok((memory[part]?.length ?? 0) >= 1, `memory.${part}: none`);
      for (const [i, entry] of memory[part]!.entries())
        assertFigures(`memory.${part}[${i}]`, entry, [part === 'daemons' ? 'heapUsedMB' : 'rssMB' in entry ? 'rssMB' : 'idleMB']);
    }
    assert.deepEqual(
      memory.daemons!.map((d) => d.name),
      ['standalone', 'kube writer', 'kube reader'],
    );
    assertFigures('domains', details.domains, ['rssMaxMB', 'tcpConnsPerReplica', 'afterLastStoredMs', 'massRenewalP99Ms']);
    // Each goal judged with its floor from this run (issue 42); the table shows no verdict for --tiny.
    const goals = report.goals as Record<string, { value: number; goal: number; holds: boolean; floor: { value: number } | null }>;
    for (const key of [
      'rssKubeReaderMB',
      'rssStandaloneMB',
      'startupCpuOverFastifyMs',
      'rssInjectorMB',
      'healthzVsBareFastify',
      'propagationP99Ms',
      'rssAdvertiseAgentMB',
      'advertiseAgentRestCpuMsPerHour',
    ]) {
      assertFigures(`goals.${key}`, goals[key] as unknown as Record<string, unknown>, ['value', 'goal']);
      assert.equal(typeof goals[key]!.holds, 'boolean', `goals.${key}.holds`);
    }
    for (const [key, floor] of [
      ['rssStandaloneMB', 'rssFastifyHelloMB'],
      ['rssInjectorMB', 'rssInjectorPackagesMB'],
      ['rssAdvertiseAgentMB', 'rssNodeHttpFsMB'],
    ] as const)
      assert.equal(goals[key]!.floor!.value, report[floor], `goals.${key}: its floor is ${floor} of the same run`);
    assert.equal(goals.startupToHealthyMs, undefined, 'start-up is judged by CPU time; its wall time has no goal');
    assert.doesNotMatch(stdout, /\bMISS\b|\bPASS\b/, '--tiny gives no verdicts on the issue targets');
  });

  it('--federation: a home and a member apiserver, requests at the home and sidecar memory with a home; exits 0', { timeout: 240_000 }, async () => {
    const stdout = await runBench(['--federation', '--tiny', '--json']);
    const report = lastJsonLine(stdout);
    assertFigures('federation', report, [
      'homeRequestsPerGroupHour',
      'homeRequestsPerGroupHourNoBookmarks',
      'homeLeaseRequestsPerPeriod',
      'homeWatchesPerMember',
      'homeWatchesPerMemberGroup',
      'sidecarRssDeltaWriterMB',
      'sidecarRssDeltaReaderMB',
      'sidecarHeapDeltaWriterMB',
      'sidecarHeapDeltaReaderMB',
    ]);
    const details = report.federation as { runs: Array<{ leaseDurationS: number; perGroup: unknown[] }>; memoryPairs: unknown[] };
    assert.deepEqual(
      details.runs.map((r) => r.leaseDurationS),
      [3, 6],
      'one window at rest per --lease-durations entry',
    );
    for (const run of details.runs) assert.equal(run.perGroup.length, 1);
    assert.equal(details.memoryPairs.length, 1);
    assert.match(stdout, /^Federation home at rest: /m);
    assert.match(stdout, /^ {2}per group-hour at the default 1h lease: /m);
    assert.doesNotMatch(stdout, /\bMISS\b|\bPASS\b/, '--tiny gives no verdicts on the issue targets');
  });
});
