import Fastify, { type FastifyInstance } from 'fastify';
import type { Clock } from '../core/clock.ts';
import type { HealthState } from '../core/health.ts';
import type { Metrics } from './metrics.ts';

export interface PodAddresses {
  ipv4: string | undefined;
  ipv6: string | undefined;
}

/** POD_IPS (downward API status.podIPs, comma separated) with POD_IP as the older single-address form. */
export function podAddressesFromEnv(env: NodeJS.ProcessEnv): PodAddresses {
  const ips = (env.POD_IPS ?? env.POD_IP ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  return { ipv4: ips.find((ip) => !ip.includes(':')), ipv6: ips.find((ip) => ip.includes(':')) };
}

/** "[::]:9002", "0.0.0.0:9002", "127.0.0.1:0", ":9002" → host and port. */
export function parseListenAddress(text: string): { host: string; port: number } {
  const match = /^(?:\[([^\]]*)\]|([^:]*)):(\d{1,5})$/.exec(text.trim());
  const port = Number(match?.[3]);
  if (!match || port > 65535) throw new Error(`invalid listen address "${text}" (expected HOST:PORT, e.g. [::]:9002)`);
  return { host: match[1] ?? (match[2] || '::'), port };
}

export interface HttpServerDeps {
  health: HealthState;
  metrics: Metrics;
  clock: Clock;
  pod: PodAddresses;
}

/** /healthz and /metrics. Every response, errors included, carries the Pod's addresses for routing checks. */
export function buildHttpServer(deps: HttpServerDeps): FastifyInstance {
  const app = Fastify({ logger: false, keepAliveTimeout: 5000, return503OnClosing: true });
  app.addHook('onRequest', async (_request, reply) => {
    if (deps.pod.ipv4) reply.header('Pod-IPv4', deps.pod.ipv4);
    if (deps.pod.ipv6) reply.header('Pod-IPv6', deps.pod.ipv6);
  });
  app.get('/healthz', async (_request, reply) => {
    const verdict = deps.health.evaluate(deps.clock.now());
    return reply.code(verdict.healthy ? 200 : 503).type('text/plain; charset=utf-8').send(verdict.reason);
  });
  app.get('/metrics', async (_request, reply) => {
    const body = await deps.metrics.registry.metrics();
    return reply.type(deps.metrics.registry.contentType).send(body);
  });
  return app;
}
