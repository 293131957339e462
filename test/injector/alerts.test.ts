// The injector's alerts and metrics, checked by Prometheus' own tools (promtool from
// test/prometheus/install.sh, as test/monitoring does for the daemon's).
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { copyFile, readFile, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { before, describe, it } from 'node:test';
import { promisify } from 'node:util';
import { dump, load } from 'js-yaml';
import { withCa, withLeaf, emptyRotationState } from '../../src/core/ca-rotation.ts';
import { InjectorMetrics } from '../../src/injector/metrics.ts';
import { useTempDir } from '../support/standalone.ts';

const run = promisify(execFile);
const HERE = import.meta.dirname;
const RULE_FILE = resolve(HERE, '../../manifests/injector/monitoring/prometheusrule.yaml');
const RULE_TESTS = join(HERE, 'alerts.promtest.yaml');

interface Rule {
  alert?: string;
  expr: string;
}

async function promtool(args: string[], options: { cwd?: string; input?: string } = {}): Promise<string> {
  const bin = join((await run('bash', [resolve(HERE, '../prometheus/install.sh')], { maxBuffer: 1 << 20 })).stdout.trim(), 'promtool');
  return new Promise((resolveRun) => {
    const child = execFile(bin, args, { cwd: options.cwd, maxBuffer: 16 << 20 }, (err, stdout, stderr) => resolveRun(`${err ? `exit ${err.code}\n` : ''}${stdout}${stderr}`));
    child.stdin?.end(options.input ?? '');
  });
}

describe('injector alerts and metrics, by promtool', () => {
  const dir = useTempDir();
  let groups: { name: string; rules: Rule[] }[];

  before(async () => {
    groups = (load(await readFile(RULE_FILE, 'utf8')) as { spec: { groups: typeof groups } }).spec.groups;
    await writeFile(join(dir(), 'rules.yaml'), dump({ groups }));
    await copyFile(RULE_TESTS, join(dir(), 'alerts.promtest.yaml'));
  });

  it('promtool accepts the rules, and each alert fires when it should and stays quiet otherwise', async () => {
    assert.match(await promtool(['check', 'rules', 'rules.yaml'], { cwd: dir() }), new RegExp(`SUCCESS: ${groups.flatMap((g) => g.rules).length} rules found`));
    const out = await promtool(['test', 'rules', 'alerts.promtest.yaml'], { cwd: dir() });
    assert.match(out, /SUCCESS/, out);
  });

  it('every alert has a firing case and a quiet case, and uses only metrics the injector exports', async () => {
    const tests = load(await readFile(RULE_TESTS, 'utf8')) as { tests: { alert_rule_test: { alertname: string; exp_alerts: unknown[] }[] }[] };
    const cases = tests.tests.flatMap((t) => t.alert_rule_test);
    const metrics = new InjectorMetrics(() => emptyRotationState([]), { defaultMetrics: false });
    const exported = new Set([...(await metrics.registry.metrics()).matchAll(/^# HELP (\S+) /gm)].map((m) => m[1]!));
    for (const rule of groups.flatMap((g) => g.rules)) {
      const mine = cases.filter((c) => c.alertname === rule.alert);
      assert.ok(mine.some((c) => c.exp_alerts.length > 0), `${rule.alert} has no case where it fires`);
      assert.ok(mine.some((c) => c.exp_alerts.length === 0), `${rule.alert} has no case where it stays quiet`);
      for (const [name] of rule.expr.matchAll(/\bcertshare_[a-z_]+/g)) assert.ok(exported.has(name), `${rule.alert}: ${name} is not exported`);
    }
  });

  it('promtool check metrics finds no naming or type problem in /metrics', async () => {
    let state = withCa(emptyRotationState(['mwc']), { id: '0A', notBefore: 0, notAfter: 2_000_000_000_000 });
    state = withLeaf(state, { serial: '0B', signedBy: '0A', notBefore: 0, notAfter: 1_900_000_000_000 });
    const metrics = new InjectorMetrics(() => state);
    metrics.admission('injected');
    metrics.step({ kind: 'retire-ca', reason: '', caId: '0A' });
    const text = await metrics.registry.metrics();
    assert.match(text, /^certshare_injector_ca_expiration_timestamp_seconds\{serial="0A"\} 2000000000$/m);
    assert.match(text, /^certshare_injector_leaf_expiration_timestamp_seconds 1900000000$/m);
    assert.equal(await promtool(['check', 'metrics'], { input: text }), '');
  });
});
