// A TLS client for the end-to-end tier, run inside the cluster's network namespace (the Pods and
// Services are reachable there only). Every handshake sends the SNI and verifies the chain against the
// given CA bundle (pebble's root), as a browser would; a failure is counted, never retried.
//
//   tls-probe.ts once --ca FILE --sni NAME TARGET...      one handshake per target; one JSON line
//   tls-probe.ts loop --ca FILE --sni NAME --interval-ms N TARGET
//       a new connection every N ms (an HTTP/1.1 GET / over it) until stdin ends; then one JSON line:
//       attempts, failures (time and error), the serials seen in order of first appearance, and when each
//       was first and last served (epoch ms)
import { readFileSync } from 'node:fs';
import { connect } from 'node:tls';
import { parseArgs } from 'node:util';

interface Probe {
  target: string;
  serial?: string;
  notAfter?: string;
  body?: string;
  error?: string;
  ms: number;
}

function probe(target: string, ca: string, servername: string, request: boolean): Promise<Probe> {
  const started = performance.now();
  const [host, port] = [target.slice(0, target.lastIndexOf(':')), Number(target.slice(target.lastIndexOf(':') + 1))];
  return new Promise((resolve) => {
    const done = (p: Omit<Probe, 'target' | 'ms'>) => {
      socket.destroy();
      resolve({ target, ...p, ms: Math.round(performance.now() - started) });
    };
    const socket = connect({ host, port, servername, ca, ALPNProtocols: ['http/1.1'], timeout: 5000 }, () => {
      const cert = socket.getPeerCertificate();
      const seen = { serial: cert.serialNumber, notAfter: cert.valid_to };
      if (!request) return done(seen);
      let body = '';
      socket.setEncoding('utf8');
      socket.on('data', (chunk: string) => (body += chunk));
      socket.on('end', () => done(/^HTTP\/1\.1 200/.test(body) ? seen : { ...seen, error: `HTTP answer: ${body.slice(0, 80)}` }));
      socket.write(`GET / HTTP/1.1\r\nHost: ${servername}\r\nConnection: close\r\n\r\n`);
    });
    socket.on('timeout', () => done({ error: 'timeout' }));
    socket.on('error', (err: NodeJS.ErrnoException) => done({ error: err.code ?? err.message }));
  });
}

const { positionals, values } = parseArgs({
  allowPositionals: true,
  options: { ca: { type: 'string' }, sni: { type: 'string' }, 'interval-ms': { type: 'string', default: '50' } },
});
const [mode, ...targets] = positionals;
if (!values.ca || !values.sni || targets.length === 0 || (mode !== 'once' && mode !== 'loop')) {
  console.error('usage: tls-probe.ts once|loop --ca FILE --sni NAME [--interval-ms N] TARGET...');
  process.exit(2);
}
const ca = readFileSync(values.ca, 'utf8');
const sni = values.sni;

if (mode === 'once') {
  console.log(JSON.stringify(await Promise.all(targets.map((t) => probe(t, ca, sni, false)))));
} else {
  const interval = Number(values['interval-ms']);
  const failures: Array<{ at: string; error: string }> = [];
  const serials: string[] = [];
  /** A serial seen again after a newer one: a replica served an old certificate after the renewal. */
  const regressions: Array<{ at: string; serial: string }> = [];
  const seen: Record<string, { first: number; last: number }> = {};
  let attempts = 0;
  let stopping = false;
  process.stdin.on('end', () => (stopping = true)).resume();
  while (!stopping) {
    const next = performance.now() + interval;
    attempts++;
    const result = await probe(targets[0]!, ca, sni, true);
    const at = new Date().toISOString();
    if (result.error) failures.push({ at, error: result.error });
    if (result.serial) {
      seen[result.serial] = { first: seen[result.serial]?.first ?? Date.parse(at), last: Date.parse(at) };
      const index = serials.indexOf(result.serial);
      if (index === -1) serials.push(result.serial);
      else if (index < serials.length - 1) regressions.push({ at, serial: result.serial });
    }
    const wait = next - performance.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
  }
  console.log(JSON.stringify({ attempts, failures, serials, regressions, seen }));
}
