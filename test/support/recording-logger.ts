import { EventEmitter } from 'node:events';
import type { Logger } from '../../src/core/ports/logger.ts';

export interface LogEntry {
  level: 'debug' | 'info' | 'warn' | 'error';
  msg: string | undefined;
  [field: string]: unknown;
}

/** A Logger that keeps every entry (child bindings merged in) and emits `entry` for `until`/`nextEvent`. */
export function recordingLogger(): { logger: Logger; entries: LogEntry[]; events: EventEmitter } {
  const entries: LogEntry[] = [];
  const events = new EventEmitter();
  const make = (bindings: object): Logger => {
    const record = (level: LogEntry['level']) => (obj: object, msg?: string) => {
      const entry = { ...bindings, ...obj, level, msg };
      entries.push(entry);
      events.emit('entry', entry);
    };
    return { debug: record('debug'), info: record('info'), warn: record('warn'), error: record('error'), child: (more) => make({ ...bindings, ...more }) };
  };
  return { logger: make({}), entries, events };
}
