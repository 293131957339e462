import { CertshareError } from '../errors.ts';

// The one check every domain passes before it names a file, a directory, a Secret or a LocalAPI path,
// whatever door it came in by (--domain, a ServeConfig host, tailscaled's cert domains).

const LABEL = /^[a-z0-9]([a-z0-9-]*[a-z0-9])?$/;

/**
 * The canonical form of a DNS name (lower case, without the one trailing dot of an absolute name), or a
 * CERTSHARE_BAD_DOMAIN error saying which rule it breaks: at least two labels of letters, digits and inner
 * hyphens, each at most 63 characters, 253 in all; a leading `*.` for a wildcard. Anything that could
 * reach outside a directory (`..`, `/`, `\`, a leading dot) fails the label rule.
 */
export function normalizeDomain(text: string): string {
  const domain = text.trim().toLowerCase().replace(/\.$/, '');
  const refuse = (why: string): never => {
    throw new CertshareError('CERTSHARE_BAD_DOMAIN', { name: text, rule: why });
  };
  if (domain.length === 0) refuse('empty');
  if (domain.length > 253) refuse(`${domain.length} characters, at most 253`);
  const labels = domain.split('.');
  const [first, ...rest] = labels;
  const checked = first === '*' ? rest : labels;
  if (checked.length < 2) refuse('needs at least two labels (e.g. web.tailnet-1234.ts.net)');
  for (const label of checked) {
    if (label.length === 0) refuse('empty label');
    if (label.length > 63) refuse(`label of ${label.length} characters, at most 63`);
    if (!LABEL.test(label)) refuse(`label "${label}" may hold only letters, digits and inner hyphens`);
  }
  return domain;
}

/** Splits names into the canonical valid ones (deduplicated, sorted) and the refused ones with their reason. */
export function partitionDomains(names: Iterable<string>): { domains: string[]; refused: Array<{ name: string; reason: string }> } {
  const domains = new Set<string>();
  const refused: Array<{ name: string; reason: string }> = [];
  for (const name of names) {
    try {
      domains.add(normalizeDomain(name));
    } catch (err) {
      refused.push({ name, reason: (err as Error).message });
    }
  }
  return { domains: [...domains].sort(), refused };
}
