// The emulator's flags: its command line to EmulatorOptions, and its usage (`certshare emulator`, src/cli/emulator.ts).
import { parseArgs } from 'node:util';
import { normalizeDomain } from '../core/domain.ts';
import { parseDuration } from '../core/duration.ts';
import { CertshareError, errorMessage } from '../core/errors.ts';
import { parseBudget } from '../core/issuance-budget.ts';
import type { AcmeLimits } from './acme-limits.ts';
import { parseFaultSpec, type Fault } from './faults.ts';
import { parseListen } from './listen.ts';
import { parseTailscaledVersion, releaseFeatures } from '../localapi/releases.ts';
import { DEFAULT_DOMAIN, DEFAULT_TAILSCALED_VERSION, DEFAULT_VERSIONS, type EmulatorOptions } from './server.ts';

export const emulatorUsage = `Usage: certshare emulator [flags]

A stand-in for tailscaled's LocalAPI: the IPN bus, cert-domains, status and certificate issuance
(from its own in-memory CA, with tailscaled's caching and renewal), plus scripted faults.
Runs until SIGINT or SIGTERM.

Flags:
  --listen PATH|HOST:PORT   unix socket path, or TCP when the value has ':' and no '/'
                            (default ./tailscaled.sock; HOST:0 picks a free port)
  --domain FQDN             a cert domain of the node; repeatable (default ${DEFAULT_DOMAIN})
  --domain-count N          also N generated cert domains, ${generatedDomains(1)[0]} and on (for many-domain runs)
  --domain-delay DUR        the domains appear only after this delay, announced on the bus (e.g. 10s)
  --cert-lifetime DUR       certificate lifetime (default 90d; e.g. 6d, 1h, 90s)
  --tailscaled-version V    the release to emulate (default ${DEFAULT_TAILSCALED_VERSION}): what the IPN bus accepts
                            and sends, which endpoints exist, Tailscale-Version. 1.104+: 400 on the
                            obsolete mask bits 8 and 256; 1.102: 400 on RateLimit with new-style bits;
                            1.100+: InitialStatus, SelfChange only; 1.98: NetMap resent with SelfChange,
                            /cert-domains; 1.96: NetMap resent, no /cert-domains
  --netmap-style STYLE      selfchange (v1.100+) or resend (older); alone it picks ${DEFAULT_VERSIONS.resend} for
                            resend; it must agree with --tailscaled-version
  --cert-backdate DUR       notBefore this long before issuance, the certificate valid for --cert-lifetime
                            from issuance (a CA that backdates; default: 1m within lifetimes of 1h or more)
  --clock-skew=[-]DUR       the CA's clock ahead (or, with -, behind) tailscaled's, e.g. --clock-skew=-120s
  --cert-short-by DUR       a CA that gives less than asked: with min_validity set, valid that much less
  --netmap-style STYLE      selfchange (tailscaled v1.100+: SelfChange then /cert-domains, default)
  --netmap-pad-bytes N      pad each NetMap with peers up to N bytes (big bus lines)
  --limit-new-certs N/DUR   Let's Encrypt's new certificates per registered domain (renewals exempt), e.g.
                            50/168h: a first issuance past it answers 429 with the CA's text and Retry-After
  --limit-orders N/DUR      Let's Encrypt's new orders per account (renewals included), e.g. 300/3h
  --acme-listen HOST:PORT   also serve the CA's ACME Renewal Information (GET /acme/directory,
                            /acme/renewal-info/<certID>) on this TCP address; a TCP --listen serves it too
  --ledger FILE             append one JSON line per issuance (several emulators may share it)
  --ledger-requests         also append one line per cert request (time, min_validity, outcome)
  --fault SPEC              inject a fault at start; repeatable. SPEC is target:kind[:key=value...]
                              cert kinds: rate_limit_429 acme_rate_limit_500 error_500 access_denied_403
                                          slow hang garbage mismatched wrong_domain expired reset
                              bus kinds:  disconnect malformed_line huge_line
                              keys: count=N|always (default 1), domain=FQDN, retry_after=SECONDS,
                                    delay=DUR, bytes=N[k|m], abrupt=true, message=TEXT (last)
                            e.g. cert:rate_limit_429:retry_after=30:count=2  bus:disconnect:count=always
  --id NAME                 name of this emulator in logs, stats and the ledger
  --log-level LEVEL         trace, debug, info (default), warn, error, silent
  -h, --help                show this help

Control API on the same listener: GET /certshare-emulator/v0/stats, POST|DELETE /certshare-emulator/v0/faults,
POST /certshare-emulator/v0/domains {"add":[...],"remove":[...]}, POST /certshare-emulator/v0/bus/drop,
GET|POST /certshare-emulator/v0/ari {"domain"|"serial"|"certId":...,"window":{"start","end"}} (a certificate's ARI window),
POST /certshare-emulator/v0/ari/revoke {"domain"|"serial"|"certId":...} (its window moves an hour into the past).`;

const LOG_LEVELS = ['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent'];

/** The cert domains `--domain-count N` adds: host-0001.tailnet-0000.ts.net ... (the bench grants RBAC on the same names). */
export function generatedDomains(count: number): string[] {
  return Array.from({ length: count }, (_, i) => `host-${String(i + 1).padStart(4, '0')}.tailnet-0000.ts.net`);
}

export type ParsedEmulatorArgs = { help: true } | { help: false; options: EmulatorOptions; logLevel: string };

function badFlag(message: string): never {
  throw new CertshareError('CERTSHARE_BAD_FLAG', message);
}

function durationFlag(flag: string, value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  try {
    return parseDuration(value);
  } catch {
    badFlag(`--${flag}: invalid duration "${value}" (examples: 90s, 10m, 24h, 90d)`);
  }
}

/** Parses the emulator's flags; throws CertshareError CERTSHARE_BAD_FLAG with one line on bad input. */
export function parseEmulatorArgs(argv: string[]): ParsedEmulatorArgs {
  // biome-ignore lint/suspicious/noImplicitAnyLet: typed by parseArgs from the options table below
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      strict: true,
      allowPositionals: false,
      options: {
        listen: { type: 'string' },
        domain: { type: 'string', multiple: true },
        'domain-count': { type: 'string' },
        'domain-delay': { type: 'string' },
        'cert-lifetime': { type: 'string' },
        'cert-backdate': { type: 'string' },
        'clock-skew': { type: 'string' },
        'cert-short-by': { type: 'string' },
        'netmap-style': { type: 'string' },
        'netmap-pad-bytes': { type: 'string' },
        'tailscaled-version': { type: 'string' },
        ledger: { type: 'string' },
        'limit-new-certs': { type: 'string' },
        'limit-orders': { type: 'string' },
        'acme-listen': { type: 'string' },
        'ledger-requests': { type: 'boolean' },
        fault: { type: 'string', multiple: true },
        id: { type: 'string' },
        'log-level': { type: 'string' },
        help: { type: 'boolean', short: 'h' },
      },
    }));
  } catch (err) {
    badFlag(errorMessage(err).split('\n')[0]!);
  }
  if (values.help) return { help: true };

  const listen = values.listen ?? './tailscaled.sock';
  try {
    parseListen(listen);
  } catch (err) {
    badFlag(`--listen: ${errorMessage(err)}`);
  }
  const domainCount = values['domain-count'];
  if (domainCount !== undefined && !/^\d+$/.test(domainCount)) badFlag('--domain-count: want a whole number');
  const generated = generatedDomains(Number(domainCount ?? 0));
  const domains: string[] = [];
  for (const d of values.domain ?? (generated.length > 0 ? [] : [DEFAULT_DOMAIN])) {
    try {
      domains.push(normalizeDomain(d));
    } catch (err) {
      badFlag(`--domain: ${errorMessage(err)}`);
    }
  }
  domains.push(...generated);
  const style = values['netmap-style'];
  if (style !== undefined && style !== 'selfchange' && style !== 'resend') badFlag(`--netmap-style: want selfchange or resend, not "${style}"`);
  const version = values['tailscaled-version'];
  if (version !== undefined) {
    const parsed = parseTailscaledVersion(version);
    if (!parsed) badFlag(`--tailscaled-version: want a release like ${DEFAULT_TAILSCALED_VERSION}, not "${version}"`);
    const implied = releaseFeatures(parsed).resendsNetMap ? 'resend' : 'selfchange';
    if (style !== undefined && style !== implied) badFlag(`--netmap-style ${style} contradicts --tailscaled-version ${version} (style ${implied})`);
  }
  const certLifetimeMs = durationFlag('cert-lifetime', values['cert-lifetime']);
  if (certLifetimeMs !== undefined && certLifetimeMs < 1000) badFlag('--cert-lifetime: must be at least 1s');
  const domainDelayMs = durationFlag('domain-delay', values['domain-delay']);
  const certBackdateMs = durationFlag('cert-backdate', values['cert-backdate']);
  const certShortByMs = durationFlag('cert-short-by', values['cert-short-by']);
  const skewText = values['clock-skew'];
  const clockSkewMs = skewText === undefined ? undefined : (skewText.startsWith('-') ? -1 : 1) * durationFlag('clock-skew', skewText.replace(/^[-+]/, ''))!;
  let netmapPadBytes: number | undefined;
  if (values['netmap-pad-bytes'] !== undefined) {
    if (!/^\d+$/.test(values['netmap-pad-bytes'])) badFlag('--netmap-pad-bytes: want a whole number of bytes');
    netmapPadBytes = Number(values['netmap-pad-bytes']);
  }
  const acmeListen = values['acme-listen'];
  if (acmeListen !== undefined) {
    let kind: string;
    try {
      kind = parseListen(acmeListen).kind;
    } catch (err) {
      badFlag(`--acme-listen: ${errorMessage(err)}`);
    }
    if (kind !== 'tcp') badFlag(`--acme-listen: want HOST:PORT (TCP), not "${acmeListen}"`);
  }
  const faults: Fault[] = [];
  for (const spec of values.fault ?? []) {
    try {
      faults.push(parseFaultSpec(spec));
    } catch (err) {
      badFlag(`--fault: ${errorMessage(err)}`);
    }
  }
  const logLevel = values['log-level'] ?? 'info';
  if (!LOG_LEVELS.includes(logLevel)) badFlag(`--log-level: want one of ${LOG_LEVELS.join(', ')}`);

  const options: EmulatorOptions = { listen, domains, faults };
  if (style !== undefined) options.netmapStyle = style;
  if (certLifetimeMs !== undefined) options.certLifetimeMs = certLifetimeMs;
  if (domainDelayMs !== undefined) options.domainDelayMs = domainDelayMs;
  if (certBackdateMs !== undefined) options.certBackdateMs = certBackdateMs;
  if (clockSkewMs !== undefined) options.clockSkewMs = clockSkewMs;
  if (certShortByMs !== undefined) options.certShortByMs = certShortByMs;
  if (netmapPadBytes !== undefined) options.netmapPadBytes = netmapPadBytes;
  if (values['tailscaled-version'] !== undefined) options.tailscaledVersion = values['tailscaled-version'];
  if (values.ledger !== undefined) options.ledgerPath = values.ledger;
  if (values['ledger-requests']) {
    if (values.ledger === undefined) badFlag('--ledger-requests needs --ledger');
    options.ledgerRequests = true;
  }
  const limits: AcmeLimits = {};
  for (const [flag, key] of [
    ['limit-new-certs', 'newCertsPerRegisteredDomain'],
    ['limit-orders', 'ordersPerAccount'],
  ] as const) {
    const text = values[flag];
    if (text !== undefined) limits[key] = parseBudget(text, `--${flag}`);
  }
  if (limits.newCertsPerRegisteredDomain || limits.ordersPerAccount) options.limits = limits;
  if (values.id !== undefined) options.id = values.id;
  if (acmeListen !== undefined) options.acmeListen = acmeListen;
  return { help: false, options, logLevel };
}
