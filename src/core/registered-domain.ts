/** The registered domain (eTLD+1) of a fully qualified domain name. */
export type RegisteredDomainRule = (domain: string) => string;

let loading: Promise<RegisteredDomainRule> | undefined;

/**
 * The registered domain by the public suffix list with its private section (tldts): Let's Encrypt counts
 * its "new certificates per registered domain" limit this way, and `ts.net` is a private suffix there, so
 * every `<tailnet>.ts.net` is a registered domain of its own. A name the list cannot place stands for
 * itself. Loaded on first use: the list costs about 7 MB of RSS (measured with `npm run bench`), which only
 * a writer deciding a first issuance pays, never a reader or a writer whose domains all hold certificates.
 */
export function loadRegisteredDomainRule(): Promise<RegisteredDomainRule> {
  loading ??= import('tldts').then(
    ({ getDomain }) =>
      (domain: string) =>
        getDomain(domain, { allowPrivateDomains: true }) ?? domain,
  );
  return loading;
}
