// /healthz and /metrics as the daemon serves them: the routes (http-server.ts) on --listen, over HTTPS with
// the --tls pair followed from its source, each renewed pair served from the next handshake on while open
// connections keep theirs. Built with the daemon's other parts; listen() is one of its start-up checks.
import type { Server as TlsServer } from 'node:tls';
import type { Clock } from '../core/ports/clock.ts';
import type { Logger } from '../core/ports/logger.ts';
import type { PodAddresses } from '../core/values/pod-addresses.ts';
import { followPair, type FollowedPair } from '../tls/followed-pair.ts';
import { servePair, type PairSourceOptions, type TlsChoice } from '../tls/serving-pair.ts';
import { buildHttpServer, type HttpServerDeps } from './http-server.ts';

/** Where /healthz and /metrics listen, the Pod's addresses every answer carries, and the --tls pair (undefined: HTTP). */
export interface HttpSettings {
  listen: { host: string; port: number };
  pod: PodAddresses;
  tls: TlsChoice | undefined;
}

interface DaemonListenerDeps extends Omit<HttpServerDeps, 'pod' | 'https'> {
  clock: Clock;
  logger: Logger;
  env: NodeJS.ProcessEnv;
  /** A renewed --tls pair is served, with its serial. */
  onTlsServed(serial: string): void;
  /** Where a `--tls secret:NAME` pair comes from (kube/secret-pair-source.ts, handed in by the daemon). */
  secretSource: NonNullable<PairSourceOptions['secretSource']>;
}

export interface DaemonListener {
  /** The first --tls pair read and served (unusable: it throws, nothing listens), then listening: the address. */
  listen(): Promise<string>;
  /** No more renewed pairs followed; the listener keeps serving the last one. */
  stopFollowing(): Promise<void>;
  close(): Promise<void>;
}

export function daemonListener(settings: HttpSettings, deps: DaemonListenerDeps): DaemonListener {
  const { logger, clock, env, onTlsServed, secretSource, ...routes } = deps;
  const app = buildHttpServer({ ...routes, clock, pod: settings.pod, https: settings.tls !== undefined });
  let tls: FollowedPair | undefined;
  return {
    async listen() {
      if (settings.tls) {
        const server = app.server as unknown as TlsServer;
        tls = await followPair(settings.tls, { clock, logger, env, secretSource, what: '/healthz and /metrics', onServed: onTlsServed });
        servePair(server, tls.first);
        tls.serveOn((renewed) => servePair(server, renewed));
      }
      return app.listen(settings.listen);
    },
    stopFollowing: async () => tls?.stop(),
    async close() {
      await app.close();
    },
  };
}
