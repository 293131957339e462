// Observing the test control plane: an admin watch of one Secret (raw HTTPS, NDJSON), the apiserver's
// Prometheus counters, and its audit log (who made which request).
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { request } from 'node:https';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { startControlPlane, type ControlPlane } from '../../test/harness/control-plane.ts';
import { progress } from './stats.ts';

export interface WatchEvent {
  /** performance.now() when the event's line arrived. */
  at: number;
  type: string;
  object: { metadata?: { name?: string; resourceVersion?: string; annotations?: Record<string, string> }; data?: Record<string, string> };
}

export interface SecretWatchProbe {
  readonly events: WatchEvent[];
  /** performance.now() when the watch was established, and when close() was called. */
  readonly startedAt: number;
  readonly closedAt: number | undefined;
  /** Ends the watch (the apiserver counts the WATCH request when it ends). */
  close(): void;
}

/** Watches one Secret as admin, with bookmarks, from the current resourceVersion. */
export function watchSecret(cp: ControlPlane, ns: string, name: string, onEvent: (e: WatchEvent) => void = () => {}): Promise<SecretWatchProbe> {
  return watchSecrets(cp, ns, `fieldSelector=${encodeURIComponent(`metadata.name=${name}`)}`, onEvent);
}

/** Watches the Secrets of `ns` matching `selector` (a query string, e.g. `labelSelector=...`) as admin, with bookmarks, from the current resourceVersion. */
export async function watchSecrets(cp: ControlPlane, ns: string, selector: string, onEvent: (e: WatchEvent) => void = () => {}): Promise<SecretWatchProbe> {
  const list = await cp.adminRequest('GET', `/api/v1/namespaces/${ns}/secrets?${selector}`);
  if (list.status !== 200) throw new Error(`list Secrets ${ns} (${selector}): HTTP ${list.status} ${list.body.slice(0, 300)}`);
  const rv = (JSON.parse(list.body) as { metadata: { resourceVersion: string } }).metadata.resourceVersion;
  const events: WatchEvent[] = [];
  const path = `/api/v1/namespaces/${ns}/secrets?watch=1&allowWatchBookmarks=true&timeoutSeconds=3600&${selector}&resourceVersion=${rv}`;
  const req = request(new URL(path, cp.server), {
    ca: cp.caPem,
    cert: cp.adminCertPem,
    key: cp.adminKeyPem,
    agent: false,
    headers: { Accept: 'application/json' },
  });
  await new Promise<void>((resolve, reject) => {
    req.once('error', reject);
    req.once('response', (res) => {
      if (res.statusCode !== 200) {
        reject(new Error(`watch Secrets ${ns} (${selector}): HTTP ${res.statusCode}`));
        res.resume();
        return;
      }
      const lines = createInterface({ input: res, crlfDelay: Infinity });
      // The watch ends when we close it (or the apiserver stops): not an error for the bench.
      lines.on('error', () => {});
      lines.on('line', (line) => {
        const at = performance.now();
        try {
          const parsed = JSON.parse(line) as Omit<WatchEvent, 'at'>;
          const event = { at, type: parsed.type, object: parsed.object };
          events.push(event);
          onEvent(event);
        } catch {
          // not JSON: ignore
        }
      });
      res.on('error', () => {});
      resolve();
    });
    req.end();
  });
  req.on('error', () => {});
  const probe = {
    events,
    startedAt: performance.now(),
    closedAt: undefined as number | undefined,
    close() {
      probe.closedAt ??= performance.now();
      req.destroy();
    },
  };
  return probe;
}

/** The longest time (s) the probe's watch went without an event, from its start to its close (bookmarks break a silence). */
export function longestSilenceS(probe: SecretWatchProbe): number {
  let longest = 0;
  let prev = probe.startedAt;
  for (const at of [...probe.events.map((e) => e.at), probe.closedAt ?? performance.now()]) {
    longest = Math.max(longest, (at - prev) / 1000);
    prev = at;
  }
  return longest;
}

/** Series of one metric family: labels text (`{a="b",...}`) -> value. */
export function metricSeries(text: string, name: string): Map<string, number> {
  const series = new Map<string, number>();
  const prefix = `${name}{`;
  for (const line of text.split('\n')) {
    if (!line.startsWith(prefix)) continue;
    const space = line.lastIndexOf(' ');
    series.set(line.slice(name.length, space), Number(line.slice(space + 1)));
  }
  return series;
}

export function labelsOf(labels: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const m of labels.matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) out[m[1]!] = m[2]!;
  return out;
}

/** Per-series increase from `before` to `after` (a series new in `after` counts from 0); only increases > 0. */
export function seriesDelta(before: Map<string, number>, after: Map<string, number>): Map<string, number> {
  const delta = new Map<string, number>();
  for (const [k, v] of after) {
    const d = v - (before.get(k) ?? 0);
    if (d > 0) delta.set(k, d);
  }
  return delta;
}

export function sum(values: Iterable<number>): number {
  let total = 0;
  for (const v of values) total += v;
  return total;
}

/** An audit policy that records every ServiceAccount request (the replicas are the only ServiceAccount clients) at Metadata level. */
export async function writeAuditPolicy(path: string): Promise<void> {
  await writeFile(
    path,
    [
      'apiVersion: audit.k8s.io/v1',
      'kind: Policy',
      'omitStages: ["RequestReceived"]',
      'rules:',
      '  - level: Metadata',
      '    userGroups: ["system:serviceaccounts"]',
      '  - level: None',
      '',
    ].join('\n'),
  );
}

/** A control plane with the apiserver's audit log on, in `dir` (the API-requests figures count from it). */
export async function startAuditedControlPlane(dir: string, what = 'the control plane'): Promise<{ cp: ControlPlane; auditLog: string }> {
  progress(`starting ${what} (etcd + kube-apiserver; the first run builds them, see test/k8s-binaries)`);
  const auditPolicy = join(dir, 'audit-policy.yaml');
  const auditLog = join(dir, 'audit.log');
  await mkdir(dir, { recursive: true });
  await writeAuditPolicy(auditPolicy);
  const started = await startControlPlane({
    extraApiServerArgs: [`--audit-policy-file=${auditPolicy}`, `--audit-log-path=${auditLog}`, '--audit-log-format=json'],
  });
  return { cp: started, auditLog };
}

export interface AuditEvent {
  auditID: string;
  stage: string;
  verb: string;
  requestURI: string;
  user: { username: string };
  objectRef?: { resource?: string; subresource?: string; namespace?: string; name?: string };
  responseStatus?: { code?: number };
  stageTimestamp: string;
}

export async function readAudit(path: string): Promise<AuditEvent[]> {
  const text = await readFile(path, 'utf8').catch(() => '');
  const events: AuditEvent[] = [];
  for (const line of text.split('\n')) {
    if (!line.startsWith('{')) continue;
    try {
      events.push(JSON.parse(line) as AuditEvent);
    } catch {
      // a partial last line: ignore
    }
  }
  return events;
}

/** Watch renewals per hour implied by open watches: each ends at its timeoutSeconds (the apiserver's 1800-3600 s when absent) and resumes. */
export function watchRenewalsPerHour(openWatchUris: string[]): number {
  let perHour = 0;
  for (const uri of openWatchUris) {
    const timeout = Number(new URL(uri, 'https://x').searchParams.get('timeoutSeconds') ?? NaN);
    perHour += 3600 / (Number.isFinite(timeout) && timeout > 0 ? timeout : 2700);
  }
  return perHour;
}
