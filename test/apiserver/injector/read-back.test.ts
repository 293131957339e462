// What the injector reads back from its own Secrets, which its account (a stolen token) may write: only a serving
// pair signed by a CA of its bundle is served, only certificates that are CAs join the bundle, and nothing that
// does not parse stops a replica. Real tokens against the real apiserver, which calls the webhook through a relay.
import assert from 'node:assert/strict';
import { X509Certificate } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { after, before, describe, it } from 'node:test';
import type { V1Secret } from '../../../src/kube/transport/client-node.ts';
import { parseFlags } from '../../../src/flags/flags.ts';
import { silentLogger } from '../../../src/core/ports/logger.ts';
import { startInjector, type Injector } from '../../../src/injector/injector.ts';
import { createInjectorCa, issueServingLeaf, loadInjectorCa } from '../../../src/injector/pki.ts';
import { MAX_BUNDLE_CAS } from '../../../src/core/injector-ca/ca-rotation.ts';
import { INJECTOR_FLAGS, injectorConfigFrom } from '../../../src/config/injector-options.ts';
import { useControlPlane } from '../../harness/use-control-plane.ts';
import { DAY, makePair, selfSignedPair } from '../../support/certs.ts';
import { freePort } from '../../support/processes.ts';
import { startRelay, type Relay } from '../../support/relay.ts';
import { injectorLoopbackFlags } from '../../support/replica-flags.ts';
import { asAccount } from '../../support/token-request.ts';
import { ASKED, installInjector, proxyPod } from '../../support/injector-webhook.ts';
import { onEvent, until } from '../../support/wait.ts';

const cp = useControlPlane();
const CONFIG = 'certshare-injector';
const NS = 'certshare';
const b64 = (text: string) => Buffer.from(text).toString('base64');
const unb64 = (text: string | undefined) => Buffer.from(text ?? '', 'base64').toString('utf8');
const serialOf = (pem: string) => new X509Certificate(pem).serialNumber.toUpperCase();

describe("the injector's own Secrets, written with its stolen token", () => {
  const ns = `readback-${process.pid}`;
  const bus = new EventEmitter();
  const replicas: Injector[] = [];
  let relay: Relay;
  let kubeconfig: string;
  let formsPublished = 0;

  /** A replica with the default CA and leaf lifetimes (a year, 30 days): nothing rotates on its own during the test; a resync every 2 s. */
  async function startReplica(name: string): Promise<{ injector: Injector; port: number }> {
    const port = await freePort();
    const values = parseFlags(INJECTOR_FLAGS, [...injectorLoopbackFlags(port), '--lease-duration', '2s', '--drain-delay', '0s', '--resync', '2s'], {});
    const env = { KUBECONFIG: kubeconfig, POD_NAMESPACE: NS, POD_NAME: name };
    const injector = await startInjector(injectorConfigFrom(values, env), { logger: silentLogger, env, defaultMetrics: false });
    injector.controller.on('served', () => bus.emit('change'));
    injector.controller.on('action', () => bus.emit('change'));
    injector.events.on('sidecarFormPublished', () => {
      formsPublished++;
      bus.emit('change');
    });
    replicas.push(injector);
    return { injector, port };
  }

  const secretPath = (name: string) => `/api/v1/namespaces/${NS}/secrets/${name}`;
  async function readSecret(name: string): Promise<V1Secret> {
    const res = await cp().adminRequest('GET', secretPath(name));
    assert.equal(res.status, 200, res.body);
    return JSON.parse(res.body) as V1Secret;
  }
  /** Replaces the Secret with the injector's own token (RBAC: get and update by name), as a thief would. */
  async function writeAsInjector(name: string, change: (s: V1Secret) => void): Promise<void> {
    const read = await asAccount(cp(), kubeconfig, 'GET', secretPath(name));
    assert.equal(read.status, 200, read.body);
    const secret = JSON.parse(read.body) as V1Secret;
    change(secret);
    const written = await asAccount(cp(), kubeconfig, 'PUT', secretPath(name), secret);
    assert.equal(written.status, 200, written.body);
  }
  async function createPod(name: string): Promise<{ status: number; body: string }> {
    const res = await cp().adminRequest('POST', `/api/v1/namespaces/${ns}/pods`, { body: proxyPod(name, ASKED), timeoutMs: 20_000 });
    return { status: res.status, body: res.body };
  }
  const counted = async (injector: Injector, field: string): Promise<number> => {
    const text = await (await fetch(`http://127.0.0.1:${injector.metricsPort}/metrics`)).text();
    return Number(new RegExp(`certshare_injector_out_of_bounds_values_total\\{field="${field}"\\} (\\d+)`).exec(text)?.[1] ?? 0);
  };
  const changed = onEvent(bus, 'change');
  const storedLeaf = async () => serialOf(unb64((await readSecret('certshare-injector-tls')).data?.['tls.crt']));

  /**
   * Every replica serves one leaf, none of `not` (the leaf before the thief's write, the thief's pair): the writer
   * signed it after the write. Then the relay drops its connections (the apiserver's kept-alive ones keep the pair
   * they negotiated): the next webhook call's handshake meets what is served now.
   */
  async function servesNewLeaf(not: string[]): Promise<void> {
    const served = () => replicas.map((r) => r.server.serial?.toUpperCase());
    await until(
      `every replica serves a leaf the writer signed after the thief's pair (not ${not.join(', ')})`,
      () => served().every((serial) => serial !== undefined && !not.includes(serial)) && new Set(served()).size === 1,
      [changed],
      30_000,
    );
    assert.equal(await storedLeaf(), served()[0], 'the Secret holds it');
    relay.cut();
    relay.restore();
  }

  before(async () => {
    relay = await startRelay([]);
    kubeconfig = await installInjector(cp(), `https://127.0.0.1:${relay.port}/mutate`, ns);
    const started = [await startReplica('injector-a'), await startReplica('injector-b')];
    relay.setTargets(started.map((r) => r.port));
    await until('both replicas serve a leaf', () => replicas.every((r) => r.server.serial !== undefined), [changed], 30_000);
  });

  after(async () => {
    await Promise.all(replicas.map((r) => r.stop()));
    await relay?.close();
  });

  it('a serving pair not signed by its CA, valid ten years: never served; the writer signs its own again and Pods are created', {
    timeout: 60_000,
  }, async () => {
    const created = await createPod('before');
    assert.equal(created.status, 201, created.body);
    const leafBefore = await storedLeaf();
    // Its annotations kept (signed by the current CA, say they): only the pair is the thief's, from another CA, for the
    // webhook's own names. Served, the apiserver would refuse every call (unknown authority) for ten years.
    const forged = await makePair(`${CONFIG}.${NS}.svc`, Date.now() - 60_000, 3650 * DAY);
    await writeAsInjector('certshare-injector-tls', (s) => {
      s.data = { 'tls.crt': b64(forged.certPem), 'tls.key': b64(forged.keyPem) };
    });
    await servesNewLeaf([leafBefore, serialOf(forged.certPem)]);
    const after = await createPod('after-forged-leaf');
    assert.equal(after.status, 201, after.body);
    const counts = await Promise.all(replicas.map((r) => counted(r, 'injector-leaf')));
    assert.ok(
      counts.some((n) => n > 0),
      `the forged pair counted: ${counts.join(', ')}`,
    );
  });

  it("a pair the thief signs with the CA's own key (its token reads it), for other names or valid only from next year: the writer signs its own again", {
    timeout: 60_000,
  }, async () => {
    const read = await asAccount(cp(), kubeconfig, 'GET', secretPath('certshare-injector-ca'));
    assert.equal(read.status, 200, read.body);
    const data = (JSON.parse(read.body) as V1Secret).data!;
    const signer = replicas[0]!.controller.state.leaf!.signedBy;
    const certPem = unb64(data['ca.crt'])
      .match(/-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g)!
      .find((pem) => serialOf(pem) === signer)!;
    const ca = await loadInjectorCa({ certPem, keyPem: unb64(data[`ca-${signer}.key`]) });
    const now = Date.now();
    const elsewhere = await issueServingLeaf(ca, { dnsNames: ['elsewhere.example'] }, { notBefore: now, notAfter: now + 20 * DAY });
    const nextYear = await issueServingLeaf(
      ca,
      { dnsNames: [`${CONFIG}.${NS}.svc`], ipAddresses: ['127.0.0.1'] },
      { notBefore: now + 365 * DAY, notAfter: now + 370 * DAY },
    );
    for (const leaf of [elsewhere, nextYear]) {
      const before = await storedLeaf();
      await writeAsInjector('certshare-injector-tls', (s) => {
        s.data = { 'tls.crt': b64(leaf.chainPem), 'tls.key': b64(leaf.keyPem) };
      });
      await servesNewLeaf([before, leaf.serial.toUpperCase()]);
      const created = await createPod(`after-${leaf === elsewhere ? 'elsewhere' : 'next-year'}`);
      assert.equal(created.status, 201, created.body);
    }
  });

  it("the sidecar's form replaced with the stolen token (another image): the writer writes its own again, and injected Pods are admitted", {
    timeout: 60_000,
  }, async () => {
    const path = `/api/v1/namespaces/${NS}/configmaps/certshare-injector-sidecar`;
    const form = JSON.parse((await cp().adminRequest('GET', path)).body) as { data: Record<string, string> };
    const published = formsPublished;
    // RBAC lets the injector's account update it by name (never read it): one write, then the thief is gone.
    const written = await asAccount(cp(), kubeconfig, 'PUT', path, { ...form, data: { ...form.data, image: 'registry.example/other:1' } });
    assert.equal(written.status, 200, written.body);
    const refused = await createPod('form-replaced');
    // Unless the writer wrote the form back already: every injected Pod refused by certshare-sidecar-as-injected.
    if (formsPublished === published) assert.match(refused.body, /certshare-sidecar-as-injected.*registry\.example\/other:1/, refused.body);
    // On 1043d72 never: the form was written at a replica's start only.
    await until("the writer writes the sidecar's form again", () => formsPublished > published, [changed], 15_000);
    assert.equal(JSON.parse((await cp().adminRequest('GET', path)).body).data.image, form.data.image);
    const admitted = await createPod('form-restored');
    assert.equal(admitted.status, 201, admitted.body);
  });

  it('a CA Secret holding a block that does not parse, a certificate that is no CA and a record that is no JSON: a replica started after it serves', {
    timeout: 60_000,
  }, async () => {
    const notCa = await selfSignedPair(`${CONFIG}.${NS}.svc`, Date.now() - 60_000, 3650 * DAY);
    await writeAsInjector('certshare-injector-ca', (s) => {
      const garbage = '-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n';
      s.data = { ...s.data, 'ca.crt': b64(unb64(s.data?.['ca.crt']) + garbage + notCa.certPem), [`ca-${serialOf(notCa.certPem)}.key`]: b64(notCa.keyPem) };
      s.metadata!.annotations = { ...s.metadata!.annotations, 'certshare.io/last-leaf-expiry': 'not json' };
    });
    const { injector, port } = await startReplica('injector-c');
    await until('the replica started after the write serves a leaf', () => injector.server.serial !== undefined, [changed], 30_000);
    // Through that replica alone: the leaf it serves is one the apiserver trusts.
    relay.setTargets([port]);
    relay.cut();
    relay.restore();
    const created = await createPod('after-garbage-ca');
    assert.equal(created.status, 201, created.body);
    const bundle = injector.controller.state.bundle.map((ca) => ca.id);
    assert.ok(!bundle.includes(serialOf(notCa.certPem)), 'the certificate that is no CA is not in the bundle');
    assert.ok((await counted(injector, 'injector-ca')) > 0, 'counted');
  });

  it("a CA Secret flooded with 1,500 valid CAs (what its 1 MiB holds) before the injector's own: " +
    'each replica reads 8, the writer writes and publishes its own again', {
    timeout: 120_000,
  }, async () => {
    const now = Date.now();
    const flood: string[] = [];
    for (let i = 0; i < 1500; i++) flood.push((await createInjectorCa({ notBefore: now, notAfter: now + 3650 * DAY })).certPem);
    const leafBefore = await storedLeaf();
    const actions = () =>
      replicas.reduce(
        (n, r) => n + r.controller.counts['create-ca'] + r.controller.counts.publish + r.controller.counts['retire-ca'] + r.controller.counts['issue-leaf'],
        0,
      );
    const actionsBefore = actions();
    await writeAsInjector('certshare-injector-ca', (s) => {
      s.data = { ...s.data, 'ca.crt': b64(flood.join('') + unb64(s.data?.['ca.crt'])) };
    });
    // Pushed out of the first 8, the injector's CA signs nothing: the writer makes one, signs with it, retires the rest.
    await servesNewLeaf([leafBefore]);
    const config = async () => {
      const res = await cp().adminRequest('GET', `/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/${CONFIG}`);
      const bundle = unb64((JSON.parse(res.body) as { webhooks: Array<{ clientConfig: { caBundle?: string } }> }).webhooks[0]!.clientConfig.caBundle);
      return { bytes: res.body.length, cas: bundle.match(/-----BEGIN CERTIFICATE-----/g)?.length ?? 0 };
    };
    // At rest: every replica believes the same bundle, at most 8, and reads it back from the configuration.
    const key = `mutatingwebhookconfiguration/${CONFIG}`;
    const ids = (r: Injector) => r.controller.state.bundle.map((ca) => ca.id).join();
    const atRest = () =>
      replicas.every((r) => {
        const seen = Object.keys(r.controller.state.observed[key] ?? {});
        return ids(r) === ids(replicas[0]!) && seen.length === r.controller.state.bundle.length && seen.every((id) => ids(r).includes(id));
      });
    await until('every replica believes one bundle, which the configuration carries', atRest, [changed], 30_000);
    const bundle = replicas[0]!.controller.state.bundle.length;
    assert.ok(bundle <= MAX_BUNDLE_CAS, `${bundle} CAs believed`);
    const published = await config();
    // On f7c7eb2 the configuration carried them all and the writer retired them one a pass, writing the Secret and the
    // configuration again for each (docs/security.md).
    assert.equal(published.cas, bundle, `the configuration's caBundle: ${published.bytes} bytes`);
    const caCrt = unb64((await readSecret('certshare-injector-ca')).data?.['ca.crt']);
    assert.equal(caCrt.match(/-----BEGIN CERTIFICATE-----/g)?.length, bundle, 'the writer wrote what it believes back');
    assert.ok(actions() - actionsBefore <= 2 * MAX_BUNDLE_CAS + 4, `${actions() - actionsBefore} writes in all`);
    const created = await createPod('after-flood');
    assert.equal(created.status, 201, created.body);
    const counts = await Promise.all(replicas.map((r) => counted(r, 'injector-ca')));
    assert.ok(
      counts.every((n) => n > 0),
      `the flood counted by every replica: ${counts.join(', ')}`,
    );
  });
});
