// The one flag system of every command (certshare run, demo, injector, emulator; the project's scripts through
// scripts/lib/command-line.ts): a table of FlagSpecs, parsed with the environment behind the flags, and the usage
// --help prints from the same table.
import { parseArgs } from 'node:util';
import { parseDuration } from '../core/duration.ts';
import { CertshareError } from '../core/errors.ts';

/** One command-line flag; every flag also reads `CERTSHARE_<NAME>` from the environment, flags win. */
export interface FlagSpec {
  name: string;
  help: string;
  default?: string;
  /** Repeatable: the flag may be given several times; the environment variable is comma separated. */
  multiple?: boolean;
  boolean?: boolean;
  /** Extra environment variables honoured after CERTSHARE_<NAME> (e.g. TS_CERT_SHARE_MODE). */
  aliasesEnv?: string[];
  placeholder?: string;
}

export type FlagValues = Record<string, string | string[] | boolean | undefined>;

export function envName(flag: string): string {
  return `CERTSHARE_${flag.toUpperCase().replaceAll('-', '_')}`;
}

/** Parses argv against the spec, then fills gaps from the environment and the defaults. */
export function parseFlags(specs: FlagSpec[], argv: string[], env: NodeJS.ProcessEnv): FlagValues {
  const options: Record<string, { type: 'string' | 'boolean'; multiple?: boolean; short?: string }> = { help: { type: 'boolean', short: 'h' } };
  for (const spec of specs) options[spec.name] = { type: spec.boolean ? 'boolean' : 'string', multiple: spec.multiple ?? false };
  let values: Record<string, unknown>;
  try {
    ({ values } = parseArgs({ args: argv, options, strict: true, allowPositionals: false }));
  } catch (err) {
    throw new CertshareError('CERTSHARE_BAD_FLAG', (err as Error).message.split('\n')[0]!);
  }
  const result: FlagValues = { help: values.help as boolean | undefined };
  for (const spec of specs) {
    let value = values[spec.name] as string | string[] | boolean | undefined;
    if (value === undefined) {
      const fromEnv = [envName(spec.name), ...(spec.aliasesEnv ?? [])].map((n) => env[n]).find((v) => v !== undefined && v !== '');
      if (fromEnv !== undefined) {
        value = spec.boolean
          ? /^(1|true|yes)$/i.test(fromEnv)
          : spec.multiple
            ? fromEnv
                .split(',')
                .map((s) => s.trim())
                .filter(Boolean)
            : fromEnv;
      }
    }
    if (value === undefined && spec.default !== undefined) value = spec.multiple ? [spec.default] : spec.default;
    result[spec.name] = value;
  }
  return result;
}

/** A Go-style duration flag in milliseconds; CERTSHARE_BAD_FLAG naming the flag otherwise. */
export function duration(values: FlagValues, name: string): number {
  try {
    return parseDuration(String(values[name]));
  } catch (err) {
    throw new CertshareError('CERTSHARE_BAD_FLAG', `--${name}: ${(err as Error).message}`);
  }
}

export interface UsageOptions {
  /** What the first line runs (default `certshare COMMAND`). */
  invocation?: string;
  /** Whether the flags were parsed with the environment (default true): the usage then names each variable. */
  fromEnv?: boolean;
}

export function usage(command: string, summary: string, specs: FlagSpec[], options: UsageOptions = {}): string {
  const fromEnv = options.fromEnv ?? true;
  const lines = [
    `Usage: ${options.invocation ?? `certshare ${command}`} [flags]`,
    '',
    summary,
    '',
    fromEnv ? 'Flags (each also read from the environment variable shown; flags win):' : 'Flags:',
  ];
  for (const spec of specs) {
    const arg = spec.boolean ? '' : ` ${spec.placeholder ?? 'VALUE'}`;
    lines.push(`  --${spec.name}${arg}${spec.multiple ? ' (repeatable)' : ''}`);
    const extra = fromEnv ? [`env ${envName(spec.name)}${spec.multiple ? ' (comma separated)' : ''}`, ...(spec.aliasesEnv ?? []).map((e) => `or ${e}`)] : [];
    if (spec.default !== undefined) extra.push(`default ${spec.default}`);
    lines.push(`      ${spec.help}${extra.length > 0 ? ` [${extra.join(', ')}]` : ''}`);
  }
  lines.push('  -h, --help', '      Show this help.');
  return lines.join('\n');
}
