// The objects that carry the injector's caBundle, read and written as raw JSON through the custom
// objects API (every kind here lives in a named API group), so nothing of them is lost in a round trip.
import { X509Certificate } from 'node:crypto';
import { CertshareError } from '../core/errors.ts';
import type { Target, TargetKind } from '../core/injector-ca/ca-targets.ts';
import { MAX_BUNDLE_CAS } from '../core/injector-ca/ca-rotation.ts';

export const targetKey = (t: Target): string => `${t.kind}/${t.name}`;

type Json = Record<string, unknown>;

interface ClientConfigHolder {
  clientConfig?: { caBundle?: string };
}

/** The caBundle fields of an object (one per webhook of a configuration). */
function bundleFields(kind: TargetKind, object: Json): { get(): string | undefined; set(value: string): void }[] {
  const field = (holder: { caBundle?: string } | undefined, create: () => { caBundle?: string }) => ({
    get: () => holder?.caBundle,
    set: (value: string) => {
      create().caBundle = value;
    },
  });
  switch (kind) {
    case 'mutatingwebhookconfiguration':
    case 'validatingwebhookconfiguration':
      return ((object.webhooks as ClientConfigHolder[] | undefined) ?? []).map((w) => field(w.clientConfig, () => (w.clientConfig ??= {})));
    case 'customresourcedefinition': {
      const spec = object.spec as { conversion?: { webhook?: ClientConfigHolder } } | undefined;
      const webhook = spec?.conversion?.webhook;
      if (!webhook)
        throw new CertshareError('CERTSHARE_BAD_CONFIG', {
          source: `CustomResourceDefinition ${String((object.metadata as Json | undefined)?.name)}`,
          reason: 'has no conversion webhook to carry a caBundle',
        });
      return [field(webhook.clientConfig, () => (webhook.clientConfig ??= {}))];
    }
    case 'apiservice': {
      object.spec ??= {};
      const spec = object.spec as { caBundle?: string };
      return [field(spec, () => spec)];
    }
  }
}

const PEM_BLOCK = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g;

/**
 * The certificates of a PEM bundle by serial (upper-case hex), in order; unparsable blocks are skipped. Only the
 * first blocks, one more than a bundle the injector writes holds: a longer one is not the injector's, whatever
 * the rest (written again), and the caBundle is the injector's account's to write too.
 */
function bundleCerts(pem: string): Map<string, string> {
  const certs = new Map<string, string>();
  for (const block of (pem.match(PEM_BLOCK) ?? []).slice(0, MAX_BUNDLE_CAS + 1)) {
    try {
      certs.set(new X509Certificate(block).serialNumber.toUpperCase(), `${block}\n`);
    } catch {
      // Not ours to judge: a CA we cannot parse is a CA we did not publish.
    }
  }
  return certs;
}

/** The CAs (PEM by serial) every caBundle of the object contains (a configuration with several webhooks trusts only what all of them trust). */
export function observedCas(kind: TargetKind, object: Json): Map<string, string> {
  const fields = bundleFields(kind, object);
  if (fields.length === 0) return new Map();
  const sets = fields.map((f) => bundleCerts(Buffer.from(f.get() ?? '', 'base64').toString('utf8')));
  return new Map([...sets[0]!].filter(([serial]) => sets.every((s) => s.has(serial))));
}

export function observedCaSerials(kind: TargetKind, object: Json): string[] {
  return [...observedCas(kind, object).keys()];
}

/** A copy of the object with every caBundle set to `bundlePem`. */
export function withCaBundle(kind: TargetKind, object: Json, bundlePem: string): Json {
  const copy = structuredClone(object);
  const encoded = Buffer.from(bundlePem).toString('base64');
  for (const f of bundleFields(kind, copy)) f.set(encoded);
  return copy;
}
