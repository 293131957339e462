import { isIP } from 'node:net';

export interface PodAddresses {
  ipv4: string | undefined;
  ipv6: string | undefined;
  /** Entries that are not IP addresses (a misconfigured downward API field). */
  invalid: string[];
}

/**
 * The one parser of POD_IPS (downward API status.podIPs, comma separated), with POD_IP as the older
 * single-address form: the first IPv4 and the first IPv6 address, checked with a real address parser.
 */
export function podAddressesFromEnv(env: NodeJS.ProcessEnv): PodAddresses {
  const entries = (env.POD_IPS || env.POD_IP || '')
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  return {
    ipv4: entries.find((ip) => isIP(ip) === 4),
    ipv6: entries.find((ip) => isIP(ip) === 6),
    invalid: entries.filter((ip) => isIP(ip) === 0),
  };
}
