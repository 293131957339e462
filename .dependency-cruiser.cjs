// Import rules checked by `npm test` (npm run check:imports): no import circles; the core (renewal
// decisions, validation, the issuance state machine) stays free of fastify, the Kubernetes client and the
// adapters at the edge; src/cli/ is entry points only, imported by nothing of src/; and @kubernetes/client-node is
// imported by one file, src/kube/transport/client-node.ts (the fence around its internals).
// The floors of src/, from the ground up: a folder imports only folders of lower floors, never one beside it, so
// the adapters stand side by side above the rules and no arrow runs back up (docs/development.md's layout).
const FLOORS = [
  ['core'],
  ['flags', 'store', 'acme', 'localapi', 'signals', 'pki', 'tls'],
  ['logging', 'http', 'served', 'delivery', 'kube', 'emulator'],
  ['config'],
  ['daemon', 'injector'],
  ['cli'],
];
const floorRules = FLOORS.flatMap((floor, i) =>
  floor.map((folder) => ({
    name: `floors-${folder}`,
    severity: 'error',
    comment: `src/${folder}/ stands on floor ${i + 1}: it imports only folders of the floors below (.dependency-cruiser.cjs FLOORS).`,
    from: { path: `^src/${folder}/` },
    to: { path: `^src/(${[...floor.filter((f) => f !== folder), ...FLOORS.slice(i + 1).flat()].join('|')})/` },
  })),
);

module.exports = {
  forbidden: [
    ...floorRules,
    { name: 'no-circular', severity: 'error', comment: 'Import circles hide which module owns what.', from: {}, to: { circular: true } },
    {
      name: 'core-is-pure',
      severity: 'error',
      comment:
        'The pure parts import neither fastify nor the Kubernetes client nor the adapters around them: src/core, and the ' +
        "served checker's scheduling in src/served (rules, not I/O).",
      from: { path: ['^src/core/', '^src/served/served-checker\\.ts$'] },
      to: {
        path: [
          'node_modules/(fastify|@kubernetes/client-node|pino|prom-client)/',
          '^src/(acme|cli|config|delivery|emulator|flags|injector|kube|localapi|logging|pki|http|signals|store|tls)/',
          '^src/served/(advertiser|served-rotation|served-metrics|served-probe)\\.ts$',
          '^src/daemon/',
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
    {
      name: 'client-node-through-the-fence',
      severity: 'error',
      comment:
        "certshare imports @kubernetes/client-node in one file, src/kube/transport/client-node.ts: its dist/ paths are client-node's internals (see src/kube/transport/README.md).",
      from: { path: '^src/', pathNot: '^src/kube/transport/client-node\\.ts$' },
      to: { path: '^node_modules/@kubernetes/client-node/' },
    },
    {
      name: 'client-node-internals-through-the-fence',
      severity: 'error',
      comment:
        "Tests, the bench and scripts reach client-node's dist/ internals through the fence too (its package index is fine); " +
        "but the build's test, which compares the bundle's rewrite of client-node's ObjectSerializer (scripts/build.ts kubeModelsOnDemand) with the original file.",
      from: { path: '^(bin|scripts|bench|test)/', pathNot: '^test/repo/build\\.test\\.ts$' },
      to: { path: '^node_modules/@kubernetes/client-node/dist/', pathNot: '^node_modules/@kubernetes/client-node/dist/index\\.(js|d\\.ts)$' },
    },
  ],
  options: {
    tsPreCompilationDeps: true,
    doNotFollow: { path: 'node_modules' },
    tsConfig: { fileName: 'tsconfig.json' },
  },
};
