// A logger of pino's JSON lines without pino, for the advertise agent: a process of its own beside certshare in
// every Pod that advertises, whose whole job is a file read and a prefs edit now and then. pino and its
// dependencies are most of what its bundle would hold besides its own code (docs/performance.md, the advertise
// agent). The lines are those createLogger (pino-logger.ts) writes, field for field and in the same order
// (test/unit/line-logger.test.ts holds the two to each other), so whatever reads certshare's logs reads these.
import type { Logger } from '../core/ports/logger.ts';
import { iso } from '../core/ports/clock.ts';
import { type LogFormat, prettyLine, writesPretty } from './log-format.ts';

const LEVELS = { debug: 20, info: 30, warn: 40, error: 50 } as const;
type Level = keyof typeof LEVELS;
/** pino-logger.ts's redact paths (keyPem, pair, key and the same one level down), here at any depth: a second line of defence. */
const REDACTED = new Set(['keyPem', 'pair', 'key']);

interface LineSink {
  write(text: string): unknown;
}

/** Values as pino's default serializers give them: an Error as its type, message and stack, any other as JSON has it. */
function replacer(key: string, value: unknown): unknown {
  if (REDACTED.has(key)) return '[redacted]';
  if (value instanceof Error) return { type: value.name, message: value.message, stack: value.stack };
  return value;
}

/** JSON lines on stdout (or `sink`), or readable ones (log-format.ts), at `level` and above. */
export function createLineLogger(level: string, name: string, format: LogFormat = 'json', sink?: LineSink): Logger {
  const out: LineSink = sink ?? process.stdout;
  const pretty = writesPretty(format, process.stdout.isTTY === true);
  const threshold = LEVELS[level as Level] ?? LEVELS.info;
  const make = (bindings: object): Logger => {
    const write = (at: Level, obj: object, text: string | undefined): void => {
      if (LEVELS[at] < threshold) return;
      // As pino: an Error under `err` and no message, its message.
      const err = (obj as { err?: unknown }).err;
      const msg = text ?? (err instanceof Error ? err.message : undefined);
      const entry = { level: at, time: iso(Date.now()), pid: process.pid, name, ...bindings, ...obj, ...(msg === undefined ? {} : { msg }) };
      let line: string;
      try {
        line = JSON.stringify(entry, replacer);
      } catch (err) {
        // A cycle or a BigInt: the message stays, the fields are said to be unserializable.
        line = JSON.stringify({ level: at, time: entry.time, pid: process.pid, name, msg, logError: String(err) });
      }
      out.write(pretty ? prettyLine(line) : `${line}\n`);
    };
    return {
      debug: (obj, msg) => write('debug', obj, msg),
      info: (obj, msg) => write('info', obj, msg),
      warn: (obj, msg) => write('warn', obj, msg),
      error: (obj, msg) => write('error', obj, msg),
      child: (more) => make({ ...bindings, ...more }),
    };
  };
  return make({});
}
