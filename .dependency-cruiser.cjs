// Import rules checked by `npm test` (npm run check:imports): no import circles; the core (renewal
// decisions, validation, the issuance state machine) stays free of fastify, the Kubernetes client and the
// adapters at the edge; and src/cli/ is entry points only, imported by nothing of src/.
module.exports = {
  forbidden: [
    { name: 'no-circular', severity: 'error', comment: 'Import circles hide which module owns what.', from: {}, to: { circular: true } },
    {
      name: 'core-is-pure',
      severity: 'error',
      comment: 'src/core imports neither fastify nor the Kubernetes client nor the adapters around it.',
      from: { path: '^src/core/' },
      to: {
        path: [
          'node_modules/(fastify|@kubernetes/client-node|pino|prom-client)/',
          '^src/(acme|cli|config|delivery|emulator|flags|injector|kube|localapi|logging|pki|server|signals|store|tls)/',
          '^src/(daemon|store-backend)\\.ts$',
        ],
      },
    },
    {
      name: 'cli-is-entry-points',
      severity: 'error',
      comment: 'src/cli/ holds the commands only: nothing of certshare imports them (flags, logging, signals, config live in their own folders).',
      from: { path: '^src/', pathNot: '^src/cli/' },
      to: { path: '^src/cli/' },
    },
  ],
  options: {
    tsPreCompilationDeps: true,
    doNotFollow: { path: 'node_modules' },
    tsConfig: { fileName: 'tsconfig.json' },
  },
};
