// The ARI certificate identifier (RFC 9773 section 4.1): base64url(Authority Key Identifier keyIdentifier)
// "." base64url(the serial number's DER INTEGER content octets), both without padding. It names one
// certificate at its CA, so an ARI answer is bound to the certificate it was asked for (renewal-info.ts).
// node:crypto's X509Certificate exposes neither the AKI nor the serial's octets, hence @peculiar/x509's own
// ASN.1 layer (@peculiar/asn1-x509: the Certificate and AuthorityKeyIdentifier structures @peculiar/x509
// parses them with). Not @peculiar/x509 itself: with its dependency injection and reflect-metadata it adds
// several times the schemas' memory to every writer and standalone daemon (they compute this ID for each
// certificate; docs/performance.md). Loaded on first use: a reader never computes one.
import { CertshareError } from '../errors.ts';

const FIRST_CERT = /-----BEGIN CERTIFICATE-----([\s\S]+?)-----END CERTIFICATE-----/;

type Asn1X509 = [typeof import('@peculiar/asn1-schema'), typeof import('@peculiar/asn1-x509')];
let asn1Loading: Promise<Asn1X509> | undefined;

function loadAsn1(): Promise<Asn1X509> {
  asn1Loading ??= Promise.all([import('@peculiar/asn1-schema'), import('@peculiar/asn1-x509')]);
  return asn1Loading;
}

function hexOf(octets: ArrayBuffer): string {
  return Buffer.from(octets).toString('hex');
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
  const [{ AsnConvert }, { AuthorityKeyIdentifier, Certificate, id_ce_authorityKeyIdentifier }] = await loadAsn1();
  const body = FIRST_CERT.exec(certPem)?.[1];
  let tbs: InstanceType<typeof Certificate>['tbsCertificate'];
  try {
    if (!body) throw new Error('no PEM certificate');
    tbs = AsnConvert.parse(Buffer.from(body, 'base64'), Certificate).tbsCertificate;
  } catch (err) {
    throw new CertshareError('CERTSHARE_CERT_INVALID', 'certificate does not parse: no ARI certificate ID', { cause: err });
  }
  const serialHex = serialOctetsHex(hexOf(tbs.serialNumber));
  const aki = tbs.extensions?.find((e) => e.extnID === id_ce_authorityKeyIdentifier);
  let keyId: ArrayBuffer | undefined;
  try {
    keyId = aki && AsnConvert.parse(aki.extnValue, AuthorityKeyIdentifier).keyIdentifier?.buffer;
  } catch (err) {
    throw new CertshareError('CERTSHARE_CERT_INVALID', 'certificate does not parse: no ARI certificate ID', { cause: err });
  }
  if (!keyId || keyId.byteLength === 0) {
    throw new CertshareError('CERTSHARE_ARI_UNSUPPORTED', `certificate ${serialHex} has no Authority Key Identifier: no ARI certificate ID`);
  }
  return `${base64url(hexOf(keyId))}.${base64url(serialHex)}`;
}
