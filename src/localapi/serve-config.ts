import { isServiceName } from '../core/served/advertisement.ts';
import { partitionDomains } from '../core/certificates/domain.ts';
import { CertshareError } from '../core/errors.ts';

// The parts of Tailscale's ipn.ServeConfig that name TLS-terminated hosts. Go field names, no json tags.
interface TcpPortHandler {
  HTTPS?: boolean;
  TerminateTLS?: string;
}
interface ServeScope {
  TCP?: Record<string, TcpPortHandler | null>;
  Web?: Record<string, unknown>;
}
interface ServeConfig extends ServeScope {
  Services?: Record<string, ServeScope | null>;
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

interface ServeConfigDomains {
  /** Canonical domain names (see normalizeDomain), sorted. */
  domains: string[];
  /** Hosts that are not domain names (e.g. `../../x`): never used, reported with the reason. */
  refused: Array<{ name: string; reason: string }>;
}

/**
 * The domains that need certificates: hosts of `Web` keys on port 443 and names of TCP handlers that
 * terminate TLS, in `Services.*` and at the top level. Each passes the same check as `--domain`; the ones
 * that fail are returned apart, the others still count. Throws CERTSHARE_BAD_CONFIG on malformed input.
 */
export function domainsFromServeConfig(text: string, source = 'serve config'): ServeConfigDomains {
  const config = parseServeConfig(text, source);
  const scopes: ServeScope[] = [config, ...Object.values(config.Services ?? {}).filter(isObject)];
  const hosts: string[] = [];
  for (const scope of scopes) {
    if (scope.Web !== undefined && !isObject(scope.Web)) throw new CertshareError('CERTSHARE_BAD_CONFIG', { source, reason: '"Web" must be an object' });
    if (scope.TCP !== undefined && !isObject(scope.TCP)) throw new CertshareError('CERTSHARE_BAD_CONFIG', { source, reason: '"TCP" must be an object' });
    for (const hostPort of Object.keys(scope.Web ?? {})) {
      const match = /^(.+):443$/.exec(hostPort);
      if (match) hosts.push(match[1]!);
    }
    for (const handler of Object.values(scope.TCP ?? {})) {
      if (isObject(handler) && typeof handler.TerminateTLS === 'string' && handler.TerminateTLS) {
        hosts.push(handler.TerminateTLS);
      }
    }
  }
  return partitionDomains(hosts);
}

/** The JSON object of a ServeConfig, its `Services` an object if present; CERTSHARE_BAD_CONFIG otherwise. */
function parseServeConfig(text: string, source: string): ServeConfig {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (err) {
    throw new CertshareError('CERTSHARE_BAD_CONFIG', { source, reason: `is not valid JSON: ${(err as Error).message}` });
  }
  if (!isObject(parsed)) throw new CertshareError('CERTSHARE_BAD_CONFIG', { source, reason: 'must be a JSON object' });
  const config = parsed as ServeConfig;
  if (config.Services !== undefined && !isObject(config.Services)) {
    throw new CertshareError('CERTSHARE_BAD_CONFIG', { source, reason: '"Services" must be an object' });
  }
  return config;
}

/**
 * At most this many Services from one ServeConfig (--advertise-services serve-config): a bound on what a
 * runaway file makes certshare write into tailscaled's prefs at every edit, far above a proxy group's few.
 * @forTests
 */
export const MAX_SERVE_CONFIG_SERVICES = 64;

interface ServeConfigServices {
  /** Tailscale Service names (`svc:<label>`), sorted. */
  services: string[];
  /** Keys of `Services` that are no Service name (e.g. `web`, `svc:Web_1`): never advertised, reported with the reason. */
  refused: Array<{ name: string; reason: string }>;
}

/**
 * The Tailscale Services a ServeConfig lists: the keys of its `Services` (tailscaled's ipn.ServeConfig keys
 * them by tailcfg.ServiceName, `svc:<dns-label>`; Tailscale's containerboot advertises exactly these). A key
 * that is no Service name is returned apart, the others still count. Throws CERTSHARE_BAD_CONFIG on
 * malformed input, and on more than MAX_SERVE_CONFIG_SERVICES keys.
 */
export function servicesFromServeConfig(text: string, source = 'serve config'): ServeConfigServices {
  const keys = Object.keys(parseServeConfig(text, source).Services ?? {});
  if (keys.length > MAX_SERVE_CONFIG_SERVICES) {
    throw new CertshareError('CERTSHARE_BAD_CONFIG', {
      source,
      reason: `${keys.length} Services, more than the ${MAX_SERVE_CONFIG_SERVICES} certshare advertises`,
    });
  }
  const services = keys.filter(isServiceName).sort();
  const refused = keys
    .filter((key) => !isServiceName(key))
    .map((name) => ({ name, reason: `"${name}" is not a Tailscale Service name (svc:<dns-label>, lower case)` }));
  return { services, refused };
}
