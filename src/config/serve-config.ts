import { partitionDomains } from '../core/domain.ts';
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

export interface ServeConfigDomains {
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
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (err) {
    throw new CertshareError('CERTSHARE_BAD_CONFIG', `${source} is not valid JSON: ${(err as Error).message}`);
  }
  if (!isObject(parsed)) throw new CertshareError('CERTSHARE_BAD_CONFIG', `${source} must be a JSON object`);
  const config = parsed as ServeConfig;
  if (config.Services !== undefined && !isObject(config.Services)) {
    throw new CertshareError('CERTSHARE_BAD_CONFIG', `${source}: "Services" must be an object`);
  }
  const scopes: ServeScope[] = [config, ...Object.values(config.Services ?? {}).filter(isObject)];
  const hosts: string[] = [];
  for (const scope of scopes) {
    if (scope.Web !== undefined && !isObject(scope.Web)) throw new CertshareError('CERTSHARE_BAD_CONFIG', `${source}: "Web" must be an object`);
    if (scope.TCP !== undefined && !isObject(scope.TCP)) throw new CertshareError('CERTSHARE_BAD_CONFIG', `${source}: "TCP" must be an object`);
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
