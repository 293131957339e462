import { spawn } from 'node:child_process';
import { EventEmitter } from 'node:events';
import { join } from 'node:path';
import type { ControlPlane } from '../harness/control-plane.ts';

/** An events.k8s.io/v1 Event as the tests read it. */
export interface RecordedEvent {
  metadata: { name: string };
  reason: string;
  type: string;
  note?: string;
  reportingController?: string;
  series?: { count: number; lastObservedTime: string };
  regarding: { kind: string; name: string; uid?: string };
  related?: { kind: string; name: string; uid?: string };
}

/** Follows the namespace's Events (kubectl get --watch): the latest state of each, by name. */
export function watchEvents(cp: ControlPlane, ns: string): { events: Map<string, RecordedEvent>; changed: EventEmitter; close(): void } {
  const child = spawn(
    join(cp.binDir, 'kubectl'),
    ['--kubeconfig', cp.adminKubeconfigPath, '-n', ns, 'get', 'events.v1.events.k8s.io', '--watch', '-o', 'json', '--output-watch-events=false'],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  const events = new Map<string, RecordedEvent>();
  const changed = new EventEmitter();
  void (async () => {
    let buffer = '';
    for await (const chunk of child.stdout!) {
      buffer += String(chunk);
      // kubectl prints one pretty JSON document per change; a document ends with a "}" line.
      for (let end = buffer.indexOf('\n}\n'); end !== -1; end = buffer.indexOf('\n}\n')) {
        const doc = JSON.parse(buffer.slice(0, end + 2)) as RecordedEvent | { kind: 'List'; items: RecordedEvent[] };
        buffer = buffer.slice(end + 3);
        for (const event of 'items' in doc ? doc.items : [doc]) events.set(event.metadata.name, event);
        changed.emit('change');
      }
    }
  })();
  return { events, changed, close: () => child.kill() };
}

export const about = (events: Map<string, RecordedEvent>, pod: string, reason?: string): RecordedEvent[] =>
  [...events.values()].filter((e) => e.regarding.name === pod && (reason === undefined || e.reason === reason));
