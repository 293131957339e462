// A certificate authority: an in-memory ECDSA P-256 CA that signs ECDSA P-256 leaves. The injector's
// webhook CA (src/injector/pki.ts: validity given, several SANs, kept in a Secret as PEM and loaded back
// with loadCertificateAuthority), and the emulator's stand-in for Let's Encrypt. @peculiar/x509 is loaded
// on the first signature, so an emulator that never issues (or a process that only imports this module)
// does not pay for it.
import { KeyObject, createPrivateKey, randomBytes, webcrypto } from 'node:crypto';
import { type X509Module, loadX509 } from '../core/certificates/x509.ts';

const EC_ALG = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' } as const;

/** A freshly signed leaf: the SEC1 key PEM and the chain PEM (leaf, then the CA), as tailscaled returns them. */
export interface SignedLeaf {
  keyPem: string;
  /** Leaf certificate then the issuing CA certificate. */
  chainPem: string;
  /** Just the leaf certificate. */
  leafPem: string;
  /** Upper-case hex, as node:crypto's X509Certificate#serialNumber prints it. */
  serial: string;
  notBefore: number;
  notAfter: number;
}

interface LeafRequest {
  /** DNS name placed in the SAN (and the CN). */
  dnsName: string;
  /** More SAN entries after dnsName. */
  moreDnsNames?: string[];
  ipAddresses?: string[];
  /** Milliseconds since the epoch, whole seconds (X.509 has second resolution). */
  notBefore: number;
  notAfter: number;
}

export interface CertificateAuthority {
  readonly certPem: string;
  /** The CA's private key, PKCS#8 PEM: for keeping it in a Secret, never for logs. */
  readonly keyPem: string;
  /** Upper-case hex. */
  readonly serial: string;
  readonly notBefore: number;
  readonly notAfter: number;
  sign(request: LeafRequest): Promise<SignedLeaf>;
  /** A new key pair's SEC1 PEM, unrelated to any certificate (the `mismatched` fault). */
  strayKeyPem(): Promise<string>;
}

/** Random positive serial: 16 bytes, first byte 0x01..0x7f so DER needs no sign padding and the hex is stable. @forTests */
export function randomSerialHex(): string {
  const bytes = randomBytes(16);
  bytes[0] = (bytes[0]! & 0x7f) | 0x01;
  return bytes.toString('hex').toUpperCase();
}

async function newKeyPair(): Promise<webcrypto.CryptoKeyPair> {
  return (await webcrypto.subtle.generateKey(EC_ALG, true, ['sign', 'verify'])) as webcrypto.CryptoKeyPair;
}

/** tailscaled writes leaf keys as SEC1 ("EC PRIVATE KEY"), like Go's x509.MarshalECPrivateKey. */
function sec1Pem(key: webcrypto.CryptoKey): string {
  return KeyObject.from(key).export({ type: 'sec1', format: 'pem' }).toString();
}

export async function createCertificateAuthority(options: {
  name: string;
  now: number;
  notBefore?: number;
  notAfter?: number;
  organization?: string;
}): Promise<CertificateAuthority> {
  const x509 = await loadX509();
  const caKeys = await newKeyPair();
  const caCert = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: randomSerialHex(),
    name: `CN=${options.name}, O=${options.organization ?? 'certshare emulator'}`,
    keys: caKeys,
    // Wide validity by default: tests move a fake clock days or months ahead.
    notBefore: new Date(options.notBefore ?? options.now - 366 * 86_400_000),
    notAfter: new Date(options.notAfter ?? options.now + 20 * 366 * 86_400_000),
    signingAlgorithm: EC_ALG,
    extensions: [
      new x509.BasicConstraintsExtension(true, 0, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign | x509.KeyUsageFlags.digitalSignature, true),
      await x509.SubjectKeyIdentifierExtension.create(caKeys.publicKey),
    ],
  });
  return authority(x509, caCert, caKeys.privateKey);
}

/** A CA kept as PEM (its certificate and PKCS#8 key, as `keyPem` gives them), ready to sign again. */
export async function loadCertificateAuthority(pem: { certPem: string; keyPem: string }): Promise<CertificateAuthority> {
  const x509 = await loadX509();
  const caCert = new x509.X509Certificate(pem.certPem);
  const der = createPrivateKey(pem.keyPem).export({ type: 'pkcs8', format: 'der' });
  const key = await webcrypto.subtle.importKey('pkcs8', der, EC_ALG, true, ['sign']);
  return authority(x509, caCert, key);
}

async function authority(
  x509: X509Module,
  caCert: InstanceType<X509Module['X509Certificate']>,
  caPrivateKey: webcrypto.CryptoKey,
): Promise<CertificateAuthority> {
  const caPem = `${caCert.toString('pem')}\n`;
  const authorityKeyId = await x509.AuthorityKeyIdentifierExtension.create(caCert, false);

  return {
    certPem: caPem,
    keyPem: KeyObject.from(caPrivateKey).export({ type: 'pkcs8', format: 'pem' }).toString(),
    serial: caCert.serialNumber.toUpperCase(),
    notBefore: caCert.notBefore.getTime(),
    notAfter: caCert.notAfter.getTime(),
    async sign(request: LeafRequest): Promise<SignedLeaf> {
      const keys = await newKeyPair();
      const serial = randomSerialHex();
      const leaf = await x509.X509CertificateGenerator.create({
        serialNumber: serial,
        subject: `CN=${request.dnsName}`,
        issuer: caCert.subject,
        notBefore: new Date(request.notBefore),
        notAfter: new Date(request.notAfter),
        publicKey: keys.publicKey,
        signingKey: caPrivateKey,
        signingAlgorithm: EC_ALG,
        extensions: [
          new x509.BasicConstraintsExtension(false, undefined, true),
          new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
          new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth], false),
          new x509.SubjectAlternativeNameExtension(
            [
              ...[request.dnsName, ...(request.moreDnsNames ?? [])].map((value) => ({ type: 'dns' as const, value })),
              ...(request.ipAddresses ?? []).map((value) => ({ type: 'ip' as const, value })),
            ],
            false,
          ),
          await x509.SubjectKeyIdentifierExtension.create(keys.publicKey),
          authorityKeyId,
        ],
      });
      const leafPem = `${leaf.toString('pem')}\n`;
      return {
        keyPem: sec1Pem(keys.privateKey),
        chainPem: leafPem + caPem,
        leafPem,
        serial,
        notBefore: request.notBefore,
        notAfter: request.notAfter,
      };
    },
    async strayKeyPem(): Promise<string> {
      return sec1Pem((await newKeyPair()).privateKey);
    },
  };
}
