// Prometheus' own tools for the tests of the monitoring we ship (the daemon's in test/apiserver/monitoring, the
// injector's in test/integration/injector): promtool and prometheus from test/prometheus/install.sh (cached).
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { copyFile, readFile, writeFile } from 'node:fs/promises';
import { basename, join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { dump, load } from 'js-yaml';

const run = promisify(execFile);
const INSTALL = resolve(import.meta.dirname, '../prometheus/install.sh');

let binDir: Promise<string> | undefined;
/** The path of promtool or prometheus, installed on first use. */
export async function prometheusBin(name: 'promtool' | 'prometheus'): Promise<string> {
  binDir ??= run('bash', [INSTALL], { maxBuffer: 1 << 20 }).then((r) => r.stdout.trim());
  return join(await binDir, name);
}

/** Runs promtool; resolves with its output and exit code (stdin from `input`). */
export async function promtool(args: string[], options: { cwd?: string; input?: string } = {}): Promise<{ code: number; output: string }> {
  const bin = await prometheusBin('promtool');
  return new Promise((done) => {
    const child = execFile(bin, args, { cwd: options.cwd, maxBuffer: 16 << 20 }, (err, stdout, stderr) =>
      done({ code: err ? Number((err as { code?: number }).code ?? 1) : 0, output: `${stdout}${stderr}` }),
    );
    child.stdin?.end(options.input ?? '');
  });
}

/** `promtool check metrics` over an exposition: '' when it finds nothing, its complaints otherwise. */
export async function checkMetrics(exposition: string): Promise<string> {
  const { code, output } = await promtool(['check', 'metrics'], { input: exposition });
  return code === 0 ? '' : output.trim() || `exit ${code}`;
}

export interface Rule {
  alert?: string;
  record?: string;
  expr: string;
}
export type RuleGroup = { name: string; rules: Rule[] };

/** The rule groups of a PrometheusRule manifest. */
export async function ruleGroups(file: string): Promise<RuleGroup[]> {
  const doc = load(await readFile(file, 'utf8')) as { kind: string; spec: { groups: RuleGroup[] } };
  assert.equal(doc.kind, 'PrometheusRule', file);
  return doc.spec.groups;
}

/**
 * `promtool check rules` and `promtool test rules` over a PrometheusRule's groups (written to
 * `dir`/rules.yaml, which the tests file names), and that every alert has a case where it fires and
 * one where it stays quiet. Fails with promtool's own output.
 */
export async function assertRulesTested(ruleFile: string, testsFile: string, dir: string): Promise<void> {
  const groups = await ruleGroups(ruleFile);
  await writeFile(join(dir, 'rules.yaml'), dump({ groups }));
  await copyFile(testsFile, join(dir, basename(testsFile)));
  const checked = await promtool(['check', 'rules', 'rules.yaml'], { cwd: dir });
  assert.match(checked.output, new RegExp(`SUCCESS: ${groups.flatMap((g) => g.rules).length} rules found`), checked.output);
  const tested = await promtool(['test', 'rules', basename(testsFile)], { cwd: dir });
  assert.equal(tested.code, 0, tested.output);

  const tests = load(await readFile(testsFile, 'utf8')) as { tests: Array<{ alert_rule_test: Array<{ alertname: string; exp_alerts: unknown[] }> }> };
  const cases = tests.tests.flatMap((t) => t.alert_rule_test);
  for (const rule of groups.flatMap((g) => g.rules)) {
    if (!rule.alert) continue;
    const mine = cases.filter((c) => c.alertname === rule.alert);
    assert.ok(
      mine.some((c) => c.exp_alerts.length > 0),
      `${rule.alert} has no case where it fires`,
    );
    assert.ok(
      mine.some((c) => c.exp_alerts.length === 0),
      `${rule.alert} has no case where it stays quiet`,
    );
  }
}
