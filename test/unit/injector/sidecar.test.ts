// One description of certshare's sidecar (src/injector/sidecar.ts): the example StatefulSet no longer
// carries it by hand but asks the injector for it, and what the injector makes of the example is what the
// example carried before (the real apiserver and webhook version of this is in webhook.test.ts).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { SIDECAR_NAME } from '../../../src/injector/sidecar.ts';
import { examplePodSpecBefore, exampleTemplate, injectTemplate, injectedExampleSpec, injectedParts } from '../../support/injector-example.ts';

describe('the example StatefulSet and the injector share one sidecar', () => {
  it('the example asks for injection and carries no sidecar, token volume or gate of its own', async () => {
    const { metadata, spec } = await exampleTemplate();
    assert.equal(metadata.annotations['certshare.io/inject'], 'true');
    assert.equal(spec.initContainers, undefined);
    assert.ok(!spec.containers.some((c) => c.name === SIDECAR_NAME));
    assert.equal(spec.readinessGates, undefined);
    assert.ok(!spec.volumes?.some((v) => v.name === 'certshare-token'));
  });

  it('the injected example has the sidecar, env, volumes and readiness gate the hand-written example had', async () => {
    assert.deepEqual(injectedParts(await injectedExampleSpec()), injectedParts(await examplePodSpecBefore()));
  });

  it("writes the served check the injector would fill from nginx's https port anyway", async () => {
    const { metadata, spec } = await exampleTemplate();
    const flags = metadata.annotations['certshare.io/flags'] ?? '';
    assert.match(flags, /--served-check=127\.0\.0\.1:8443/);
    const annotations = { ...metadata.annotations, 'certshare.io/flags': flags.replace(/--served-check=\S+/, '') };
    const env = (s: typeof spec) => s.initContainers?.find((c) => c.name === SIDECAR_NAME)?.env ?? [];
    const filled = env(injectTemplate({ metadata: { annotations }, spec }));
    const written = env(await injectedExampleSpec());
    assert.deepEqual(
      filled.find((e) => e.name === 'CERTSHARE_SERVED_CHECK'),
      written.find((e) => e.name === 'CERTSHARE_SERVED_CHECK'),
    );
    assert.deepEqual(new Set(filled.map((e) => e.name)), new Set(written.map((e) => e.name)));
  });
});
