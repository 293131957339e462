import type { V1Secret } from '@kubernetes/client-node/dist/gen/models/V1Secret.js';
import { validateCertPair } from '../core/certificate.ts';
import { errorMessage } from '../core/errors.ts';
import type { StoreRead, StoredCert } from '../core/store.ts';

export const LABEL_MANAGED_BY = 'app.kubernetes.io/managed-by';
export const LABEL_GROUP = 'certshare.io/group';
export const ANNOTATION_NOT_AFTER = 'certshare.io/not-after';
export const ANNOTATION_SERIAL = 'certshare.io/serial';
export const ANNOTATION_WRITER = 'certshare.io/written-by';

const decode = (value: string | undefined): string | undefined => (value === undefined ? undefined : Buffer.from(value, 'base64').toString('utf8'));

/** What a Secret holds for `domain`: an empty or hand-edited Secret is `unusable`, never an error. */
export function readCertSecret(secret: V1Secret, domain: string, now: number): StoreRead {
  const certPem = decode(secret.data?.['tls.crt']);
  const keyPem = decode(secret.data?.['tls.key']);
  if (!certPem && !keyPem) return { state: 'unusable', reason: 'Secret holds no tls.crt / tls.key' };
  if (!certPem || !keyPem) return { state: 'unusable', reason: `Secret lacks ${certPem ? 'tls.key' : 'tls.crt'}` };
  try {
    return { state: 'valid', cert: { pair: { certPem, keyPem }, info: validateCertPair({ certPem, keyPem }, domain, now) } };
  } catch (err) {
    return { state: 'unusable', reason: errorMessage(err) };
  }
}

/** The whole Secret certshare writes; labels and annotations are restored if someone removed them. */
export function certSecret(
  domain: string,
  cert: StoredCert,
  meta: { namespace: string; group: string | undefined; writer: string | undefined; resourceVersion?: string },
): V1Secret {
  const labels: Record<string, string> = { [LABEL_MANAGED_BY]: 'certshare' };
  if (meta.group) labels[LABEL_GROUP] = meta.group;
  const annotations: Record<string, string> = {
    [ANNOTATION_NOT_AFTER]: new Date(cert.info.notAfter).toISOString(),
    [ANNOTATION_SERIAL]: cert.info.serial,
  };
  if (meta.writer) annotations[ANNOTATION_WRITER] = meta.writer;
  return {
    apiVersion: 'v1',
    kind: 'Secret',
    type: 'kubernetes.io/tls',
    metadata: { name: domain, namespace: meta.namespace, labels, annotations, ...(meta.resourceVersion ? { resourceVersion: meta.resourceVersion } : {}) },
    data: {
      'tls.crt': Buffer.from(cert.pair.certPem).toString('base64'),
      'tls.key': Buffer.from(cert.pair.keyPem).toString('base64'),
    },
  };
}
