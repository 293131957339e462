// ACME Renewal Information (RFC 9773), the pure part: the certificate ID, the answer's validation, the
// time chosen in the window and the at-most-one-order guard (src/core/renewal/renewal-info.ts, design note there).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { webcrypto } from 'node:crypto';
import { describe, it } from 'node:test';
import { ariCertificateId } from '../../src/core/renewal/certificate-id.ts';
import { CertshareError } from '../../src/core/errors.ts';
import { loadX509 } from '../../src/core/certificates/x509.ts';
import {
  NO_ARI_STATE,
  type AriCertificate,
  ariMinValidityMs,
  ariRenewalDone,
  ariVerdict,
  chooseRenewalTime,
  describeAriAnswer,
  holding,
  nextAriCheck,
  parseRenewalInfo,
  withAnswer,
} from '../../src/core/renewal/renewal-info.ts';
import { createCertificateAuthority } from '../../src/pki/ca.ts';

const H = 3_600_000;
const DAY = 24 * H;
const T0 = Date.UTC(2026, 10, 25);
const iso = (ms: number): string => new Date(ms).toISOString();
const CERT: AriCertificate = { certId: 'a.AQ', notBefore: T0, notAfter: T0 + 90 * DAY };
const answer = (start: number, end: number, extra: Record<string, unknown> = {}): string =>
  JSON.stringify({ suggestedWindow: { start: iso(start), end: iso(end) }, ...extra });

function rejects(body: string, message: RegExp): void {
  assert.throws(
    () => parseRenewalInfo(body, CERT, T0),
    (err: unknown) => err instanceof CertshareError && err.code === 'CERTSHARE_ARI_BAD_RESPONSE' && message.test(err.message),
  );
}

describe('ARI certificate ID (RFC 9773 section 4.1)', () => {
  const alg = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' } as const;
  async function selfSigned(serialNumber: string, keyId?: string): Promise<string> {
    const x509 = await loadX509();
    const keys = (await webcrypto.subtle.generateKey(alg, true, ['sign', 'verify'])) as webcrypto.CryptoKeyPair;
    const cert = await x509.X509CertificateGenerator.createSelfSigned({
      serialNumber,
      name: 'CN=ari.example',
      keys,
      notBefore: new Date(T0),
      notAfter: new Date(T0 + DAY),
      signingAlgorithm: alg,
      extensions: keyId ? [new x509.AuthorityKeyIdentifierExtension(keyId)] : [],
    });
    return cert.toString('pem');
  }

  it("gives the RFC's own example: AKI 69:88:5B:..:D4 and serial 0x87654321 (a leading zero octet in DER)", async () => {
    const pem = await selfSigned('0087654321', '69885b6b87464041e1b37b847ba0ae2cde01c8d4');
    assert.equal(await ariCertificateId(pem), 'aYhba4dGQEHhs3uEe6CuLN4ByNQ.AIdlQyE');
  });

  it('keeps a serial without the high bit as is, and reads the leaf of a chain', async () => {
    const ca = await createCertificateAuthority({ name: 'ari test', now: T0 });
    const leaf = await ca.sign({ dnsName: 'web.tailnet-1.ts.net', notBefore: T0, notAfter: T0 + DAY });
    const id = await ariCertificateId(leaf.chainPem);
    assert.equal(id.split('.')[1], Buffer.from(leaf.serial, 'hex').toString('base64url'));
    const next = await ca.sign({ dnsName: 'web.tailnet-1.ts.net', notBefore: T0, notAfter: T0 + DAY });
    const nextId = await ariCertificateId(next.leafPem);
    assert.equal(nextId.split('.')[0], id.split('.')[0], 'one CA, one key ID');
    assert.notEqual(nextId, id, 'each certificate its own ID');
  });

  it('refuses a certificate without an Authority Key Identifier, and one that does not parse', async () => {
    const pem = await selfSigned('01');
    await assert.rejects(ariCertificateId(pem), (err: unknown) => err instanceof CertshareError && err.code === 'CERTSHARE_ARI_UNSUPPORTED');
    await assert.rejects(ariCertificateId('no pem here'), (err: unknown) => err instanceof CertshareError && err.code === 'CERTSHARE_CERT_INVALID');
  });

  it('refuses DER whose lengths overrun what encloses them (cut short, or a length pointing past the end)', async () => {
    const der = Buffer.from(
      /-----BEGIN CERTIFICATE-----([\s\S]+?)-----END/.exec(await selfSigned('0087654321', '69885b6b87464041e1b37b847ba0ae2cde01c8d4'))![1]!,
      'base64',
    );
    const pem = (bytes: Buffer): string => `-----BEGIN CERTIFICATE-----\n${bytes.toString('base64')}\n-----END CERTIFICATE-----\n`;
    const longer = Buffer.from(der);
    longer[1] = 0x84; // a four-octet length of the Certificate, far past the buffer's end
    for (const bad of [der.subarray(0, der.length - 10), der.subarray(0, 40), longer]) {
      await assert.rejects(ariCertificateId(pem(bad)), (err: unknown) => err instanceof CertshareError && err.code === 'CERTSHARE_CERT_INVALID');
    }
  });

  it('loads no ASN.1 library: neither @peculiar/x509, reflect-metadata nor the ASN.1 schemas (memory in every writer: docs/performance.md)', async () => {
    const pem = await selfSigned('0087654321', '69885b6b87464041e1b37b847ba0ae2cde01c8d4');
    const script = `import { registerHooks } from 'node:module';
const loaded = [];
registerHooks({ load(url, context, next) { loaded.push(url); return next(url, context); } });
const { ariCertificateId } = await import(${JSON.stringify(new URL('../../src/core/renewal/certificate-id.ts', import.meta.url).href)});
const id = await ariCertificateId(process.env.PEM);
const heavy = loaded.filter((u) => ['@peculiar/', 'asn1js/', 'reflect-metadata/', 'tsyringe/'].some((p) => u.includes(p)));
process.stdout.write(JSON.stringify({ id, heavy }));`;
    const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', env: { ...process.env, PEM: pem }, timeout: 60_000 });
    assert.equal(r.status, 0, r.stderr);
    assert.deepEqual(JSON.parse(r.stdout), { id: 'aYhba4dGQEHhs3uEe6CuLN4ByNQ.AIdlQyE', heavy: [] });
  });
});

describe('renewalInfo answer', () => {
  it('reads the window and the explanation URL', () => {
    const info = parseRenewalInfo(answer(T0 + 59 * DAY, T0 + 61 * DAY, { explanationURL: 'https://ca.example/incident/1' }), CERT, T0 + H);
    assert.deepEqual(info, {
      certId: 'a.AQ',
      window: { start: T0 + 59 * DAY, end: T0 + 61 * DAY },
      explanationUrl: 'https://ca.example/incident/1',
      fetchedAt: T0 + H,
    });
  });

  it('accepts a window in the past (revocation, incident) and RFC 3339 offsets', () => {
    const info = parseRenewalInfo(JSON.stringify({ suggestedWindow: { start: '2026-11-24T23:00:00+01:00', end: '2026-11-24T22:00:01Z' } }), CERT, T0);
    assert.deepEqual(info.window, { start: Date.UTC(2026, 10, 24, 22), end: Date.UTC(2026, 10, 24, 22, 0, 1) });
  });

  it('drops an explanationURL that is not an http(s) URL, keeps the window', () => {
    for (const explanationURL of ['javascript:alert(1)', 'not a url', 42, `https://x.example/${'a'.repeat(3000)}`]) {
      const info = parseRenewalInfo(answer(T0, T0 + DAY, { explanationURL }), CERT, T0);
      assert.equal(info.explanationUrl, undefined, String(explanationURL).slice(0, 30));
    }
  });

  const refused: Array<[string, string, RegExp]> = [
    ['malformed JSON', '{"suggestedWindow":', /not JSON/],
    ['an array', '[]', /not a JSON object/],
    ['null', 'null', /not a JSON object/],
    ['no suggestedWindow', '{"explanationURL":"https://x.example"}', /suggestedWindow is missing/],
    ['no start', JSON.stringify({ suggestedWindow: { end: iso(T0) } }), /suggestedWindow.start is missing/],
    ['a number for end', JSON.stringify({ suggestedWindow: { start: iso(T0), end: 17e11 } }), /suggestedWindow.end is missing or not a string/],
    ['a date without a zone', JSON.stringify({ suggestedWindow: { start: '2026-11-25T00:00:00', end: iso(T0) } }), /not an RFC 3339 date-time/],
    ['a date that does not exist', JSON.stringify({ suggestedWindow: { start: '2026-13-45T00:00:00Z', end: iso(T0) } }), /not an RFC 3339/],
    ['an inverted window', answer(T0 + 2 * DAY, T0 + DAY), /inverted window/],
    ['a window years away', answer(T0 + 3 * 365 * DAY, T0 + 4 * 365 * DAY), /after the certificate expires/],
    ['a window starting at expiry', answer(CERT.notAfter, CERT.notAfter + DAY), /after the certificate expires/],
  ];
  for (const [name, body, message] of refused) it(`rejects ${name} with CERTSHARE_ARI_BAD_RESPONSE`, () => rejects(body, message));
});

describe('the time chosen in the window', () => {
  const window = { start: T0 + 10 * H, end: T0 + 20 * H };
  it('is uniform inside the window, by the random source', () => {
    assert.equal(
      chooseRenewalTime(window, T0, () => 0),
      T0 + 10 * H,
    );
    assert.equal(
      chooseRenewalTime(window, T0, () => 0.5),
      T0 + 15 * H,
    );
    assert.ok(chooseRenewalTime(window, T0, () => 0.999_999_999) < window.end);
  });
  it('is now for a window already over', () => {
    assert.equal(
      chooseRenewalTime(window, T0 + 21 * H, () => 0.5),
      T0 + 21 * H,
    );
    assert.equal(
      chooseRenewalTime(window, T0 + 20 * H, () => 0.5),
      T0 + 20 * H,
    );
  });
  it('stays in the window whatever the random source returns', () => {
    for (const r of [-1, 1, 2, Number.NaN]) {
      const at = chooseRenewalTime(window, T0, () => r);
      assert.ok(at >= window.start && at <= window.end, `${r} -> ${at}`);
    }
  });
});

describe('the at-most-one-order guard', () => {
  const info = (certId: string, start: number, end: number, fetchedAt: number) => ({ certId, window: { start, end }, fetchedAt });
  const half = () => 0.5;

  it('orders once the chosen time is reached, with ca_requested', () => {
    let s = holding(NO_ARI_STATE, 'A', T0);
    s = withAnswer(s, info('A', T0 + 10 * H, T0 + 20 * H, T0), half);
    assert.deepEqual(ariVerdict(s, T0 + H, 0), { kind: 'wait', at: T0 + 15 * H, reason: 'ca_requested', answer: s.answer });
    assert.equal(ariVerdict(s, T0 + 15 * H, 0).kind, 'order');
  });

  it('orders at once for a window over on arrival (revocation), with ca_requested_now, but not before the hold', () => {
    let s = holding(NO_ARI_STATE, 'A', T0);
    s = withAnswer(s, info('A', T0 - H, T0 - H + 1000, T0 + 10_000), half);
    assert.deepEqual(ariVerdict(s, T0 + 10_000, 60_000), { kind: 'wait', at: T0 + 60_000, reason: 'ca_requested_now', answer: s.answer });
    const order = ariVerdict(s, T0 + 60_000, 60_000);
    assert.equal(order.kind === 'order' && order.reason, 'ca_requested_now');
  });

  it('never acts twice on one certificate, whatever the CA answers after the order', () => {
    let s = holding(NO_ARI_STATE, 'A', T0);
    s = withAnswer(s, info('A', T0 - H, T0 - H + 1000, T0), half);
    assert.equal(ariVerdict(s, T0, 0).kind, 'order');
    s = ariRenewalDone(s);
    // The renewal handed back the same certificate; the CA still says "now".
    s = holding(s, 'A', T0 + 1000);
    s = withAnswer(s, info('A', T0 - H, T0 - H + 1000, T0 + 2000), half);
    assert.deepEqual(ariVerdict(s, T0 + 10 * DAY, 0), { kind: 'silent', why: 'already_renewed' });
  });

  it("drops the previous certificate's window when the certificate is replaced (cert-manager #8993)", () => {
    // Let's Encrypt backdates notBefore by an hour: the old window (started 30 minutes ago) begins after
    // the new certificate's notBefore, which is how cert-manager took it for the new one's.
    let s = holding(NO_ARI_STATE, 'A', T0);
    s = withAnswer(s, info('A', T0 + 60 * DAY, T0 + 62 * DAY, T0), half);
    const replaced = T0 + 60 * DAY + 30 * 60_000;
    s = ariRenewalDone(s);
    s = holding(s, 'B', replaced);
    assert.deepEqual(ariVerdict(s, replaced, 0), { kind: 'silent', why: 'no_answer' });
    // A late answer for A (a check that began before the replacement) is not B's.
    s = withAnswer(s, info('A', T0 + 60 * DAY, T0 + 62 * DAY, replaced + 1000), half);
    assert.deepEqual(ariVerdict(s, replaced + 1000, 0), { kind: 'silent', why: 'no_answer' });
    // B's own answer counts only when fetched since B was held.
    assert.equal(withAnswer(s, info('B', replaced - DAY, replaced - DAY + 1000, replaced - 1), half), s);
    s = withAnswer(s, info('B', T0 + 120 * DAY, T0 + 122 * DAY, replaced + 2000), half);
    assert.equal(ariVerdict(s, replaced + 2000, 0).kind, 'wait');
  });

  it('keeps the chosen time while the CA repeats the window, draws anew when it moves', () => {
    let draws = 0;
    const random = () => {
      draws += 1;
      return 0.25;
    };
    let s = holding(NO_ARI_STATE, 'A', T0);
    s = withAnswer(s, info('A', T0 + 10 * H, T0 + 20 * H, T0), random);
    s = withAnswer(s, info('A', T0 + 10 * H, T0 + 20 * H, T0 + 6 * H), random);
    assert.equal(draws, 1);
    assert.equal(s.answer?.renewAt, T0 + 12.5 * H);
    assert.equal(s.answer?.fetchedAt, T0 + 6 * H);
    s = withAnswer(s, info('A', T0 - H, T0 - H + 1000, T0 + 7 * H), random);
    assert.equal(s.answer?.renewAt, T0 + 7 * H, 'a window moved into the past: now');
  });

  it('asks tailscaled for one second more than the revoked certificate has left, never more than a fresh one has', () => {
    const held = { notAfter: T0 + 89 * DAY + 1500 };
    assert.equal(ariMinValidityMs(held, T0, 90 * DAY), 89 * DAY + 3000);
    assert.equal(ariMinValidityMs(held, T0, 89 * DAY + 2500), 89 * DAY + 2000, 'capped at the fresh validity, whole seconds');
    assert.equal(ariMinValidityMs({ notAfter: T0 - DAY }, T0, 90 * DAY), 1000, 'an expired certificate: the least tailscaled reads');
  });

  it('describes the window, the chosen time and the explanation in one line', () => {
    let s = holding(NO_ARI_STATE, 'A', T0);
    s = withAnswer(s, { ...info('A', T0 + 10 * H, T0 + 20 * H, T0), explanationUrl: 'https://ca.example/why' }, half);
    assert.equal(
      describeAriAnswer(s.answer!),
      'CA suggests renewal 2026-11-25T10:00:00.000Z..2026-11-25T20:00:00.000Z, chosen 2026-11-25T15:00:00.000Z (the CA explains: https://ca.example/why)',
    );
  });

  it('asks again after Retry-After, within the floor and the --ari-interval cap', () => {
    const policy = { floorMs: 60_000, capMs: 6 * H };
    assert.equal(nextAriCheck(T0, undefined, policy), T0 + 6 * H);
    assert.equal(nextAriCheck(T0, 2 * H, policy), T0 + 2 * H);
    assert.equal(nextAriCheck(T0, 24 * H, policy), T0 + 6 * H);
    assert.equal(nextAriCheck(T0, 0, policy), T0 + 60_000);
    assert.equal(nextAriCheck(T0, 0, { floorMs: 60_000, capMs: 5000 }), T0 + 5000, 'a cap below the floor wins');
  });
});
