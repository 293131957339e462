import { describe, test, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { LocalApiError, NotifyMask } from '../../../src/core/ports/localapi.ts';
import type { IpnNotify } from '../../../src/core/ports/localapi.ts';
import { CertshareError } from '../../../src/core/errors.ts';
import { silentLogger } from '../../../src/core/ports/logger.ts';
import { createLocalApiClient, splitCertPair } from '../../../src/localapi/client.ts';
import { parseRetryAfter } from '../../../src/core/renewal/retry-after.ts';
import type { LocalApiClientOptions } from '../../../src/localapi/client.ts';
import { BusConnection, samplePems, sendJson, sendText, startServer } from '../../support/localapi.ts';
import type { Handler, TestServer, Transport } from '../../support/localapi.ts';

const pems = samplePems();
const never = new AbortController().signal;

function client(server: TestServer, extra: Partial<LocalApiClientOptions> = {}) {
  return createLocalApiClient({ address: server.address, logger: silentLogger, ...extra });
}

async function withServer(transport: Transport, handler: Handler, fn: (server: TestServer) => Promise<void>) {
  const server = await startServer(handler, transport);
  try {
    await fn(server);
  } finally {
    await server.close();
  }
}

function isCallError(code: string, extra: (err: LocalApiError) => void = () => {}) {
  return (err: unknown): boolean => {
    assert.ok(err instanceof LocalApiError, `expected LocalApiError, got ${String(err)}`);
    assert.ok(err instanceof CertshareError);
    assert.equal(err.code, code, err.message);
    extra(err);
    return true;
  };
}

async function collect(iterable: AsyncIterable<IpnNotify>): Promise<IpnNotify[]> {
  const out: IpnNotify[] = [];
  for await (const n of iterable) out.push(n);
  return out;
}

for (const transport of ['unix', 'tcp'] as const) {
  describe(`LocalAPI client over ${transport}`, () => {
    test('certPair sends the LocalAPI headers and splits key and chain', async () => {
      await withServer(
        transport,
        (_req, res) => sendText(res, 200, pems.keyPem + pems.chainPem, { 'Tailscale-Version': '1.100.0' }),
        async (server) => {
          const pair = await client(server, { clientVersionCap: 125 }).certPair('node.tail1.ts.net', {
            minValidityMs: 30 * 86_400_000,
            signal: never,
          });
          assert.equal(pair.keyPem, pems.keyPem);
          assert.equal(pair.certPem, pems.chainPem);
          const [req] = server.requests;
          assert.equal(req!.method, 'GET');
          assert.equal(req!.url, '/localapi/v0/cert/node.tail1.ts.net?type=pair&min_validity=720h0m0s');
          assert.equal(req!.headers.host, 'local-tailscaled.sock');
          assert.equal(req!.headers['tailscale-cap'], '125');
          assert.equal(req!.headers.referer, undefined);
          assert.equal(req!.headers.origin, undefined);
        },
      );
    });

    test('certPair sends min_validity=0s and a default Tailscale-Cap', async () => {
      await withServer(
        transport,
        (_req, res) => sendText(res, 200, pems.keyPem + pems.leafPem),
        async (server) => {
          await client(server).certPair('a.b.ts.net', { minValidityMs: 0, signal: never });
          assert.match(server.requests[0]!.url, /&min_validity=0s$/);
          assert.match(String(server.requests[0]!.headers['tailscale-cap']), /^\d+$/);
        },
      );
    });

    test('certPair rejects a body whose key comes after the certificates', async () => {
      await withServer(
        transport,
        (_req, res) => sendText(res, 200, pems.chainPem + pems.keyPem),
        async (server) => {
          await assert.rejects(
            client(server).certPair('a.b.ts.net', { minValidityMs: 0, signal: never }),
            isCallError('CERTSHARE_LOCALAPI_BAD_RESPONSE', (err) => {
              assert.equal(err.status, undefined);
              assert.doesNotMatch(err.message, /BEGIN/);
            }),
          );
        },
      );
    });

    test('HTTP 429 with Retry-After seconds becomes a LocalApiError with retryAfterMs', async () => {
      const text =
        'acme: 429 urn:ietf:params:acme:error:rateLimited: too many certificates (5) already issued for this exact set of domains in the last 168h0m0s';
      await withServer(
        transport,
        (_req, res) => sendText(res, 429, `${text}\n`, { 'Retry-After': '3600' }),
        async (server) => {
          await assert.rejects(
            client(server).certPair('a.b.ts.net', { minValidityMs: 0, signal: never }),
            isCallError('CERTSHARE_LOCALAPI_HTTP', (err) => {
              assert.equal(err.status, 429);
              assert.equal(err.retryAfterMs, 3_600_000);
              assert.equal(err.body, text);
              assert.equal(err.timedOut, false);
              assert.match(err.message, /HTTP 429: acme: 429/);
            }),
          );
        },
      );
    });

    test('a 4xx that asking again cannot change is CERTSHARE_LOCALAPI_REFUSED, naming the tailscaled version and the request', async () => {
      await withServer(
        transport,
        (req, res) =>
          req.url?.startsWith('/localapi/v0/watch-ipn-bus')
            ? sendText(res, 400, 'the NotifyRateLimit IPN bus subscription bit is no longer supported\n', { 'Tailscale-Version': '1.104.5-t1' })
            : sendText(res, 403, 'cert access denied\n', { 'Tailscale-Version': '1.104.5-t1' }),
        async (server) => {
          const c = client(server);
          assert.equal(c.tailscaledVersion(), undefined);
          const iterator = c.watchIpnBus(282, never)[Symbol.asyncIterator]();
          await assert.rejects(
            iterator.next(),
            isCallError('CERTSHARE_LOCALAPI_REFUSED', (err) => {
              assert.equal(err.status, 400);
              assert.equal(err.tailscaledVersion, '1.104.5-t1');
              assert.match(
                err.message,
                new RegExp(
                  '^tailscaled LocalAPI refused GET \\/localapi\\/v0\\/watch-ipn-bus\\?mask=282: tailscaled 1\\.104\\.5-t1 answered ' +
                    'HTTP 400: the NotifyRateLimit IPN bus subscription bit is no longer supported ' +
                    '\\(this tailscaled release refuses the IPN bus subscription mask',
                ),
              );
            }),
          );
          assert.equal(c.tailscaledVersion(), '1.104.5-t1');
          await assert.rejects(
            c.certPair('a.b.ts.net', { minValidityMs: 0, signal: never }),
            isCallError('CERTSHARE_LOCALAPI_REFUSED', (err) => {
              assert.equal(err.status, 403);
              assert.match(err.message, /HTTP 403: cert access denied \(.*TS_PERMIT_CERT_UID/);
            }),
          );
        },
      );
    });

    test('watchIpnBus streams Notifies as they arrive and finishes when the server ends the stream', async () => {
      let conn: BusConnection | undefined;
      await withServer(
        transport,
        (req, res) => {
          conn = new BusConnection(req, res);
        },
        async (server) => {
          const mask = NotifyMask.InitialState | NotifyMask.InitialNetMap | NotifyMask.NoPrivateKeys;
          const iterator = client(server).watchIpnBus(mask, never)[Symbol.asyncIterator]();
          const first = iterator.next();
          await server.nextRequest();
          assert.equal(server.requests[0]!.url, `/localapi/v0/watch-ipn-bus?mask=${mask}`);
          assert.equal(server.requests[0]!.headers.host, 'local-tailscaled.sock');
          conn!.send({ Version: '1.100.0', State: 6 });
          assert.deepEqual((await first).value, { Version: '1.100.0', State: 6 });
          // The second message is written only after the first was received: proves incremental reading.
          conn!.sendRaw('{"SelfChange":{"Name":"n"}}\n{"State"');
          conn!.sendRaw(':4}\n');
          assert.deepEqual((await iterator.next()).value, { SelfChange: { Name: 'n' } });
          assert.deepEqual((await iterator.next()).value, { State: 4 });
          conn!.end();
          assert.equal((await iterator.next()).done, true);
        },
      );
    });
  });
}

describe('certPair response splitting', () => {
  test('key first, then the chain', () => {
    const pair = splitCertPair(pems.keyPem + pems.chainPem);
    assert.equal(pair.keyPem, pems.keyPem);
    assert.equal(pair.certPem, pems.chainPem);
  });

  test('tolerates CRLF and surrounding whitespace', () => {
    const body = `\r\n${(pems.keyPem + pems.chainPem).replaceAll('\n', '\r\n')}\r\n\r\n`;
    const pair = splitCertPair(body);
    assert.match(pair.keyPem, /^-----BEGIN EC PRIVATE KEY-----\r\n/);
    assert.match(pair.certPem, /^-----BEGIN CERTIFICATE-----\r\n[\s\S]*-----END CERTIFICATE-----\n$/);
  });

  const bad: [string, string][] = [
    ['no certificate', pems.keyPem],
    ['no key', pems.chainPem],
    ['key after the certificates', pems.leafPem + pems.keyPem],
    ['a private key inside the certificate part', pems.keyPem + pems.leafPem + pems.keyPem + pems.leafPem],
    ['two key blocks', pems.keyPem + pems.keyPem + pems.leafPem],
    ['garbage', 'hello world'],
    ['garbage before the key', `junk\n${pems.keyPem}${pems.leafPem}`],
    ['truncated certificate', pems.keyPem + pems.leafPem.slice(0, 80)],
    ['empty', ''],
  ];
  for (const [name, body] of bad) {
    test(`rejects ${name}`, () => {
      assert.throws(
        () => splitCertPair(body),
        isCallError('CERTSHARE_LOCALAPI_BAD_RESPONSE', (err) => {
          assert.equal(err.status, undefined);
          assert.doesNotMatch(err.message, /-----BEGIN|MHc|hello/);
        }),
      );
    });
  }
});

describe('Retry-After', () => {
  test('seconds and HTTP-date', () => {
    const now = Date.UTC(2026, 0, 1, 12, 0, 0);
    assert.equal(parseRetryAfter('120', now), 120_000);
    assert.equal(parseRetryAfter(' 0 ', now), 0);
    assert.equal(parseRetryAfter('Thu, 01 Jan 2026 13:00:00 GMT', now), 3_600_000);
    assert.equal(parseRetryAfter('Thu, 01 Jan 2026 11:00:00 GMT', now), 0);
    assert.equal(parseRetryAfter('soon', now), undefined);
    assert.equal(parseRetryAfter('-5', now), undefined);
    assert.equal(parseRetryAfter(undefined, now), undefined);
  });

  test('an HTTP-date header is measured against the injected wall clock', async () => {
    const now = Date.UTC(2026, 0, 1, 12, 0, 0);
    await withServer(
      'tcp',
      (_req, res) => sendText(res, 429, 'rate limited', { 'Retry-After': 'Thu, 01 Jan 2026 12:10:00 GMT' }),
      async (server) => {
        await assert.rejects(
          client(server, { now: () => now }).certPair('a.b.ts.net', { minValidityMs: 0, signal: never }),
          (err: unknown) => err instanceof LocalApiError && err.retryAfterMs === 600_000,
        );
      },
    );
  });
});

describe('errors', () => {
  test('a missing socket gives a clear error naming the path', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'certshare-la-'));
    after(() => rm(dir, { recursive: true, force: true }));
    const address = join(dir, 'tailscaled.sock');
    const api = createLocalApiClient({ address, logger: silentLogger });
    await assert.rejects(
      api.certDomains(never),
      isCallError('CERTSHARE_LOCALAPI_UNREACHABLE', (err) => {
        assert.equal(err.status, undefined);
        assert.equal(err.timedOut, false);
        assert.ok(
          err.message.startsWith(`tailscaled LocalAPI unreachable for GET /localapi/v0/cert-domains: not reachable at ${address}: ENOENT`),
          err.message,
        );
      }),
    );
    await assert.rejects(
      collect(api.watchIpnBus(2, never)),
      isCallError('CERTSHARE_LOCALAPI_UNREACHABLE', (err) => assert.match(err.message, /ENOENT/)),
    );
  });

  test('a closed TCP port gives ECONNREFUSED', async () => {
    const probe = http.createServer();
    await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve));
    const port = (probe.address() as AddressInfo).port;
    await new Promise<void>((resolve) => probe.close(() => resolve()));
    const api = createLocalApiClient({ address: `http://127.0.0.1:${port}`, logger: silentLogger });
    await assert.rejects(
      api.certPair('a.b.ts.net', { minValidityMs: 0, signal: never }),
      isCallError('CERTSHARE_LOCALAPI_UNREACHABLE', (err) =>
        assert.match(err.message, new RegExp(`not reachable at http://127\\.0\\.0\\.1:${port}: ECONNREFUSED`)),
      ),
    );
  });

  test('a CertPair that takes longer than certTimeoutMs rejects with timedOut', async () => {
    await withServer(
      'unix',
      () => {},
      async (server) => {
        await assert.rejects(
          client(server, { certTimeoutMs: 50 }).certPair('slow.ts.net', { minValidityMs: 0, signal: never }),
          isCallError('CERTSHARE_LOCALAPI_TIMEOUT', (err) => {
            assert.equal(err.timedOut, true);
            assert.equal(err.status, undefined);
          }),
        );
      },
    );
  });

  test('the timeout also covers a body that stalls after the headers', async () => {
    await withServer(
      'unix',
      (_req, res) => {
        res.writeHead(200);
        res.write(pems.keyPem);
      },
      async (server) => {
        await assert.rejects(
          client(server, { certTimeoutMs: 50 }).certPair('slow.ts.net', { minValidityMs: 0, signal: never }),
          (err: unknown) => err instanceof LocalApiError && err.timedOut,
        );
      },
    );
  });

  test("the caller's abort rejects with the signal's reason, not a LocalApiError", async () => {
    await withServer(
      'unix',
      () => {},
      async (server) => {
        const controller = new AbortController();
        const reason = new Error('shutting down');
        const call = client(server).certPair('a.b.ts.net', { minValidityMs: 0, signal: controller.signal });
        const { req } = await server.nextRequest();
        const gone = new Promise((resolve) => req.socket.once('close', resolve));
        controller.abort(reason);
        await assert.rejects(call, (err: unknown) => err === reason);
        await gone; // the request was torn down
      },
    );
  });

  test('an already aborted signal rejects without a request', async () => {
    await withServer(
      'unix',
      () => {},
      async (server) => {
        const reason = new Error('already');
        await assert.rejects(client(server).certDomains(AbortSignal.abort(reason)), (err: unknown) => err === reason);
        assert.equal(server.requests.length, 0);
      },
    );
  });

  test('a long error body is trimmed and capped; key material is withheld', async () => {
    let body = 'x'.repeat(10_000);
    await withServer(
      'tcp',
      (_req, res) => sendText(res, 500, `  ${body}  `),
      async (server) => {
        const api = client(server);
        await assert.rejects(
          api.certPair('a.b.ts.net', { minValidityMs: 0, signal: never }),
          (err: unknown) => err instanceof LocalApiError && err.status === 500 && err.body.length <= 2049,
        );
        body = `oops ${pems.keyPem}`;
        await assert.rejects(
          api.certPair('a.b.ts.net', { minValidityMs: 0, signal: never }),
          (err: unknown) => err instanceof LocalApiError && !err.body.includes('BEGIN') && !err.message.includes('BEGIN'),
        );
      },
    );
  });

  test('403 cert access denied', async () => {
    await withServer(
      'unix',
      (_req, res) => sendText(res, 403, 'cert access denied\n'),
      async (server) => {
        await assert.rejects(
          client(server).certPair('a.b.ts.net', { minValidityMs: 0, signal: never }),
          (err: unknown) => err instanceof LocalApiError && err.status === 403 && err.body === 'cert access denied' && !err.retryAfterMs,
        );
      },
    );
  });
});

describe('cert-domains and status', () => {
  test('certDomains returns the list; null is an empty list; 404 keeps its status', async () => {
    let answer: () => [number, string] = () => [200, '["a.ts.net","b.ts.net"]'];
    await withServer(
      'unix',
      (_req, res) => {
        const [status, body] = answer();
        sendText(res, status, body);
      },
      async (server) => {
        const api = client(server);
        assert.deepEqual(await api.certDomains(never), ['a.ts.net', 'b.ts.net']);
        assert.equal(server.requests[0]!.url, '/localapi/v0/cert-domains');
        answer = () => [200, 'null'];
        assert.deepEqual(await api.certDomains(never), []);
        answer = () => [404, '404 page not found\n'];
        await assert.rejects(api.certDomains(never), (err: unknown) => err instanceof LocalApiError && err.status === 404);
        answer = () => [200, '[1,2]'];
        await assert.rejects(api.certDomains(never), isCallError('CERTSHARE_LOCALAPI_BAD_RESPONSE'));
        answer = () => [200, '<html>'];
        await assert.rejects(api.certDomains(never), isCallError('CERTSHARE_LOCALAPI_BAD_RESPONSE'));
      },
    );
  });

  test('status asks without peers and returns the object', async () => {
    await withServer(
      'tcp',
      (_req, res) => sendJson(res, 200, { BackendState: 'Running', CertDomains: ['n.ts.net'] }),
      async (server) => {
        const status = await client(server).status(never);
        assert.deepEqual(status.CertDomains, ['n.ts.net']);
        assert.equal(server.requests[0]!.url, '/localapi/v0/status?peers=false');
      },
    );
  });

  test('an http:// address with credentials sends basic auth and Sec-Tailscale (tsnet)', async () => {
    await withServer(
      'tcp',
      (_req, res) => sendJson(res, 200, []),
      async (server) => {
        const address = server.address.replace('http://', 'http://:s3cret@');
        await createLocalApiClient({ address, logger: silentLogger }).certDomains(never);
        const headers = server.requests[0]!.headers;
        assert.equal(headers.authorization, `Basic ${Buffer.from(':s3cret').toString('base64')}`);
        assert.equal(headers['sec-tailscale'], 'localapi');
        assert.equal(headers.host, 'local-tailscaled.sock');
      },
    );
  });
});

describe('IPN bus stream', () => {
  const busServer =
    (fn: (conn: BusConnection) => void): Handler =>
    (req, res) =>
      fn(new BusConnection(req, res));

  test('a malformed line is reported through onBadLine and the stream continues', async () => {
    await withServer(
      'unix',
      busServer((conn) => {
        conn.sendRaw('{"State":2}\nnot json\n[1,2]\n"str"\n{"State":6}\n');
        conn.end();
      }),
      async (server) => {
        const bad: CertshareError[] = [];
        const got = await collect(client(server, { onBadLine: (err) => bad.push(err) }).watchIpnBus(2, never));
        assert.deepEqual(got, [{ State: 2 }, { State: 6 }]);
        assert.equal(bad.length, 3);
        assert.ok(bad.every((e) => e instanceof CertshareError && e.code === 'CERTSHARE_BUS_BAD_LINE'));
        assert.ok(
          bad.every((e) => !e.message.includes('not json')),
          'line content is not echoed',
        );
      },
    );
  });

  test('a line over maxBusLineBytes ends the iteration with CERTSHARE_BUS_LINE_TOO_LONG and closes the request', async () => {
    let closed: Promise<void> | undefined;
    await withServer(
      'unix',
      busServer((conn) => {
        closed = conn.closed;
        conn.send({ State: 6 });
        conn.sendRaw(`{"NetMap":"${'x'.repeat(4000)}`); // no newline: the limit trips before it
      }),
      async (server) => {
        const got: IpnNotify[] = [];
        await assert.rejects(
          (async () => {
            for await (const n of client(server, { maxBusLineBytes: 1024 }).watchIpnBus(2, never)) got.push(n);
          })(),
          (err: unknown) => err instanceof CertshareError && err.code === 'CERTSHARE_BUS_LINE_TOO_LONG',
        );
        assert.deepEqual(got, [{ State: 6 }]);
        await closed;
      },
    );
  });

  test('a 5 MB netmap line arrives whole', async () => {
    const peers = Array.from({ length: 20_000 }, (_, i) => ({ Name: `peer-${i}.tail1.ts.net`, Pad: 'p'.repeat(220) }));
    const netmap = { NetMap: { DNS: { CertDomains: ['big.tail1.ts.net'] }, Peers: peers } };
    const line = Buffer.from(`${JSON.stringify(netmap)}\n`);
    assert.ok(line.length > 5_000_000);
    await withServer(
      'tcp',
      busServer((conn) => {
        for (let i = 0; i < line.length; i += 100_000) conn.sendRaw(line.subarray(i, i + 100_000));
        conn.send({ State: 6 });
        conn.end();
      }),
      async (server) => {
        const got = await collect(client(server).watchIpnBus(10, never));
        assert.equal(got.length, 2);
        assert.deepEqual(got[0]!.NetMap?.DNS?.CertDomains, ['big.tail1.ts.net']);
        assert.equal((got[0]!.NetMap?.Peers as unknown[] | undefined)?.length, 20_000);
      },
    );
  });

  test('HTTP errors: 403 watch ipn bus access denied, 400 bad mask', async () => {
    let status = 403;
    await withServer(
      'unix',
      (_req, res) => sendText(res, status, status === 403 ? 'watch ipn bus access denied\n' : 'bad mask\n'),
      async (server) => {
        await assert.rejects(
          collect(client(server).watchIpnBus(2, never)),
          (err: unknown) => err instanceof LocalApiError && err.status === 403 && err.body === 'watch ipn bus access denied',
        );
        status = 400;
        await assert.rejects(
          collect(client(server).watchIpnBus(2, never)),
          (err: unknown) => err instanceof LocalApiError && err.status === 400 && err.body === 'bad mask',
        );
      },
    );
  });

  test('an abrupt server drop mid-stream is a LocalApiError without status', async () => {
    await withServer(
      'unix',
      busServer((conn) => {
        conn.send({ State: 6 });
        setImmediate(() => conn.drop());
      }),
      async (server) => {
        const got: IpnNotify[] = [];
        await assert.rejects(
          (async () => {
            for await (const n of client(server).watchIpnBus(2, never)) got.push(n);
          })(),
          isCallError('CERTSHARE_LOCALAPI_UNREACHABLE', (err) => assert.equal(err.status, undefined)),
        );
        assert.deepEqual(got, [{ State: 6 }]);
      },
    );
  });

  test("aborting mid-stream rejects with the signal's reason and closes the connection", async () => {
    let closed: Promise<void> | undefined;
    await withServer(
      'tcp',
      busServer((conn) => {
        closed = conn.closed;
        conn.send({ State: 6 });
      }),
      async (server) => {
        const controller = new AbortController();
        const reason = new Error('stop watching');
        const iterator = client(server).watchIpnBus(2, controller.signal)[Symbol.asyncIterator]();
        assert.deepEqual((await iterator.next()).value, { State: 6 });
        const pending = iterator.next();
        controller.abort(reason);
        await assert.rejects(pending, (err: unknown) => err === reason);
        await closed;
      },
    );
  });

  test('breaking out of the loop closes the connection', async () => {
    let closed: Promise<void> | undefined;
    await withServer(
      'unix',
      busServer((conn) => {
        closed = conn.closed;
        conn.send({ State: 6 });
      }),
      async (server) => {
        for await (const n of client(server).watchIpnBus(2, never)) {
          assert.equal(n.State, 6);
          break;
        }
        await closed;
      },
    );
  });

  test('an invalid mask is refused up front', () => {
    const api = createLocalApiClient({ address: '/nonexistent.sock', logger: silentLogger });
    assert.throws(() => api.watchIpnBus(-1, never), RangeError);
  });
});
