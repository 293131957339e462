// Baseline for the standalone figures: a bare fastify hello-world, same fastify and Node as the daemon,
// nothing else, bundled the way dist/ is (bench/lib/baseline.ts) and configured as the bundle needs (no
// schema compilers: src/http/no-schemas.ts). The bench measures it next to the daemon: RSS, /healthz
// throughput, start-up to its first answer. Prints {"listening":"http://127.0.0.1:PORT"} once it
// listens; runs until SIGTERM. `node bench/fastify-hello.ts [PORT]` also runs it unbundled.
import Fastify from 'fastify';
import { NO_SCHEMAS } from '../src/http/no-schemas.ts';

const app = Fastify({ logger: false, schemaController: NO_SCHEMAS });
app.get('/healthz', async () => 'ok');
const address = await app.listen({ host: '127.0.0.1', port: Number(process.argv[2] ?? 0) });
process.stdout.write(`${JSON.stringify({ listening: address })}\n`);
const stop = (): void => {
  void app.close().then(() => process.exit(0));
};
process.once('SIGTERM', stop);
process.once('SIGINT', stop);
