import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { parseFlags } from '../../src/flags/flags.ts';
import { RUN_FLAGS, daemonConfigFrom } from '../../src/config/run-options.ts';
import { rotationExitTime } from '../../src/core/renewal/renewal.ts';
import { partSettings } from '../../src/daemon/part-settings.ts';

const DOMAIN = 'web.tailnet-1234.ts.net';
const POD = { POD_NAME: 'proxy-0', POD_IPS: '10.0.0.7' };
const DAY = 86_400_000;

function configOf(args: string[], env: NodeJS.ProcessEnv = {}) {
  return daemonConfigFrom(parseFlags(RUN_FLAGS, ['--domain', DOMAIN, ...args], env), env);
}

function settingsOf(args: string[], env: NodeJS.ProcessEnv = {}) {
  return partSettings(configOf(args, env));
}

describe('part settings: each part is handed its own, derived once before any part is built', () => {
  it('delivery gets its six settings and nothing else of the configuration', () => {
    const { delivery } = settingsOf(['--store', 'dir:/tmp/certs', '--reload-command', 'nginx -s reload']);
    assert.deepEqual(Object.keys(delivery).sort(), ['haproxyCrtDir', 'haproxySocket', 'reloadCommand', 'reloadPidFile', 'reloadSignal', 'reloadTimeoutMs']);
  });

  it('the directory store gets its path and the writer name; Kubernetes mode its own settings', () => {
    assert.deepEqual(settingsOf(['--store', 'dir:/tmp/certs'], POD).store, { kind: 'dir', path: '/tmp/certs', podName: 'proxy-0' });
    const kube = settingsOf(['--store', 'kube'], POD).store;
    assert.equal(kube.kind, 'kube');
    assert.equal(kube.kind === 'kube' && kube.settings.podName, 'proxy-0');
  });

  it('parts the flags leave off are handed nothing (no served check, no ARI)', () => {
    const settings = settingsOf(['--store', 'dir:/tmp/certs', '--acme-directory', 'none']);
    assert.equal(settings.served, undefined);
    assert.equal(settings.ari, undefined);
  });

  it('the readiness gate and the served advertisement are handed one exit time: rotationExitTime of the configuration', () => {
    const config = configOf(['--store', 'kube', '--readiness-gate', 'certshare.io/ready', '--served-check', '127.0.0.1:443'], POD);
    const settings = partSettings(config);
    const gate = settings.store.kind === 'kube' ? settings.store.settings.gate : undefined;
    assert.ok(gate && settings.served);
    assert.equal(gate.validityEnd, settings.served.validityEnd, 'one function, derived once');
    const held = { notBefore: 0, notAfter: 90 * DAY };
    assert.equal(gate.validityEnd(held), rotationExitTime(held, config.renewal, config.readinessLeadMs));
  });
});
