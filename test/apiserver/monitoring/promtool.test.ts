// The monitoring we ship, checked by Prometheus' own tools rather than by metric names alone:
// - `promtool check rules` and `promtool test rules` (test/apiserver/monitoring/alerts.promtest.yaml) over the
//   daemon's PrometheusRule (the injector's: test/integration/injector/alerts.test.ts): every alert fires when it
//   should, with its labels and annotations, and stays quiet when it should;
// - `promtool check metrics` over a live /metrics of the daemon, standalone and as writer and reader;
// - a real Prometheus server scraping a writer and two readers: every alert expression of the daemon's
//   evaluates without error, and every certshare series it selects exists with the labels it groups
//   by; so do the queries of the Grafana dashboard (manifests/monitoring/dashboard.json).
// promtool and prometheus: test/support/promtool.ts.
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { readFile, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { dump } from 'js-yaml';
import { useControlPlane } from '../../harness/use-control-plane.ts';
import { GROUP, KUBE_DOMAIN, exampleNamespace, filesWritten, startReplica, startReplicas, type Replica } from '../../support/kube.ts';
import { deathSignalPrefix, freePort } from '../../support/processes.ts';
import { emulatorIn, standaloneDaemon, tempDir, useTempDir } from '../../support/standalone.ts';
import { assertRulesTested, checkMetrics, prometheusBin, ruleGroups } from '../../support/promtool.ts';
import { until } from '../../support/wait.ts';

const HERE = import.meta.dirname;
const DAEMON_RULES = resolve(HERE, '../../../manifests/monitoring/prometheusrule.yaml');
const RULE_TESTS = join(HERE, 'alerts.promtest.yaml');
const DASHBOARD = resolve(HERE, '../../../manifests/monitoring/dashboard.json');

const metricsOf = async (address: string): Promise<string> => (await fetch(`${address}/metrics`)).text();

describe('alert rules, by promtool', () => {
  const dir = useTempDir();

  it('promtool check rules accepts every rule; promtool test rules: each alert fires when due, with labels and annotations, quiet otherwise', async () => {
    await assertRulesTested(DAEMON_RULES, RULE_TESTS, dir());
  });
});

describe('/metrics, by promtool check metrics', () => {
  it('standalone: no naming or type problem', async () => {
    const dir = await tempDir();
    const emulator = await emulatorIn(dir.path);
    const daemon = await standaloneDaemon(emulator, join(dir.path, 'certs'));
    try {
      await until('healthy', () => daemon.health.evaluate(Date.now()).healthy, [(l) => daemon.health.onChange(l)]);
      const text = await metricsOf(daemon.address);
      assert.match(text, /^certshare_certificate_expiration_timestamp_seconds\{/m);
      assert.equal(await checkMetrics(text), '');
    } finally {
      await daemon.stop();
      await emulator.close();
      await dir.remove();
    }
  });
});

describe('a real Prometheus scraping a writer and two readers', () => {
  const cp = useControlPlane();
  const dir = useTempDir();
  let replicas: Replica[] = [];
  let prometheus: ChildProcess | undefined;
  let prometheusUrl = '';

  before(
    async () => {
      const ns = await exampleNamespace(cp());
      // The writer checks what a proxy serves at a port where nothing listens: the served-check series exist
      // (outcome unknown) for the alerts that select them.
      const servedFlags = ['--served-check', `127.0.0.1:${await freePort()}`, '--served-check-interval', '1s'];
      replicas = [await startReplica(cp(), ns, dir(), 'proxy-0', { mode: 'rw', flags: servedFlags })];
      replicas.push(...(await startReplicas(cp(), ns, dir(), ['proxy-1', 'proxy-2'], { mode: 'ro' })));
      // The labels the PodMonitor adds (namespace, pod, group), as static target labels.
      const config = {
        global: { scrape_interval: '1s', evaluation_interval: '1s' },
        scrape_configs: [
          {
            job_name: 'certshare',
            static_configs: replicas.map((r) => ({ targets: [new URL(r.daemon.address).host], labels: { namespace: ns, pod: r.name, group: GROUP } })),
          },
        ],
      };
      await writeFile(join(dir(), 'prometheus.yml'), dump(config));
      const port = await freePort();
      prometheusUrl = `http://127.0.0.1:${port}`;
      const [cmd, ...prefix] = [...deathSignalPrefix(), await prometheusBin('prometheus')];
      prometheus = spawn(
        cmd!,
        [...prefix, `--config.file=${join(dir(), 'prometheus.yml')}`, `--storage.tsdb.path=${join(dir(), 'tsdb')}`, `--web.listen-address=127.0.0.1:${port}`],
        { stdio: 'ignore' },
      );
    },
    { timeout: 120_000 },
  );

  after(async () => {
    if (prometheus && prometheus.exitCode === null) {
      prometheus.kill('SIGTERM');
      await once(prometheus, 'exit');
    }
    await Promise.all(replicas.map((r) => r.stop()));
  });

  async function query(expr: string): Promise<Array<{ metric: Record<string, string> }>> {
    const res = await fetch(`${prometheusUrl}/api/v1/query?query=${encodeURIComponent(expr)}`);
    const body = (await res.json()) as { status: string; error?: string; data?: { result: Array<{ metric: Record<string, string> }> } };
    assert.equal(body.status, 'success', `${expr}: ${body.error}`);
    return body.data!.result;
  }

  /** Prometheus is an outside process: poll its query API until the condition holds (bounded). */
  async function eventually(what: string, check: () => Promise<boolean>, timeoutMs = 60_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      if (await check().catch(() => false)) return;
      if (Date.now() > deadline) assert.fail(`Prometheus: ${what} within ${timeoutMs} ms`);
      await new Promise((r) => setTimeout(r, 250));
    }
  }

  it('the replicas pass promtool check metrics (writer and reader)', async () => {
    await until(
      'every replica holds the certificate',
      () => replicas.every((r) => r.daemon.manager.loop(KUBE_DOMAIN)?.current !== undefined),
      replicas.map(filesWritten),
      30_000,
    );
    for (const r of replicas) {
      const text = await metricsOf(r.daemon.address);
      assert.match(text, /^certshare_writer /m, r.name);
      assert.equal(await checkMetrics(text), '', r.name);
    }
  });

  it('every alert expression evaluates, and every certshare series it selects exists with the labels it groups by', async () => {
    await eventually(
      'all three targets up with the certificate scraped',
      async () =>
        (await query(`certshare_certificate_expiration_timestamp_seconds{domain="${KUBE_DOMAIN}"}`)).length === 3 && (await query('up == 1')).length === 3,
    );
    const rules = (await ruleGroups(DAEMON_RULES)).flatMap((g) => g.rules);
    for (const rule of rules) {
      await query(rule.expr);
      const names = new Set([...rule.expr.matchAll(/\bcertshare_[a-z_]+/g)].map((m) => m[0]));
      const grouping = new Set([...rule.expr.matchAll(/\b(?:by|on|without)\s*\(([^)]*)\)/g)].flatMap((m) => m[1]!.split(',').map((l) => l.trim())));
      for (const name of names) {
        // A rate limit may not have happened: its series exists only after one. The rest must be there.
        const series = await query(name);
        if (name === 'certshare_issuance_attempts_total') assert.ok(series.length > 0 || /result="rate_limited"/.test(rule.expr), `${rule.alert}: no ${name}`);
        else assert.ok(series.length > 0, `${rule.alert}: ${name} has no series in Prometheus`);
        for (const s of series)
          for (const label of grouping)
            if (label !== 'instance' && label !== '') assert.ok(label in s.metric, `${rule.alert}: ${name} lacks label ${label}: ${JSON.stringify(s.metric)}`);
      }
    }
    // One writer in the group: the no-writer expression is empty, as it should be.
    assert.deepEqual(await query('max without (pod, instance) (certshare_writer) == 0'), []);
  });

  it('every query of the Grafana dashboard evaluates and returns series (bar counters that exist only after an event)', async () => {
    await eventually('two scrapes of every target', async () => (await query('count_over_time(up[1m]) >= 2')).length === 3);
    const dashboard = JSON.parse(await readFile(DASHBOARD, 'utf8')) as { panels: Array<{ title: string; targets: Array<{ expr: string }> }> };
    assert.ok(dashboard.panels.length >= 10);
    // Grafana's variables, as Grafana would substitute them ($namespace is multi-value with "All" = .+).
    const grafana = (expr: string): string => expr.replaceAll('$__rate_interval', '1m').replaceAll('$namespace', '.+');
    for (const panel of dashboard.panels) {
      assert.ok(panel.targets.length > 0, panel.title);
      for (const { expr } of panel.targets) {
        const series = await query(grafana(expr));
        if (/certshare_store_errors_total|result="rate_limited"/.test(expr)) continue;
        assert.ok(series.length > 0, `${panel.title}: ${expr} returns no series`);
      }
    }
  });
});
