// Per-call deadline and cancellation for client-node's generated APIs: a middleware puts an AbortSignal
// on the request, which the node:https transport (src/kube/https-transport.ts) honours.
import type { ConfigurationOptions } from '@kubernetes/client-node/dist/gen/configuration.js';
import type { RequestContext, ResponseContext } from '@kubernetes/client-node/dist/gen/http/http.js';
import { of } from '@kubernetes/client-node/dist/gen/rxjsStub.js';

/** Options for one API call: it fails after `timeoutMs`, or as soon as `signal` aborts. */
export function callOptions(signal: AbortSignal, timeoutMs: number): ConfigurationOptions {
  return {
    middleware: [
      {
        pre: (context: RequestContext) => {
          context.setSignal(AbortSignal.any([signal, AbortSignal.timeout(timeoutMs)]));
          return of(context);
        },
        post: (context: ResponseContext) => of(context),
      },
    ],
    middlewareMergeStrategy: 'append',
  };
}
