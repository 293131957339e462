// The webhook's bounds against a flood (src/injector/tls-server.ts), each at the value the docs give: the
// docs' figures are read from README.md and docs/ and compared with the constants, and each bound is
// exercised on a loopback server, callers coming from several loopback addresses (127.0.0.0/8 is all
// local), the body timer on a fake clock. Synchronisation is on the server's own state: every request it
// admits starts one body timer (a pending sleep of the clock) until its body is read or it goes.
import assert from 'node:assert/strict';
import { readdir, readFile } from 'node:fs/promises';
import { request } from 'node:https';
import { connect as tcpConnect, type Socket } from 'node:net';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { createInjectorCa, issueServingLeaf } from '../../src/injector/pki.ts';
import {
  BODY_TIMEOUT_MS,
  MAX_BODY_BYTES,
  MAX_BUFFERED_BYTES,
  MAX_BUFFERED_BYTES_PER_PEER,
  MAX_CONNECTIONS,
  MAX_CONNECTIONS_PER_PEER,
  MAX_IN_FLIGHT,
  MAX_IN_FLIGHT_PER_PEER,
  REQUEST_TIMEOUT_MS,
  startTlsServer,
  type ServingPair,
  type TlsServer,
} from '../../src/injector/tls-server.ts';
import { FakeClock } from '../support/fake-clock.ts';

const REPO = fileURLToPath(new URL('../../', import.meta.url));
const MiB = 1024 * 1024;
const HOUR = 3_600_000;

/** README.md and every page under docs/: wherever the bounds are documented. */
async function docs(): Promise<string> {
  const pages = [await readFile(join(REPO, 'README.md'), 'utf8')];
  const dir = join(REPO, 'docs');
  const names = await readdir(dir, { recursive: true }).catch(() => [] as string[]);
  for (const name of names.filter((n) => n.endsWith('.md')).sort()) pages.push(await readFile(join(dir, name), 'utf8'));
  // One line per paragraph: a phrase may wrap.
  return pages.join('\n').replace(/\n(?!\n)/g, ' ');
}

describe("the webhook's documented bounds are the code's", () => {
  it('README and docs give each bound at the value of its constant', async () => {
    const text = await docs();
    const phrases: Array<[string, RegExp, number[]]> = [
      ['413 over the body bound', /Content-Length is over (\d+) MiB .{0,80}?refused with 413/, [MAX_BODY_BYTES / MiB]],
      [
        'requests and bytes at once, in all and per address',
        /at most (\d+) requests and (\d+) MiB of declared bodies are read or handled at once, (\d+) requests and (\d+) MiB from one address/,
        [MAX_IN_FLIGHT, MAX_BUFFERED_BYTES / MiB, MAX_IN_FLIGHT_PER_PEER, MAX_BUFFERED_BYTES_PER_PEER / MiB],
      ],
      ['connections, in all and per address', /at most (\d+) connections, (\d+) from one address/, [MAX_CONNECTIONS, MAX_CONNECTIONS_PER_PEER]],
      [
        'the body and the whole request',
        /a body must arrive within (\d+) s of its headers \(else 408\), the whole request within (\d+) s/,
        [BODY_TIMEOUT_MS / 1000, REQUEST_TIMEOUT_MS / 1000],
      ],
      // The security table's row (docs/security.md).
      [
        "the security table's shares",
        /a request of at most (\d+) MiB; from one address at most (\d+) requests and (\d+) MiB at once, (\d+) connections/,
        [MAX_BODY_BYTES / MiB, MAX_IN_FLIGHT_PER_PEER, MAX_BUFFERED_BYTES_PER_PEER / MiB, MAX_CONNECTIONS_PER_PEER],
      ],
      [
        "the security table's refusals",
        /503 with Retry-After past (\d+) requests or (\d+) MiB in all, or past its address's share; (\d+) s for a body \(408\); past (\d+) connections/,
        [MAX_IN_FLIGHT, MAX_BUFFERED_BYTES / MiB, BODY_TIMEOUT_MS / 1000, MAX_CONNECTIONS],
      ],
    ];
    for (const [what, phrase, values] of phrases) {
      const found = [...text.matchAll(new RegExp(phrase, 'g'))];
      assert.ok(found.length > 0, `${what}: no sentence of the docs says ${phrase}`);
      for (const m of found) assert.deepEqual(m.slice(1).map(Number), values, `${what}: the docs say "${m[0]}"`);
    }
  });
});

describe('the webhook port under a flood, bound by bound', () => {
  let pair: ServingPair;
  let ca: string;
  let server: TlsServer;
  let clock: FakeClock;
  const open: Array<{ destroy(): void }> = [];

  before(async () => {
    const now = Date.now();
    const authority = await createInjectorCa({ notBefore: now, notAfter: now + HOUR });
    const leaf = await issueServingLeaf(authority, { dnsNames: ['hook'], ipAddresses: ['127.0.0.1'] }, { notBefore: now, notAfter: now + HOUR });
    pair = { certPem: leaf.chainPem, keyPem: leaf.keyPem };
    ca = authority.certPem;
  });

  /** A fresh server per test: no bound carries over. */
  async function fresh(): Promise<void> {
    for (const o of open.splice(0)) o.destroy();
    await server?.close({ graceMs: 0 });
    clock = new FakeClock();
    server = await startTlsServer({ host: '127.0.0.1', port: 0, pair, clock, routes: { '/echo': (body) => ({ echo: body }) } });
  }

  after(async () => {
    for (const o of open.splice(0)) o.destroy();
    await server?.close({ graceMs: 0 });
  });

  interface Sent {
    status: Promise<{ status: number; body: string; retryAfter?: string }>;
  }
  /**
   * A POST from `from` declaring `declared` bytes: `body` is all it sends (a part holds the request in
   * flight), undefined sends no Content-Length (chunked).
   */
  function post(from: string, declared: number | undefined, body: string): Sent {
    const req = request({
      host: '127.0.0.1',
      port: server.port,
      localAddress: from,
      path: '/echo',
      method: 'POST',
      agent: false,
      ca,
      headers: declared === undefined ? {} : { 'content-length': String(declared) },
    });
    open.push(req);
    const status = new Promise<{ status: number; body: string; retryAfter?: string }>((resolve) => {
      req.on('response', (res) => {
        let text = '';
        res.setEncoding('utf8').on('data', (c: string) => (text += c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: text, retryAfter: res.headers['retry-after'] as string | undefined }));
      });
      req.on('error', () => resolve({ status: -1, body: '' }));
    });
    if (body !== '') req.write(body);
    else req.flushHeaders();
    return { status };
  }
  /** `n` requests from `from`, each declaring `declared` bytes and sending one, held in flight. */
  async function hold(from: string, n: number, declared: number): Promise<void> {
    const before = clock.pendingSleeps();
    for (let i = 0; i < n; i++) post(from, declared, '{');
    await clock.waitForSleepers(before + n);
  }
  const whole = (from: string) => post(from, 2, '{}').status;

  it(`per address: ${MAX_IN_FLIGHT_PER_PEER} requests at once, the next 503 with Retry-After; other addresses still served`, async () => {
    await fresh();
    await hold('127.0.0.2', MAX_IN_FLIGHT_PER_PEER, 100);
    const refused = await whole('127.0.0.2');
    assert.equal(refused.status, 503);
    assert.equal(refused.retryAfter, '1');
    assert.match(refused.body, new RegExp(`more than ${MAX_IN_FLIGHT_PER_PEER} requests or ${MAX_BUFFERED_BYTES_PER_PEER} bytes at once from 127\\.0\\.0\\.2`));
    assert.equal((await whole('127.0.0.3')).status, 200);
  });

  it(`per address: ${MAX_BUFFERED_BYTES_PER_PEER / MiB} MiB of declared bodies at once`, async () => {
    await fresh();
    await hold('127.0.0.2', 1, MAX_BUFFERED_BYTES_PER_PEER - 10);
    const refused = await post('127.0.0.2', 11, '').status;
    assert.equal(refused.status, 503);
    assert.match(refused.body, /at once from 127\.0\.0\.2/);
    // Up to the byte, the same address still gets in; another address is not held to the first one's share.
    await hold('127.0.0.2', 1, 10);
    assert.equal((await whole('127.0.0.3')).status, 200);
  });

  it(`in all: ${MAX_IN_FLIGHT} requests at once, from addresses each within its share`, async () => {
    await fresh();
    for (let i = 0; i * MAX_IN_FLIGHT_PER_PEER < MAX_IN_FLIGHT; i++) await hold(`127.0.1.${i + 1}`, MAX_IN_FLIGHT_PER_PEER, 100);
    const refused = await whole('127.0.2.1');
    assert.equal(refused.status, 503);
    assert.match(refused.body, new RegExp(`more than ${MAX_IN_FLIGHT} requests or ${MAX_BUFFERED_BYTES} bytes at once"`));
  });

  it(`in all: ${MAX_BUFFERED_BYTES / MiB} MiB of declared bodies at once`, async () => {
    await fresh();
    for (let i = 0; i * MAX_BUFFERED_BYTES_PER_PEER < MAX_BUFFERED_BYTES; i++) await hold(`127.0.3.${i + 1}`, 1, MAX_BUFFERED_BYTES_PER_PEER);
    const refused = await post('127.0.4.1', 1, '').status;
    assert.equal(refused.status, 503);
    assert.match(refused.body, new RegExp(`more than ${MAX_IN_FLIGHT} requests or ${MAX_BUFFERED_BYTES} bytes at once"`));
  });

  it('411 without Content-Length, 413 over the bound, both before a byte of the body is read', async () => {
    await fresh();
    const chunked = await post('127.0.0.2', undefined, '').status;
    assert.equal(chunked.status, 411);
    assert.match(chunked.body, /Content-Length required/);
    assert.equal((await post('127.0.0.2', MAX_BODY_BYTES + 1, '').status).status, 413);
    assert.equal(clock.sleepCalls.length, 0, 'no body timer started: nothing was read');
  });

  it(`408 when the body has not arrived ${BODY_TIMEOUT_MS / 1000} s after its headers (the clock's), and the slot is free again`, async () => {
    await fresh();
    const slow = post('127.0.0.2', 100, '{"half":');
    await clock.waitForSleepers(1);
    assert.deepEqual(clock.pendingDurations(), [BODY_TIMEOUT_MS]);
    await clock.advance(BODY_TIMEOUT_MS);
    const answer = await slow.status;
    assert.equal(answer.status, 408);
    assert.match(answer.body, new RegExp(`not received within ${BODY_TIMEOUT_MS} ms`));
    assert.equal((await whole('127.0.0.2')).status, 200);
  });

  /** A TCP connection from `from`, once connected; `closed` resolves when the server drops it. */
  async function tcp(from: string): Promise<{ socket: Socket; closed: Promise<void> }> {
    const socket = tcpConnect({ host: '127.0.0.1', port: server.port, localAddress: from });
    open.push(socket);
    const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
    socket.on('error', () => {});
    await new Promise<void>((resolve, reject) => {
      socket.once('connect', resolve);
      socket.once('error', reject);
    });
    return { socket, closed };
  }
  /** Resolves when an exchange over a new connection from `from` completed: the server has handled every accept before it. */
  const barrier = async (from: string) => assert.equal((await whole(from)).status, 200);

  it(`${MAX_CONNECTIONS_PER_PEER} connections per address, the next dropped at accept`, async () => {
    await fresh();
    const kept = [];
    for (let i = 0; i < MAX_CONNECTIONS_PER_PEER; i++) kept.push(await tcp('127.0.5.1'));
    const extra = await tcp('127.0.5.1');
    await extra.closed;
    await barrier('127.0.5.2');
    for (const k of kept) assert.equal(k.socket.destroyed, false, 'the first ones stay');
  });

  it(`${MAX_CONNECTIONS} connections in all: past it the address holding most loses its oldest, not the newcomer`, async () => {
    await fresh();
    const flooders = MAX_CONNECTIONS / MAX_CONNECTIONS_PER_PEER;
    const byAddress: Array<Array<{ socket: Socket; closed: Promise<void> }>> = [];
    for (let a = 0; a < flooders; a++) {
      byAddress.push([]);
      for (let i = 0; i < MAX_CONNECTIONS_PER_PEER; i++) byAddress[a]!.push(await tcp(`127.0.6.${a + 1}`));
    }
    // The apiserver, say, from an address of its own: let in, and the first flooder's oldest connection goes.
    const newcomer = await tcp('127.0.7.1');
    await byAddress[0]![0]!.closed;
    assert.equal(newcomer.socket.destroyed, false);
    assert.equal(byAddress[0]![1]!.socket.destroyed, false, 'one connection, the oldest');
  });
});
