// The sidecar's form (mutate.ts's sidecarForm), the parameters of the admission policy certshare-sidecar-as-injected:
// every variable the injector writes into certshare's container is in it, as the policy reads it (a downward-API
// field, a Pod's own setting, or the platform's with its value), so the policy admits whatever the injector makes;
// and nothing a Pod chooses is recorded as the platform's. The policy itself runs on the real apiserver in
// test/apiserver/pod-accounts.test.ts.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { V1Container } from '../../../src/kube/transport/client-node.ts';
import { parseFlags } from '../../../src/flags/flags.ts';
import { INJECTOR_FLAGS, injectorConfigFrom } from '../../../src/config/injector-options.ts';
import { ANNOTATION, POD_CHOSEN_ENV, injectionFor, sidecarForm } from '../../../src/injector/mutate.ts';
import type { InjectionDefaults } from '../../../src/config/injection-defaults.ts';
import { SIDECAR_NAME } from '../../../src/injector/sidecar.ts';
import { SIDECAR_FORM_BOUNDS, checkSidecarFormBounds } from '../../../src/injector/sidecar-form.ts';
import { examplePod } from '../../support/injector-example.ts';

const PLATFORM = [
  '--sidecar-flags=--issuance-budget=20/168h --drain-delay=3s',
  '--sidecar-ca-configmap=acme-ca',
  '--sidecar-image=registry.example/certshare:2',
];

function defaultsOf(args: string[]): InjectionDefaults {
  return injectorConfigFrom(parseFlags(INJECTOR_FLAGS, args, {}), {}).defaults;
}

/** What certshare-sidecar-as-injected refuses in `sidecar` for this form (its rules on variables, written out). */
function refusedBy(form: Record<string, string>, sidecar: V1Container): string[] {
  const podEnv = form['pod-env']!.split(',');
  const env = sidecar.env ?? [];
  const foreign = env
    .filter((e) => {
      const field = form[`field.${e.name}`];
      if (field !== undefined) return e.valueFrom?.fieldRef?.fieldPath !== field;
      return e.valueFrom !== undefined || !(podEnv.includes(e.name) || form[`env.${e.name}`] === (e.value ?? ''));
    })
    .map((e) => `not ${e.name}`);
  const platform = Object.keys(form).filter((k) => k.startsWith('env.'));
  const missing = platform.filter((k) => !env.some((e) => e.name === k.slice(4))).map((k) => `${k.slice(4)} missing`);
  return [...(sidecar.image === form.image ? [] : ['image']), ...foreign, ...missing];
}

describe("the sidecar's form", () => {
  it("records the image and the platform's settings with their values, a Pod's own settings by name only", () => {
    const form = sidecarForm(defaultsOf(PLATFORM));
    assert.equal(form.image, 'registry.example/certshare:2');
    assert.equal(form['env.CERTSHARE_ISSUANCE_BUDGET'], '20/168h');
    assert.equal(form['env.NODE_EXTRA_CA_CERTS'], '/etc/certshare/ca/ca.crt');
    assert.equal(form['env.CERTSHARE_STORE'], 'kube');
    assert.equal(form['field.POD_NAME'], 'metadata.name');
    assert.equal(form['mount.certshare-ca'], '/etc/certshare/ca');
    assert.equal(form['volume.certshare-ca'], 'configMap/acme-ca');
    // The platform's drain delay is a default a Pod may override: the Pod's, by name.
    assert.equal(form['env.CERTSHARE_DRAIN_DELAY'], undefined);
    for (const name of POD_CHOSEN_ENV) assert.equal(form[`env.${name}`], undefined, name);
    assert.deepEqual(form['pod-env']!.split(','), [...POD_CHOSEN_ENV]);
  });

  it('fits the bounds the policies hold it to; settings past them are refused at start', () => {
    const form = sidecarForm(defaultsOf(PLATFORM));
    checkSidecarFormBounds(form);
    assert.ok(Object.keys(form).length < SIDECAR_FORM_BOUNDS.keys / 4, `${Object.keys(form).length} keys`);
    const long = sidecarForm(defaultsOf([...PLATFORM.slice(1), `--sidecar-flags=--retry-cap=${'1'.repeat(SIDECAR_FORM_BOUNDS.valueChars)}h`]));
    assert.throws(() => checkSidecarFormBounds(long), /CERTSHARE_BAD_FLAG|at most 128 settings/);
    assert.throws(() => checkSidecarFormBounds({ ...form, ...Object.fromEntries(Array.from({ length: 128 }, (_, i) => [`env.X${i}`, ''])) }), /settings/);
  });

  it('admits every sidecar the injector makes: the example, a Pod advertising a Service, one reloaded by signal, one behind HAProxy', async () => {
    const defaults = defaultsOf(PLATFORM);
    const form = sidecarForm(defaults);
    const example = await examplePod('proxy-0');
    const annotations = example.metadata!.annotations!;
    const variants: Array<[string, Record<string, string>]> = [
      ['the example', {}],
      ['advertising', { [ANNOTATION.flags]: '--served-check=127.0.0.1:8443 --advertise-services=svc:proxy --shutdown-timeout=8s' }],
      ['reloaded by signal', { [ANNOTATION.reloadSignal]: 'HUP', [ANNOTATION.reloadPidfile]: '/tmp/nginx.pid', [ANNOTATION.flags]: '--drain-delay=1s' }],
      ['HAProxy', { [ANNOTATION.haproxySocket]: '/tmp/haproxy.sock', [ANNOTATION.mode]: 'rw', [ANNOTATION.outDir]: '/certs' }],
    ];
    for (const [what, extra] of variants) {
      const pod = { ...example, metadata: { ...example.metadata, annotations: { ...annotations, ...extra } } };
      if (extra[ANNOTATION.reloadSignal] || extra[ANNOTATION.haproxySocket]) {
        // A proxy that waits for the first certificate: tailscaled must run as a native sidecar (checkPodShape).
        const tailscaled = example.spec!.containers.filter((c) => c.volumeMounts?.some((m) => m.name === 'tailscale-socket') && c.name !== 'proxy');
        pod.spec = {
          ...example.spec!,
          containers: example.spec!.containers.filter((c) => !tailscaled.includes(c)),
          initContainers: [...(example.spec!.initContainers ?? []), ...tailscaled.map((c) => ({ ...c, restartPolicy: 'Always' }))],
        };
      }
      const injection = injectionFor(pod, defaults);
      assert.equal(injection.kind, 'inject', what);
      const sidecar = injection.kind === 'inject' ? injection.pod.spec!.initContainers!.find((c) => c.name === SIDECAR_NAME)! : undefined;
      assert.deepEqual(refusedBy(form, sidecar!), [], what);
      // The same sidecar under another platform's form (another budget) is refused: the policy compares values.
      const other = sidecarForm(defaultsOf(['--sidecar-flags=--issuance-budget=5/168h', '--sidecar-ca-configmap=acme-ca']));
      assert.deepEqual(refusedBy(other, sidecar!), ['image', 'not CERTSHARE_ISSUANCE_BUDGET'], what);
    }
  });
});
