import assert from 'node:assert/strict';
import { before, describe, it } from 'node:test';
import { parseFlags } from '../../../src/flags/flags.ts';
import { INJECTOR_FLAGS, injectorConfigFrom } from '../../../src/config/injector-options.ts';
import { createInjectorCa } from '../../../src/injector/pki.ts';
import { parseTarget } from '../../../src/core/injector-ca/ca-targets.ts';
import { observedCaSerials, withCaBundle } from '../../../src/injector/targets.ts';

const HOUR = 3_600_000;

describe('caBundle targets', () => {
  let a: { pem: string; serial: string };
  let b: { pem: string; serial: string };
  before(async () => {
    const now = Date.now();
    const [x, y] = await Promise.all([createInjectorCa({ notBefore: now, notAfter: now + HOUR }), createInjectorCa({ notBefore: now, notAfter: now + HOUR })]);
    a = { pem: x.certPem, serial: x.serial };
    b = { pem: y.certPem, serial: y.serial };
  });

  it('parses KIND/NAME and the short forms, and refuses anything else', () => {
    assert.deepEqual(parseTarget('mwc/hook'), { kind: 'mutatingwebhookconfiguration', name: 'hook' });
    assert.deepEqual(parseTarget('APIService/v1.metrics.example.com'), { kind: 'apiservice', name: 'v1.metrics.example.com' });
    for (const bad of ['hook', 'pod/x', 'crd/', 'mwc/a/b']) assert.throws(() => parseTarget(bad), { code: 'CERTSHARE_BAD_FLAG' });
  });

  it('counts a CA as observed only when every webhook of a configuration carries it', () => {
    const enc = (pem: string) => Buffer.from(pem).toString('base64');
    const mwc = { webhooks: [{ clientConfig: { caBundle: enc(a.pem + b.pem) } }, { clientConfig: { caBundle: enc(b.pem) } }] };
    assert.deepEqual(observedCaSerials('mutatingwebhookconfiguration', mwc), [b.serial]);
    assert.deepEqual(observedCaSerials('mutatingwebhookconfiguration', { webhooks: [{ clientConfig: {} }] }), []);
    const written = withCaBundle('mutatingwebhookconfiguration', mwc, a.pem + b.pem);
    assert.deepEqual(observedCaSerials('mutatingwebhookconfiguration', written), [a.serial, b.serial]);
    assert.deepEqual(observedCaSerials('mutatingwebhookconfiguration', mwc), [b.serial], 'the original is not modified');
  });

  it('writes the bundle where each kind keeps it', () => {
    const crd = withCaBundle(
      'customresourcedefinition',
      { spec: { conversion: { strategy: 'Webhook', webhook: { clientConfig: { service: { name: 's', namespace: 'n' } } } } } },
      a.pem,
    );
    assert.deepEqual(observedCaSerials('customresourcedefinition', crd), [a.serial]);
    assert.throws(() => withCaBundle('customresourcedefinition', { spec: {} }, a.pem), { code: 'CERTSHARE_BAD_CONFIG' });
    const apiService = withCaBundle('apiservice', { spec: { service: { name: 's' } } }, b.pem) as { spec: { caBundle: string } };
    assert.deepEqual(observedCaSerials('apiservice', apiService), [b.serial]);
  });

  it('reads the injector flags, splitting extra names from IPs and refusing a rotation that cannot overlap', () => {
    const config = injectorConfigFrom(
      parseFlags(INJECTOR_FLAGS, ['--extra-san', '127.0.0.1', '--extra-san', 'hook.example.com', '--inject-ca-into', 'vwc/v'], {}),
      { POD_NAMESPACE: 'ns' },
    );
    assert.deepEqual([config.extraIps, config.extraDnsNames, config.serviceNamespace], [['127.0.0.1'], ['hook.example.com'], 'ns']);
    assert.deepEqual(config.targets, [{ kind: 'validatingwebhookconfiguration', name: 'v' }]);
    assert.deepEqual(config.policy, {
      caLifetimeMs: 8760 * HOUR,
      caRotateBeforeMs: 2160 * HOUR,
      leafLifetimeMs: 720 * HOUR,
      leafRenewBeforeMs: 240 * HOUR,
      propagationGraceMs: 30_000,
    });
    assert.throws(() => injectorConfigFrom(parseFlags(INJECTOR_FLAGS, ['--leaf-renew-before', '800h'], {}), {}), { code: 'CERTSHARE_BAD_FLAG' });
    assert.throws(() => injectorConfigFrom(parseFlags(INJECTOR_FLAGS, ['--propagation-grace', '3000h'], {}), {}), /propagation grace/);
  });
});
