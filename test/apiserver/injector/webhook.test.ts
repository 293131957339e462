// The injector against the real kube-apiserver: the apiserver calls the webhook over TLS (clientConfig.url
// on 127.0.0.1), trusting only the caBundle the injector itself keeps in the MutatingWebhookConfiguration.
import assert from 'node:assert/strict';
import { X509Certificate } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { after, before, describe, it } from 'node:test';
import type { V1Pod } from '../../../src/kube/transport/client-node.ts';
import { parseFlags } from '../../../src/flags/flags.ts';
import { silentLogger } from '../../../src/core/ports/logger.ts';
import { startInjector, type Injector } from '../../../src/injector/injector.ts';
import { INJECTOR_FLAGS, injectorConfigFrom } from '../../../src/config/injector-options.ts';
import { ANNOTATION } from '../../../src/injector/mutate.ts';
import { useControlPlane } from '../../harness/use-control-plane.ts';
import { dryRunWebhookUpdate, must, refusedWebhookUpdate, secretSatisfies, type SecretObject } from '../../support/kube.ts';
import { DAY, makePair } from '../../support/certs.ts';
import { bucketIncrease, histogramQuantile } from '../../support/histogram.ts';
import { freePort } from '../../support/processes.ts';
import { useTempDir } from '../../support/standalone.ts';
import { get, writePair } from '../../support/tls.ts';
import { nextEvent, onEvent, until } from '../../support/wait.ts';
import { examplePod, examplePodSpecBefore, injectedParts } from '../../support/injector-example.ts';
import { ASKED, installInjector, proxyPod } from '../../support/injector-webhook.ts';
import { startRelay, type Relay } from '../../support/relay.ts';
import { injectorReplicaFlags } from '../../support/replica-flags.ts';

/** Serials (upper-case hex) of the certificates in a PEM bundle. */
function bundleSerials(pem: string): string[] {
  const blocks = pem.match(/-----BEGIN CERTIFICATE-----[\s\S]*?-----END CERTIFICATE-----/g) ?? [];
  return blocks.map((block) => new X509Certificate(block).serialNumber.toUpperCase());
}

const cp = useControlPlane();
const WEBHOOK = 'inject.certshare.io';
const CONFIG = 'certshare-injector';
const INJECTOR_NS = 'certshare';
const MANIFESTS = fileURLToPath(new URL('../../../manifests/injector', import.meta.url));

/** Counters of the apiserver's own webhook metrics for our webhook: calls by HTTP code and rejections by error type. */
async function webhookMetrics(): Promise<{ calls: Record<string, number>; rejections: Record<string, number>; latency: Map<number, number> }> {
  const text = await cp().metrics();
  const calls: Record<string, number> = {};
  const rejections: Record<string, number> = {};
  /** Cumulative count of admitted calls per bucket bound (seconds), as the apiserver measured them. */
  const latency = new Map<number, number>();
  for (const line of text.split('\n')) {
    if (!line.includes(`name="${WEBHOOK}"`)) continue;
    const value = Number(line.slice(line.lastIndexOf(' ') + 1));
    if (line.startsWith('apiserver_admission_webhook_request_total{')) {
      const code = /code="(\d+)"/.exec(line)?.[1] ?? '?';
      const rejected = /rejected="(\w+)"/.exec(line)?.[1] ?? '?';
      calls[`${code}/${rejected}`] = (calls[`${code}/${rejected}`] ?? 0) + value;
    } else if (line.startsWith('apiserver_admission_webhook_admission_duration_seconds_bucket{') && line.includes('rejected="false"')) {
      const le = Number(/le="([^"]+)"/.exec(line)?.[1]);
      latency.set(le, (latency.get(le) ?? 0) + value);
    } else if (line.startsWith('apiserver_admission_webhook_rejection_count{')) {
      const type = /error_type="([^"]+)"/.exec(line)?.[1] ?? '?';
      rejections[type] = (rejections[type] ?? 0) + value;
    }
  }
  return { calls, rejections, latency };
}

/** `npm test` runs the short form; CERTSHARE_INJECTOR_SOAK_SECONDS=600 keeps rotating and creating Pods that long. */
const SOAK_MS = Number(process.env.CERTSHARE_INJECTOR_SOAK_SECONDS ?? 0) * 1000;

interface Replica {
  name: string;
  port: number;
  injector: Injector;
}

describe('injector against the real apiserver (manifests/injector RBAC, two replicas behind a relay)', () => {
  const dir = useTempDir();
  const ns = `inj-${process.pid}`;
  let relay: Relay;
  let kubeconfig: string;
  let replicas: Replica[] = [];
  /** Every replica's controller events, also of replicas since stopped. */
  const bus = new EventEmitter();
  const totals: Record<string, number> = {};
  let started = 0;

  /** `flags` after the defaults below: the last value of a flag wins. */
  async function startReplica(flags: string[] = []): Promise<Replica> {
    const name = `injector-${++started}`;
    const port = await freePort();
    const values = parseFlags(INJECTOR_FLAGS, [...injectorReplicaFlags(port), '--drain-delay', '1s', ...flags], {});
    const env = { KUBECONFIG: kubeconfig, POD_NAMESPACE: INJECTOR_NS, POD_NAME: name };
    const logger = process.env.CERTSHARE_TEST_LOG
      ? (await import('../../../src/logging/pino-logger.ts')).createLogger(process.env.CERTSHARE_TEST_LOG, name)
      : silentLogger;
    const injector = await startInjector(injectorConfigFrom(values, env), { logger, env, defaultMetrics: false });
    injector.controller.on('action', (action) => {
      totals[action.kind] = (totals[action.kind] ?? 0) + 1;
      bus.emit('action', action);
    });
    injector.controller.on('served', (serial) => bus.emit('served', { name, serial, injector }));
    return { name, port, injector };
  }

  const serving = (r: Replica) => r.injector.server.serial !== undefined;

  before(async () => {
    // The apiserver calls a relay on loopback, which spreads the calls over the replicas.
    relay = await startRelay([]);
    kubeconfig = await installInjector(cp(), `https://127.0.0.1:${relay.port}/mutate`, ns);
    replicas = [await startReplica(), await startReplica()];
    relay.setTargets(replicas.map((r) => r.port));
    await until('both replicas serve a leaf', () => replicas.every(serving), [onEvent(bus, 'served')], 30_000);
  });

  after(async () => {
    await Promise.all(replicas.map((r) => r.injector.stop()));
    await relay?.close();
    await cp().kubectl(['delete', 'mutatingwebhookconfiguration', CONFIG, '--ignore-not-found']);
  });

  async function createPod(body: V1Pod): Promise<{ status: number; body: string }> {
    const res = await cp().adminRequest('POST', `/api/v1/namespaces/${ns}/pods`, { body, timeoutMs: 20_000 });
    return { status: res.status, body: res.body };
  }

  /** Serials of the CAs in the stored configuration's caBundle. */
  async function storedBundle(): Promise<string[]> {
    const res = await cp().adminRequest('GET', `/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/${CONFIG}`);
    return bundleSerials(Buffer.from(JSON.parse(res.body).webhooks[0].clientConfig.caBundle ?? '', 'base64').toString());
  }

  it('keeps its CA in the webhook configuration and serves a leaf signed by it', async () => {
    const bundle = await storedBundle();
    for (const r of replicas) assert.ok(bundle.includes(r.injector.controller.state.leaf!.signedBy), r.name);
    const secrets = await cp().adminRequest('GET', `/api/v1/namespaces/${INJECTOR_NS}/secrets`);
    assert.deepEqual((JSON.parse(secrets.body).items as { metadata: { name: string } }[]).map((x) => x.metadata.name).sort(), [
      'certshare-injector-ca',
      'certshare-injector-tls',
    ]);
  });

  it('injects an annotated Pod, leaves others untouched, rejects a bad annotation with its message', async () => {
    const injected = await createPod(proxyPod('annotated', ASKED));
    assert.equal(injected.status, 201, injected.body);
    const stored = JSON.parse(injected.body) as V1Pod;
    const sidecar = stored.spec!.initContainers?.find((c) => c.name === 'certshare');
    assert.equal(sidecar?.restartPolicy, 'Always');
    assert.equal(stored.spec!.automountServiceAccountToken, false);
    assert.deepEqual(stored.spec!.readinessGates, [{ conditionType: 'certshare.io/certificates' }]);

    const plain = await createPod(proxyPod('plain'));
    assert.equal(plain.status, 201, plain.body);
    const plainStored = JSON.parse(plain.body) as V1Pod;
    assert.equal(plainStored.spec!.initContainers, undefined);
    assert.deepEqual(plainStored.spec!.volumes, proxyPod('plain').spec!.volumes);

    const bad = await createPod(proxyPod('bad-mode', { ...ASKED, [ANNOTATION.mode]: 'writer' }));
    assert.equal(bad.status, 400, bad.body);
    assert.match(JSON.parse(bad.body).message, /certshare\.io\/mode: "writer" is not rw, ro or auto/);

    // The replicas' own account of it, on /metrics.
    const admissions: Record<string, number> = {};
    for (const r of replicas) {
      const text = await (await fetch(`http://127.0.0.1:${r.injector.metricsPort}/metrics`)).text();
      for (const m of text.matchAll(/^certshare_injector_admissions_total\{result="(\w+)"\} (\d+)$/gm))
        admissions[m[1]!] = (admissions[m[1]!] ?? 0) + Number(m[2]);
      assert.match(text, /^certshare_injector_leaf_expiration_timestamp_seconds \d+/m);
    }
    assert.deepEqual([admissions.injected, admissions.skipped, admissions.rejected], [1, 1, 1]);
  });

  it('injects a Pod of the example StatefulSet with the sidecar, env, volumes and readiness gate the hand-written example had', async () => {
    const injected = await createPod(await examplePod('proxy-0'));
    assert.equal(injected.status, 201, injected.body);
    // The example as it was written by hand: already carrying certshare, so the webhook leaves it as it is;
    // both are defaulted by the same apiserver.
    const handWritten = await createPod({ apiVersion: 'v1', kind: 'Pod', metadata: { name: 'example-before' }, spec: await examplePodSpecBefore() });
    assert.equal(handWritten.status, 201, handWritten.body);
    const parts = (body: string) => injectedParts((JSON.parse(body) as V1Pod).spec!);
    assert.deepEqual(parts(injected.body), parts(handWritten.body));
  });

  it("does not touch Pods outside the selected namespaces, the injector's own included; a Pod's label skips nothing", async () => {
    for (const namespace of ['kube-system', INJECTOR_NS]) {
      const outside = await cp().adminRequest('POST', `/api/v1/namespaces/${namespace}/pods`, { body: proxyPod('annotated-outside', ASKED) });
      assert.equal(outside.status, 201, outside.body);
      assert.equal((JSON.parse(outside.body) as V1Pod).spec!.initContainers, undefined, namespace);
    }
    // The injector's own label, set by a Pod author in a selected namespace: injected all the same.
    const labelled = proxyPod('injector-like', ASKED);
    labelled.metadata!.labels = { 'app.kubernetes.io/name': 'certshare-injector' };
    const labelledRes = await createPod(labelled);
    assert.equal(labelledRes.status, 201, labelledRes.body);
    assert.deepEqual(
      (JSON.parse(labelledRes.body) as V1Pod).spec!.initContainers?.map((c) => c.name),
      ['certshare'],
    );
  });

  it('writes the caBundle back at once when a redeploy of the configuration wipes it', async () => {
    const restored = nextEvent<{ kind: string }>(bus, 'action', (a) => a.kind === 'publish', 10_000);
    const wipe = [{ op: 'remove', path: '/webhooks/0/clientConfig/caBundle' }];
    await must(cp().kubectl(['patch', 'mutatingwebhookconfiguration', CONFIG, '--type=json', '-p', JSON.stringify(wipe)]));
    await restored;
    const bundle = await storedBundle();
    for (const r of replicas) assert.ok(bundle.includes(r.injector.controller.state.leaf!.signedBy), r.name);
  });

  it('the opt-in NetworkPolicy (manifests/injector/network-policy) passes a server-side dry run', async () => {
    const out = await must(cp().kubectl(['apply', '-k', join(MANIFESTS, 'network-policy'), '--dry-run=server']));
    assert.match(out, /networkpolicy\.networking\.k8s\.io\/certshare-injector created \(server dry run\)/);
  });

  it("a stolen injector token changes the webhook's caBundle only: not its selectors, failure policy, rules, URL or labels", async () => {
    type Webhook = Record<string, unknown> & { clientConfig: Record<string, unknown>; rules: Array<{ resources: string[] }> };
    type Configuration = { metadata: { labels?: Record<string, string> }; webhooks: Webhook[] };
    /** A server-side dry run of an update (the verb RBAC grants it) under the injector's own token: 'allowed' or the refusal. */
    const updateAsInjector = (change: (c: Configuration) => void): Promise<string> => dryRunWebhookUpdate(cp(), kubeconfig, CONFIG, change);
    const widen = (c: Configuration) => {
      c.webhooks[0]!.namespaceSelector = {};
    };
    const refused = await refusedWebhookUpdate(cp(), kubeconfig, CONFIG, widen);
    assert.match(refused, /certshare-injector-cabundle-only.*the injector may change the webhooks' clientConfig\.caBundle only/);
    const changes: Array<[string, (c: Configuration) => void]> = [
      ['failurePolicy Ignore', (c) => (c.webhooks[0]!.failurePolicy = 'Ignore')],
      ['another URL', (c) => (c.webhooks[0]!.clientConfig.url = 'https://203.0.113.9/mutate')],
      ['every resource', (c) => (c.webhooks[0]!.rules[0]!.resources = ['*'])],
      ['an objectSelector', (c) => (c.webhooks[0]!.objectSelector = { matchLabels: { skip: 'yes' } })],
      ['a second webhook', (c) => c.webhooks.push({ ...structuredClone(c.webhooks[0]!), name: 'second.certshare.io' })],
    ];
    for (const [what, change] of changes) assert.match(await updateAsInjector(change), /caBundle only/, what);
    assert.match(await updateAsInjector((c) => (c.metadata.labels = { ...c.metadata.labels, x: 'y' })), /not labels, annotations/, 'a label');
    assert.equal(await updateAsInjector((c) => delete c.webhooks[0]!.clientConfig.caBundle), 'allowed', 'the caBundle itself');
    // The administrator (not a ServiceAccount) still changes anything.
    assert.equal(await dryRunWebhookUpdate(cp(), cp().adminKubeconfigPath, CONFIG, widen), 'allowed');
  });

  it('keeps the caBundle of a ValidatingWebhookConfiguration, a CRD conversion webhook and an APIService, and restores Secrets deleted by hand', async () => {
    const hookUrl = { url: 'https://127.0.0.1:1/validate' };
    const objects = [
      {
        apiVersion: 'admissionregistration.k8s.io/v1',
        kind: 'ValidatingWebhookConfiguration',
        metadata: { name: 'certshare-extra' },
        webhooks: [
          {
            name: 'validate.certshare.io',
            clientConfig: hookUrl,
            rules: [{ apiGroups: ['example.certshare.io'], apiVersions: ['v1'], operations: ['CREATE'], resources: ['widgets'] }],
            sideEffects: 'None',
            admissionReviewVersions: ['v1'],
            failurePolicy: 'Ignore',
          },
        ],
      },
      {
        apiVersion: 'apiextensions.k8s.io/v1',
        kind: 'CustomResourceDefinition',
        metadata: { name: 'widgets.example.certshare.io' },
        spec: {
          group: 'example.certshare.io',
          names: { plural: 'widgets', singular: 'widget', kind: 'Widget' },
          scope: 'Namespaced',
          versions: [
            { name: 'v1', served: true, storage: true, schema: { openAPIV3Schema: { type: 'object', 'x-kubernetes-preserve-unknown-fields': true } } },
          ],
          conversion: {
            strategy: 'Webhook',
            webhook: { conversionReviewVersions: ['v1'], clientConfig: { service: { name: 'certshare-injector', namespace: INJECTOR_NS, path: '/convert' } } },
          },
        },
      },
      // Another group than the CRD's: the apiserver registers a CRD's group itself, as a local APIService.
      {
        apiVersion: 'apiregistration.k8s.io/v1',
        kind: 'APIService',
        metadata: { name: 'v1.aggregated.certshare.io' },
        spec: {
          group: 'aggregated.certshare.io',
          version: 'v1',
          groupPriorityMinimum: 100,
          versionPriority: 10,
          service: { name: 'certshare-injector', namespace: INJECTOR_NS },
        },
      },
    ];
    for (const o of objects) await must(cp().kubectl(['apply', '-f', '-'], { input: JSON.stringify(o) }));
    const port = await freePort();
    const values = parseFlags(
      INJECTOR_FLAGS,
      [
        '--listen',
        `127.0.0.1:${port}`,
        '--metrics-listen',
        '127.0.0.1:0',
        '--ca-secret',
        'extra-ca',
        '--tls-secret',
        'extra-tls',
        // Its own Lease: it writes its own Secrets, beside the replicas of the other tests.
        '--lease',
        'extra',
        '--propagation-grace',
        '0s',
        '--resync',
        '1s',
        '--inject-ca-into',
        'vwc/certshare-extra',
        '--inject-ca-into',
        'crd/widgets.example.certshare.io',
        '--inject-ca-into',
        'apiservice/v1.aggregated.certshare.io',
        '--inject-ca-into',
        'vwc/certshare-later',
      ],
      {},
    );
    // Under the injector's own account, given what the README tells users to add per target (and its own
    // Secrets and Lease here): its admission policy must let it write the caBundle of every kind.
    const extraRbac = [
      {
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: 'ClusterRole',
        metadata: { name: 'certshare-injector-extra' },
        rules: [
          {
            apiGroups: ['admissionregistration.k8s.io'],
            resources: ['validatingwebhookconfigurations'],
            resourceNames: ['certshare-extra', 'certshare-later'],
            verbs: ['get', 'list', 'watch', 'update'],
          },
          {
            apiGroups: ['apiextensions.k8s.io'],
            resources: ['customresourcedefinitions'],
            resourceNames: ['widgets.example.certshare.io'],
            verbs: ['get', 'list', 'watch', 'update'],
          },
          {
            apiGroups: ['apiregistration.k8s.io'],
            resources: ['apiservices'],
            resourceNames: ['v1.aggregated.certshare.io'],
            verbs: ['get', 'list', 'watch', 'update'],
          },
        ],
      },
      {
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: 'ClusterRoleBinding',
        metadata: { name: 'certshare-injector-extra' },
        roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: 'certshare-injector-extra' },
        subjects: [{ kind: 'ServiceAccount', name: 'certshare-injector', namespace: INJECTOR_NS }],
      },
      {
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: 'Role',
        metadata: { name: 'certshare-injector-extra', namespace: INJECTOR_NS },
        rules: [
          { apiGroups: [''], resources: ['secrets'], resourceNames: ['extra-ca', 'extra-tls'], verbs: ['get', 'list', 'watch', 'update'] },
          { apiGroups: ['coordination.k8s.io'], resources: ['leases'], resourceNames: ['extra'], verbs: ['get', 'update'] },
        ],
      },
      {
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: 'RoleBinding',
        metadata: { name: 'certshare-injector-extra', namespace: INJECTOR_NS },
        roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'certshare-injector-extra' },
        subjects: [{ kind: 'ServiceAccount', name: 'certshare-injector', namespace: INJECTOR_NS }],
      },
    ];
    for (const o of extraRbac) await must(cp().kubectl(['apply', '-f', '-'], { input: JSON.stringify(o) }));
    // Other names than the defaults: the policy on the injector's creates names them too (change all three).
    const creates = await namesInCreatesPolicy({ 'extra-ca': 'Opaque', 'extra-tls': 'kubernetes.io/tls' }, ['extra']);
    const env = { KUBECONFIG: kubeconfig, POD_NAMESPACE: INJECTOR_NS };
    const logger = process.env.CERTSHARE_TEST_LOG
      ? (await import('../../../src/logging/pino-logger.ts')).createLogger(process.env.CERTSHARE_TEST_LOG, 'extra')
      : silentLogger;
    const later = { ...structuredClone(objects[0]!), metadata: { name: 'certshare-later' } };
    const extra = await startInjector(injectorConfigFrom(values, env), { logger, env, defaultMetrics: false });
    try {
      // One target does not exist yet: the injector says so and backs off (no busy loop), serving nothing.
      await nextEvent(extra.controller, 'failed', (kind: string) => kind === 'error', 10_000);
      assert.equal(extra.server.serial, undefined);
      assert.ok(extra.controller.counts.publish <= 1, `publish ${extra.controller.counts.publish} times`);
      // Created: its watch wakes the injector.
      await must(cp().kubectl(['apply', '-f', '-'], { input: JSON.stringify(later) }));
      objects.push(later);
      await until('the extra injector serves', () => extra.server.serial !== undefined, [onEvent(extra.controller, 'served')], 30_000);
      const ca = extra.controller.state.leaf!.signedBy;
      const bundles = {
        vwc: JSON.parse((await cp().adminRequest('GET', '/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/certshare-extra')).body)
          .webhooks[0].clientConfig.caBundle,
        crd: JSON.parse((await cp().adminRequest('GET', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.certshare.io')).body).spec
          .conversion.webhook.clientConfig.caBundle,
        apiService: JSON.parse((await cp().adminRequest('GET', '/apis/apiregistration.k8s.io/v1/apiservices/v1.aggregated.certshare.io')).body).spec.caBundle,
      };
      for (const [kind, b64] of Object.entries(bundles)) assert.deepEqual(bundleSerials(Buffer.from(b64 ?? '', 'base64').toString()), [ca], kind);

      // Deleted by hand: written back from the last read (same CA, same leaf), never answered with a new
      // CA that would replace the trusted one at once. Default lifetimes here: nothing rotates meanwhile.
      const leaf = extra.controller.state.leaf!.serial;
      await must(cp().kubectl(['delete', 'secret', 'extra-ca', 'extra-tls', '-n', INJECTOR_NS]));
      const pemSerials = (secret: SecretObject | undefined, key: string) => bundleSerials(Buffer.from(secret?.data?.[key] ?? '', 'base64').toString());
      await secretSatisfies(cp(), INJECTOR_NS, 'extra-ca', (secret) => pemSerials(secret, 'ca.crt').join() === ca);
      await secretSatisfies(cp(), INJECTOR_NS, 'extra-tls', (secret) => pemSerials(secret, 'tls.crt')[0] === leaf);
      assert.equal(extra.controller.counts['create-ca'], 1, 'no second CA');
      assert.equal(extra.controller.counts['issue-leaf'], 1, 'no second leaf');
    } finally {
      await extra.stop();
      for (const o of objects.reverse()) await cp().kubectl(['delete', o.kind.toLowerCase(), o.metadata.name, '--ignore-not-found']);
      for (const o of extraRbac) await cp().kubectl(['delete', '-f', '-'], { input: JSON.stringify(o) });
      await creates.restore();
    }
  });

  /**
   * Adds Secret names (with their types) and Lease names to those certshare-injector-creates-own-objects lets
   * the injector's account create, as a platform that renames them does; resolves once the apiserver admits a
   * dry-run create of the first under the injector's token. restore() puts the policy back as applied.
   */
  async function namesInCreatesPolicy(secrets: Record<string, string>, leases: string[]): Promise<{ restore(): Promise<void> }> {
    const policy = 'certshare-injector-creates-own-objects';
    type Variable = { name: string; expression: string };
    const stored = JSON.parse(await must(cp().kubectl(['get', 'validatingadmissionpolicy', policy, '-o', 'json']))) as { spec: { variables: Variable[] } };
    const original = stored.spec.variables;
    const secretTypes = { 'certshare-injector-ca': 'Opaque', 'certshare-injector-tls': 'kubernetes.io/tls', ...secrets };
    const variables = original.map((v) =>
      v.name === 'secretTypes'
        ? { ...v, expression: JSON.stringify(secretTypes) }
        : v.name === 'leases'
          ? { ...v, expression: JSON.stringify(['certshare-injector', ...leases]) }
          : v,
    );
    const set = (list: Variable[]) =>
      must(cp().kubectl(['patch', 'validatingadmissionpolicy', policy, '--type=merge', '-p', JSON.stringify({ spec: { variables: list } })]));
    await set(variables);
    const [name, type] = Object.entries(secrets)[0]!;
    const probe = JSON.stringify({
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name },
      type,
      data: type === 'kubernetes.io/tls' ? { 'tls.crt': '', 'tls.key': '' } : {},
    });
    const deadline = performance.now() + 30_000;
    while ((await cp().kubectl(['create', '-n', INJECTOR_NS, '--dry-run=server', '-f', '-'], { kubeconfig, input: probe })).code !== 0) {
      assert.ok(performance.now() < deadline, `${policy} never admitted ${name}`);
      await delay(200);
    }
    return { restore: () => set(original).then(() => {}) };
  }

  /** Creates annotated Pods one after another until `done()`; failures (refused, or stored without the sidecar) go to `failures`. */
  async function createPodsUntil(done: () => boolean, prefix: string, failures: string[]): Promise<number> {
    let created = 0;
    for (let i = 0; !done(); i++) {
      // Pacing, not synchronisation: about 20 Pods a second per worker, leaving the shared CPUs some air.
      if (i > 0) await delay(50);
      const res = await createPod(proxyPod(`${prefix}-${i}`, ASKED));
      if (res.status !== 201) failures.push(`${res.status} ${res.body.slice(0, 300)}`);
      else if (!(JSON.parse(res.body) as V1Pod).spec!.initContainers?.some((c) => c.name === 'certshare'))
        failures.push(`${prefix}-${i} stored without the sidecar`);
      else created++;
    }
    return created;
  }

  it('rotates CA and leaf several times while Pods are created continuously and replicas are replaced: zero admission failures', {
    timeout: 240_000 + SOAK_MS,
  }, async () => {
    const start = { ...totals };
    const delta = (kind: string) => (totals[kind] ?? 0) - (start[kind] ?? 0);
    const metricsBefore = await webhookMetrics();
    const failures: string[] = [];
    let created = 0;
    let stop = false;
    const creator = async (worker: number) => {
      created += await createPodsUntil(() => stop, `load-${worker}`, failures);
    };
    // Each leaf, the moment a replica serves it, must be signed by a CA the stored configuration already carries.
    const checks: Promise<void>[] = [];
    const onServed = ({ name, serial, injector }: { name: string; serial: string; injector: Injector }) => {
      const leaf = injector.controller.state.leaf;
      const signer = leaf?.serial === serial ? leaf.signedBy : undefined;
      checks.push(
        storedBundle().then((serials) => {
          if (!signer || !serials.includes(signer))
            failures.push(`${name} served leaf ${serial} while the configuration carries ${serials.join(',')} (signer ${signer})`);
        }),
      );
    };
    bus.on('served', onServed);
    // At each new CA, the oldest replica goes (out of the relay first, as an endpoint is removed before
    // SIGTERM; then a graceful stop) and a fresh one takes its place.
    let replaced = 0;
    let replacing = Promise.resolve();
    const onAction = (action: { kind: string }) => {
      if (action.kind !== 'create-ca') return;
      replacing = replacing.then(async () => {
        const [oldest, ...rest] = replicas;
        relay.setTargets(rest.map((r) => r.port));
        await oldest!.injector.stop();
        const fresh = await startReplica();
        await until(`${fresh.name} serves`, () => serving(fresh), [onEvent(bus, 'served')], 30_000);
        replicas = [...rest, fresh];
        relay.setTargets(replicas.map((r) => r.port));
        replaced++;
      });
    };
    bus.on('action', onAction);
    const workers = [creator(0), creator(1)];
    try {
      // Three CAs after the first, each retiring its predecessor after that one's last leaf expired.
      const began = Date.now();
      const ticker = setInterval(() => bus.emit('tick'), 1000);
      try {
        await until(
          'three CA rotations with their retirements (and the soak time)',
          () => delta('create-ca') >= 3 && delta('retire-ca') >= 2 && Date.now() - began >= SOAK_MS,
          [onEvent(bus, 'action'), onEvent(bus, 'tick')],
          180_000 + SOAK_MS,
        );
      } finally {
        clearInterval(ticker);
      }
    } finally {
      stop = true;
      bus.off('served', onServed);
      bus.off('action', onAction);
      await Promise.all([...workers, ...checks, replacing]);
    }
    const metricsAfter = await webhookMetrics();
    const run = {
      cas: delta('create-ca'),
      leaves: delta('issue-leaf'),
      retired: delta('retire-ca'),
      publishes: delta('publish'),
      replicasReplaced: replaced,
      podsCreated: created,
      admissionP50ms: Math.round(histogramQuantile(0.5, bucketIncrease(metricsBefore.latency, metricsAfter.latency)) * 10_000) / 10,
      admissionP99ms: Math.round(histogramQuantile(0.99, bucketIncrease(metricsBefore.latency, metricsAfter.latency)) * 10_000) / 10,
    };
    console.log(
      `injector rotation run: ${JSON.stringify(run)}; ` +
        `apiserver webhook calls ${JSON.stringify(metricsAfter.calls)}, rejections ${JSON.stringify(metricsAfter.rejections)}`,
    );
    assert.deepEqual(failures, []);
    assert.ok(created >= 10, `only ${created} Pods created`);
    assert.ok(run.leaves >= 3 && replaced >= 2, JSON.stringify(run));
    // The apiserver's own account: no call failed (calling_webhook_error) during the run.
    const newErrors = (metricsAfter.rejections.calling_webhook_error ?? 0) - (metricsBefore.rejections.calling_webhook_error ?? 0);
    assert.equal(newErrors, 0, `apiserver counted ${newErrors} failed webhook calls`);
  });

  it('recovers from the CA Secret deleted while every replica was down: its CA stays trusted until its last leaf expired, zero admission failures', {
    timeout: 120_000,
  }, async () => {
    // Leaves that outlive a restart (15 s, renewed 5 s ahead), under a 60 s CA: first settle on those.
    const slow = ['--leaf-lifetime', '15s', '--leaf-renew-before', '5s', '--ca-lifetime', '60s', '--ca-rotate-before', '20s'];
    const restart = async () => {
      relay.setTargets([]);
      await Promise.all(replicas.map((r) => r.injector.stop()));
    };
    const settled = () =>
      replicas.every(({ injector: { controller } }) => {
        const { bundle, leaf } = controller.state;
        return bundle.length === 1 && leaf?.signedBy === bundle[0]!.id && leaf.notAfter - Date.now() > 8000;
      }) && replicas.every(serving);
    await restart();
    replicas = [await startReplica(slow), await startReplica(slow)];
    relay.setTargets(replicas.map((r) => r.port));
    await until('one 60 s CA and a 15 s leaf signed by it', settled, [onEvent(bus, 'action'), onEvent(bus, 'served')], 60_000);
    const oldBundle = await storedBundle();

    // Every replica down, and the CA Secret deleted meanwhile: no replica can restore it from memory.
    await restart();
    await must(cp().kubectl(['delete', 'secret', 'certshare-injector-ca', '-n', INJECTOR_NS]));
    const start = { ...totals };
    const delta = (kind: string) => (totals[kind] ?? 0) - (start[kind] ?? 0);
    replicas = [await startReplica(slow), await startReplica(slow)];
    await until('the new replicas serve the stored leaf', () => replicas.every(serving), [onEvent(bus, 'served')], 30_000);
    relay.setTargets(replicas.map((r) => r.port));
    const failures: string[] = [];
    let done = false;
    // Every bundle the configuration carries on the way keeps the old CAs until a leaf of the new one is served.
    const workers = [createPodsUntil(() => done, 'recovery-0', failures), createPodsUntil(() => done, 'recovery-1', failures)];
    try {
      await until(
        'a new CA signs the served leaf and the old CAs left the bundle',
        () =>
          delta('create-ca') >= 1 &&
          delta('issue-leaf') >= 1 &&
          replicas.every(({ injector: { controller } }) => {
            const { bundle, leaf } = controller.state;
            return leaf !== undefined && !oldBundle.includes(leaf.signedBy) && !bundle.some((ca) => oldBundle.includes(ca.id));
          }),
        [onEvent(bus, 'action'), onEvent(bus, 'served')],
        45_000,
      );
    } finally {
      done = true;
    }
    const created = (await Promise.all(workers)).reduce((a, b) => a + b, 0);
    const bundle = await storedBundle();
    assert.deepEqual(failures, []);
    assert.ok(created >= 10, `only ${created} Pods created`);
    assert.ok(!bundle.some((ca) => oldBundle.includes(ca)), `old CAs ${oldBundle.join(',')} still in ${bundle.join(',')}`);
    for (const r of replicas) assert.ok(bundle.includes(r.injector.controller.state.leaf!.signedBy), r.name);
  });

  it('serves /metrics over HTTPS with --metrics-tls, a renewed pair from the next handshake on, and refuses an unreadable pair at start', async () => {
    const tlsDir = join(dir(), 'metrics-tls');
    await mkdir(tlsDir);
    const first = await writePair(tlsDir, await makePair('localhost', Date.now() - 60_000, DAY));
    await assert.rejects(startReplica(['--metrics-tls', `dir:${join(dir(), 'missing')}`]), {
      code: 'CERTSHARE_BAD_CONFIG',
      message: /^--metrics-tls dir:.*cannot read tls\.crt and tls\.key/,
    });
    const r = await startReplica(['--metrics-tls', `dir:${tlsDir}`]);
    try {
      const url = `https://127.0.0.1:${r.injector.metricsPort}/metrics`;
      const before = await get(url, false);
      assert.deepEqual([before.status, before.serial], [200, first]);
      const served = nextEvent<{ serial: string }>(r.injector.events, 'metricsTlsServed', () => true, 10_000);
      const second = await writePair(tlsDir, await makePair('localhost', Date.now() - 60_000, DAY));
      assert.equal((await served).serial, second);
      const after = await get(url, false);
      assert.deepEqual([after.status, after.serial], [200, second]);
    } finally {
      await r.injector.stop();
    }
  });
});
