// The one file of certshare that imports @kubernetes/client-node (the fence: README.md here says why).
// Deep dist/ paths rather than the package's index: the index loads all of client-node (undici, ws,
// openid-client, the exec and port-forward helpers...) where a replica needs the generated API classes,
// KubeConfig and the seams of its generated HTTP layer that https-transport.ts plugs node:http2 into.
// None of these paths is a documented entry point: a client-node upgrade may move or reshape them, and
// test/integration/client-node-fence.test.ts fails when it does. Everything else imports client-node from here
// (check:imports, .dependency-cruiser.cjs 'client-node-through-the-fence').

// Credentials and cluster settings: kubeconfig files, in-cluster tokens, exec plugins, token refresh.
export { KubeConfig } from '@kubernetes/client-node/dist/config.js';
// The generated API classes certshare calls.
export { CoordinationV1Api, CoreV1Api, CustomObjectsApi, EventsV1Api } from '@kubernetes/client-node/dist/gen/index.js';
// The generated HTTP layer's seams that https-transport.ts replaces or joins: the configuration an API class
// is built from, the per-request authentication hook, the request and response contexts, the library
// wrapper, the base server, the middleware and the observable stub its middleware returns.
export type { SecurityAuthentication } from '@kubernetes/client-node/dist/gen/auth/auth.js';
export { createConfiguration, type ConfigurationOptions } from '@kubernetes/client-node/dist/gen/configuration.js';
export { HttpMethod, RequestContext, ResponseContext, wrapHttpLibrary } from '@kubernetes/client-node/dist/gen/http/http.js';
export { of } from '@kubernetes/client-node/dist/gen/rxjsStub.js';
export { ServerConfiguration } from '@kubernetes/client-node/dist/gen/servers.js';
export { setHeaderMiddleware, setHeaderOptions } from '@kubernetes/client-node/dist/middleware.js';
// Request details: a patch's content type, a MicroTime field (Lease renewals, Events).
export { PatchStrategy } from '@kubernetes/client-node/dist/patch.js';
export { V1MicroTime } from '@kubernetes/client-node/dist/types.js';
// Types only (erased: they load nothing).
export type {
  V1ConfigMap,
  V1Container,
  V1EnvVar,
  V1Lease,
  V1Pod,
  V1PodSpec,
  V1ResourceRequirements,
  V1Secret,
  V1SecurityContext,
  V1Volume,
  V1VolumeMount,
} from '@kubernetes/client-node/dist/gen/models/all.js';
