// The wait for a Tailscale Service's domain (control grants it only to the Service's hosts: the emulator's
// serviceHosts rule) as `kubectl describe pod` shows it through the real kube-apiserver: one Warning Event
// ServiceDomainWait per wait, with the reason docs/tailscale-services.md names, recorded with the replica's
// own bound token (the admission policies admit its Events only).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { useControlPlane } from '../harness/use-control-plane.ts';
import { DAY, makePair } from '../support/certs.ts';
import { KUBE_DOMAIN, createGatedPod, exampleNamespace, podUid, must, startReplica } from '../support/kube.ts';
import { about, watchEvents } from '../support/kube-events.ts';
import { useTempDir } from '../support/standalone.ts';
import { startTlsProxy } from '../support/tls-proxy.ts';
import { onEvent, until } from '../support/wait.ts';

const cp = useControlPlane();
const SERVICE = 'svc:proxy';
const REASON = `waiting for control to grant this node the domain of ${SERVICE}`;

describe('ServiceDomainWait through a real kube-apiserver', () => {
  const dir = useTempDir();

  it('one Warning Event per wait, with the reason the docs name; the bootstrap ends it, and no second one follows', async () => {
    const ns = await exampleNamespace(cp());
    await createGatedPod(cp(), ns, 'proxy-0');
    const watch = watchEvents(cp(), ns);
    // An expired leaf served: nothing valid for the name, so advertising to obtain the domain costs no client anything.
    const proxy = await startTlsProxy(await makePair(KUBE_DOMAIN, Date.now() - 2 * DAY, DAY));
    const replica = await startReplica(cp(), ns, dir(), 'proxy-0', {
      mode: 'rw',
      env: { POD_UID: await podUid(cp(), ns, 'proxy-0') },
      emulator: { serviceHosts: { domains: [KUBE_DOMAIN] } },
      flags: [
        `--served-check=127.0.0.1:${proxy.port}`,
        '--served-check-interval=1s',
        '--served-check-timeout=500ms',
        `--advertise-services=${SERVICE}`,
        '--advertise-failover=100ms',
        '--advertise-bootstrap',
      ],
    });
    try {
      await until(
        'ServiceDomainWait on proxy-0, then Issued',
        () => ['ServiceDomainWait', 'Issued'].every((r) => about(watch.events, 'proxy-0', r).length > 0),
        [onEvent(watch.changed, 'change')],
      );
      assert.equal(replica.emulator.stats().issuancesTotal, 1, 'the bootstrap issued once');
      // Several served checks and grants later (withdrawn: the proxy does not serve the new certificate, so
      // control takes the domain back): the wait was one, and so is its Event.
      await until('control took the domain back', () => !replica.emulator.certDomains().includes(KUBE_DOMAIN), [
        onEvent(replica.emulator.events, 'certDomains'),
      ]);
      const waits = about(watch.events, 'proxy-0', 'ServiceDomainWait');
      assert.equal(waits.length, 1, 'one Event for the wait');
      assert.equal(waits[0]!.type, 'Warning');
      assert.equal(waits[0]!.series, undefined, 'recorded once, not repeated');
      assert.match(waits[0]!.note ?? '', new RegExp(`^${KUBE_DOMAIN.replaceAll('.', '\\.')}: ${REASON} \\(with --advertise-bootstrap`));

      const described = await must(cp().kubectl(['-n', ns, 'describe', 'pod', 'proxy-0']));
      assert.match(described.slice(described.indexOf('\nEvents:')), new RegExp(`Warning\\s+ServiceDomainWait\\s+.*${REASON}`), described);
    } finally {
      watch.close();
      await replica.stop();
      await proxy.close();
    }
  });
});
