// Import rules checked by `npm test` (npm run check:imports): no import circles, and the core (renewal
// decisions, validation, the issuance state machine) stays free of fastify, the Kubernetes client and the
// adapters at the edge.
module.exports = {
  forbidden: [
    { name: 'no-circular', severity: 'error', comment: 'Import circles hide which module owns what.', from: {}, to: { circular: true } },
    {
      name: 'core-is-pure',
      severity: 'error',
      comment: 'src/core imports neither fastify nor the Kubernetes client nor the adapters around it.',
      from: { path: '^src/core/' },
      to: { path: ['node_modules/(fastify|@kubernetes/client-node|pino|prom-client)/', '^src/(acme|cli|config|delivery|emulator|injector|kube|localapi|server|store)/', '^src/(daemon|store-backend)\\.ts$'] },
    },
  ],
  options: {
    tsPreCompilationDeps: true,
    doNotFollow: { path: 'node_modules' },
    tsConfig: { fileName: 'tsconfig.json' },
  },
};
