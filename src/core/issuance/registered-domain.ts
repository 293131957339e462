/** The registered domain (eTLD+1) of a fully qualified domain name. */
export type RegisteredDomainRule = (domain: string) => string;

let loading: Promise<RegisteredDomainRule> | undefined;

/**
 * The registered domain by the public suffix list with its private section (tldts): Let's Encrypt counts
 * its "new certificates per registered domain" limit this way, and `ts.net` is a private suffix there, so
 * every `<tailnet>.ts.net` is a registered domain of its own. A name the list cannot place stands for
 * itself. Loaded on first use: the list costs about 7 MB of RSS (measured with `npm run bench`).
 */
export function loadRegisteredDomainRule(): Promise<RegisteredDomainRule> {
  loading ??= import('tldts').then(
    ({ getDomain }) =>
      (domain: string) =>
        getDomain(domain, { allowPrivateDomains: true }) ?? domain,
  );
  return loading;
}

/**
 * Tailscale's cert domains are `<host>.<tailnet>.ts.net`, and the list makes every `<tailnet>.ts.net` a
 * registered domain, except under its wildcard `*.c.ts.net`. This answers that case without the list
 * (test/unit/issuance-budget.test.ts holds it equal to tldts's answer); anything else: undefined.
 */
export function tailnetDomain(domain: string): string | undefined {
  const labels = domain.split('.');
  const n = labels.length;
  if (n < 4 || labels[n - 1] !== 'net' || labels[n - 2] !== 'ts' || labels[n - 3] === 'c') return undefined;
  return labels.slice(-3).join('.');
}
