// Who writes in this cluster: with --mode auto the holder of the group's Lease (elected by lease-elector.ts), else
// --mode says (rw, ro). The writer gauge and the Pod's Events follow the role as it changes.
import { staticRole, type IssuanceRole, type ShareMode } from '../core/ports/store.ts';
import type { Clock } from '../core/ports/clock.ts';
import type { Logger } from '../core/ports/logger.ts';
import type { KubeConnection } from './connection.ts';
import type { KubeMetrics } from './kube-metrics.ts';
import { LeaseElector, leaseIdentity } from './lease-elector.ts';
import { reportOutOfBounds, type PodEvents } from './pod-events.ts';

/** --mode, and with --mode auto the group whose Lease elects the writer and how long a holder keeps it without renewing. */
interface WriterSettings {
  mode: ShareMode;
  group: string | undefined;
  leaseDurationMs: number;
}

/** This cluster's role, and its elector with --mode auto (started and stopped by Kubernetes mode). */
export function localWriterRole(
  settings: WriterSettings,
  connection: KubeConnection,
  identity: string,
  deps: { clock: Clock; logger: Logger; metrics: KubeMetrics; podEvents: PodEvents | undefined },
): { elector: LeaseElector | undefined; localRole: IssuanceRole } {
  const { metrics, podEvents } = deps;
  if (settings.mode !== 'auto') {
    metrics.writer.set(settings.mode === 'rw' ? 1 : 0);
    return { elector: undefined, localRole: staticRole(identity, settings.mode === 'rw') };
  }
  // --mode auto: the writer elected with the group's Lease (`certshare-<group>`); validateConfig: it has a group.
  const lease = { name: `certshare-${settings.group!}`, identity: leaseIdentity(identity), leaseDurationMs: settings.leaseDurationMs };
  const elector = new LeaseElector(lease, {
    connection,
    clock: deps.clock,
    logger: deps.logger.child({ component: 'lease' }),
    onLeadershipChange: (leader) => {
      metrics.writer.set(leader ? 1 : 0);
      podEvents?.writer(leader);
    },
    onOutOfBounds: reportOutOfBounds(metrics, podEvents),
  });
  return { elector, localRole: elector };
}
