import { EventsV1Api, setHeaderOptions, PatchStrategy, V1MicroTime } from './transport/client-node.ts';
import type { Clock } from '../core/ports/clock.ts';
import type { Logger } from '../core/ports/logger.ts';
import { apiErrorCode, apiErrorText, type KubeConnection } from './connection.ts';
import { makeApi, withSignal } from './transport/https-transport.ts';

/** The reportingController of every Event certshare records. @forTests */
export const REPORTING_CONTROLLER = 'certshare.io/certshare';

/** One occurrence to record. */
export interface EventOccurrence {
  type: 'Normal' | 'Warning';
  /** A reason of the documented set (pod-events.ts EVENT_REASONS). */
  reason: string;
  /** What certshare did or was doing (events.k8s.io `action`). */
  action: string;
  /** The human text (at most 1 kB). The API keeps an Event's note immutable: a series shows the first one. */
  note: string;
  /**
   * What makes two occurrences the same beside reason and action (e.g. the domain and failure kind): the
   * note itself usually holds a changing time (the next retry), so it cannot be the key as in client-go.
   */
  key: string;
  /**
   * Another object of the namespace the Event is about (the domain Secret the writer stored), instead of
   * the Pod; the Pod is then the Event's `related` object, so `kubectl describe secret` names who wrote it.
   */
  about?: { kind: 'Secret'; name: string };
}

interface EventRecorderOptions {
  connection: KubeConnection;
  /** The Pod the Events are about; `uid` (downward API metadata.uid) lets `kubectl describe pod` find them. */
  regarding: { name: string; uid?: string | undefined };
  /** reportingInstance: this replica (the Pod name). */
  instance: string;
  clock: Clock;
  logger: Logger;
  /** An occurrence not recorded: the queue was full, or the API refused or did not answer. */
  onDropped?: () => void;
  /** Requests waiting to be sent at most (default 32); beyond, occurrences are dropped. */
  queueLimit?: number;
  /** A repeat within this time of the last one updates the same Event's series (default 10 min). */
  seriesWindowMs?: number;
}

/** The Pod the Events are about: POD_NAME, and POD_UID (downward API metadata.uid), by which `kubectl describe pod` selects them. */
interface PodEventSettings {
  podName: string;
  podUid: string | undefined;
}

/** Events about the Pod, reported as this replica (its Pod name). */
export function podEventRecorder(
  settings: PodEventSettings,
  connection: KubeConnection,
  deps: { clock: Clock; logger: Logger; onDropped: () => void },
): EventRecorder {
  return new EventRecorder({
    connection,
    regarding: { name: settings.podName, uid: settings.podUid },
    instance: settings.podName,
    clock: deps.clock,
    logger: deps.logger.child({ component: 'events' }),
    onDropped: deps.onDropped,
  });
}

/** An Event created for a key, and what it has seen since. */
interface Series {
  /** The Event's name once created (undefined while its create is queued or in flight). */
  name: string | undefined;
  count: number;
  lastAt: number;
  occurrence: EventOccurrence;
  /** A request for this series is queued: a repeat updates the series in place rather than queueing another. */
  queued: boolean;
}

/** events.k8s.io MicroTime: serialized as RFC 3339 with six fractional digits, which the API requires. */
const microTime = (ms: number): V1MicroTime => new V1MicroTime(ms);
/** The API's bound on a note. */
const NOTE_LIMIT = 1024;

/**
 * Records events.k8s.io/v1 Events about the Pod, aggregated like client-go's recorder: a repeat of the
 * same (reason, action, key) within the series window increments the Event's `series` by a merge patch
 * instead of creating another, so a storm of one failure is one Event with a count. record() never blocks
 * and never throws: requests go through a bounded queue sent one at a time, each bounded by the
 * connection's request timeout and cancelled by stop(); what cannot be sent is dropped and counted.
 */
export class EventRecorder {
  readonly #o: EventRecorderOptions;
  readonly #api: EventsV1Api;
  readonly #series = new Map<string, Series>();
  readonly #queue: Series[] = [];
  readonly #stop = new AbortController();
  #draining: Promise<void> | undefined;
  #sequence = 0;
  #stopping = false;

  constructor(options: EventRecorderOptions) {
    this.#o = options;
    this.#api = makeApi(options.connection.config, EventsV1Api, options.connection.requestTimeoutMs);
  }

  record(occurrence: EventOccurrence): void {
    if (this.#stopping) return;
    const now = this.#o.clock.now();
    const about = occurrence.about ? `${occurrence.about.kind}/${occurrence.about.name}` : '';
    const key = `${occurrence.reason}\u0000${occurrence.action}\u0000${occurrence.key}\u0000${about}`;
    const windowMs = this.#o.seriesWindowMs ?? 600_000;
    const known = this.#series.get(key);
    if (known && now - known.lastAt < windowMs) {
      known.count++;
      known.lastAt = now;
      // Queued already (its create or a patch): that request sends the latest count.
      if (!known.queued) this.#enqueue(known);
      return;
    }
    this.#forgetOlderThan(now - windowMs);
    const series: Series = { name: undefined, count: 1, lastAt: now, occurrence, queued: false };
    this.#series.set(key, series);
    if (!this.#enqueue(series)) this.#series.delete(key);
  }

  /** Resolves once the queue is empty and no request is in flight. */
  async idle(): Promise<void> {
    while (this.#draining) await this.#draining;
  }

  /**
   * Sends what is queued until `flush` aborts (none: not at all), then cancels the request in flight and
   * drops the rest. Records nothing more from the call on.
   */
  async stop(flush?: AbortSignal): Promise<void> {
    const draining = this.#draining;
    this.#stopping = true;
    if (flush && draining && !flush.aborted) {
      await Promise.race([draining, new Promise((resolve) => flush.addEventListener('abort', resolve, { once: true }))]);
    }
    this.#stop.abort();
    this.#queue.length = 0;
    await this.idle();
  }

  #enqueue(series: Series): boolean {
    if (this.#queue.length >= (this.#o.queueLimit ?? 32)) {
      this.#o.onDropped?.();
      return false;
    }
    series.queued = true;
    this.#queue.push(series);
    this.#startDraining();
    return true;
  }

  #startDraining(): void {
    if (this.#draining) return;
    this.#draining = this.#drain().finally(() => {
      this.#draining = undefined;
      // Queued between the loop's last look and here.
      if (this.#queue.length > 0 && !this.#stop.signal.aborted) this.#startDraining();
    });
  }

  async #drain(): Promise<void> {
    for (let series = this.#queue.shift(); series; series = this.#queue.shift()) {
      series.queued = false;
      try {
        await this.#send(series);
      } catch (err) {
        // A series the API does not know (its create failed, the Event expired) starts again next time.
        for (const [key, s] of this.#series) if (s === series) this.#series.delete(key);
        if (this.#stop.signal.aborted) return;
        this.#o.onDropped?.();
        this.#o.logger.warn(
          { reason: series.occurrence.reason, err: apiErrorText(err), code: apiErrorCode(err) },
          'could not record a Kubernetes Event; dropped',
        );
      }
    }
  }

  async #send(series: Series): Promise<void> {
    const { connection, regarding, instance } = this.#o;
    const { type, reason, action, note, about } = series.occurrence;
    const count = series.count;
    const repeats = count > 1 ? { series: { count, lastObservedTime: microTime(series.lastAt) } } : {};
    const signal = this.#stop.signal;
    if (series.name === undefined) {
      // client-go's naming: the object's name and a timestamp in hex (a sequence keeps two in a millisecond apart);
      // the name cut so that a long domain still leaves a valid object name (at most 253 characters).
      const stamp = (BigInt(this.#o.clock.now()) * 1_000_000n + BigInt(this.#sequence++ % 1_000_000)).toString(16);
      const name = `${(about?.name ?? regarding.name).slice(0, 253 - stamp.length - 1).replace(/[.-]+$/, '')}.${stamp}`;
      const pod = {
        apiVersion: 'v1',
        kind: 'Pod',
        namespace: connection.namespace,
        name: regarding.name,
        ...(regarding.uid ? { uid: regarding.uid } : {}),
      };
      await this.#api.createNamespacedEvent(
        {
          namespace: connection.namespace,
          body: {
            apiVersion: 'events.k8s.io/v1',
            kind: 'Event',
            metadata: { name, namespace: connection.namespace },
            eventTime: microTime(series.lastAt),
            reportingController: REPORTING_CONTROLLER,
            reportingInstance: instance.slice(0, 128),
            type,
            reason,
            action,
            ...(about
              ? { regarding: { apiVersion: 'v1', kind: about.kind, namespace: connection.namespace, name: about.name }, related: pod }
              : { regarding: pod }),
            note: note.slice(0, NOTE_LIMIT),
            ...repeats,
          },
        },
        withSignal(signal),
      );
      series.name = name;
    } else {
      await this.#api.patchNamespacedEvent(
        // Only the series: the API refuses a change of the note (or any other field) of an Event.
        { name: series.name, namespace: connection.namespace, body: repeats },
        withSignal(signal, setHeaderOptions('Content-Type', PatchStrategy.MergePatch)),
      );
    }
  }

  #forgetOlderThan(cutoff: number): void {
    if (this.#series.size < 256) return;
    for (const [key, s] of this.#series) if (s.lastAt < cutoff && !s.queued) this.#series.delete(key);
  }
}
