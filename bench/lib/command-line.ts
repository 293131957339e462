// Command lines of the project's scripts (the bench, the chaos run, the end-to-end tier, the test cluster),
// on certshare's own flag system (src/flags/flags.ts) without its environment variables: --help prints the
// usage, an unknown or malformed flag prints one line and the way to the usage, and exits 2 (no stack trace).
import { errorMessage } from '../../src/core/errors.ts';
import { type FlagSpec, type FlagValues, parseFlags, usage } from '../../src/flags/flags.ts';

export interface CommandLine {
  /** Its name, before its error messages (e.g. `bench`, `chaos`). */
  name: string;
  /** How the script is run, for the usage's first line (e.g. `npm run bench --`). */
  invocation: string;
  summary: string;
  /** A script's flags need no group: its usage lists them in one section. */
  flags: ScriptFlag[];
}

export type ScriptFlag = Omit<FlagSpec, 'group'> & { group?: string };

/** Parses `argv`; prints the usage and exits 0 on --help; prints the error and exits 2 on a bad flag. */
export function parseScriptArgs(script: CommandLine, argv: string[] = process.argv.slice(2)): FlagValues {
  let values: FlagValues;
  try {
    values = parseFlags(specsOf(script), argv, {});
  } catch (err) {
    exitWithUsageError(script, errorMessage(err));
  }
  if (values.help) {
    process.stdout.write(`${usage('', script.summary, specsOf(script), { invocation: script.invocation, fromEnv: false })}\n`);
    process.exit(0);
  }
  return values;
}

function specsOf(script: CommandLine): FlagSpec[] {
  return script.flags.map((flag) => ({ ...flag, group: flag.group ?? '' }));
}

/** A flag's value that the parser accepted but the script cannot use: the same answer as an unknown flag. */
export function exitWithUsageError(script: CommandLine, message: string): never {
  process.stderr.write(`${script.name}: ${message}\nRun "${script.invocation} --help" for the flags.\n`);
  process.exit(2);
}

/** A number flag (`--name N`, `fallback` when absent) checked by `valid`, or the usage error saying what it wants. */
export function numberFlag(script: CommandLine, values: FlagValues, name: string, fallback: number, wants: string, valid: (n: number) => boolean): number {
  const given = values[name];
  const n = given === undefined ? fallback : Number(given);
  if (!valid(n)) exitWithUsageError(script, `--${name} wants ${wants}, got "${String(given)}"`);
  return n;
}
