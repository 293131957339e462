import { getDomain } from 'tldts';

/**
 * The registered domain (eTLD+1) of a name, by the public suffix list with its private section: Let's
 * Encrypt counts its "new certificates per registered domain" limit this way, and `ts.net` is a private
 * suffix there, so every `<tailnet>.ts.net` is a registered domain of its own. A name the list cannot
 * place (a single label, an unknown suffix that is the whole name) stands for itself.
 */
export function registeredDomain(domain: string): string {
  return getDomain(domain, { allowPrivateDomains: true }) ?? domain;
}
