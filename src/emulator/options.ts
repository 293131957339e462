// The emulator's flags: its command line to EmulatorOptions, and its usage (`certshare emulator`, src/cli/emulator.ts).
// The project's one flag system (src/flags/flags.ts), without environment variables: the emulator reads none.
import { normalizeDomain } from '../core/domain.ts';
import { CertshareError, errorMessage } from '../core/errors.ts';
import { parseBudget } from '../core/issuance-budget.ts';
import { duration, parseFlags, usage, type FlagSpec, type FlagValues } from '../flags/flags.ts';
import type { AcmeLimits } from './acme-limits.ts';
import { BUS_FAULT_KINDS, CERT_FAULT_KINDS, parseFaultSpec, type Fault } from './faults.ts';
import { DEFAULT_DOMAIN, DEFAULT_TAILSCALED_VERSION, DEFAULT_VERSIONS, emulatorOptionsProblem, type EmulatorOptions, type NetmapStyle } from './server.ts';

const LOG_LEVELS = ['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent'];

/** The cert domains `--domain-count N` adds: host-0001.tailnet-0000.ts.net ... (the bench grants RBAC on the same names). */
export function generatedDomains(count: number): string[] {
  return Array.from({ length: count }, (_, i) => `host-${String(i + 1).padStart(4, '0')}.tailnet-0000.ts.net`);
}

export const EMULATOR_FLAGS: FlagSpec[] = [
  {
    name: 'listen',
    placeholder: 'PATH|HOST:PORT',
    default: './tailscaled.sock',
    help: "A unix socket path, or TCP when the value has ':' and no '/' (HOST:0 picks a free port).",
  },
  { name: 'domain', placeholder: 'FQDN', multiple: true, help: `A cert domain of the node. Default ${DEFAULT_DOMAIN}, unless --domain-count is given.` },
  { name: 'domain-count', placeholder: 'N', help: `Also N generated cert domains, ${generatedDomains(1)[0]} and on (for many-domain runs).` },
  { name: 'domain-delay', placeholder: 'DURATION', help: 'The domains appear only after this delay, announced on the bus (e.g. 10s).' },
  { name: 'cert-lifetime', placeholder: 'DURATION', help: 'Certificate lifetime (default 90d; e.g. 6d, 1h, 90s).' },
  {
    name: 'tailscaled-version',
    placeholder: 'V',
    help:
      `The release to emulate (default ${DEFAULT_TAILSCALED_VERSION}): what the IPN bus accepts and sends, which endpoints exist, ` +
      'Tailscale-Version. 1.104+: 400 on the obsolete mask bits 8 and 256; 1.102: 400 on RateLimit with new-style bits; ' +
      '1.100+: InitialStatus, SelfChange only; 1.98: NetMap resent with SelfChange, /cert-domains; 1.96: NetMap resent, no /cert-domains.',
  },
  {
    name: 'netmap-style',
    placeholder: 'selfchange|resend',
    help:
      'selfchange (tailscaled v1.100+: SelfChange then /cert-domains) or resend (older: a full NetMap per change); ' +
      `alone, resend picks ${DEFAULT_VERSIONS.resend}; it must agree with --tailscaled-version.`,
  },
  {
    name: 'cert-backdate',
    placeholder: 'DURATION',
    help:
      'notBefore this long before issuance, the certificate valid for --cert-lifetime from issuance ' +
      '(a CA that backdates; default: 1m within lifetimes of 1h or more).',
  },
  { name: 'clock-skew', placeholder: '[-]DURATION', help: "The CA's clock ahead (or, with -, behind) tailscaled's, e.g. --clock-skew=-120s." },
  { name: 'cert-short-by', placeholder: 'DURATION', help: 'A CA that gives less than asked: with min_validity set, valid that much less.' },
  { name: 'netmap-pad-bytes', placeholder: 'N', help: 'Pad each NetMap with peers up to N bytes (big bus lines).' },
  {
    name: 'limit-new-certs',
    placeholder: 'N/DURATION',
    help:
      "Let's Encrypt's new certificates per registered domain (renewals exempt), e.g. 50/168h: " +
      "a first issuance past it answers 429 with the CA's text and Retry-After.",
  },
  { name: 'limit-orders', placeholder: 'N/DURATION', help: "Let's Encrypt's new orders per account (renewals included), e.g. 300/3h." },
  {
    name: 'acme-listen',
    placeholder: 'HOST:PORT',
    help: "Also serve the CA's ACME Renewal Information (GET /acme/directory, /acme/renewal-info/<certID>) here; a TCP --listen serves it too.",
  },
  { name: 'ledger', placeholder: 'FILE', help: 'Append one JSON line per issuance (several emulators may share it).' },
  { name: 'ledger-requests', boolean: true, help: 'Also append one line per cert request (time, min_validity, outcome).' },
  {
    name: 'fault',
    placeholder: 'SPEC',
    multiple: true,
    help:
      'Inject a fault at start. SPEC is target:kind[:key=value...]; ' +
      `cert kinds: ${CERT_FAULT_KINDS.join(' ')}; bus kinds: ${BUS_FAULT_KINDS.join(' ')}; ` +
      'keys: count=N|always (default 1), domain=FQDN, retry_after=SECONDS, delay=DUR, bytes=N[k|m], abrupt=true, message=TEXT (last). ' +
      'E.g. cert:rate_limit_429:retry_after=30:count=2, bus:disconnect:count=always.',
  },
  { name: 'id', placeholder: 'NAME', help: 'Name of this emulator in logs, stats and the ledger.' },
  { name: 'log-level', placeholder: 'LEVEL', default: 'info', help: `${LOG_LEVELS.join(', ')}.` },
];

export const emulatorUsage = usage(
  'emulator',
  [
    "A stand-in for tailscaled's LocalAPI: the IPN bus, cert-domains, status and certificate issuance (from its own",
    "in-memory CA, with tailscaled's caching and renewal), plus scripted faults. Runs until SIGINT or SIGTERM.",
    '',
    'Control API on the same listener: GET /certshare-emulator/v0/stats, POST|DELETE /certshare-emulator/v0/faults,',
    'POST /certshare-emulator/v0/domains {"add":[...],"remove":[...]}, POST /certshare-emulator/v0/bus/drop,',
    'GET|POST /certshare-emulator/v0/ari {"domain"|"serial"|"certId":...,"window":{"start","end"}} (a certificate\'s ARI window),',
    'POST /certshare-emulator/v0/ari/revoke {"domain"|"serial"|"certId":...} (its window moves an hour into the past).',
  ].join('\n'),
  EMULATOR_FLAGS,
  { fromEnv: false },
);

export type ParsedEmulatorArgs = { help: true } | { help: false; options: EmulatorOptions; logLevel: string };

function badFlag(message: string): never {
  throw new CertshareError('CERTSHARE_BAD_FLAG', message);
}

/** The flag's value when given, else undefined (the emulator leaves unset options to startEmulator's defaults). */
function given(values: FlagValues, name: string): string | undefined {
  return values[name] as string | undefined;
}

function wholeNumber(values: FlagValues, name: string, want: string): number | undefined {
  const text = given(values, name);
  if (text !== undefined && !/^\d+$/.test(text)) badFlag(`--${name}: want ${want}`);
  return text === undefined ? undefined : Number(text);
}

/** Each flag's syntax here, then the rules of the options as startEmulator checks them; CERTSHARE_BAD_FLAG with one line on bad input. */
export function parseEmulatorArgs(argv: string[]): ParsedEmulatorArgs {
  const values = parseFlags(EMULATOR_FLAGS, argv, {});
  if (values.help) return { help: true };
  const ms = (name: string): number | undefined => (given(values, name) === undefined ? undefined : duration(values, name));

  const generated = generatedDomains(wholeNumber(values, 'domain-count', 'a whole number') ?? 0);
  const domains: string[] = [];
  for (const d of (values.domain as string[] | undefined) ?? (generated.length > 0 ? [] : [DEFAULT_DOMAIN])) {
    try {
      domains.push(normalizeDomain(d));
    } catch (err) {
      badFlag(`--domain: ${errorMessage(err)}`);
    }
  }
  domains.push(...generated);
  const skew = given(values, 'clock-skew');
  const faults: Fault[] = [];
  for (const spec of (values.fault as string[] | undefined) ?? []) {
    try {
      faults.push(parseFaultSpec(spec));
    } catch (err) {
      badFlag(`--fault: ${errorMessage(err)}`);
    }
  }
  const logLevel = String(values['log-level']);
  if (!LOG_LEVELS.includes(logLevel)) badFlag(`--log-level: want one of ${LOG_LEVELS.join(', ')}`);
  const limits: AcmeLimits = {};
  for (const [flag, key] of [
    ['limit-new-certs', 'newCertsPerRegisteredDomain'],
    ['limit-orders', 'ordersPerAccount'],
  ] as const) {
    const text = given(values, flag);
    if (text !== undefined) limits[key] = parseBudget(text, `--${flag}`);
  }

  const set: EmulatorOptions = {
    netmapStyle: given(values, 'netmap-style') as NetmapStyle | undefined,
    certLifetimeMs: ms('cert-lifetime'),
    domainDelayMs: ms('domain-delay'),
    certBackdateMs: ms('cert-backdate'),
    clockSkewMs: skew === undefined ? undefined : (skew.startsWith('-') ? -1 : 1) * duration({ 'clock-skew': skew.replace(/^[-+]/, '') }, 'clock-skew'),
    certShortByMs: ms('cert-short-by'),
    netmapPadBytes: wholeNumber(values, 'netmap-pad-bytes', 'a whole number of bytes'),
    tailscaledVersion: given(values, 'tailscaled-version'),
    ledgerPath: given(values, 'ledger'),
    ledgerRequests: values['ledger-requests'] === true ? true : undefined,
    limits: limits.newCertsPerRegisteredDomain || limits.ordersPerAccount ? limits : undefined,
    id: given(values, 'id'),
    acmeListen: given(values, 'acme-listen'),
  };
  // Only what was given: the rest keeps startEmulator's defaults.
  const options: EmulatorOptions = {
    listen: String(values.listen),
    domains,
    faults,
    ...Object.fromEntries(Object.entries(set).filter(([, value]) => value !== undefined)),
  };
  const problem = emulatorOptionsProblem(options);
  if (problem) badFlag(problem.cli);
  return { help: false, options, logLevel };
}
