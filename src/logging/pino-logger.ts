// The process's logger: pino, JSON lines or readable ones (log-format.ts).
import { pino } from 'pino';
import type { Logger } from '../core/ports/logger.ts';
import { iso } from '../core/ports/clock.ts';
import { prettyLine, writesPretty, type LogFormat } from './log-format.ts';

/** Where a pretty logger's lines go: stdout by default (a test passes a capture). */
interface LineSink {
  write(text: string): unknown;
}

/**
 * JSON lines on stdout, or readable lines (log-format.ts) for a person at a terminal. Key material never
 * reaches a log call; the redaction is a second line of defence, applied before either format.
 */
export function createLogger(level: string, name = 'certshare', format: LogFormat = 'json', sink?: LineSink): Logger {
  const options = {
    name,
    level,
    base: { pid: process.pid },
    // pino.stdTimeFunctions.isoTime's text, without Date's toISOString (iso() says why).
    timestamp: () => `,"time":"${iso(Date.now())}"`,
    formatters: { level: (label: string) => ({ level: label }) },
    redact: { paths: ['keyPem', '*.keyPem', 'pair', '*.pair', 'key', '*.key'], censor: '[redacted]' },
  };
  if (!writesPretty(format, process.stdout.isTTY === true)) return sink ? pino(options, sink) : pino(options);
  // pino's own stdout stream (buffered, flushed on exit), each serialised line reshaped on its way.
  const out = sink ?? pino.destination(1);
  return pino(options, { write: (line: string) => out.write(prettyLine(line)) });
}
