// fastify's schema compilers for servers that declare no JSON schema: the daemon's (http-server.ts) and the
// bench's bare fastify baseline (bench/fastify-hello.ts), which needs them for the same reason once bundled:
// the bundle replaces fastify's default compilers with stand-ins (scripts/build.ts LOAD_TIME_STAND_INS).

/**
 * No route declares a JSON schema, so fastify needs neither of its schema compilers: given these, it never
 * loads its defaults (ajv, fast-json-stringify), which cost a daemon ~25-35 ms of start-up and ~3 MB of RSS
 * (measured with fastify alone). A route with a schema would fail at start-up, saying why.
 */
export const NO_SCHEMAS = {
  compilersFactory: {
    buildValidator: noSchemaCompiler,
    buildSerializer: noSchemaCompiler,
  },
};

function noSchemaCompiler(): never {
  throw new Error('certshare routes declare no JSON schema (no-schemas.ts NO_SCHEMAS): add a schema compiler first');
}
