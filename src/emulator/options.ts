// The emulator's flags: its command line to EmulatorOptions, and its usage (`certshare emulator`, src/cli/emulator.ts).
// The project's one flag system (src/flags/flags.ts), without environment variables: the emulator reads none.
import { readFileSync } from 'node:fs';
import { normalizeDomain } from '../core/certificates/domain.ts';
import { CertshareError, errorMessage } from '../core/errors.ts';
import { parseBudget } from '../core/issuance/issuance-budget.ts';
import { type CommandHelp, commandUsage, duration, parseFlags, type FlagSpec, type FlagValues } from '../flags/flags.ts';
import type { AcmeLimits } from './acme-limits.ts';
import { BUS_FAULT_KINDS, CERT_FAULT_KINDS, parseFaultSpec, type Fault } from './faults.ts';
import { DEFAULT_DOMAIN, DEFAULT_TAILSCALED_VERSION, DEFAULT_VERSIONS, emulatorOptionsProblem, type EmulatorOptions, type NetmapStyle } from './server.ts';

/** pino's levels: the emulator logs with pino directly, not through certshare's logger (LOG_LEVELS). */
const PINO_LEVELS = ['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent'];

/** The cert domains `--domain-count N` adds: host-0001.tailnet-0000.ts.net ... (the bench grants RBAC on the same names). */
export function generatedDomains(count: number): string[] {
  return Array.from({ length: count }, (_, i) => `host-${String(i + 1).padStart(4, '0')}.tailnet-0000.ts.net`);
}

const EMULATOR_FLAGS = [
  {
    name: 'listen',
    group: 'serving and logs',
    placeholder: 'PATH|HOST:PORT',
    default: './tailscaled.sock',
    help: "A unix socket path, or TCP when the value has ':' and no '/' (HOST:0 picks a free port).",
  },
  {
    name: 'domain',
    group: 'cert domains',
    placeholder: 'FQDN',
    multiple: true,
    help: `A cert domain of the node. Default ${DEFAULT_DOMAIN}, unless --domain-count is given.`,
  },
  {
    name: 'domain-count',
    group: 'cert domains',
    placeholder: 'N',
    help: `Also N generated cert domains, ${generatedDomains(1)[0]} and on (for many-domain runs).`,
  },
  {
    name: 'service-domain',
    group: 'cert domains',
    placeholder: 'FQDN',
    multiple: true,
    help: 'A Service domain (<label>.<tailnet>.ts.net), granted only while prefs advertise svc:<label>.',
  },
  {
    name: 'service-tag',
    group: 'cert domains',
    placeholder: 'TAG',
    multiple: true,
    help: "With --service-domain: granted only while the node's AdvertiseTags hold one of these too.",
  },
  { name: 'domain-delay', group: 'cert domains', placeholder: 'DURATION', help: 'The domains appear only after this delay, announced on the bus (e.g. 10s).' },
  { name: 'cert-lifetime', group: 'the CA', placeholder: 'DURATION', help: 'Certificate lifetime (default 90d; e.g. 6d, 1h, 90s).' },
  {
    name: 'tailscaled-version',
    group: 'tailscaled release',
    placeholder: 'V',
    help: `The tailscaled release to emulate (default ${DEFAULT_TAILSCALED_VERSION}).`,
    detail:
      'What the IPN bus accepts and sends, which endpoints exist, Tailscale-Version. ' +
      '1.104+: 400 on the obsolete mask bits 8 and 256; 1.102: 400 on RateLimit with new-style bits; ' +
      '1.100+: InitialStatus, SelfChange only; 1.98: NetMap resent with SelfChange, /cert-domains; 1.96: NetMap resent, no /cert-domains.',
  },
  {
    name: 'netmap-style',
    group: 'tailscaled release',
    placeholder: 'selfchange|resend',
    help: 'How the node announces a change: SelfChange (v1.100+) or a full NetMap.',
    detail:
      'selfchange (tailscaled v1.100+: SelfChange then /cert-domains) or resend (older: a full NetMap per change); ' +
      `alone, resend picks ${DEFAULT_VERSIONS.resend}; it must agree with --tailscaled-version.`,
  },
  {
    name: 'cert-backdate',
    group: 'the CA',
    placeholder: 'DURATION',
    help: 'A CA that backdates: notBefore this long before issuance.',
    detail: 'The certificate stays valid for --cert-lifetime from issuance; default: 1m within lifetimes of 1h or more.',
  },
  { name: 'clock-skew', group: 'the CA', placeholder: '[-]DURATION', help: "The CA's clock ahead (or, with -, behind) tailscaled's, e.g. --clock-skew=-120s." },
  {
    name: 'ca',
    group: 'the CA',
    placeholder: 'FILE',
    help: 'Sign with this CA: a PEM file with its certificate and its PKCS#8 private key.',
    detail: "A file several emulators share is one CA behind them all (as Let's Encrypt is); default: a CA of the emulator's own.",
  },
  { name: 'cert-short-by', group: 'the CA', placeholder: 'DURATION', help: 'A CA that gives less than asked: with min_validity set, valid that much less.' },
  { name: 'netmap-pad-bytes', group: 'tailscaled release', placeholder: 'N', help: 'Pad each NetMap with peers up to N bytes (big bus lines).' },
  {
    name: 'limit-new-certs',
    group: 'rate limits',
    placeholder: 'N/DURATION',
    help: "Let's Encrypt's new certificates per registered domain (renewals exempt), e.g. 50/168h.",
    detail: "A first issuance past it answers 429 with the CA's text and Retry-After.",
  },
  { name: 'limit-orders', group: 'rate limits', placeholder: 'N/DURATION', help: "Let's Encrypt's new orders per account (renewals included), e.g. 300/3h." },
  {
    name: 'acme-listen',
    group: 'serving and logs',
    placeholder: 'HOST:PORT',
    help: "Also serve the CA's ACME Renewal Information here; a TCP --listen serves it too.",
    detail: 'GET /acme/directory, /acme/renewal-info/<certID>.',
  },
  { name: 'ledger', group: 'ledger and faults', placeholder: 'FILE', help: 'Append one JSON line per issuance (several emulators may share it).' },
  { name: 'ledger-requests', group: 'ledger and faults', boolean: true, help: 'Also append one line per cert request (time, min_validity, outcome).' },
  {
    name: 'fault',
    group: 'ledger and faults',
    placeholder: 'SPEC',
    multiple: true,
    help: 'Inject a fault at start; SPEC is target:kind[:key=value...].',
    detail:
      `cert kinds: ${CERT_FAULT_KINDS.join(' ')}; bus kinds: ${BUS_FAULT_KINDS.join(' ')}; ` +
      'keys: count=N|always (default 1), domain=FQDN, retry_after=SECONDS, delay=DUR, bytes=N[k|m], abrupt=true, message=TEXT (last). ' +
      'E.g. cert:rate_limit_429:retry_after=30:count=2, bus:disconnect:count=always.',
  },
  { name: 'id', group: 'serving and logs', placeholder: 'NAME', help: 'Name of this emulator in logs, stats and the ledger.' },
  { name: 'log-level', group: 'serving and logs', placeholder: 'LEVEL', default: 'info', help: `${PINO_LEVELS.join(', ')}.` },
] as const satisfies readonly FlagSpec[];

/** `certshare emulator --help` and its part of docs/configuration.md. */
export const EMULATOR_HELP: CommandHelp = {
  command: 'emulator',
  summary: [
    "A stand-in for tailscaled's LocalAPI: the IPN bus, cert-domains, status and certificate issuance (from its own",
    "in-memory CA, with tailscaled's caching and renewal), plus scripted faults. Runs until SIGINT or SIGTERM.",
    '',
    'Control API on the same listener: GET /certshare-emulator/v0/stats, POST|DELETE /certshare-emulator/v0/faults,',
    'POST /certshare-emulator/v0/domains {"add":[...],"remove":[...]}, POST /certshare-emulator/v0/bus/drop,',
    'GET|POST /certshare-emulator/v0/ari {"domain"|"serial"|"certId":...,"window":{"start","end"}} (a certificate\'s ARI window),',
    'POST /certshare-emulator/v0/ari/revoke {"domain"|"serial"|"certId":...} (its window moves an hour into the past).',
  ].join('\n'),
  flags: EMULATOR_FLAGS,
  groups: ['cert domains', 'the CA', 'rate limits', 'tailscaled release', 'ledger and faults', 'serving and logs'],
  example: 'certshare emulator --listen 127.0.0.1:8080 --domain web.tailnet-1234.ts.net --cert-lifetime 1h --fault cert:garbage',
  // The emulator reads no environment variable.
  fromEnv: false,
};

export const emulatorUsage = commandUsage(EMULATOR_HELP);

type ParsedEmulatorArgs = { help: true } | { help: false; options: EmulatorOptions; logLevel: string };

function badFlag(flag: string, rule: string): never {
  throw new CertshareError('CERTSHARE_BAD_FLAG', { flag, rule });
}

type EmulatorValues = FlagValues<typeof EMULATOR_FLAGS>;

/** The names of the emulator's flags that take one value and have no default: unset ones keep startEmulator's defaults. */
type OptionalFlag = {
  [K in keyof EmulatorValues]-?: EmulatorValues[K] extends string | undefined ? (undefined extends EmulatorValues[K] ? K : never) : never;
}[keyof EmulatorValues];

function wholeNumber(values: EmulatorValues, name: OptionalFlag, want: string): number | undefined {
  const text = values[name];
  if (text !== undefined && !/^\d+$/.test(text)) badFlag(`--${name}`, `want ${want}`);
  return text === undefined ? undefined : Number(text);
}

/** --ca FILE: the CA's certificate and key, read at start. */
function caFile(path: string): { certPem: string; keyPem: string } {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    return badFlag('--ca', `cannot read ${path}: ${errorMessage(err)}`);
  }
  const certPem = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----\n?/.exec(text)?.[0];
  const keyPem = /-----BEGIN PRIVATE KEY-----[\s\S]+?-----END PRIVATE KEY-----\n?/.exec(text)?.[0];
  if (!certPem || !keyPem) return badFlag('--ca', `${path} needs a PEM CERTIFICATE and a PKCS#8 PRIVATE KEY`);
  return { certPem, keyPem };
}

/** Each flag's syntax here, then the rules of the options as startEmulator checks them; CERTSHARE_BAD_FLAG with one line on bad input. */
export function parseEmulatorArgs(argv: string[]): ParsedEmulatorArgs {
  const values = parseFlags(EMULATOR_FLAGS, argv, {});
  if (values.help) return { help: true };
  const ms = (name: OptionalFlag): number | undefined => (values[name] === undefined ? undefined : duration(values, name));

  const generated = generatedDomains(wholeNumber(values, 'domain-count', 'a whole number') ?? 0);
  const domains: string[] = [];
  for (const d of values.domain ?? (generated.length > 0 ? [] : [DEFAULT_DOMAIN])) {
    try {
      domains.push(normalizeDomain(d));
    } catch (err) {
      badFlag('--domain', `${errorMessage(err)}`);
    }
  }
  domains.push(...generated);
  const serviceDomains: string[] = [];
  for (const d of values['service-domain'] ?? []) {
    try {
      serviceDomains.push(normalizeDomain(d));
    } catch (err) {
      badFlag('--service-domain', `${errorMessage(err)}`);
    }
  }
  const skew = values['clock-skew'];
  const faults: Fault[] = [];
  for (const spec of values.fault ?? []) {
    try {
      faults.push(parseFaultSpec(spec));
    } catch (err) {
      badFlag('--fault', `${errorMessage(err)}`);
    }
  }
  const logLevel = values['log-level'];
  if (!PINO_LEVELS.includes(logLevel)) badFlag('--log-level', `want one of ${PINO_LEVELS.join(', ')}`);
  const limits: AcmeLimits = {};
  for (const [flag, key] of [
    ['limit-new-certs', 'newCertsPerRegisteredDomain'],
    ['limit-orders', 'ordersPerAccount'],
  ] as const) {
    const text = values[flag];
    if (text !== undefined) limits[key] = parseBudget(text, `--${flag}`);
  }

  const set: EmulatorOptions = {
    // Checked against the known styles by emulatorOptionsProblem below, with the flag's message.
    netmapStyle: values['netmap-style'] as NetmapStyle | undefined,
    certLifetimeMs: ms('cert-lifetime'),
    domainDelayMs: ms('domain-delay'),
    certBackdateMs: ms('cert-backdate'),
    clockSkewMs: skew === undefined ? undefined : (skew.startsWith('-') ? -1 : 1) * duration({ 'clock-skew': skew.replace(/^[-+]/, '') }, 'clock-skew'),
    certShortByMs: ms('cert-short-by'),
    ca: values.ca === undefined ? undefined : caFile(values.ca),
    netmapPadBytes: wholeNumber(values, 'netmap-pad-bytes', 'a whole number of bytes'),
    tailscaledVersion: values['tailscaled-version'],
    ledgerPath: values.ledger,
    ledgerRequests: values['ledger-requests'] === true ? true : undefined,
    limits: limits.newCertsPerRegisteredDomain || limits.ordersPerAccount ? limits : undefined,
    id: values.id,
    acmeListen: values['acme-listen'],
    serviceHosts: serviceDomains.length > 0 ? { domains: serviceDomains, tags: values['service-tag'] ?? [] } : undefined,
  };
  // Only what was given: the rest keeps startEmulator's defaults.
  const options: EmulatorOptions = {
    listen: values.listen,
    domains,
    faults,
    ...Object.fromEntries(Object.entries(set).filter(([, value]) => value !== undefined)),
  };
  const problem = emulatorOptionsProblem(options);
  if (problem) badFlag(problem.cli.flag, problem.cli.rule);
  return { help: false, options, logLevel };
}
