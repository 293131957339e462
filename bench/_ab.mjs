import { buildHttpServer } from '../dist/server/http-server.js';
import { HealthState } from '../dist/core/health.js';
import { Metrics } from '../dist/server/metrics.js';
import { systemClock } from '../dist/core/clock.js';
const v = process.argv[2];
if (v.includes('pino')) { const { createLogger } = await import('../dist/cli/logger.js'); globalThis.l = createLogger('info'); }
const health = new HealthState();
health.manage(['a.tailnet-0000.ts.net']);
if (!v.includes('unhealthy')) health.certificate('a.tailnet-0000.ts.net', { info: { notBefore: Date.now() - 1000, notAfter: Date.now() + 86400000, serial: '1' } });
const metrics = new Metrics(systemClock, { renewFraction: 1 / 3, checkIntervalMs: 86400000 }, { defaultMetrics: !v.includes('nodef') });
const app = buildHttpServer({ health, metrics, clock: systemClock, pod: { ipv4: undefined, ipv6: undefined } });
await app.listen({ host: '127.0.0.1', port: Number(process.argv[3]) });
console.log(JSON.stringify({ listening: 1 }));
