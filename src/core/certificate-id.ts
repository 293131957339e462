// The ARI certificate identifier (RFC 9773 section 4.1): base64url(Authority Key Identifier keyIdentifier)
// "." base64url(the serial number's DER INTEGER content octets), both without padding. It names one
// certificate at its CA, so an ARI answer is bound to the certificate it was asked for (renewal-info.ts).
// node:crypto's X509Certificate exposes neither the AKI nor the serial's octets, hence @peculiar/x509
// (loaded on first use: x509.ts says why).
import { CertshareError } from './errors.ts';
import { loadX509 } from './x509.ts';

const FIRST_CERT = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/;

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
  const { AuthorityKeyIdentifierExtension, X509Certificate } = await loadX509();
  const block = FIRST_CERT.exec(certPem)?.[0];
  let cert: InstanceType<typeof X509Certificate>;
  try {
    if (!block) throw new Error('no PEM certificate');
    cert = new X509Certificate(block);
  } catch (err) {
    throw new CertshareError('CERTSHARE_CERT_INVALID', 'certificate does not parse: no ARI certificate ID', { cause: err });
  }
  const keyId = cert.getExtension(AuthorityKeyIdentifierExtension)?.keyId;
  if (!keyId) {
    throw new CertshareError('CERTSHARE_ARI_UNSUPPORTED', `certificate ${cert.serialNumber} has no Authority Key Identifier: no ARI certificate ID`);
  }
  return `${base64url(keyId)}.${base64url(serialOctetsHex(cert.serialNumber))}`;
}
