// Baseline for the /healthz throughput figure: a bare fastify hello-world, same fastify and Node as the
// daemon, nothing else. Prints {"listening":"http://127.0.0.1:PORT"} once it listens; runs until SIGTERM.
import Fastify from 'fastify';

const app = Fastify({ logger: false });
app.get('/healthz', async () => 'ok');
const address = await app.listen({ host: '127.0.0.1', port: Number(process.argv[2] ?? 0) });
process.stdout.write(`${JSON.stringify({ listening: address })}\n`);
const stop = (): void => {
  void app.close().then(() => process.exit(0));
};
process.once('SIGTERM', stop);
process.once('SIGINT', stop);
