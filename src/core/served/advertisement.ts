// Whether this replica advertises a Tailscale Service: the pure half (src/served/advertiser.ts edits
// tailscaled's prefs). Tailnet clients reach a Service through every node advertising it, so a replica
// advertises only while clients would get a valid certificate from it.
import { CertshareError } from '../errors.ts';
import type { HeldValidity } from '../renewal/renewal.ts';
import type { ServedVerdict } from './served-certificate.ts';

/** --advertise-services serve-config: the Services the --serve-config file lists. */
export const SERVE_CONFIG_SERVICES = 'serve-config';

/** The daemon advertises Tailscale Services (named, or from the ServeConfig). */
export function advertises(c: { advertiseServices: readonly string[] | typeof SERVE_CONFIG_SERVICES }): boolean {
  return c.advertiseServices === SERVE_CONFIG_SERVICES || c.advertiseServices.length > 0;
}

/** A Tailscale Service name as tailscaled's prefs hold it: `svc:` and one DNS label (tailcfg.ServiceName). */
const SERVICE_NAME = /^svc:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/;

export function isServiceName(text: string): boolean {
  return SERVICE_NAME.test(text);
}

export function parseServiceName(text: string): string {
  const name = text.trim();
  if (!isServiceName(name)) {
    throw new CertshareError('CERTSHARE_BAD_FLAG', {
      flag: '--advertise-services',
      rule: `"${name}" is not a Tailscale Service name (svc:<dns-label>, lower case)`,
    });
  }
  return name;
}

/** The certificate domain a Service is served under: `<label>.<tailnet>.ts.net`, the managed domain whose first label is the Service's. */
export function serviceDomain(service: string, domains: Iterable<string>): string | undefined {
  const label = service.slice('svc:'.length);
  for (const domain of domains) if (domain.split('.')[0] === label) return domain;
  return undefined;
}

interface AdvertiseFacts {
  /** The Pod (or process) is shutting down. */
  terminating: boolean;
  /** The certificate held for the Service's domain, if any. */
  held: HeldValidity | undefined;
  /** What the proxy was last seen serving for the domain (served-certificate.ts servedVerdict). */
  served: ServedVerdict;
  now: number;
  /** Where a certificate stops counting (renewal.ts rotationExitTime: the readiness lead before notAfter). */
  end: (held: HeldValidity) => number;
  /** Advertise to obtain the Service's domain from control (bootstrapAllowed). */
  bootstrap?: boolean;
  /**
   * tailscaled's config file lists the Service (served/advertiser.ts withdrawOnly): the file's owner decided to
   * advertise it, and only a served certificate clients must not get (expired, foreign, for another name, inside
   * the readiness lead) withdraws it; nothing seen yet, or a certificate certshare holds no more, leaves the file's word.
   */
  fromFile?: boolean;
}

export type AdvertiseDecision = { advertise: true } | { advertise: false; why: string };

export function advertiseDecision(f: AdvertiseFacts): AdvertiseDecision {
  if (f.terminating) return { advertise: false, why: 'shutting down' };
  if (f.fromFile) return f.served.verdict === 'bad' ? { advertise: false, why: f.served.why } : { advertise: true };
  if (f.bootstrap) return { advertise: true };
  if (!f.held || f.now < f.held.notBefore || f.now >= f.held.notAfter) return { advertise: false, why: 'no valid certificate held' };
  if (f.now >= f.end(f.held)) return { advertise: false, why: 'the certificate held is inside the readiness lead before it expires' };
  if (f.served.verdict === 'unconfirmed') return { advertise: false, why: 'the proxy has not been seen serving the certificate yet' };
  if (f.served.verdict === 'bad') return { advertise: false, why: f.served.why };
  return { advertise: true };
}

interface BootstrapFacts {
  /** --advertise-bootstrap: the platform allows it (off by default, see docs/tailscale-services.md). */
  enabled: boolean;
  /**
   * The certificate loop asked to issue for the domain: neither the group's store nor the federation home holds
   * a valid certificate for it (the loop takes one from there before it issues).
   */
  issuing: boolean;
  /** A certificate valid now is held for the domain. */
  heldValid: boolean;
  /** The proxy's answer for the domain: a leaf valid now that covers the name, none, or not asked yet (undefined). */
  servedValidLeaf: boolean | undefined;
}

/**
 * Whether to advertise a Service before its first certificate. Control grants a Service's domain only to its
 * hosts, so without a certificate and without the advertisement neither ever comes. Advertising costs no
 * client anything only while nothing valid exists anywhere in the group and the proxy serves nothing a
 * client would accept: every client fails anyway. Any leaf the proxy serves that is valid for the name
 * (another cluster's copy, an operator's file) keeps it off.
 */
export function bootstrapAllowed(f: BootstrapFacts): boolean {
  return f.enabled && f.issuing && !f.heldValid && f.servedValidLeaf === false;
}

/**
 * The AdvertiseServices list to write, or undefined when `current` already says what is wanted. Only the
 * Services certshare manages change: others' entries keep their place, certshare's wanted ones are appended.
 */
export function mergeAdvertised(current: readonly string[], managed: ReadonlySet<string>, wanted: ReadonlySet<string>): string[] | undefined {
  const kept = current.filter((s) => !managed.has(s));
  const ours = [...managed].filter((s) => wanted.has(s));
  const next = [...kept, ...ours];
  const now = new Set(current);
  const same = now.size === new Set(next).size && next.every((s) => now.has(s));
  return same ? undefined : next;
}
