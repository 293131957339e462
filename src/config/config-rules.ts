// The one form of a command's configuration rules, for `run` (run-options.ts validateConfig) and `injector`
// (injector-options.ts validateInjectorConfig): each value's syntax is checked where it is parsed, every rule
// that relates values stands in the command's table, and the first broken one is CERTSHARE_BAD_FLAG (exit 2)
// before anything starts, as Tailscale's containerboot settings.validate() does.
import { CertshareError } from '../core/errors.ts';

/** A rule of the configuration: broken, the flag it is about, and what the rule says (to mend it). */
export type ConfigRule = [broken: boolean, flag: string, rule: () => string];

/** The first broken rule of a table, in its order, or undefined when all hold. */
export function firstBroken(rules: readonly ConfigRule[]): { flag: string; rule: string } | undefined {
  const broken = rules.find(([isBroken]) => isBroken);
  return broken && { flag: broken[1], rule: broken[2]() };
}

/** A value its flag does not take. */
export function badFlag(flag: string, rule: string): CertshareError {
  return new CertshareError('CERTSHARE_BAD_FLAG', { flag, rule });
}
