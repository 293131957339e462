import { pino } from 'pino';
import type { Logger } from '../core/logger.ts';

/** JSON lines on stdout. Key material never reaches a log call; the redaction is a second line of defence. */
export function createLogger(level: string, name = 'certshare'): Logger {
  return pino({
    name,
    level,
    base: { pid: process.pid },
    timestamp: pino.stdTimeFunctions.isoTime,
    formatters: { level: (label) => ({ level: label }) },
    redact: { paths: ['keyPem', '*.keyPem', 'pair', '*.pair', 'key', '*.key'], censor: '[redacted]' },
  });
}
