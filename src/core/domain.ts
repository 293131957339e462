// What certshare accepts as a certificate domain, from a flag or a Pod annotation alike.
const FQDN = /^(?=.{1,253}$)(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;

/** Lower case, without surrounding blanks or a trailing dot: the form Secrets are named after. */
export function normaliseDomain(text: string): string {
  return text.trim().toLowerCase().replace(/\.$/, '');
}

/** A fully qualified name of at least two labels (a leading `*.` allowed), already normalised. */
export function isFqdn(domain: string): boolean {
  return FQDN.test(domain);
}
