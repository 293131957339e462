import { CertshareError } from '../errors.ts';

// Go-style durations ("90s", "1h30m", "720h", "250ms"), the format tailscaled's min_validity and
// operators' flags already use.
const UNIT_MS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };
const PART = /(\d+(?:\.\d+)?)(ms|s|m|h|d)/y;

/** `text` in milliseconds; CERTSHARE_BAD_FLAG naming `flag` (the flag or field it came from) otherwise. */
export function parseDuration(text: string, flag = 'duration'): number {
  const input = text.trim();
  if (input === '0') return 0;
  let total = 0;
  let pos = 0;
  while (pos < input.length) {
    PART.lastIndex = pos;
    const match = PART.exec(input);
    if (!match) break;
    total += Number(match[1]) * UNIT_MS[match[2]!]!;
    pos = PART.lastIndex;
  }
  if (input.length === 0 || pos !== input.length) {
    throw new CertshareError('CERTSHARE_BAD_FLAG', { flag, rule: `invalid duration "${text}" (examples: 90s, 5m, 24h, 1h30m)` });
  }
  return Math.round(total);
}

/** Formats milliseconds as a Go duration string, as the LocalAPI's min_validity expects (whole seconds). */
export function formatGoDuration(ms: number): string {
  const seconds = Math.max(0, Math.ceil(ms / 1000));
  const h = Math.floor(seconds / 3600);
  const m = Math.floor((seconds % 3600) / 60);
  const s = seconds % 60;
  if (h) return `${h}h${m}m${s}s`;
  if (m) return `${m}m${s}s`;
  return `${s}s`;
}
