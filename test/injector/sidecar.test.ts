// One description of certshare's sidecar (src/injector/sidecar.ts): the example StatefulSet's certshare
// container and token volume are exactly what the injector would add with the same settings, so the
// documented example and the injected Pods cannot drift apart.
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { describe, it } from 'node:test';
import { load } from 'js-yaml';
import { certshareContainer, SIDECAR_NAME, serviceAccountTokenVolume } from '../../src/injector/sidecar.ts';

const STATEFULSET = new URL('../../manifests/example/statefulset.yaml', import.meta.url);

interface PodSpec {
  initContainers: Array<{ name: string; image: string; env: Array<{ name: string; value?: string }> }>;
  volumes: Array<{ name: string }>;
}

describe('the example StatefulSet and the injector share one sidecar', () => {
  it("the example's certshare container is certshareContainer() with the example's settings", async () => {
    const sts = load(await readFile(STATEFULSET, 'utf8')) as { spec: { template: { spec: PodSpec } } };
    const pod = sts.spec.template.spec;
    const example = pod.initContainers.find((c) => c.name === SIDECAR_NAME);
    assert.ok(example, 'the example has a certshare init container');
    const value = (name: string): string => {
      const v = example.env.find((e) => e.name === name)?.value;
      assert.ok(v !== undefined, `${name} set in the example`);
      return v;
    };
    const extra = ['CERTSHARE_ROUTING_CHECK', 'CERTSHARE_ROUTING_ATTEMPTS', 'CERTSHARE_DRAIN_DELAY', 'CERTSHARE_SHUTDOWN_TIMEOUT'];
    const expected = certshareContainer({
      image: example.image,
      domains: value('CERTSHARE_DOMAIN').split(','),
      mode: value('CERTSHARE_MODE') as 'auto',
      outDir: value('CERTSHARE_OUT_DIR'),
      readinessGate: value('CERTSHARE_READINESS_GATE'),
      socketVolume: 'tailscale-socket',
      certsVolume: 'certs',
      tokenVolume: 'certshare-token',
      extraEnv: extra.map((name) => ({ name, value: value(name) })),
    });
    assert.deepEqual(example, JSON.parse(JSON.stringify(expected)));
    const token = pod.volumes.find((v) => v.name === 'certshare-token');
    assert.deepEqual(token, serviceAccountTokenVolume('certshare-token'));
  });
});
