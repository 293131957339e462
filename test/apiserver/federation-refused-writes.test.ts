// A federation home that answers reads but refuses writes (docs/federation-chaos.md, "A home that refuses writes"): its
// etcd out of space, an admission webhook or policy refusing, a write timing out. The home answers, so no member breaks
// glass as for an outage; a takeover of the home Lease cannot be written, so none stands; the Lease's holder cannot
// write the renewal's intent nor the certificate. Three real kube-apiservers with etcd (the home, east, west); the home
// set up by manifests/federation, group `proxy` with one replica in each member under the credential's real token. The
// refusal is a real one: a ValidatingAdmissionPolicy of the home's administrator refusing every update of a
// ServiceAccount in the home namespace (422), as the apiserver refuses them all (500) when etcd is out of space. On
// cd5370f the copy passed its readiness exit with no renewal anywhere.
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { describe, it } from 'node:test';
import { breakGlassPoint } from '../../src/core/federation/home-verdicts.ts';
import { renewalTime, rotationExitTime } from '../../src/core/renewal/renewal.ts';
import type { ControlPlane } from '../harness/control-plane.ts';
import { currentOf, followReplicas, NS, secretAt, secretsHold, useFederation } from '../support/federation.ts';
import { KUBE_DOMAIN, must } from '../support/kube.ts';
import { asAccount } from '../support/token-request.ts';
import { until } from '../support/wait.ts';

const FEDERATION = fileURLToPath(new URL('../../manifests/federation', import.meta.url));
const HOME = 'fed-refused';
const LEASE = `/apis/coordination.k8s.io/v1/namespaces/${HOME}/leases/certshare-proxy`;
const SECRET = `/api/v1/namespaces/${HOME}/secrets/${KUBE_DOMAIN}`;
const POLICIES = '/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies';
const BINDINGS = '/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings';
const STEP = 6 * 3_600_000;

const current = currentOf;

/**
 * The refusals of the home's administrator, for a ServiceAccount's updates in the home namespace: every update of a Secret
 * or Lease (`writes`), or of a Secret's certificate only (`certificates`: intents go through).
 */
const REFUSALS = {
  writes: { resources: ['secrets', 'leases'], expression: 'false' },
  certificates: { resources: ['secrets'], expression: "object.data[?'tls.crt'] == oldObject.data[?'tls.crt']" },
};

/** Puts `what` in force (or, `nothing`, lifts both), and returns once the credential's own writes (dry runs) say so. */
async function refuse(home: ControlPlane, token: string, what: keyof typeof REFUSALS | 'nothing'): Promise<void> {
  for (const [name, refusal] of Object.entries(REFUSALS)) {
    const on = name === what;
    const policy = {
      apiVersion: 'admissionregistration.k8s.io/v1',
      kind: 'ValidatingAdmissionPolicy',
      metadata: { name: `refuse-${name}` },
      spec: {
        failurePolicy: 'Fail',
        matchConstraints: {
          namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': HOME } },
          resourceRules: [{ apiGroups: ['', 'coordination.k8s.io'], apiVersions: ['v1'], operations: ['UPDATE'], resources: refusal.resources }],
        },
        validations: [
          { expression: `!request.userInfo.username.startsWith('system:serviceaccount:') || ${refusal.expression}`, message: `the home refuses ${name}` },
        ],
      },
    };
    const binding = {
      apiVersion: 'admissionregistration.k8s.io/v1',
      kind: 'ValidatingAdmissionPolicyBinding',
      metadata: { name: `refuse-${name}` },
      spec: { policyName: `refuse-${name}`, validationActions: ['Deny'] },
    };
    if (on) {
      for (const [path, body] of [
        [POLICIES, policy],
        [BINDINGS, binding],
      ] as const) {
        const res = await home.adminRequest('POST', path, { body });
        assert.ok([201, 409].includes(res.status), res.body);
      }
    } else {
      const res = await home.adminRequest('DELETE', `${BINDINGS}/refuse-${name}`);
      assert.ok([200, 404].includes(res.status), res.body);
    }
  }
  // The policies load in the background: dry runs of the Lease unchanged and of a new certificate tell when they hold.
  const deadline = Date.now() + 30_000;
  for (;;) {
    const lease = await asAccount(home, token, 'GET', LEASE);
    const secret = await asAccount(home, token, 'GET', SECRET);
    assert.equal(lease.status, 200, lease.body);
    assert.equal(secret.status, 200, secret.body);
    const changed = JSON.parse(secret.body) as { data: Record<string, string> };
    changed.data['tls.crt'] = Buffer.from('another certificate').toString('base64');
    const leasePut = await asAccount(home, token, 'PUT', `${LEASE}?dryRun=All`, JSON.parse(lease.body));
    const certPut = await asAccount(home, token, 'PUT', `${SECRET}?dryRun=All`, changed);
    const refused = { writes: leasePut.status === 422, certificates: certPut.status === 422 };
    if (refused.writes === (what === 'writes') && refused.certificates === (what !== 'nothing')) return;
    assert.ok(Date.now() < deadline, `refusing ${what}: the Lease ${leasePut.status}, a certificate ${certPut.status} ${certPut.body}`);
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}

describe('a federation home that answers reads but refuses writes', () => {
  const bed = useFederation([]);
  const { clock, replicas } = bed;
  const { anyChange, agreed, decisions } = followReplicas(replicas);
  const breakGlass = async (): Promise<number[]> =>
    Promise.all(replicas.map(async (r) => (await r.daemon.metrics.breakGlass.get()).values.reduce((n, v) => n + v.value, 0)));

  it('past the safety point and a bound of refused writes, each member breaks glass once before the exit; the home back, one certificate', async () => {
    const home = bed.home();
    await must(home.kubectl(['create', 'namespace', HOME]));
    await must(home.kubectl(['apply', '-k', FEDERATION, '-n', HOME]));
    const token = await home.kubeconfigFor(HOME, 'certshare-federation');
    // A home Lease of 30 s: the bound of refused writes past the safety point is twice that, on the clock that also runs.
    const flags = ['--federation-kubeconfig', token, '--federation-namespace', HOME, '--federation-lease-duration', '30s'];
    await bed.startReplica(bed.member('east'), 'proxy', 'proxy-0', { domains: [KUBE_DOMAIN], flags });
    await bed.startReplica(bed.member('west'), 'proxy', 'proxy-0', { domains: [KUBE_DOMAIN], flags });
    await until('both members hold the first certificate', () => agreed() !== undefined, anyChange(), 60_000);
    const first = current(replicas[0]!)!;
    assert.equal(bed.issued(KUBE_DOMAIN), 1);

    await refuse(home, token, 'writes');
    const { renewal: policy, readinessLeadMs } = replicas[0]!.config;
    const held = { ...first.info, obtainedAt: first.obtainedAt };
    const exit = rotationExitTime(held, policy, readinessLeadMs);
    // From just before the safety point to the exit, six hours at a time: every replica looks (and reads the home) each time.
    clock.jumpTo(breakGlassPoint(held, policy, readinessLeadMs) - 60_000);
    const renewedBoth = (): boolean => replicas.every((r) => ![undefined, first.info.serial].includes(current(r)?.info.serial));
    while (!renewedBoth() && clock.now() < exit - STEP) {
      await decisions(1, renewedBoth);
      clock.jump(STEP);
    }
    if (!renewedBoth()) {
      clock.jumpTo(exit + 60_000);
      await decisions(1, renewedBoth);
    }
    const serving = replicas.map(
      (r) => `${r.member}: ${current(r)?.info.serial === first.info.serial ? 'the first copy' : (current(r)?.info.serial ?? 'none')}`,
    );
    assert.ok(renewedBoth(), `a renewal in both members by the exit: ${serving.join(', ')}, ${bed.issued(KUBE_DOMAIN)} issuances in all`);
    assert.ok(clock.now() < exit, 'before the readiness exit');
    assert.deepEqual(await breakGlass(), [1, 1], 'one break-glass issuance per member');
    assert.equal(bed.issued(KUBE_DOMAIN), 3, 'the first, and one per member');

    // The window holds: three more looks hours apart, no issuance more.
    for (let i = 0; i < 3; i++) {
      await decisions(1, () => bed.issued(KUBE_DOMAIN) > 3);
      clock.jump(2 * 3_600_000);
    }
    assert.equal(bed.issued(KUBE_DOMAIN), 3, 'no issuance more in the window');

    // The home writes again: the newest break-glass certificate everywhere, no issuance.
    await refuse(home, token, 'nothing');
    const newest = replicas.map((r) => current(r)!).sort((a, b) => b.info.notAfter - a.info.notAfter)[0]!;
    await until('one certificate in both members', () => agreed() !== undefined, anyChange(), 30_000);
    const serial = agreed()!;
    assert.ok(serial === newest.info.serial || current(replicas[0]!)!.info.notAfter === newest.info.notAfter, 'the newest one');
    await secretsHold([{ cp: home, ns: HOME }, ...bed.members().map((m) => ({ cp: m.cp, ns: NS }))], KUBE_DOMAIN, serial, anyChange, 30_000);
    assert.equal(bed.issued(KUBE_DOMAIN), 3);
  });
  it('writes refused across the safety point for less than the bound: no break-glass, one renewal once they go through', async () => {
    const home = bed.home();
    const token = await home.kubeconfigFor(HOME, 'certshare-federation');
    const held = current(replicas[0]!)!;
    assert.equal(agreed(), held.info.serial);
    const orders = bed.issued(KUBE_DOMAIN);
    const glass = await breakGlass();
    const { renewal: policy, readinessLeadMs } = replicas[0]!.config;
    const validity = { ...held.info, obtainedAt: held.obtainedAt };
    const bound = 2 * replicas[0]!.config.federation!.leaseDurationMs;
    await refuse(home, token, 'writes');
    clock.jumpTo(renewalTime(validity, policy) - 60_000);
    await decisions(1, () => false);
    const safety = breakGlassPoint(validity, policy, readinessLeadMs);
    const leaseRefusals = (): number => replicas.reduce((n, r) => n + r.log.entries.filter((e) => e.msg === 'lease update failed').length, 0);
    const before = leaseRefusals();
    clock.jumpTo(safety + 1_000);
    await until("a member's takeover refused", () => leaseRefusals() > before, anyChange(), 30_000);
    await refuse(home, token, 'nothing');
    assert.ok(clock.now() < safety + bound, `the refusal lifted ${clock.now() - safety} ms past the safety point, within the bound (${bound} ms)`);
    await until('a renewal in both members', () => ![undefined, held.info.serial].includes(agreed()), anyChange(), 60_000);
    assert.equal(bed.issued(KUBE_DOMAIN), orders + 1, 'one renewal');
    assert.deepEqual(await breakGlass(), glass, 'no break-glass');
    await secretsHold([{ cp: home, ns: HOME }, ...bed.members().map((m) => ({ cp: m.cp, ns: NS }))], KUBE_DOMAIN, agreed()!, anyChange, 30_000);
  });
  it('the certificate refused at the home, intents let through: the writer that issued serves its member, pushed once the home takes it', async () => {
    const home = bed.home();
    const token = await home.kubeconfigFor(HOME, 'certshare-federation');
    const held = current(replicas[0]!)!;
    const orders = bed.issued(KUBE_DOMAIN);
    const glass = await breakGlass();
    const { renewal: policy } = replicas[0]!.config;
    await refuse(home, token, 'certificates');
    clock.jumpTo(renewalTime({ ...held.info, obtainedAt: held.obtainedAt }, policy) + 60_000);
    await until('a renewal', () => bed.issued(KUBE_DOMAIN) > orders, anyChange(), 30_000);
    const writer = replicas.find((r) => ![undefined, held.info.serial].includes(current(r)?.info.serial))!;
    assert.ok(writer, 'the writer holds its renewal');
    const renewed = current(writer)!.info.serial;
    const member = bed.member(writer.member);
    await secretsHold([{ cp: member.cp, ns: NS }], KUBE_DOMAIN, renewed, anyChange, 30_000);
    assert.equal((await secretAt(home, HOME, KUBE_DOMAIN)).serial, held.info.serial, 'the home refused it');
    await refuse(home, token, 'nothing');
    await secretsHold([{ cp: home, ns: HOME }, ...bed.members().map((m) => ({ cp: m.cp, ns: NS }))], KUBE_DOMAIN, renewed, anyChange, 30_000);
    assert.equal(bed.issued(KUBE_DOMAIN), orders + 1, 'one renewal');
    assert.deepEqual(await breakGlass(), glass, 'no break-glass');
  });
  it("the federation account's updates are bounded in size: its token cannot fill the home's etcd", async () => {
    // On cd5370f its token wrote a Secret of record with a 1 MiB key, and 63 such writes filled a 64 MiB etcd: every
    // write at the home then failed (database space exceeded), the administrator's too. Dry runs: admitted or refused,
    // nothing is stored.
    const home = bed.home();
    const token = await home.kubeconfigFor(HOME, 'certshare-federation');
    const secret = JSON.parse((await asAccount(home, token, 'GET', SECRET)).body) as {
      data: Record<string, string>;
      metadata: { annotations?: Record<string, string> };
    };
    const lease = JSON.parse((await asAccount(home, token, 'GET', LEASE)).body) as { spec: Record<string, unknown> };
    const put = async (path: string, body: unknown): Promise<number> => (await asAccount(home, token, 'PUT', `${path}?dryRun=All`, body)).status;
    const withKey = (bytes: number) => ({ ...secret, data: { ...secret.data, 'tls.key': Buffer.alloc(bytes, 'k').toString('base64') } });
    const withAnnotations = (annotations: Record<string, string>) => ({
      ...secret,
      metadata: { ...secret.metadata, annotations: { ...secret.metadata.annotations, ...annotations } },
    });
    const many = Object.fromEntries(Array.from({ length: 33 }, (_, i) => [`certshare.io/filler-${i}`, 'x']));
    assert.equal(await put(SECRET, withKey(12 * 1024)), 200, 'a key of 12 KiB (16 KiB as stored)');
    assert.equal(await put(SECRET, withKey(12 * 1024 + 3)), 403, 'a key of 16 KiB and more as stored');
    assert.equal(await put(SECRET, withKey(1024 * 1024 - 4096)), 403, 'a key of 1 MiB');
    assert.equal(await put(SECRET, withAnnotations({ 'certshare.io/filler': 'x'.repeat(1024) })), 200, 'an annotation of 1 KiB');
    assert.equal(await put(SECRET, withAnnotations({ 'certshare.io/filler': 'x'.repeat(1025) })), 403, 'an annotation over 1 KiB');
    assert.equal(await put(SECRET, withAnnotations(many)), 403, 'more than 32 certshare.io/* annotations');
    assert.equal(await put(LEASE, { ...lease, spec: { ...lease.spec, holderIdentity: 'h'.repeat(512) } }), 200, 'a holder of 512 characters');
    assert.equal(await put(LEASE, { ...lease, spec: { ...lease.spec, holderIdentity: 'h'.repeat(513) } }), 403, 'a longer holder');
  });
});
