// The ARI client against a real local HTTP(S) server: the directory, the renewalInfo answer, Retry-After,
// every failure as a typed outcome (404, 500, a hang past the timeout, malformed answers), the caller's
// abort, and a private CA trusted through NODE_EXTRA_CA_CERTS in a child process.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { type IncomingMessage, type Server, type ServerResponse, createServer } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { promisify } from 'node:util';
import { RenewalInfoClient } from '../../src/acme/renewal-info-client.ts';
import type { AriCertificate } from '../../src/core/renewal/renewal-info.ts';
import { createCertificateAuthority } from '../../src/pki/ca.ts';
import { freePort } from '../support/processes.ts';

const H = 3_600_000;
const NOW = Date.UTC(2026, 10, 25, 12);
const CERT: AriCertificate = { certId: 'aYhba4dGQEHhs3uEe6CuLN4ByNQ.AIdlQyE', notBefore: NOW - 24 * H, notAfter: NOW + 89 * 24 * H };
const WINDOW = { start: '2027-01-23T12:00:00Z', end: '2027-01-25T12:00:00Z' };

type Handler = (req: IncomingMessage, res: ServerResponse) => void;

/** A CA stand-in whose answers each test sets; it records the paths asked. */
class FakeCa {
  readonly server: Server;
  readonly paths: string[] = [];
  directory: Handler = (_req, res) => this.json(res, 200, { newNonce: `${this.base}/nonce`, renewalInfo: `${this.base}/draft-ietf-acme-ari-03/renewalInfo/` });
  renewalInfo: Handler = (_req, res) => this.json(res, 200, { suggestedWindow: WINDOW });
  base = '';

  constructor() {
    this.server = createServer((req, res) => {
      this.paths.push(req.url ?? '');
      // As pebble and Boulder: an ACME client MUST send a User-Agent (RFC 8555 6.1).
      if (!req.headers['user-agent']) this.json(res, 400, { type: 'urn:ietf:params:acme:error:malformed', detail: 'User-Agent header missing' });
      else if (req.url === '/directory') this.directory(req, res);
      else if (req.url?.startsWith('/draft-ietf-acme-ari-03/renewalInfo/')) this.renewalInfo(req, res);
      else this.json(res, 404, { type: 'urn:ietf:params:acme:error:malformed' });
    });
  }

  json(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
    res.writeHead(status, { 'content-type': 'application/json', ...headers });
    res.end(typeof body === 'string' ? body : JSON.stringify(body));
  }

  async start(): Promise<void> {
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', resolve));
    this.base = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  client(timeoutMs = 2000): RenewalInfoClient {
    return new RenewalInfoClient({ directoryUrl: `${this.base}/directory`, timeoutMs, now: () => NOW });
  }
}

describe('ARI client', () => {
  const ca = new FakeCa();
  before(() => ca.start());
  after(() => {
    ca.server.closeAllConnections();
    ca.server.close();
  });

  it('reads the renewalInfo URL from the directory once, then GETs <renewalInfo>/<certID>', async () => {
    ca.paths.length = 0;
    const client = ca.client();
    const first = await client.check(CERT);
    assert.deepEqual(first, {
      outcome: 'ok',
      info: { certId: CERT.certId, window: { start: Date.parse(WINDOW.start), end: Date.parse(WINDOW.end) }, fetchedAt: NOW },
      retryAfterMs: undefined,
    });
    await client.check(CERT);
    assert.deepEqual(ca.paths, ['/directory', `/draft-ietf-acme-ari-03/renewalInfo/${CERT.certId}`, `/draft-ietf-acme-ari-03/renewalInfo/${CERT.certId}`]);
  });

  it('honours Retry-After in seconds and as an HTTP-date', async () => {
    ca.renewalInfo = (_req, res) => ca.json(res, 200, { suggestedWindow: WINDOW }, { 'retry-after': '21600' });
    assert.equal((await ca.client().check(CERT)).retryAfterMs, 6 * H);
    ca.renewalInfo = (_req, res) => ca.json(res, 200, { suggestedWindow: WINDOW }, { 'retry-after': new Date(NOW + 2 * H).toUTCString() });
    assert.equal((await ca.client().check(CERT)).retryAfterMs, 2 * H);
  });

  const failures: Array<[name: string, handler: Handler, outcome: string, code: string, message: RegExp]> = [
    ['a 404', (_req, res) => ca.json(res, 404, { type: 'urn:ietf:params:acme:error:malformed' }), 'not_found', 'CERTSHARE_ARI_NOT_FOUND', /HTTP 404/],
    ['a 500', (_req, res) => ca.json(res, 500, 'oops'), 'unavailable', 'CERTSHARE_ARI_UNAVAILABLE', /HTTP 500/],
    ['a 429', (_req, res) => ca.json(res, 429, 'slow down'), 'unavailable', 'CERTSHARE_ARI_UNAVAILABLE', /HTTP 429/],
    ['malformed JSON', (_req, res) => ca.json(res, 200, '{"suggestedWindow": '), 'bad_response', 'CERTSHARE_ARI_BAD_RESPONSE', /not JSON/],
    [
      'an inverted window',
      (_req, res) => ca.json(res, 200, { suggestedWindow: { start: WINDOW.end, end: WINDOW.start } }),
      'bad_response',
      'CERTSHARE_ARI_BAD_RESPONSE',
      /inverted window/,
    ],
    [
      'a body past the bound',
      (_req, res) => ca.json(res, 200, `{"pad":"${'x'.repeat(200_000)}"}`),
      'bad_response',
      'CERTSHARE_ARI_BAD_RESPONSE',
      /more than 65536 bytes/,
    ],
    ['a hang past the timeout', () => {}, 'timeout', 'CERTSHARE_ARI_TIMEOUT', /took longer than 300 ms/],
  ];
  for (const [name, handler, outcome, code, message] of failures) {
    it(`turns ${name} into outcome ${outcome} (${code}), never a throw`, async () => {
      ca.renewalInfo = (req, res) => {
        res.setHeader('retry-after', '120');
        handler(req, res);
      };
      const check = await ca.client(300).check(CERT);
      assert.equal(check.outcome, outcome);
      assert.ok(check.outcome !== 'ok');
      assert.equal(check.code, code);
      assert.match(check.message, message);
      if (outcome === 'not_found' || outcome === 'unavailable') assert.equal(check.retryAfterMs, 120_000, 'the CA asked for a pause');
    });
  }

  it('says unsupported for a directory without renewalInfo, unavailable for one that cannot be read, and asks again next time', async () => {
    ca.renewalInfo = (_req, res) => ca.json(res, 200, { suggestedWindow: WINDOW });
    ca.directory = (_req, res) => ca.json(res, 200, { newNonce: `${ca.base}/nonce` });
    const client = ca.client();
    const unsupported = await client.check(CERT);
    assert.equal(unsupported.outcome === 'unsupported' && unsupported.code, 'CERTSHARE_ARI_UNSUPPORTED');
    ca.directory = (_req, res) => ca.json(res, 503, 'maintenance');
    assert.equal((await client.check(CERT)).outcome, 'unavailable');
    ca.directory = (_req, res) => ca.json(res, 200, { renewalInfo: `${ca.base}/draft-ietf-acme-ari-03/renewalInfo` });
    assert.equal((await client.check(CERT)).outcome, 'ok', 'a base URL without the trailing slash works too');
  });

  it('says unavailable when nothing listens', async () => {
    const client = new RenewalInfoClient({ directoryUrl: `http://127.0.0.1:${await freePort()}/directory`, timeoutMs: 2000 });
    const check = await client.check(CERT);
    assert.equal(check.outcome, 'unavailable');
    assert.match(check.outcome === 'unavailable' ? check.message : '', /unreachable: .*ECONNREFUSED/);
  });

  it("throws the caller's abort reason, at once", async () => {
    ca.renewalInfo = () => {};
    const controller = new AbortController();
    const checking = ca.client(60_000).check(CERT, controller.signal);
    const reason = new Error('shutting down');
    setImmediate(() => controller.abort(reason));
    await assert.rejects(checking, (err: unknown) => err === reason);
  });
});

describe('ARI client and a private CA', () => {
  let dir = '';
  let server: ReturnType<typeof createHttpsServer>;
  let directoryUrl = '';
  let caFile = '';
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'ari-ca-'));
    const ca = await createCertificateAuthority({ name: 'private ACME CA', now: Date.now() });
    const leaf = await ca.sign({ dnsName: 'localhost', ipAddresses: ['127.0.0.1'], notBefore: Date.now() - H, notAfter: Date.now() + H });
    caFile = join(dir, 'ca.pem');
    await writeFile(caFile, ca.certPem);
    server = createHttpsServer({ key: leaf.keyPem, cert: leaf.chainPem }, (req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      const base = `https://127.0.0.1:${(server.address() as AddressInfo).port}`;
      res.end(JSON.stringify(req.url === '/directory' ? { renewalInfo: `${base}/renewalInfo/` } : { suggestedWindow: WINDOW }));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    directoryUrl = `https://127.0.0.1:${(server.address() as AddressInfo).port}/directory`;
  });
  after(async () => {
    server.closeAllConnections();
    server.close();
    await rm(dir, { recursive: true, force: true });
  });

  // Node reads NODE_EXTRA_CA_CERTS once, at start: a child process shows what a daemon started with it sees.
  const checkInChild = async (env: NodeJS.ProcessEnv): Promise<string> => {
    const script = `
      import { RenewalInfoClient } from ${JSON.stringify(new URL('../../src/acme/renewal-info-client.ts', import.meta.url).href)};
      const check = await new RenewalInfoClient({ directoryUrl: ${JSON.stringify(directoryUrl)}, timeoutMs: 5000 })
        .check({ certId: 'a.AQ', notBefore: 0, notAfter: Date.parse('2100-01-01T00:00:00Z') });
      console.log(check.outcome + ' ' + (check.message ?? ''));`;
    const { NODE_EXTRA_CA_CERTS: _, ...base } = process.env;
    const { stdout } = await promisify(execFile)(process.execPath, ['--input-type=module', '-e', script], { env: { ...base, ...env } });
    return stdout.trim();
  };

  it('trusts the CA named by NODE_EXTRA_CA_CERTS, and only then', async () => {
    assert.equal(await checkInChild({ NODE_EXTRA_CA_CERTS: caFile }), 'ok');
    assert.match(await checkInChild({}), /^unavailable .*unreachable: self-signed certificate in certificate chain/);
  });
});
