// The one flag system of every command (certshare run, demo, injector, emulator; the project's scripts through
// bench/lib/command-line.ts): a table of FlagSpecs, parsed with the environment behind the flags, the usage
// --help prints by group from the same table, and the reference page docs/configuration.md (scripts/docs.ts).
import { parseArgs } from 'node:util';
import { parseDuration } from '../core/values/duration.ts';
import { CertshareError } from '../core/errors.ts';

/** One command-line flag; every flag also reads `CERTSHARE_<NAME>` from the environment, flags win. */
export interface FlagSpec<Group extends string = string> {
  name: string;
  /** What --help prints under the flag's group: the task it belongs to. Required, so a new flag has a place. */
  group: Group;
  /** One line: what the flag does. */
  help: string;
  /** The rest (rules, trade-offs, examples), for docs/configuration.md only. */
  detail?: string;
  default?: string;
  /** Repeatable: the flag may be given several times; the environment variable is comma separated. */
  multiple?: boolean;
  boolean?: boolean;
  /** A requirement this flag meets, alone or with others of the same text (e.g. `one of --domain or --serve-config`). */
  required?: string;
  /** Extra environment variables honoured after CERTSHARE_<NAME> (e.g. TS_CERT_SHARE_MODE). */
  aliasesEnv?: readonly string[];
  placeholder?: string;
}

/** The value parsing gives a flag: a boolean, a list (repeatable), or a string, defined whenever the flag has a default. */
type ValueOf<F extends FlagSpec> = string extends F['name']
  ? string | string[] | boolean | undefined
  : F['boolean'] extends true
    ? boolean | undefined
    : F['multiple'] extends true
      ? F['default'] extends string
        ? string[]
        : string[] | undefined
      : F['default'] extends string
        ? string
        : string | undefined;

/** The parsed values of a flag table, typed by the table (declare it `as const satisfies readonly FlagSpec[]`). */
export type FlagValues<Specs extends readonly FlagSpec[] = readonly FlagSpec[]> = { help?: boolean } & {
  [F in Specs[number] as F['name']]: ValueOf<F>;
};

export function envName(flag: string): string {
  return `CERTSHARE_${flag.toUpperCase().replaceAll('-', '_')}`;
}

/** Parses argv against the spec, then fills gaps from the environment and the defaults. */
export function parseFlags<const Specs extends readonly FlagSpec[]>(specs: Specs, argv: string[], env: NodeJS.ProcessEnv): FlagValues<Specs> {
  const options: Record<string, { type: 'string' | 'boolean'; multiple?: boolean; short?: string }> = { help: { type: 'boolean', short: 'h' } };
  for (const spec of specs) options[spec.name] = { type: spec.boolean ? 'boolean' : 'string', multiple: spec.multiple ?? false };
  let values: Record<string, string | string[] | boolean | undefined>;
  try {
    // The options above say which flag is a boolean, a string or a list of strings.
    values = parseArgs({ args: argv, options, strict: true, allowPositionals: false }).values as typeof values;
  } catch (err) {
    throw new CertshareError('CERTSHARE_BAD_FLAG', { flag: 'the command line', rule: (err as Error).message.split('\n')[0]! });
  }
  const result: Record<string, string | string[] | boolean | undefined> = { help: values.help };
  for (const spec of specs) result[spec.name] = values[spec.name] ?? fromEnv(spec, env) ?? defaultOf(spec);
  // The table's types say what each entry holds: a default makes a value defined, multiple a list, boolean a boolean.
  return result as FlagValues<Specs>;
}

function fromEnv(spec: FlagSpec, env: NodeJS.ProcessEnv): string | string[] | boolean | undefined {
  const text = [envName(spec.name), ...(spec.aliasesEnv ?? [])].map((n) => env[n]).find((v) => v !== undefined && v !== '');
  if (text === undefined) return undefined;
  if (spec.boolean) return /^(1|true|yes)$/i.test(text);
  if (!spec.multiple) return text;
  return text
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
}

function defaultOf(spec: FlagSpec): string | string[] | undefined {
  if (spec.default === undefined) return undefined;
  return spec.multiple ? [spec.default] : spec.default;
}

/** A Go-style duration flag in milliseconds; CERTSHARE_BAD_FLAG naming the flag otherwise. */
export function duration<Values extends object>(values: Values, name: keyof Values & string): number {
  return parseDuration(String(values[name]), `--${name}`);
}

interface UsageOptions {
  /** What the first line runs (default `certshare COMMAND`). */
  invocation?: string;
  /** Whether the flags were parsed with the environment (default true): the usage then names each variable. */
  fromEnv?: boolean;
  /** The order of the groups; a group not named here follows, in the order of its first flag. */
  groups?: readonly string[];
  /** One command line that works, printed last. */
  example?: string;
}

/** The groups of a table in order: those of `order` first, then the rest as their first flag comes. */
export function groupsOf(specs: readonly FlagSpec[], order: readonly string[] = []): Array<[group: string, specs: FlagSpec[]]> {
  const names = [...new Set([...order, ...specs.map((s) => s.group)])];
  return names.map((g): [string, FlagSpec[]] => [g, specs.filter((s) => s.group === g)]).filter(([, members]) => members.length > 0);
}

/** The requirements of a table, each once (`one of --domain or --serve-config`). */
export function requirementsOf(specs: readonly FlagSpec[]): string[] {
  return [...new Set(specs.flatMap((s) => (s.required ? [s.required] : [])))];
}

/** `--name PLACEHOLDER`, as a flag is written. */
export function flagSyntax(spec: FlagSpec): string {
  return `--${spec.name}${spec.boolean ? '' : ` ${spec.placeholder ?? 'VALUE'}`}`;
}

export function usage(command: string, summary: string, specs: readonly FlagSpec[], options: UsageOptions = {}): string {
  const fromEnv = options.fromEnv ?? true;
  const lines = [`Usage: ${options.invocation ?? `certshare ${command}`} [flags]`, '', summary];
  const required = requirementsOf(specs);
  if (required.length > 0) lines.push('', `Required: ${required.join('; ')}.`);
  if (fromEnv) lines.push('', 'Each flag is also read from the environment variable shown; flags win.');
  for (const [group, members] of groupsOf(specs, options.groups)) {
    lines.push('', group === '' ? 'Flags:' : `${group}:`);
    for (const spec of members) {
      const marks = [spec.multiple ? 'repeatable' : '', spec.required ? 'required: see above' : ''].filter(Boolean);
      const extra = fromEnv ? [`env ${envName(spec.name)}`, ...(spec.aliasesEnv ?? []).map((e) => `or ${e}`)] : [];
      // An empty default is no default a person can read: it prints nothing.
      if (spec.default) extra.push(`default ${spec.default}`);
      const mark = marks.length > 0 ? ` (${marks.join(', ')})` : '';
      lines.push(`  ${flagSyntax(spec)}${mark}${extra.length > 0 ? `  [${extra.join(', ')}]` : ''}`, `      ${spec.help}`);
    }
  }
  lines.push('', '  -h, --help', '      Show this help.');
  if (options.example) lines.push('', 'Example:', `  ${options.example}`);
  return lines.join('\n');
}

/** A command's --help and its part of docs/configuration.md: one description for both. */
export interface CommandHelp {
  command: string;
  summary: string;
  flags: readonly FlagSpec[];
  groups?: readonly string[];
  /** One command line that works. */
  example: string;
  /** Whether the command reads CERTSHARE_* variables (default true). */
  fromEnv?: boolean;
}

export function commandUsage(help: CommandHelp): string {
  return usage(help.command, help.summary, help.flags, { groups: help.groups, example: help.example, fromEnv: help.fromEnv });
}

/** The flag of that name in a table, read as any flag (a typed table's entries differ in which fields they have). */
export function findFlag(specs: readonly FlagSpec[], name: string): FlagSpec | undefined {
  return specs.find((f) => f.name === name);
}
