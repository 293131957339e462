// The injector's alerts and metrics, checked by Prometheus' own tools (promtool from
// test/prometheus/install.sh, as test/apiserver/monitoring does for the daemon's).
import assert from 'node:assert/strict';
import { join, resolve } from 'node:path';
import { describe, it } from 'node:test';
import { withLeaf, emptyRotationState } from '../../../src/core/injector-ca/ca-rotation.ts';
import { withCa } from '../../support/rotation-state.ts';
import { InjectorMetrics } from '../../../src/injector/injector-metrics.ts';
import { assertRulesTested, checkMetrics, ruleGroups } from '../../support/promtool.ts';
import { useTempDir } from '../../support/standalone.ts';

const HERE = import.meta.dirname;
const RULE_FILE = resolve(HERE, '../../../manifests/injector/monitoring/prometheusrule.yaml');
const RULE_TESTS = join(HERE, 'alerts.promtest.yaml');

describe('injector alerts and metrics, by promtool', () => {
  const dir = useTempDir();

  it('promtool accepts the rules, and each alert fires when it should and stays quiet otherwise', async () => {
    await assertRulesTested(RULE_FILE, RULE_TESTS, dir());
  });

  it('the alerts use only metrics the injector exports', async () => {
    const metrics = new InjectorMetrics(() => emptyRotationState([]), { defaultMetrics: false });
    const exported = new Set([...(await metrics.registry.metrics()).matchAll(/^# HELP (\S+) /gm)].map((m) => m[1]!));
    for (const rule of (await ruleGroups(RULE_FILE)).flatMap((g) => g.rules)) {
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
    assert.equal(await checkMetrics(text), '');
  });
});
