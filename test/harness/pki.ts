// Certificates and keys for the test control plane: one CA, the kube-apiserver serving certificate,
// an admin client certificate (system:masters) and the service-account token signing key pair.
// ECDSA P-256 throughout: generation takes milliseconds.
import 'reflect-metadata';
import * as x509 from '@peculiar/x509';
import { webcrypto } from 'node:crypto';

x509.cryptoProvider.set(webcrypto);

const ALG = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' } as const;

export interface KeyPairPem {
  certPem: string;
  keyPem: string;
}

export interface ControlPlanePki {
  ca: KeyPairPem;
  /** kube-apiserver serving certificate, signed by the CA. */
  serving: KeyPairPem;
  /** Client certificate CN=admin, O=system:masters, signed by the CA. */
  admin: KeyPairPem;
  /** Service-account token signing key (PKCS#8) and its public key (SPKI). */
  serviceAccount: { privateKeyPem: string; publicKeyPem: string };
  /** The client certificates asked for in PkiOptions.clients, by the same keys. */
  clients: Record<string, KeyPairPem>;
}

function pem(label: string, der: ArrayBuffer): string {
  return `${x509.PemConverter.encode(der, label)}\n`;
}

async function newKeys(): Promise<webcrypto.CryptoKeyPair> {
  return (await webcrypto.subtle.generateKey(ALG, true, ['sign', 'verify'])) as webcrypto.CryptoKeyPair;
}

async function privateKeyPem(keys: webcrypto.CryptoKeyPair): Promise<string> {
  return pem('PRIVATE KEY', await webcrypto.subtle.exportKey('pkcs8', keys.privateKey));
}

export interface PkiOptions {
  /** Extra IP addresses for the serving certificate (127.0.0.1 and ::1 are always present). */
  extraIps?: string[];
  /** Extra DNS names for the serving certificate. */
  extraDnsNames?: string[];
  /** Validity, default 7 days. */
  validityMs?: number;
  /** Further client certificates, by name: their subject (e.g. `CN=system:node:n1, O=system:nodes`). */
  clients?: Record<string, string>;
}

export async function createControlPlanePki(options: PkiOptions = {}): Promise<ControlPlanePki> {
  const notBefore = new Date(Date.now() - 5 * 60_000); // clock-skew margin
  const notAfter = new Date(Date.now() + (options.validityMs ?? 7 * 24 * 3600_000));

  const [caKeys, servingKeys, adminKeys, saKeys] = await Promise.all([newKeys(), newKeys(), newKeys(), newKeys()]);

  const caCert = await x509.X509CertificateGenerator.createSelfSigned({
    name: 'CN=certshare-test-ca',
    keys: caKeys,
    notBefore,
    notAfter,
    signingAlgorithm: ALG,
    extensions: [
      new x509.BasicConstraintsExtension(true, undefined, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign | x509.KeyUsageFlags.digitalSignature, true),
      await x509.SubjectKeyIdentifierExtension.create(caKeys.publicKey),
    ],
  });
  const caAki = await x509.AuthorityKeyIdentifierExtension.create(caKeys.publicKey);

  const leaf = async (subject: string, keys: webcrypto.CryptoKeyPair, extensions: x509.Extension[]) =>
    x509.X509CertificateGenerator.create({
      subject,
      issuer: caCert.subject,
      publicKey: keys.publicKey,
      signingKey: caKeys.privateKey,
      notBefore,
      notAfter,
      signingAlgorithm: ALG,
      extensions: [
        new x509.BasicConstraintsExtension(false, undefined, true),
        new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature | x509.KeyUsageFlags.keyEncipherment, true),
        caAki,
        ...extensions,
      ],
    });

  const ips = ['127.0.0.1', '::1', '10.0.0.1', ...(options.extraIps ?? [])];
  const dnsNames = [
    'localhost',
    'kubernetes',
    'kubernetes.default',
    'kubernetes.default.svc',
    'kubernetes.default.svc.cluster.local',
    ...(options.extraDnsNames ?? []),
  ];
  const servingCert = await leaf('CN=kube-apiserver', servingKeys, [
    new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth]),
    new x509.SubjectAlternativeNameExtension([
      ...dnsNames.map((value) => ({ type: 'dns' as const, value })),
      ...ips.map((value) => ({ type: 'ip' as const, value })),
    ]),
  ]);
  const clientAuth = () => [new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.clientAuth])];
  const adminCert = await leaf('CN=admin, O=system:masters', adminKeys, clientAuth());
  const clients: Record<string, KeyPairPem> = {};
  for (const [name, subject] of Object.entries(options.clients ?? {})) {
    const keys = await newKeys();
    clients[name] = { certPem: `${(await leaf(subject, keys, clientAuth())).toString('pem')}\n`, keyPem: await privateKeyPem(keys) };
  }

  return {
    ca: { certPem: `${caCert.toString('pem')}\n`, keyPem: await privateKeyPem(caKeys) },
    serving: { certPem: `${servingCert.toString('pem')}\n`, keyPem: await privateKeyPem(servingKeys) },
    admin: { certPem: `${adminCert.toString('pem')}\n`, keyPem: await privateKeyPem(adminKeys) },
    serviceAccount: {
      privateKeyPem: await privateKeyPem(saKeys),
      publicKeyPem: pem('PUBLIC KEY', await webcrypto.subtle.exportKey('spki', saKeys.publicKey)),
    },
    clients,
  };
}
