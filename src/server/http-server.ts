import Fastify, { type FastifyInstance } from 'fastify';
import { errorMessage } from '../core/errors.ts';
import type { Clock } from '../core/clock.ts';
import type { HealthState } from '../core/health.ts';
import type { PodAddresses } from '../core/pod-addresses.ts';
import type { Metrics } from './metrics.ts';

export interface HttpServerDeps {
  health: HealthState;
  metrics: Metrics;
  clock: Clock;
  pod: Pick<PodAddresses, 'ipv4' | 'ipv6'>;
  /** HTTPS (--tls): the listener starts without a pair; the caller serves one (servePair) before listening. */
  https?: boolean;
}

/** /healthz and /metrics. Every response, errors included, carries the Pod's addresses for routing checks. */
export function buildHttpServer(deps: HttpServerDeps): FastifyInstance {
  const options = { logger: false, keepAliveTimeout: 5000, return503OnClosing: true } as const;
  // Typed as the plain HTTP instance: the routes are the same, only the listener differs.
  const app = deps.https ? (Fastify({ ...options, https: { minVersion: 'TLSv1.2' } }) as unknown as FastifyInstance) : Fastify(options);
  // No hook and a callback-style handler: /healthz is probed constantly, and every hook or async
  // handler costs per request (npm run bench: healthzVsBareFastify). The headers are set by the
  // handlers, the not-found handler and the error handler instead, which covers every response.
  const podHeaders: Record<string, string> = {};
  if (deps.pod.ipv4) podHeaders['Pod-IPv4'] = deps.pod.ipv4;
  if (deps.pod.ipv6) podHeaders['Pod-IPv6'] = deps.pod.ipv6;
  // ?verbose adds a line per domain with what the CA said through ACME Renewal Information (its window,
  // the renewal time chosen in it, its explanation); the plain answer stays "ok" for probes.
  app.get('/healthz', (request, reply) => {
    const verdict = deps.health.evaluate(deps.clock.now());
    const verbose = (request.query as Record<string, unknown> | undefined)?.verbose !== undefined;
    reply
      .code(verdict.healthy ? 200 : 503)
      .headers(podHeaders)
      .header('content-type', 'text/plain; charset=utf-8')
      .send(verbose ? [verdict.reason, ...deps.health.details()].join('\n') : verdict.reason);
  });
  app.get('/metrics', async (_request, reply) => {
    const body = await deps.metrics.registry.metrics();
    return reply.headers(podHeaders).type(deps.metrics.registry.contentType).send(body);
  });
  app.setNotFoundHandler((_request, reply) => {
    reply.code(404).headers(podHeaders).send({ error: 'Not Found', message: 'certshare serves GET /healthz and GET /metrics' });
  });
  app.setErrorHandler((err, _request, reply) => {
    const status = (err as { statusCode?: number }).statusCode ?? 500;
    reply
      .code(status >= 400 ? status : 500)
      .headers(podHeaders)
      .send({ error: status >= 500 ? 'Internal Server Error' : 'Bad Request', message: errorMessage(err) });
  });
  return app;
}
