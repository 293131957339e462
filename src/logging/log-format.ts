// Readable log lines for a person at a terminal. JSON lines stay the default wherever stdout is not a
// TTY (Kubernetes, CI, every test): this only reshapes the line pino already serialised, after its
// redaction, so it needs no dependency of its own (pino-pretty would bring a dozen into the image).
import { CertshareError } from '../core/errors.ts';
import type { FlagSpec } from '../flags/flags.ts';

/** --log-format: JSON lines, readable lines, or readable only when stdout is a terminal. */
export type LogFormat = 'json' | 'pretty' | 'auto';

const LOG_FORMATS: readonly LogFormat[] = ['json', 'pretty', 'auto'];

/** The log levels of every command that logs with certshare's logger (run, demo, injector, the injected sidecar). */
export const LOG_LEVELS = ['debug', 'info', 'warn', 'error'] as const;

type LogLevel = (typeof LOG_LEVELS)[number];

/** The levels as a message names them: `debug, info, warn or error`. */
export const LOG_LEVELS_TEXT = `${LOG_LEVELS.slice(0, -1).join(', ')} or ${LOG_LEVELS.at(-1)}`;

export function isLogLevel(text: string): text is LogLevel {
  return (LOG_LEVELS as readonly string[]).includes(text);
}

/** The logging flags of every long-running command (run, demo, injector): one definition. */
export const LOG_FLAGS = [
  { name: 'log-level', group: 'serving and logs', placeholder: 'LEVEL', default: 'info', help: `${LOG_LEVELS_TEXT}.` },
  {
    name: 'log-format',
    group: 'serving and logs',
    placeholder: 'json|pretty|auto',
    default: 'auto',
    help: 'json (an object a line), pretty ("time LEVEL message key=value"), auto (pretty on a tty).',
  },
] as const satisfies readonly FlagSpec[];

export function logFormatFrom(values: { 'log-format': string }): LogFormat {
  const format = values['log-format'];
  if (!(LOG_FORMATS as readonly string[]).includes(format))
    throw new CertshareError('CERTSHARE_BAD_FLAG', { flag: '--log-format', rule: `must be ${LOG_FORMATS.join(', ')}, got "${format}"` });
  return format as LogFormat;
}

/** Whether a logger of this format writes pretty lines: auto decides by whether stdout is a terminal. */
export function writesPretty(format: LogFormat, stdoutIsTty: boolean): boolean {
  return format === 'pretty' || (format === 'auto' && stdoutIsTty);
}

/** Envelope fields a person does not need on each line (the time and level lead the line instead). */
const HIDDEN = new Set(['time', 'level', 'msg', 'pid', 'hostname', 'name']);
/** The fields that matter, in this order, before any other; the rest follow as logged. */
const FIRST = ['component', 'domain', 'code', 'status', 'reason', 'serial', 'notAfter', 'retryInMs', 'nextCheck', 'err'];
/** A third line of defence after "key material never reaches a log call" and pino's redact paths. */
const PRIVATE_KEY = /-----BEGIN [A-Z ]*PRIVATE KEY-----/;
/** A string holding any of these is quoted, so `key=value` pairs stay splittable. */
const BARE_STRING_BREAKERS = /[\s"=]/;
/** Longer values (a nested object, a response body) are cut: the JSON format keeps them whole. */
const MAX_VALUE = 120;

/** One pino JSON line (with or without its newline) as `HH:MM:SS.mmm LEVEL message key=value ...` and a newline. */
export function prettyLine(jsonLine: string): string {
  let entry: Record<string, unknown>;
  try {
    entry = JSON.parse(jsonLine) as Record<string, unknown>;
  } catch {
    return jsonLine.endsWith('\n') ? jsonLine : `${jsonLine}\n`;
  }
  if (entry === null || typeof entry !== 'object') return `${jsonLine.trimEnd()}\n`;
  const time = typeof entry.time === 'string' ? entry.time.slice(11, 23) : '';
  const level = String(entry.level ?? '')
    .toUpperCase()
    .padEnd(5);
  const keys = [...FIRST.filter((k) => k in entry), ...Object.keys(entry).filter((k) => !FIRST.includes(k))];
  const fields = keys.filter((k) => !HIDDEN.has(k) && entry[k] !== undefined).map((k) => `${k}=${fieldValue(k, entry[k])}`);
  const message = oneLine(typeof entry.msg === 'string' ? entry.msg : '');
  return `${[time, level, message, ...fields].filter((part) => part !== '').join(' ')}\n`;
}

function fieldValue(key: string, value: unknown): string {
  // pino's err serializer gives { type, message, stack, code?... }: the message (and code) is what a person reads.
  if (key === 'err' && value !== null && typeof value === 'object') {
    const err = value as { message?: unknown; code?: unknown };
    const text = typeof err.message === 'string' ? err.message : JSON.stringify(value);
    return quoted(typeof err.code === 'string' ? `${err.code}: ${text}` : text, BARE_STRING_BREAKERS);
  }
  if (typeof value === 'string') return quoted(value, BARE_STRING_BREAKERS);
  // Numbers, booleans and nested objects as compact JSON, quoted only when they hold white space.
  return quoted(JSON.stringify(value), /\s/);
}

function quoted(text: string, needsQuotes: RegExp): string {
  if (PRIVATE_KEY.test(text)) return '[redacted]';
  const cut = text.length > MAX_VALUE ? `${text.slice(0, MAX_VALUE - 1)}…` : text;
  return cut === '' || needsQuotes.test(cut) ? JSON.stringify(cut) : cut;
}

/** A line per entry: a message with newlines keeps them escaped. */
function oneLine(text: string): string {
  return PRIVATE_KEY.test(text) ? '[redacted]' : text.replace(/\r?\n/g, '\\n');
}
