// The injector against the real kube-apiserver: the apiserver calls the webhook over TLS (clientConfig.url
// on 127.0.0.1), trusting only the caBundle the injector itself keeps in the MutatingWebhookConfiguration.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node/dist/gen/models/V1Pod.js';
import { parseFlags } from '../../src/cli/flags.ts';
import { silentLogger } from '../../src/core/logger.ts';
import { INJECTOR_FLAGS, injectorConfigFrom, startInjector, type Injector } from '../../src/injector/command.ts';
import { ANNOTATION } from '../../src/injector/mutate.ts';
import { bundleSerials } from '../../src/injector/targets.ts';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { must } from '../support/kube.ts';
import { freePort } from '../support/processes.ts';
import { onEvent, until } from '../support/wait.ts';

const cp = useControlPlane();
const WEBHOOK = 'inject.certshare.io';

function webhookConfiguration(name: string, port: number, ns: string) {
  return {
    apiVersion: 'admissionregistration.k8s.io/v1',
    kind: 'MutatingWebhookConfiguration',
    metadata: { name },
    webhooks: [
      {
        name: WEBHOOK,
        // No caBundle: the injector writes it.
        clientConfig: { url: `https://127.0.0.1:${port}/mutate` },
        rules: [{ apiGroups: [''], apiVersions: ['v1'], operations: ['CREATE'], resources: ['pods'] }],
        namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': ns } },
        failurePolicy: 'Fail',
        sideEffects: 'None',
        admissionReviewVersions: ['v1'],
        reinvocationPolicy: 'IfNeeded',
        timeoutSeconds: 10,
      },
    ],
  };
}

function podBody(name: string, annotations?: Record<string, string>): V1Pod {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name, ...(annotations ? { annotations } : {}) },
    spec: {
      containers: [{ name: 'proxy', image: 'nginx', volumeMounts: [{ name: 'tailscale-socket', mountPath: '/var/run/tailscale' }] }],
      volumes: [{ name: 'tailscale-socket', emptyDir: {} }],
    },
  };
}

const asked = { [ANNOTATION.inject]: 'true', [ANNOTATION.domains]: 'proxy.tailnet-0000.ts.net' };

/** Counters of the apiserver's own webhook metrics for our webhook: calls by HTTP code and rejections by error type. */
async function webhookMetrics(): Promise<{ calls: Record<string, number>; rejections: Record<string, number> }> {
  const text = await cp().metrics();
  const calls: Record<string, number> = {};
  const rejections: Record<string, number> = {};
  for (const line of text.split('\n')) {
    if (!line.includes(`name="${WEBHOOK}"`)) continue;
    const value = Number(line.slice(line.lastIndexOf(' ') + 1));
    if (line.startsWith('apiserver_admission_webhook_request_total{')) {
      const code = /code="(\d+)"/.exec(line)?.[1] ?? '?';
      const rejected = /rejected="(\w+)"/.exec(line)?.[1] ?? '?';
      calls[`${code}/${rejected}`] = (calls[`${code}/${rejected}`] ?? 0) + value;
    } else if (line.startsWith('apiserver_admission_webhook_rejection_count{')) {
      const type = /error_type="([^"]+)"/.exec(line)?.[1] ?? '?';
      rejections[type] = (rejections[type] ?? 0) + value;
    }
  }
  return { calls, rejections };
}

describe('injector against the real apiserver', () => {
  let ns: string;
  let injector: Injector;
  let configName: string;

  before(async () => {
    ns = `inj-${process.pid}`;
    configName = `certshare-injector-${process.pid}`;
    await must(cp().kubectl(['create', 'namespace', ns]));
    const port = await freePort();
    await must(cp().kubectl(['apply', '-f', '-'], { input: JSON.stringify(webhookConfiguration(configName, port, ns)) }));
    const values = parseFlags(
      INJECTOR_FLAGS,
      [
        '--listen', `127.0.0.1:${port}`,
        '--extra-san', '127.0.0.1',
        '--inject-ca-into', `mutatingwebhookconfiguration/${configName}`,
        // Rotation in seconds: a new CA every 6 s, a new leaf every 2 s, 1 s for the apiserver to see a new bundle.
        '--ca-lifetime', '12s', '--ca-rotate-before', '6s',
        '--leaf-lifetime', '4s', '--leaf-renew-before', '2s',
        '--propagation-grace', '1s', '--resync', '1s',
      ],
      {},
    );
    const env = { KUBECONFIG: cp().adminKubeconfigPath, POD_NAMESPACE: ns };
    const logger = process.env.CERTSHARE_TEST_LOG ? (await import('../../src/cli/logger.ts')).createLogger(process.env.CERTSHARE_TEST_LOG, 'injector') : silentLogger;
    injector = await startInjector(injectorConfigFrom(values, env), { logger, env });
    await until('the injector serves a leaf', () => injector.server.serial !== undefined, [onEvent(injector.controller, 'served')], 30_000);
  });

  after(async () => {
    await injector?.stop();
    await cp().kubectl(['delete', 'mutatingwebhookconfiguration', configName, '--ignore-not-found']);
  });

  async function createPod(body: V1Pod): Promise<{ status: number; body: string }> {
    const res = await cp().adminRequest('POST', `/api/v1/namespaces/${ns}/pods`, { body, timeoutMs: 20_000 });
    return { status: res.status, body: res.body };
  }

  /** Serials of the CAs in the stored configuration's caBundle. */
  async function storedBundle(): Promise<string[]> {
    const res = await cp().adminRequest('GET', `/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/${configName}`);
    return bundleSerials(Buffer.from(JSON.parse(res.body).webhooks[0].clientConfig.caBundle ?? '', 'base64').toString());
  }

  it('keeps its CA in the webhook configuration and serves a leaf signed by it', async () => {
    assert.ok((await storedBundle()).includes(injector.controller.state.leaf!.signedBy));
  });

  it('injects an annotated Pod, leaves others untouched, rejects a bad annotation with its message', async () => {
    const injected = await createPod(podBody('annotated', asked));
    assert.equal(injected.status, 201, injected.body);
    const stored = JSON.parse(injected.body) as V1Pod;
    const sidecar = stored.spec!.initContainers?.find((c) => c.name === 'certshare');
    assert.equal(sidecar?.restartPolicy, 'Always');
    assert.equal(stored.spec!.automountServiceAccountToken, false);
    assert.deepEqual(stored.spec!.readinessGates, [{ conditionType: 'certshare.io/certificates' }]);

    const plain = await createPod(podBody('plain'));
    assert.equal(plain.status, 201, plain.body);
    const plainStored = JSON.parse(plain.body) as V1Pod;
    assert.equal(plainStored.spec!.initContainers, undefined);
    assert.deepEqual(plainStored.spec!.volumes, podBody('plain').spec!.volumes);

    const bad = await createPod(podBody('bad-mode', { ...asked, [ANNOTATION.mode]: 'writer' }));
    assert.equal(bad.status, 400, bad.body);
    assert.match(JSON.parse(bad.body).message, /certshare\.io\/mode: "writer" is not rw, ro or auto/);
  });

  it('rotates CA and leaf several times while Pods are created continuously: zero admission failures', { timeout: 180_000 }, async () => {
    const controller = injector.controller;
    const start = { ...controller.counts };
    const metricsBefore = await webhookMetrics();
    const failures: string[] = [];
    let created = 0;
    let stop = false;
    const creator = async (worker: number) => {
      for (let i = 0; !stop; i++) {
        const res = await createPod(podBody(`load-${worker}-${i}`, asked));
        if (res.status !== 201) failures.push(`${res.status} ${res.body.slice(0, 300)}`);
        else if (!(JSON.parse(res.body) as V1Pod).spec!.initContainers?.some((c) => c.name === 'certshare')) failures.push(`load-${worker}-${i} stored without the sidecar`);
        else created++;
      }
    };
    // Each leaf, the moment it is served, must be signed by a CA the stored configuration already carries.
    const checks: Promise<void>[] = [];
    const onServed = (serial: string) => {
      const signer = controller.state.leaf?.serial === serial ? controller.state.leaf.signedBy : undefined;
      checks.push(
        storedBundle().then((serials) => {
          if (!signer || !serials.includes(signer)) failures.push(`leaf ${serial} served while the configuration carries ${serials.join(',')} (signer ${signer})`);
        }),
      );
    };
    controller.on('served', onServed);
    const workers = [creator(0), creator(1)];
    try {
      // Three CAs after the first, each retiring its predecessor after that one's last leaf expired.
      await until(
        'three CA rotations with their retirements',
        () => controller.counts['create-ca'] - start['create-ca'] >= 3 && controller.counts['retire-ca'] - start['retire-ca'] >= 2,
        [onEvent(controller, 'action')],
        120_000,
      );
    } finally {
      stop = true;
      controller.off('served', onServed);
      await Promise.all([...workers, ...checks]);
    }
    const metricsAfter = await webhookMetrics();
    const rotations = {
      cas: controller.counts['create-ca'] - start['create-ca'],
      leaves: controller.counts['issue-leaf'] - start['issue-leaf'],
      retired: controller.counts['retire-ca'] - start['retire-ca'],
      created,
    };
    console.log(`injector rotation run: ${JSON.stringify(rotations)}; apiserver webhook calls ${JSON.stringify(metricsAfter.calls)}, rejections ${JSON.stringify(metricsAfter.rejections)}`);
    assert.deepEqual(failures, []);
    assert.ok(created >= 10, `only ${created} Pods created`);
    assert.ok(rotations.leaves >= 3);
    // The apiserver's own account: no call failed (calling_webhook_error) during the run.
    const newErrors = (metricsAfter.rejections.calling_webhook_error ?? 0) - (metricsBefore.rejections.calling_webhook_error ?? 0);
    assert.equal(newErrors, 0, `apiserver counted ${newErrors} failed webhook calls`);
  });
});
