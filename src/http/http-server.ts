import { timingSafeEqual } from 'node:crypto';
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import { errorMessage } from '../core/errors.ts';
import type { Clock } from '../core/ports/clock.ts';
import type { HealthState, HealthVerdict } from '../core/loop/health.ts';
import type { PodAddresses } from '../core/values/pod-addresses.ts';
import type { Metrics } from './daemon-metrics.ts';
import { ROUTING_PROOF_HEADER } from '../core/ports/routing-proof-source.ts';
import type { RoutingProofs } from './routing-proof.ts';
import { NO_SCHEMAS } from './no-schemas.ts';
import { LEAVE_ROTATION_PATH, LEAVE_TOKEN_HEADER } from '../core/served/leave-rotation.ts';

export interface HttpServerDeps {
  health: HealthState;
  metrics: Metrics;
  clock: Clock;
  pod: Pick<PodAddresses, 'ipv4' | 'ipv6'>;
  /** --routing-check: the group's calls that reach this Pod prove the Service routes to it (routing-proof.ts). */
  routingProofs?: RoutingProofs;
  /** HTTPS (--tls): the listener starts without a pair; the caller serves one (servePair) before listening. */
  https?: boolean;
  /**
   * --leave-token: GET /leave-rotation with the token in LEAVE_TOKEN_HEADER runs `leave` and answers when it is
   * done, only once `terminating` says the Pod is being deleted (409 before, 503 when it cannot tell).
   */
  leaveRotation?: { token: string; terminating(): Promise<boolean>; leave(): Promise<void> };
}

/** /healthz and /metrics. Every response, errors included, carries the Pod's addresses for routing checks. */
export function buildHttpServer(deps: HttpServerDeps): FastifyInstance {
  const options = { logger: false, keepAliveTimeout: 5000, return503OnClosing: true, schemaController: NO_SCHEMAS } as const;
  // Typed as the plain HTTP instance: the routes are the same, only the listener differs.
  const app = deps.https ? (Fastify({ ...options, https: { minVersion: 'TLSv1.2' } }) as unknown as FastifyInstance) : Fastify(options);
  // No hook and a callback-style handler: /healthz is probed constantly, and every hook or async
  // handler costs per request (npm run bench: healthzVsBareFastify). The headers are set by the
  // handlers, the not-found handler and the error handler instead, which covers every response.
  const podHeaders: Record<string, string> = {};
  if (deps.pod.ipv4) podHeaders['Pod-IPv4'] = deps.pod.ipv4;
  if (deps.pod.ipv6) podHeaders['Pod-IPv6'] = deps.pod.ipv6;
  const healthz = new Healthz(deps, podHeaders);
  app.get('/healthz', (request, reply) => healthz.answer(request, reply));
  app.get('/metrics', async (_request, reply) => {
    const body = await deps.metrics.registry.metrics();
    return reply.headers(podHeaders).type(deps.metrics.registry.contentType).send(body);
  });
  const leaving = deps.leaveRotation;
  if (leaving) {
    const expected = Buffer.from(leaving.token);
    // The kubelet calls it from the node, any Pod of the cluster could: only a caller that read the Pod's
    // spec (which holds the token) may ask, and only a Pod being deleted leaves: a reader of the spec (the
    // built-in `view` role) who may not delete the Pod cannot take a running replica out of rotation.
    app.get(LEAVE_ROTATION_PATH, async (request, reply) => {
      const given = Buffer.from(String(request.headers[LEAVE_TOKEN_HEADER] ?? ''));
      if (given.length !== expected.length || !timingSafeEqual(given, expected)) {
        return reply
          .code(403)
          .headers(podHeaders)
          .send({ error: 'Forbidden', message: `GET /leave-rotation needs the ${LEAVE_TOKEN_HEADER} header` });
      }
      let terminating: boolean;
      try {
        terminating = await leaving.terminating();
      } catch (err) {
        const message = `could not learn whether the Pod is terminating, nothing changed: ${errorMessage(err)}`;
        return reply.code(503).headers(podHeaders).send({ error: 'Service Unavailable', message });
      }
      if (!terminating) {
        const message = 'the Pod is not terminating (no deletionTimestamp): nothing changed';
        return reply.code(409).headers(podHeaders).send({ error: 'Conflict', message });
      }
      await leaving.leave();
      return reply.headers(podHeaders).type('text/plain; charset=utf-8').send('left rotation');
    });
  }
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

/**
 * GET /healthz. The answer is built when the verdict changes (HealthState.current keeps one verdict object until
 * then): per request, a clock read, a comparison and an identity check.
 *
 * Who sees what: the health port is behind a Service (the routing check's), so any Pod of the cluster
 * can ask. The status and the Pod's addresses are all a probe or a routing check needs; the detail
 * (domains, errors, with ?verbose what the CA said through ACME Renewal Information) goes only to
 * callers on loopback: the Pod itself and `kubectl port-forward`. The logs and the readiness
 * condition's message (readable with the Pod) carry it too.
 */
class Healthz {
  readonly #deps: Pick<HttpServerDeps, 'health' | 'clock' | 'routingProofs'>;
  readonly #podHeaders: Record<string, string>;
  #answer: HealthzAnswer | undefined;

  constructor(deps: Pick<HttpServerDeps, 'health' | 'clock' | 'routingProofs'>, podHeaders: Record<string, string>) {
    this.#deps = deps;
    this.#podHeaders = podHeaders;
  }

  answer(request: FastifyRequest, reply: FastifyReply): void {
    const { health, clock, routingProofs } = this.#deps;
    routingProofs?.received(request.headers[ROUTING_PROOF_HEADER]);
    const verdict = health.current(clock.now());
    if (this.#answer?.verdict !== verdict) this.#answer = healthzAnswer(verdict, this.#podHeaders);
    const answer = this.#answer;
    reply.code(answer.status).headers(answer.headers);
    if (!isLoopback(request.socket.remoteAddress)) reply.send(answer.brief);
    else if (request.url.endsWith('?verbose')) reply.send([answer.body, ...health.details()].join('\n'));
    else reply.send(answer.body);
  }
}

interface HealthzAnswer {
  verdict: HealthVerdict;
  status: number;
  headers: Record<string, string>;
  /** With the detail: for loopback callers. */
  body: string;
  /** Without: for everyone else. */
  brief: string;
}

/** 127.0.0.0/8, ::1, and IPv4 loopback as an IPv6-mapped address. */
function isLoopback(address: string | undefined): boolean {
  return address !== undefined && (address === '::1' || address.startsWith('127.') || address.startsWith('::ffff:127.'));
}

/** What GET /healthz answers for a verdict: 200 "ok" or 503 with the reason, as plain text, with the Pod's addresses. */
function healthzAnswer(verdict: HealthVerdict, podHeaders: Record<string, string>): HealthzAnswer {
  return {
    verdict,
    status: verdict.healthy ? 200 : 503,
    headers: { ...podHeaders, 'content-type': 'text/plain; charset=utf-8' },
    body: verdict.reason,
    brief: verdict.healthy ? 'ok' : 'not healthy (the detail: on loopback, in the logs and in the readiness condition)',
  };
}
