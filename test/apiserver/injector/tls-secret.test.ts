// --tls secret:NAME against the real apiserver: the pair is read from a kubernetes.io/tls Secret at start
// (a missing Secret stops the start) and every replacement of the Secret is handed to the listener.
import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { X509Certificate } from 'node:crypto';
import { describe, it } from 'node:test';
import { systemClock } from '../../../src/core/ports/clock.ts';
import { silentLogger } from '../../../src/core/ports/logger.ts';
import { pairSource } from '../../../src/tls/pair-source.ts';
import { secretPairSource } from '../../../src/kube/secret-pair-source.ts';
import type { ServingPair } from '../../../src/tls/serving-pair.ts';
import { useControlPlane } from '../../harness/use-control-plane.ts';
import { DAY, makePair } from '../../support/certs.ts';
import { must } from '../../support/kube.ts';
import { nextEvent } from '../../support/wait.ts';

const cp = useControlPlane();
const serial = (pair: ServingPair) => new X509Certificate(pair.certPem).serialNumber;

function secretJson(name: string, pair: ServingPair): string {
  const b64 = (text: string) => Buffer.from(text).toString('base64');
  return JSON.stringify({
    apiVersion: 'v1',
    kind: 'Secret',
    metadata: { name },
    type: 'kubernetes.io/tls',
    data: { 'tls.crt': b64(pair.certPem), 'tls.key': b64(pair.keyPem) },
  });
}

describe('--tls secret:NAME', () => {
  it('reads the pair from the Secret at start, then hands over each replacement', async () => {
    const ns = `tls-${process.pid}`;
    await must(cp().kubectl(['create', 'namespace', ns]));
    const env = { KUBECONFIG: cp().adminKubeconfigPath, POD_NAMESPACE: ns };
    const pairs = new EventEmitter();
    const options = { logger: silentLogger, clock: systemClock, env, onPair: (pair: ServingPair) => pairs.emit('pair', pair), secretSource: secretPairSource };

    const missing = await pairSource({ kind: 'secret', name: 'metrics-tls' }, options);
    await assert.rejects(missing.start(), { code: 'CERTSHARE_BAD_CONFIG', message: /--tls secret:metrics-tls: cannot read the Secret/ });
    await missing.stop();

    const first = await makePair('localhost', Date.now(), DAY);
    await must(cp().kubectl(['apply', '-n', ns, '-f', '-'], { input: secretJson('metrics-tls', first) }));
    const source = await pairSource({ kind: 'secret', name: 'metrics-tls' }, options);
    try {
      assert.equal(serial(await source.start()), serial(first));
      const second = await makePair('localhost', Date.now(), DAY);
      const handed = nextEvent<ServingPair>(pairs, 'pair', () => true, 15_000);
      await must(cp().kubectl(['apply', '-n', ns, '-f', '-'], { input: secretJson('metrics-tls', second) }));
      assert.equal(serial(await handed), serial(second));
    } finally {
      await source.stop();
    }
  });
});
