// The injector's --sidecar-home-kubeconfig-secret (docs/federation.md): the federation home's kubeconfig,
// mounted from a Secret the platform names into certshare's container only, and never chosen by a Pod.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { V1Pod } from '../../../src/kube/transport/client-node.ts';
import { parseFlags } from '../../../src/flags/flags.ts';
import { INJECTOR_FLAGS, injectorConfigFrom } from '../../../src/config/injector-options.ts';
import { ANNOTATION, admissionReviewResponse } from '../../../src/injector/mutate.ts';
import { DEFAULT_READINESS_GATE, type InjectionDefaults } from '../../../src/config/injection-defaults.ts';
import { HOME_DIR, HOME_KUBECONFIG, SIDECAR_NAME } from '../../../src/injector/sidecar.ts';
import { applyJsonPatch } from '../../support/json-patch.ts';

const VOLUME = 'certshare-federation';
const plain: InjectionDefaults = { image: 'example/certshare:test', mode: 'auto', outDir: '/certs', readinessGate: DEFAULT_READINESS_GATE, socketVolume: 'ts' };
/** The injector started with the flag (which needs the home's namespace and this cluster's name in --sidecar-flags). */
const federated: InjectionDefaults = {
  ...plain,
  homeKubeconfigSecret: 'certshare-home',
  sidecarFlags: '--federation-namespace=certshare-home --federation-cluster=east',
};

/** An opted-in Pod, its annotations (`more`) beside the two that ask for a sidecar, reviewed and patched. */
function admitted(defaults: InjectionDefaults, more: Record<string, string> = {}): { allowed: boolean; message?: string; pod: V1Pod } {
  const pod: V1Pod = {
    metadata: { name: 'proxy-0', namespace: 'proxy', annotations: { [ANNOTATION.inject]: 'true', [ANNOTATION.domains]: 'proxy.tailnet-0000.ts.net', ...more } },
    spec: {
      containers: [
        { name: 'proxy', image: 'nginx' },
        { name: 'tailscale', image: 'tailscale/tailscale', volumeMounts: [{ name: 'ts', mountPath: '/var/run/tailscale' }] },
      ],
      volumes: [{ name: 'ts', emptyDir: {} }],
    },
  };
  const review = {
    apiVersion: 'admission.k8s.io/v1',
    kind: 'AdmissionReview',
    request: { uid: 'u', kind: { group: '', version: 'v1', kind: 'Pod' }, operation: 'CREATE', object: pod },
  };
  const { response } = admissionReviewResponse(review, defaults) as { response: { allowed: boolean; patch?: string; status?: { message: string } } };
  const patch = response.patch ? JSON.parse(Buffer.from(response.patch, 'base64').toString()) : [];
  return { allowed: response.allowed, message: response.status?.message, pod: applyJsonPatch(pod, patch) as V1Pod };
}
const sidecarOf = (p: V1Pod) => p.spec!.initContainers!.find((c) => c.name === SIDECAR_NAME)!;

describe("the federation home's kubeconfig (--sidecar-home-kubeconfig-secret)", () => {
  it("mounts the Secret's key kubeconfig read-only into certshare's container only, as --federation-kubeconfig", () => {
    const { allowed, pod } = admitted(federated);
    assert.equal(allowed, true);
    assert.deepEqual(
      pod.spec!.volumes!.find((v) => v.name === VOLUME),
      { name: VOLUME, secret: { secretName: 'certshare-home', items: [{ key: 'kubeconfig', path: 'kubeconfig' }], optional: false } },
    );
    const sidecar = sidecarOf(pod);
    assert.deepEqual(
      sidecar.volumeMounts!.find((m) => m.name === VOLUME),
      { name: VOLUME, mountPath: HOME_DIR, readOnly: true },
    );
    assert.equal(sidecar.env!.find((e) => e.name === 'CERTSHARE_FEDERATION_KUBECONFIG')?.value, HOME_KUBECONFIG);
    for (const c of pod.spec!.containers) assert.ok(!c.volumeMounts?.some((m) => m.name === VOLUME), `${c.name} does not mount it`);

    const without = admitted(plain).pod;
    assert.equal(
      without.spec!.volumes!.find((v) => v.name === VOLUME),
      undefined,
    );
    assert.equal(
      sidecarOf(without).env!.find((e) => e.name === 'CERTSHARE_FEDERATION_KUBECONFIG'),
      undefined,
    );
  });

  it('is never a Pod annotation: a Pod can neither name a home nor drop the platform one', () => {
    for (const flags of ['--federation-kubeconfig=/var/run/tailscale/kc', '--federation-namespace=other', '--federation-cluster=x']) {
      for (const defaults of [plain, federated]) {
        const { allowed, message } = admitted(defaults, { [ANNOTATION.flags]: flags });
        assert.equal(allowed, false, flags);
        assert.match(message ?? '', /belongs to the platform, not to a Pod/, flags);
      }
    }
    const guessed = admitted(plain, { 'certshare.io/home-kubeconfig-secret': 'mine', 'certshare.io/federation-kubeconfig': 'mine' }).pod;
    assert.equal(
      guessed.spec!.volumes!.find((v) => v.name === VOLUME),
      undefined,
    );
  });

  it('is checked when the injector starts: a Secret name, with the home namespace and the cluster in --sidecar-flags', () => {
    const start = (args: string[]) => injectorConfigFrom(parseFlags(INJECTOR_FLAGS, args, {}), {}).defaults.homeKubeconfigSecret;
    const flags = '--sidecar-flags=--federation-namespace=certshare-home --federation-cluster=east';
    assert.equal(start([]), undefined);
    assert.equal(start(['--sidecar-home-kubeconfig-secret', 'certshare-home', flags]), 'certshare-home');
    const refused: [string[], RegExp][] = [
      [['--sidecar-home-kubeconfig-secret', 'Home'], /is not a Secret name/],
      [['--sidecar-home-kubeconfig-secret', 'certshare-home'], /needs --federation-namespace in --sidecar-flags/],
      [['--sidecar-home-kubeconfig-secret', 'certshare-home', '--sidecar-flags=--federation-namespace=h'], /needs --federation-cluster/],
    ];
    for (const [args, message] of refused) assert.throws(() => start(args), message, args.join(' '));
  });
});
