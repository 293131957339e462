/**
 * `certshare injector` flags of a test replica on loopback (the apiserver calls it by URL on 127.0.0.1),
 * rotating in seconds: a new CA every 6 s, a new leaf every 2 s, 1 s for the apiserver to see a new bundle.
 * No periodic re-read to lean on (the Secrets and the objects are watched); the Lease runs out 2 s after
 * its holder's last renewal.
 */
export function injectorReplicaFlags(port: number): string[] {
  return [
    ...injectorLoopbackFlags(port),
    ...['--ca-lifetime', '12s', '--ca-rotate-before', '6s', '--leaf-lifetime', '4s', '--leaf-renew-before', '2s', '--propagation-grace', '1s'],
    ...['--resync', '1h', '--lease-duration', '2s'],
  ];
}

/** An injector serving on loopback: the webhook on `port` with 127.0.0.1 in its certificate, metrics on any port. */
export function injectorLoopbackFlags(port: number): string[] {
  return ['--listen', `127.0.0.1:${port}`, '--metrics-listen', '127.0.0.1:0', '--extra-san', '127.0.0.1'];
}
