// The ARI certificate identifier (RFC 9773 section 4.1): base64url(Authority Key Identifier keyIdentifier)
// "." base64url(the serial number's DER INTEGER content octets), both without padding. It names one
// certificate at its CA, so an ARI answer is bound to the certificate it was asked for (renewal-info.ts).
// node:crypto's X509Certificate exposes neither the AKI nor the serial's octets, so this reads them from
// the DER itself: the few fields on the path to them, every length checked against what encloses it.
// Not an ASN.1 library (@peculiar/asn1-x509 and its schemas): about 1.5 MB more in every writer and
// standalone daemon, which compute this ID for each certificate held (docs/performance.md).
import { CertshareError } from '../errors.ts';

const FIRST_CERT = /-----BEGIN CERTIFICATE-----([\s\S]+?)-----END CERTIFICATE-----/;

/** One DER element: its tag and where its contents lie in the buffer. */
interface Der {
  tag: number;
  start: number;
  end: number;
}

/** The element at `at`, which must end by `end` (definite lengths, low tag numbers: DER's). */
function derAt(der: Uint8Array, at: number, end: number): Der {
  if (at + 2 > end) throw new Error('truncated element');
  const tag = der[at]!;
  if ((tag & 0x1f) === 0x1f) throw new Error('high tag number');
  let length = der[at + 1]!;
  let start = at + 2;
  if (length & 0x80) {
    const octets = length & 0x7f;
    if (octets === 0 || octets > 4 || start + octets > end) throw new Error('bad length');
    length = 0;
    for (let i = 0; i < octets; i++) length = length * 256 + der[start++]!;
  }
  if (start + length > end) throw new Error('element longer than its container');
  return { tag, start, end: start + length };
}

/** The elements inside `outer`, which must hold nothing else. */
function derChildren(der: Uint8Array, outer: Der): Der[] {
  const children: Der[] = [];
  for (let at = outer.start; at < outer.end; at = children.at(-1)!.end) children.push(derAt(der, at, outer.end));
  return children;
}

const SEQUENCE = 0x30;
const INTEGER = 0x02;
const OCTET_STRING = 0x04;
const OID = 0x06;
/** tbsCertificate's [3] EXPLICIT extensions, and AuthorityKeyIdentifier's [0] IMPLICIT keyIdentifier. */
const EXTENSIONS = 0xa3;
const KEY_IDENTIFIER = 0x80;
/** id-ce-authorityKeyIdentifier, 2.5.29.35, as DER contents. */
const AKI_OID = '551d23';

function expect(e: Der | undefined, tag: number, what: string): Der {
  if (e?.tag !== tag) throw new Error(`no ${what}`);
  return e;
}

/** The serial number's DER INTEGER content octets (hex) and the AKI keyIdentifier, if any, of a DER certificate. */
function serialAndKeyId(der: Uint8Array): { serialHex: string; keyId: Uint8Array | undefined } {
  const cert = expect(derAt(der, 0, der.length), SEQUENCE, 'Certificate');
  const tbs = derChildren(der, expect(derChildren(der, cert)[0], SEQUENCE, 'tbsCertificate'));
  // version [0] EXPLICIT is absent from v1 certificates: the serial comes first then.
  const serial = expect(tbs[0]?.tag === 0xa0 ? tbs[1] : tbs[0], INTEGER, 'serialNumber');
  const serialHex = Buffer.from(der.subarray(serial.start, serial.end)).toString('hex');
  const extensions = tbs.find((e) => e.tag === EXTENSIONS);
  if (!extensions) return { serialHex, keyId: undefined };
  for (const extension of derChildren(der, expect(derChildren(der, extensions)[0], SEQUENCE, 'Extensions'))) {
    const fields = derChildren(der, expect(extension, SEQUENCE, 'Extension'));
    const id = expect(fields[0], OID, 'extnID');
    if (Buffer.from(der.subarray(id.start, id.end)).toString('hex') !== AKI_OID) continue;
    const value = expect(fields.at(-1), OCTET_STRING, 'extnValue');
    const aki = derChildren(der, expect(derAt(der, value.start, value.end), SEQUENCE, 'AuthorityKeyIdentifier'));
    const keyId = aki.find((e) => e.tag === KEY_IDENTIFIER);
    return { serialHex, keyId: keyId && der.subarray(keyId.start, keyId.end) };
  }
  return { serialHex, keyId: undefined };
}

function base64url(hex: string): string {
  return Buffer.from(hex, 'hex').toString('base64url');
}

/**
 * The serial's DER INTEGER content octets from its hex: a positive serial whose first octet has the high
 * bit set carries a leading zero octet (RFC 9773's example: serial 0x87654321 gives "AIdlQyE").
 */
function serialOctetsHex(serialHex: string): string {
  let hex = serialHex.toLowerCase();
  if (hex.length % 2 === 1) hex = `0${hex}`;
  while (hex.length > 2 && hex.startsWith('00') && Number.parseInt(hex.slice(2, 4), 16) < 0x80) hex = hex.slice(2);
  return Number.parseInt(hex.slice(0, 2), 16) >= 0x80 ? `00${hex}` : hex;
}

/**
 * The ARI certificate ID of the leaf (the first certificate of `certPem`). Throws CERTSHARE_ARI_UNSUPPORTED
 * when the certificate has no Authority Key Identifier with a keyIdentifier (no CA that serves ARI issues
 * such a certificate), CERTSHARE_CERT_INVALID when it does not parse.
 */
export async function ariCertificateId(certPem: string): Promise<string> {
  const body = FIRST_CERT.exec(certPem)?.[1];
  let parsed: { serialHex: string; keyId: Uint8Array | undefined };
  try {
    if (!body) throw new Error('no PEM certificate');
    parsed = serialAndKeyId(Buffer.from(body, 'base64'));
  } catch (err) {
    throw new CertshareError('CERTSHARE_CERT_INVALID', { certificate: 'certificate', reason: 'it does not parse: no ARI certificate ID' }, { cause: err });
  }
  const serialHex = serialOctetsHex(parsed.serialHex);
  if (!parsed.keyId || parsed.keyId.byteLength === 0) {
    throw new CertshareError('CERTSHARE_ARI_UNSUPPORTED', {
      subject: `certificate ${serialHex}`,
      lack: 'it has no Authority Key Identifier, so no ARI certificate ID',
    });
  }
  return `${base64url(Buffer.from(parsed.keyId).toString('hex'))}.${base64url(serialHex)}`;
}
