import assert from 'node:assert/strict';
import { X509Certificate, createPrivateKey } from 'node:crypto';
import { describe, it } from 'node:test';
import { validateCertPair } from '../../../src/core/certificates/certificate.ts';
import { BACKDATE_MS, createInjectorCa, issueServingLeaf, loadInjectorCa, serviceDnsNames } from '../../../src/injector/pki.ts';

const HOUR = 3_600_000;

describe('injector PKI', () => {
  it('names a Service the four ways its clients do', () => {
    assert.deepEqual(serviceDnsNames('certshare-injector', 'certshare'), [
      'certshare-injector',
      'certshare-injector.certshare',
      'certshare-injector.certshare.svc',
      'certshare-injector.certshare.svc.cluster.local',
    ]);
  });

  it('signs a P-256 leaf for the Service names and extra IPs, inside the CA validity, with positive random serials', async () => {
    const now = Date.now();
    const ca = await createInjectorCa({ notBefore: now, notAfter: now + 10 * HOUR });
    const caCert = new X509Certificate(ca.certPem);
    assert.equal(caCert.ca, true);
    assert.ok(Math.abs(caCert.validFromDate.getTime() - (now - BACKDATE_MS)) < 1000, 'backdated by a minute');
    const names = serviceDnsNames('hook', 'ns');
    // Asked for longer than the CA lives: capped at the CA's expiry.
    const leaf = await issueServingLeaf(ca, { dnsNames: names, ipAddresses: ['127.0.0.1'] }, { notBefore: now, notAfter: now + 20 * HOUR });
    const cert = new X509Certificate(leaf.leafPem);
    assert.equal(cert.subjectAltName, 'DNS:hook, DNS:hook.ns, DNS:hook.ns.svc, DNS:hook.ns.svc.cluster.local, IP Address:127.0.0.1');
    assert.ok(cert.checkIssued(caCert) && cert.verify(caCert.publicKey));
    assert.equal(cert.validToDate.getTime(), caCert.validToDate.getTime());
    assert.equal(cert.publicKey.asymmetricKeyDetails?.namedCurve, 'prime256v1');
    for (const serial of [cert.serialNumber, caCert.serialNumber]) assert.match(serial, /^[0-7][0-9A-F]{31}$/);
    assert.notEqual(cert.serialNumber, caCert.serialNumber);
    for (const name of names) validateCertPair({ certPem: leaf.chainPem, keyPem: leaf.keyPem }, name, now);
    assert.ok(cert.checkIP('127.0.0.1'));
  });

  it('loads a CA back from its PEM (as kept in a Secret) and signs with the same key', async () => {
    const now = Date.now();
    const ca = await createInjectorCa({ notBefore: now, notAfter: now + HOUR });
    assert.equal(createPrivateKey(ca.keyPem).asymmetricKeyType, 'ec');
    const again = await loadInjectorCa({ certPem: ca.certPem, keyPem: ca.keyPem });
    assert.equal(again.serial, ca.serial);
    assert.equal(again.notAfter, ca.notAfter);
    const leaf = await issueServingLeaf(again, { dnsNames: ['hook'] }, { notBefore: now, notAfter: now + HOUR / 2 });
    assert.ok(new X509Certificate(leaf.leafPem).verify(new X509Certificate(ca.certPem).publicKey));
  });
});
